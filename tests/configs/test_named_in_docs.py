"""Every config file, variant and ``--config.<key>`` that the docs and scripts name exists.

Scans README.md, docs/*.md, scripts/ and the launch commands in configs/ docstrings for
``configs/<path>.py[:variant]`` and ``--config.<key>``. A path must be a file, its variant one
the file declares and builds; a key must be in the built config named on the same command
(shell continuations joined), or in the default recipe when the command names none.
Placeholders such as ``configs/NAME.py`` and ``--config.<section>.<key>`` are not names.
"""

import functools
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT = "configs/arith_tiny.py"  # what `rljax` runs with no --config
CONFIG_PATH = re.compile(r"\bconfigs/((?:[a-z0-9_]+/)*[a-z0-9_]+\.py)(?:\[?:([a-z0-9_]+))?")
OVERRIDE = re.compile(r"--config\.([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)")
# docs/errors.md names bad configs, variants and keys on purpose: its tests check each row.
SOURCES = sorted(
    ({ROOT / "README.md", *(ROOT / "docs").glob("*.md")} - {ROOT / "docs" / "errors.md"})
    | {p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh", ".md")}
    | set((ROOT / "configs").rglob("*.py"))
)


@functools.cache
def _module(path: str):
    spec = importlib.util.spec_from_file_location(f"named_{pathlib.Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _built(path: str, variant: str) -> dict:
    return _module(path).get_config(variant).to_dict()


def commands(text: str):
    """(first line number, logical line) with backslash continuations joined."""
    start, parts = None, []
    for number, line in enumerate(text.splitlines(), 1):
        start = start or number
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        yield start, " ".join([*parts, line])
        start, parts = None, []
    if parts:
        yield start, " ".join(parts)


def problems(text: str) -> list[str]:
    """What ``text`` names that does not exist, one line each, prefixed by its line number."""
    found = []
    for number, command in commands(text):
        configs, before = [], len(found)
        for match in CONFIG_PATH.finditer(command):
            path, variant = f"configs/{match[1]}", match[2] or ""
            if not (ROOT / path).is_file():
                found.append(f"{number}: {path} does not exist")
                continue
            declared = getattr(_module(path), "VARIANTS", ())
            if variant and variant not in declared:
                found.append(f"{number}: {path} has no variant {variant!r} (has {declared})")
                continue
            configs.append((path, variant))
        if len(found) > before:  # the keys belong to a config that is not there
            continue
        for match in OVERRIDE.finditer(command):
            for path, variant in configs or [(DEFAULT, "")]:
                node = _built(path, variant)
                for part in match[1].split("."):
                    node = node.get(part) if isinstance(node, dict) and part in node else None
                    if node is None:
                        found.append(f"{number}: --config.{match[1]} is not a key of {path}")
                        break
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_configs_variants_and_keys_exist(source):
    found = problems(source.read_text())
    assert not found, f"{source.relative_to(ROOT)} names what does not exist:\n" + "\n".join(found)


def test_the_scan_sees_the_names_it_must_check():
    readme = (ROOT / "README.md").read_text()
    assert any("arith_tiny.py" in c and "--config.learner" in c for _, c in commands(readme))
    named = {m[1] for s in SOURCES for m in CONFIG_PATH.finditer(s.read_text())}
    assert {"arith_tiny.py", "arith_async.py", "qwen3_8b_gsm8k.py", "sim/pod_compare.py"} <= named


@pytest.mark.parametrize(
    "text, problem",
    [
        ("rljax --config=configs/gsm8k_grpo.py", "configs/gsm8k_grpo.py does not exist"),
        ("rljax --config=configs/arith_tiny.py:test", "has no variant 'test'"),
        ("python scripts/simulate.py --config=configs/sim/pod_compare.py[:runlocal]", "'runlocal'"),
        (
            "launch.sh --config=configs/qwen3_8b_gsm8k.py \\\n  --config.max_staleness=2",
            "--config.max_staleness is not a key of configs/qwen3_8b_gsm8k.py",
        ),
        ("rljax --config.learner.lr=1", "--config.learner.lr is not a key of configs/arith_tiny"),
        ("rljax --config.seed.x=1", "--config.seed.x is not a key"),
    ],
)
def test_the_scan_flags_what_does_not_exist(text, problem):
    (found,) = problems(text)
    assert problem in found


def test_placeholders_and_real_names_pass():
    text = (
        "rljax --config=configs/NAME.py[:ARG] --config.KEY=VALUE --config.<section>.<key>\n"
        "rljax --config=configs/arith_async.py:eta2 --config.buffer.max_staleness=2\n"
        "python scripts/simulate.py --config=configs/sim/pod_compare.py:small --config.steps=3\n"
        "rljax --config.learner.learning_rate=1e-3 --config.init=x"
    )
    assert problems(text) == []
