"""Bad task files: one line naming config key 'data.path', the file, the line and the fix."""

import json

import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.runtime.run import Run

# A GSM8K file task; the recipe's careless-carry teacher exists only for sums.
FILE_TASK = {
    "data.task": "gsm8k",
    "sft.teacher": "reference",
    "sft.teacher_slip": 0.0,
    "sft.exact_steps": 0,
}
GOOD = {"question": "1+1=", "answer": "#### 2"}


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


CASES = [
    ("D01", "missing.jsonl", None, "point data.path at a JSONL or parquet file"),
    ("D02", "bad.jsonl", _jsonl([GOOD]) + '{"question": "2+2=", "answer": \n', "fix or delete"),
    ("D03", "keys.jsonl", _jsonl([{"question": "3+3="}] * 20), "point data.prompt_field"),
    ("D04", "empty.jsonl", "", "point data.path at a file with one record per line"),
    ("D05", "data.csv", "question,answer\n1+1=,2\n", "rename or convert it"),
    ("D06", "few.jsonl", _jsonl([GOOD] * 16), "lower heldout_size"),
    ("D07", "marker.jsonl", _jsonl([{"question": "1+1=", "answer": "2"}]), "data.answer_format"),
    ("D08", "latin1.jsonl", "caf\xe9\n", "must be UTF-8 JSON lines"),
    ("D09", "list.jsonl", _jsonl([GOOD, ["1+1=", "2"]]), "write one {...} record per line"),
]


@pytest.mark.parametrize("row_id, name, content, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_task_file(refused, check_row, workdir, tmp_path, row_id, name, content, fix):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content.encode("latin-1" if row_id == "D08" else "utf-8"))
    cfg = replace(arith_tiny.recipe("small"), **FILE_TASK, **{"data.path": str(path)})
    message = refused(lambda: Run(cfg, str(workdir)), ConfigError, workdir)
    check_row(row_id, message, fix)
