"""The table of every config key, its default and what it sets, generated from the dataclasses.

Each section documents its fields under ``Attributes:`` in its docstring (Google style). This
module reads those entries and the fields' defaults, so docs/runtime.md's table (between
:data:`BEGIN` and :data:`END`) comes from the code: ``python scripts/config_keys.py --write``
regenerates it, and tests/test_config.py fails when the two differ. A field without an entry,
or an entry without a field, is refused here, so the table cannot leave a key out.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from rljax.config.run_config import RunConfig

BEGIN = "<!-- config-keys:begin (generated: python scripts/config_keys.py --write) -->"
END = "<!-- config-keys:end -->"

# An entry's first line: two spaces, the field name(s), a colon. 'a / b:' documents two fields.
_ENTRY = re.compile(r"^  (\w+(?: / \w+)*): ?(.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: its text}`` from the ``Attributes:`` section of ``cls``'s docstring."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    if "Attributes:" not in lines:
        return {}
    docs: dict[str, list[str]] = {}
    names: list[str] = []
    for line in lines[lines.index("Attributes:") + 1 :]:
        entry = _ENTRY.match(line)
        if entry:
            names = entry.group(1).split(" / ")
            for name in names:
                docs[name] = [entry.group(2)]
        elif line.startswith("    ") and names:  # the entry goes on
            for name in names:
                docs[name].append(line.strip())
        else:  # a blank line or a new paragraph ends the section
            break
    return {name: " ".join(parts).strip() for name, parts in docs.items()}


@dataclasses.dataclass(frozen=True)
class Section:
    """One table: the keys of a section (or of the run itself, ``name=''``)."""

    name: str
    cls: type
    rows: tuple[tuple[str, Any, str], ...]  # (dotted key, default, what it sets)


def sections(cls: type = RunConfig) -> list[Section]:
    """Every key of ``cls``, grouped by section: the run-level keys first, then each section.

    Raises ValueError naming a field that its class's ``Attributes:`` does not document, or an
    entry that names no field.
    """
    docs = field_docs(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    stale = sorted(set(docs) - set(names))
    if stale:
        raise ValueError(
            f"{cls.__name__}'s docstring documents {stale[0]!r} under Attributes:, which is not "
            "one of its fields; remove or rename the entry"
        )
    run_rows, nested = [], []
    for f in dataclasses.fields(cls):
        default = _default(f)
        if dataclasses.is_dataclass(default):
            nested.append((f.name, type(default)))
            continue
        if not docs.get(f.name):
            raise ValueError(
                f"config field {cls.__name__}.{f.name} has no entry under Attributes: in its "
                f"class docstring; add one ('{f.name}: what it sets') and run "
                "python scripts/config_keys.py --write"
            )
        run_rows.append((f.name, default, docs[f.name]))
    out = [Section("", cls, tuple(run_rows))] if run_rows else []
    for name, section_cls in nested:
        for sub in sections(section_cls):
            rows = tuple((f"{name}.{key}", d, text) for key, d, text in sub.rows)
            out.append(Section(f"{name}.{sub.name}".rstrip("."), sub.cls, rows))
    return out


def _default(f: dataclasses.Field) -> Any:
    factory = f.default_factory
    return factory() if callable(factory) else f.default


def _markdown_text(text: str) -> str:
    """Docstring text as Markdown: Sphinx roles and ``literals`` become `code`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")  # a pipe would end the table cell


def markdown() -> str:
    """The tables, between :data:`BEGIN` and :data:`END`."""
    out = [BEGIN, ""]
    for section in sections():
        title = f"`{section.name}`" if section.name else "Run-level keys"
        summary = inspect.cleandoc(section.cls.__doc__ or "").split("\n\n")[0]
        summary = _markdown_text(" ".join(summary.split()))
        out += [f"### {title} (`{section.cls.__name__}`)", "", summary, ""]
        out += ["| key | default | what it sets |", "| --- | --- | --- |"]
        for key, default, text in section.rows:
            out.append(f"| `{key}` | `{repr(default)}` | {_markdown_text(text)} |")
        out.append("")
    return "\n".join([*out, END])


def with_table(doc: str) -> str:
    """``doc`` (docs/runtime.md's text) with the part between the markers regenerated."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(
            f"the document has no {BEGIN!r} ... {END!r} block; put the two marker lines where "
            "the config key table belongs"
        )
    return doc[:start] + markdown() + doc[end + len(END) :]
