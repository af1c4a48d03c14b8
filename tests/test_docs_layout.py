"""docs/design.md's layout block names real files, and names every package.

The block is the map a reader starts from, so it must not drift from the tree:

- every file or folder it names exists: the entry in the first column (``runtime/`` under
  ``rljax/``) and every ``name.py`` or ``name/`` in an entry's description, resolved inside
  the entry's folder (a file entry's: its parent) or from the repository root; ``<op>`` and
  ``*`` stand for any name and must match at least one;
- every package (a folder with ``__init__.py``) under ``rljax/`` and ``kernels/`` is named.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# A path the block names: a run of path characters ending in '.py' or '/' (so 'gs://' and
# 'rljax.kernels' are not paths); '<op>' and '*' are wildcards.
_PATH = re.compile(r"(?<![\w.:/<>*-])((?:[\w*<>-]+/)*(?:[\w*<>-]+\.py|[\w*<>-]+/))(?![\w/])")


def layout_block(text: str) -> list[str]:
    """The lines of the first fenced block after the '## Layout' heading."""
    section = text.split("\n## Layout", 1)[1]
    fence = section.index("```")
    body = section[fence:].split("\n", 1)[1]
    return body[: body.index("```")].rstrip("\n").split("\n")


def _resolve(name: str, bases: list[pathlib.Path]) -> list[pathlib.Path]:
    """The existing paths ``name`` can mean, tried from each base in turn."""
    pattern = re.sub(r"<[^>]+>", "*", name.rstrip("/"))
    for base in bases:
        found = [p for p in base.glob(pattern) if p.is_dir() == name.endswith("/")]
        if found:
            return found
    return []


def named_paths(lines: list[str]) -> tuple[set[pathlib.Path], list[str]]:
    """(every path the block names that exists, the names that resolve to nothing)."""
    found: set[pathlib.Path] = set()
    missing: list[str] = []
    top = ROOT  # the folder of the current top-level entry
    entry = ROOT  # the folder an entry's description is read in
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        words = line.split()
        if not words:
            continue
        if indent == 0:  # a top-level entry: 'rljax/', 'configs/'
            head, description = words[0], line.split(None, 1)[1:]
            paths = _resolve(head, [ROOT])
            top = entry = paths[0] if paths and paths[0].is_dir() else ROOT
        elif indent <= 2:  # an entry inside the top-level folder: 'runtime/', 'io.py'
            head, description = words[0], line.split(None, 1)[1:]
            paths = _resolve(head, [top])
            entry = paths[0] if paths and paths[0].is_dir() else top
        else:  # the description of the last entry goes on
            head, description, paths = "", [line], []
        if head:
            found.update(paths)
            if not paths:
                missing.append(f"{head} (an entry of {top.relative_to(ROOT)}/)")
        for name in _PATH.findall(" ".join(description)):
            hits = _resolve(name, [entry, ROOT])
            found.update(hits)
            if not hits:
                missing.append(f"{name} (in the description of {entry.relative_to(ROOT)}/)")
    return found, missing


def packages() -> list[pathlib.Path]:
    """Every folder with an ``__init__.py`` under rljax/ and kernels/."""
    return sorted(
        p.parent for top in ("rljax", "kernels") for p in (ROOT / top).rglob("__init__.py")
    )


def test_every_path_in_the_layout_block_exists():
    lines = layout_block(DESIGN.read_text())
    assert len(lines) > 10, "docs/design.md has no '## Layout' section with a fenced block"
    _, missing = named_paths(lines)
    assert not missing, f"docs/design.md's layout block names what does not exist: {missing}"


def test_every_package_is_named_in_the_layout_block():
    found, _ = named_paths(layout_block(DESIGN.read_text()))
    unnamed = [str(p.relative_to(ROOT)) + "/" for p in packages() if p not in found]
    assert not unnamed, f"packages missing from docs/design.md's layout block: {unnamed}"


def test_the_check_fails_on_a_wrong_block():
    """The parser reads what a block says: a name that does not exist, and a package left out."""
    lines = [
        "rljax/",
        "  runtime/      run.py (the one Run), nowhere.py,",
        "                pod*.py (any that match)",
        "  gone/         a package that was renamed",
        "kernels/        <op>/kernel.py, missing_op/",
    ]
    found, missing = named_paths(lines)
    assert missing == [
        "nowhere.py (in the description of rljax/runtime/)",
        "gone/ (an entry of rljax/)",
        "missing_op/ (in the description of kernels/)",
    ]
    assert ROOT / "rljax" / "runtime" / "run.py" in found
    assert ROOT / "kernels" / "flash_attention" / "kernel.py" in found
    assert ROOT / "rljax" / "engine" not in found  # so it would be reported as unnamed
