"""Tests for GSM8K/MATH file loading."""

import builtins
import importlib
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


def test_examples_keep_the_worked_solution_the_worked_teacher_imitates(tmp_path):
    """A row's worked text rides along as the example's 'solution': sft.teacher='worked' trains
    on the steps and '#### N' (and earns the reward), 'reference' on N alone; it needs a GSM8K
    file."""
    import numpy as np

    from rljax.config import ConfigError, DataConfig, RunConfig, replace
    from rljax.data.teachers import teacher_answer

    path = _write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    examples = math_tasks.load_math_examples(path)
    assert [e["solution"] for e in examples] == [r["answer"] for r in GSM8K_ROWS]
    rng = np.random.default_rng(0)
    for example in examples:
        worked = teacher_answer("worked", example, 0.0, rng)
        assert worked == example["solution"] and "####" in worked
        assert teacher_answer("reference", example, 0.0, rng) == example["answer"]
        assert math_answer(worked, example) == 1.0
    math = math_tasks.load_math_examples(_write_jsonl(tmp_path / "m.jsonl", MATH_ROWS), kind="math")
    assert [e["solution"] for e in math] == [MATH_ROWS[0]["solution"], "8"]
    gsm8k = replace(RunConfig(), data=DataConfig(task="gsm8k", path=path, heldout_size=1))
    replace(gsm8k, **{"sft.teacher": "worked"})  # accepted
    with pytest.raises(ConfigError, match="needs data.task='gsm8k'"):
        replace(RunConfig(), **{"sft.teacher": "worked"})


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
        # Every row's keys as columns (from_pylist infers the columns from the first row alone
        # in pyarrow 26): the first row's missing answer is a null there.
        schema = pa.schema([(k, pa.string()) for k in ("problem", "answer", "solution")])
        pq.write_table(
            pa.Table.from_pylist(MATH_ROWS, schema=schema), str(tmp_path / "math.parquet")
        )
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
        (
            [{"question": "q", "answer": "no marker"}],
            "auto",
            "none of its 1 rows is usable (1 unparsable answer)",
        ),
        ([{"problem": "p", "solution": "no box"}], "auto", "(1 unparsable answer)"),
        ([{"text": "x"}], "auto", "cannot tell the task kind from keys ['text']"),
        ([{"problem": "p"}], "gsm8k", "(1 missing 'question'); point data.prompt_field"),
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


def test_a_file_in_its_own_format_with_bad_rows_skipped_and_counted(tmp_path):
    """Keys and an answer format of the user's own; a row without its question, one without
    its answer and one whose answer does not parse are skipped and counted, not fatal."""
    from collections import Counter

    from rljax.config import DataConfig

    rows = [{"q": f"What is {i}+1?", "sol": f"It is {i + 1}."} for i in range(8)]
    rows[2] = {"sol": "It is 3."}
    rows[4] = {"q": "What is 4+1?"}
    rows[6] = {"q": "What is 6+1?", "sol": "seven"}
    path = _write_jsonl(tmp_path / "own.jsonl", rows)
    cfg = DataConfig(
        task="gsm8k",
        path=path,
        prompt_field="q",
        answer_field="sol",
        answer_format="number",
        train_size=10,
        heldout_size=2,
    )
    skipped = Counter()
    train, heldout = math_tasks.load_splits(cfg, skipped)
    assert skipped == {"missing 'q'": 1, "missing 'sol'": 1, "unparsable answer": 1}
    assert [e["id"] for e in train + heldout] == [0, 1, 3, 5, 7]
    assert [e["answer"] for e in train + heldout] == ["1", "2", "4", "6", "8"]
    assert train[0]["prompt"].startswith("What is 0+1?")


@pytest.mark.parametrize(
    "text, answer_format, want",
    [
        ("so 3 + 4 = 7\n#### 1,234", "gsm8k", "1234"),
        ("#### about seven", "gsm8k", None),
        ("we get \\boxed{\\frac{1}{2}} and \\boxed{3}", "boxed", "3"),
        ("no box", "boxed", None),
        ("12 apples, then 1,500 more", "number", "1500"),
        ("none", "number", None),
        ("  x^2  ", "raw", "x^2"),
    ],
)
def test_final_answer_formats(text, answer_format, want):
    assert math_tasks.final_answer(text, answer_format) == want


def test_a_run_counts_the_rows_it_skipped_and_goes_on(tmp_path, monkeypatch):
    from rljax.configs import arith_tiny

    from rljax.config import replace

    run_module = importlib.import_module("rljax.runtime.run")

    # The tiny recipe's char tokenizer cannot spell the prompts' instruction; the counting is
    # what is under test here, not the prompts.
    monkeypatch.setattr(run_module, "check_prompts", lambda *args: None)

    rows = [{"question": f"{i}+1=", "answer": f"#### {i + 1}"} for i in range(40)]
    rows[5] = {"question": "5+1="}
    rows[9] = {"question": "9+1=", "answer": "#### ten"}
    path = _write_jsonl(tmp_path / "g.jsonl", rows)
    changes = {"data.task": "gsm8k", "data.path": path, "sft.teacher": "reference"}
    changes |= {"sft.teacher_slip": 0.0, "sft.exact_steps": 0, "data.heldout_size": 8}
    run = run_module.Run(replace(arith_tiny.recipe("small"), **changes), str(tmp_path / "w"))
    run.close()
    assert len(run.train_examples) + len(run.heldout_examples) == 38
    records = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    [data] = [r for r in records if r["phase"] == "data"]
    assert data["skipped_rows/missing 'answer'"] == 1
    assert data["skipped_rows/unparsable answer"] == 1
