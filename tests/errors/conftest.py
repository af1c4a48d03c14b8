"""Shared checks for the bad-input table in docs/errors.md.

Every test here triggers one row of the table through the entry point a user would call, then
``check_row`` asserts that the message is one line, matches the row's quoted message (``<...>``
in the table stands for a path or library text that varies), and contains the fix; ``refused``
asserts that the refused call left the workdir byte for byte as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re
import sys

import pytest
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
CONFIG = str(ROOT / "configs" / "arith_tiny.py") + ":small"
# | `ID` | input | `message` | fix |
_ROW = re.compile(
    r"^\| `(?P<id>[A-Z]\d\d)` \| (?P<input>.+?) \| `(?P<message>.+)` \| (?P<fix>.+) \|$"
)


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    input: str
    message: str
    fix: str

    def pattern(self) -> re.Pattern:
        """The quoted message as a regex: ``<...>`` placeholders match any text."""
        parts = re.split(r"<[^<>]*>", self.message)
        return re.compile(".+?".join(re.escape(p) for p in parts), re.DOTALL)


def doc_rows() -> dict[str, Row]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line.strip())
        if match:
            row = Row(**match.groupdict())
            assert row.id not in rows, f"row {row.id} is listed twice in docs/errors.md"
            rows[row.id] = row
    return rows


@pytest.fixture(scope="session")
def rows() -> dict[str, Row]:
    return doc_rows()


@pytest.fixture
def check_row(rows):
    """``check_row(id, message, fix)``: the message is one line, is the documented one, and
    contains ``fix`` (the words that tell the user what to do)."""

    def check(row_id: str, message: str, fix: str) -> None:
        assert row_id in rows, f"row {row_id} is missing from docs/errors.md"
        assert message.strip() == message and message, repr(message)
        assert "\n" not in message, f"{row_id}: the message spans lines: {message!r}"
        assert "Traceback" not in message
        assert rows[row_id].pattern().fullmatch(message), (
            f"{row_id}: docs/errors.md quotes `{rows[row_id].message}` but the code says "
            f"`{message}`"
        )
        assert fix in message, f"{row_id}: the message does not name the fix {fix!r}: {message}"

    return check


def snapshot(directory: pathlib.Path) -> dict[str, str]:
    """Every file and folder under ``directory``: relative path -> sha256 of the bytes."""
    out = {}
    for p in sorted(directory.rglob("*")):
        rel = str(p.relative_to(directory))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def workdir(tmp_path) -> pathlib.Path:
    """A workdir that a previous run left metrics and a TensorBoard file in."""
    d = tmp_path / "workdir"
    (d / "tensorboard" / "train").mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"step": 0, "phase": "train", "reward": 0.5}\n')
    (d / "tensorboard" / "train" / "events.out").write_bytes(b"\x00event")
    return d


@pytest.fixture
def refused():
    """``refused(call, error_type, workdir)``: ``call()`` raises ``error_type`` and leaves
    ``workdir`` as it was; returns the message."""

    def run(call, error_type, workdir: pathlib.Path) -> str:
        before = snapshot(workdir)
        with pytest.raises(error_type) as info:
            call()
        assert snapshot(workdir) == before, "the refused start changed the workdir"
        return str(info.value)

    return run


@pytest.fixture
def launch_error(workdir, monkeypatch):
    """``launch_error(*flags)``: runs ``rljax --config=<small recipe> --workdir=<workdir>
    <flags>`` in this process (as ``rljax.launch.run`` would) and returns what it printed on
    exit; checks that the workdir is unchanged. Pass ``--config=`` or ``--workdir=`` to replace
    the defaults, ``command='eval'`` for ``rljax eval`` (no ``--workdir`` then)."""
    from rljax import launch

    def run(*args: str, target: pathlib.Path = workdir, command: str = "train") -> str:
        argv = ["rljax"]
        monkeypatch.setattr(launch, "_command", command)
        if not any(a.startswith("--config=") for a in args) and command != "export":
            argv.append(f"--config={CONFIG}")
        if not any(a.startswith("--workdir=") for a in args) and command == "train":
            argv.append(f"--workdir={target}")
        argv += list(args)
        before = snapshot(target) if target.exists() else None
        # config_flags finds the --config.<key> overrides in sys.argv, as in a real launch.
        monkeypatch.setattr(sys, "argv", argv)
        # config_flags execs the file into sys.modules['config_config'], reusing an earlier
        # launch's module (and its get_config); a real launch starts without one.
        monkeypatch.delitem(sys.modules, "config_config", raising=False)
        known = set(flags.FLAGS)
        try:
            with pytest.raises(SystemExit) as info:
                launch.main(launch._parse_flags(argv))
        finally:
            flags.FLAGS.unparse_flags()
            for name in set(flags.FLAGS) - known:  # the --config.<key> flags it defined
                if name.startswith("config."):
                    delattr(flags.FLAGS, name)
        if before is not None:
            assert snapshot(target) == before, "the refused start changed the workdir"
        code = info.value.code
        assert isinstance(code, str), f"exit code {code!r}: expected a one-line message"
        return code

    return run
