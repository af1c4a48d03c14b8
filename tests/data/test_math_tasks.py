"""Tests for GSM8K/MATH file loading."""

import builtins
import json

import pytest

from rljax import io
from rljax.data import math_tasks
from rljax.models.tokenizer import Tokenizer
from rljax.rewards.verifiers import math_answer
from rljax.testing.filesystems import gcs_workdir

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A car costs $1,200 plus $300.", "answer": "1200+300=1500\n#### 1,500"},
]
MATH_ROWS = [
    {"problem": "What is 1/2 of 1?", "solution": "Half is $\\boxed{\\frac{1}{2}}$."},
    {"problem": "Compute $2^3$.", "answer": "8", "solution": "ignored"},
]


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return str(path)


def test_gsm8k_jsonl(tmp_path):
    examples = math_tasks.load_math_examples(_write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS))
    assert [e["id"] for e in examples] == [0, 1]
    assert [e["answer"] for e in examples] == ["7", "1500"]
    assert examples[0]["prompt"].startswith("Tom has 3 apples")
    assert "\\boxed{answer}" in examples[0]["prompt"]
    assert math_answer("so \\boxed{1,500}", examples[1]) == 1.0


def test_math_jsonl_and_limit(tmp_path):
    path = _write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    examples = math_tasks.load_math_examples(path, kind="math")
    assert [e["answer"] for e in examples] == ["\\frac{1}{2}", "8"]
    assert math_answer("\\boxed{0.5}", examples[0]) == 1.0
    assert len(math_tasks.load_math_examples(path, limit=1)) == 1


def test_chat_prompt_builder(tmp_path):
    tok = Tokenizer.char_level(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ?.,$+=\n\\{}#"
    )
    build = math_tasks.chat_prompt_builder(tok, instruction="Answer.")
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS[:1])
    examples = math_tasks.load_math_examples(path, prompt_fn=build)
    assert examples[0]["prompt"] == "Tom has 3 apples and buys 4. How many?\nAnswer."


def test_task_files_on_gcs(tmp_path):
    """JSONL and parquet task files at gs:// URLs (GCS emulator), read through rljax.io."""
    with gcs_workdir() as workdir:
        rows = "\n".join(json.dumps(r) for r in GSM8K_ROWS) + "\n"
        io.write_text(f"{workdir}/gsm8k.jsonl", rows)
        examples = math_tasks.load_math_examples(f"{workdir}/gsm8k.jsonl")
        assert [e["answer"] for e in examples] == ["7", "1500"]
        pq = pytest.importorskip("pyarrow.parquet")
        pa = pytest.importorskip("pyarrow")
        pq.write_table(pa.Table.from_pylist(MATH_ROWS), str(tmp_path / "math.parquet"))
        io.write_bytes(f"{workdir}/math.parquet", (tmp_path / "math.parquet").read_bytes())
        examples = math_tasks.load_math_examples(f"{workdir}/math.parquet")
        assert [e["answer"] for e in examples] == ["\\frac{1}{2}", "8"]
        with pytest.raises(FileNotFoundError, match=r"Task file gs://\S+/nope\.jsonl does not"):
            math_tasks.load_math_examples(f"{workdir}/nope.jsonl")


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    import pyarrow.parquet as pq

    path = str(tmp_path / "gsm8k.parquet")
    pq.write_table(pa.Table.from_pylist(GSM8K_ROWS), path)
    assert [e["answer"] for e in math_tasks.load_math_examples(path)] == ["7", "1500"]


def test_parquet_without_pyarrow_names_the_fix(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match=r"x\.parquet needs pyarrow.*pip install pyarrow"):
        math_tasks.load_math_examples(str(tmp_path / "x.parquet"))


@pytest.mark.parametrize(
    "rows, kind, message",
    [
        ([{"question": "q", "answer": "no marker"}], "auto", "row 0: GSM8K answer has no '####"),
        ([{"problem": "p", "solution": "no box"}], "auto", "row 0: MATH solution has no \\boxed"),
        ([{"text": "x"}], "auto", "cannot tell the task kind from keys ['text']"),
        ([{"problem": "p"}], "gsm8k", "row 0: GSM8K rows need 'question' and 'answer'"),
        ([], "auto", "has no rows"),
    ],
)
def test_bad_rows(tmp_path, rows, kind, message):
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(ValueError) as info:
        math_tasks.load_math_examples(path, kind=kind)
    assert message in str(info.value) and "t.jsonl" in str(info.value)


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Task file .*missing\.jsonl does not exist"):
        math_tasks.load_math_examples(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"question": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl line 2 is not valid JSON"):
        math_tasks.load_math_examples(str(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match=r"data\.csv must end in \.jsonl, \.json or \.parquet"):
        math_tasks.load_math_examples(str(tmp_path / "data.csv"))
    with pytest.raises(ValueError, match="kind='aime' is not supported"):
        math_tasks.load_math_examples(str(tmp_path / "x.jsonl"), kind="aime")


def test_load_splits_holds_out_the_last_rows(tmp_path):
    from rljax.config import DataConfig

    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(10)]
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    cfg = DataConfig(task="gsm8k", path=path, train_size=5, heldout_size=3)
    train, heldout = math_tasks.load_splits(cfg)
    assert [e["answer"] for e in train] == ["0", "1", "2", "3", "4"]
    assert [e["answer"] for e in heldout] == ["7", "8", "9"]
    big = DataConfig(task="gsm8k", path=path, train_size=5, heldout_size=10)
    with pytest.raises(ValueError, match="has 10 rows, not more than data.heldout_size=10"):
        math_tasks.load_splits(big)
