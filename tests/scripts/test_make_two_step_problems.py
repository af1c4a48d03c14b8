"""The shipped GSM8K-format file is the generator's output, and reads as a GSM8K file with no
row skipped: every answer is the two steps' result."""

import importlib.util
import json
import pathlib
from collections import Counter

from rljax.data import math_tasks

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO / "configs" / "data" / "two_step.jsonl"


def _module():
    path = REPO / "scripts" / "make_two_step_problems.py"
    spec = importlib.util.spec_from_file_location("make_two_step_problems", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_file_is_the_generators_output_and_reads_whole():
    rows = _module().rows(640, 0)
    assert SHIPPED.read_text() == "".join(json.dumps(r) + "\n" for r in rows)
    skipped = Counter()
    examples = math_tasks.load_math_examples(str(SHIPPED), kind="gsm8k", skipped=skipped)
    assert not skipped and len(examples) == 640
    for row, example in zip(rows, examples, strict=True):
        first, second, _ = row["answer"].split("\n")
        left, ab = first.split(" = ")
        a, op, b = left.split()
        assert int(ab) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert second.startswith(f"{ab} ") and second.split(" = ")[1] == example["answer"]
        assert int(example["answer"]) >= 0
