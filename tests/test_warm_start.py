"""Run.warm_start: the SFT phase's own learning-rate schedule, kept apart from the RL one."""

import json

import pytest

from rljax.config import replace
from rljax.runtime import Run
from rljax.testing.configs import arith_tiny


def test_sft_warmup_and_schedule_do_not_leak_into_rl(tmp_path):
    cfg = replace(
        arith_tiny("test"),
        **{
            "sft.steps": 6,
            "sft.warmup_steps": 2,
            "sft.learning_rate": 0.01,
            "sft.schedule": "cosine",
            "learner.learning_rate": 1e-3,
            "num_steps": 1,
        },
    )
    run = Run(cfg, str(tmp_path))
    try:
        run.train()  # the warm start, then one RL step
    finally:
        run.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sft = [r["learning_rate"] for r in rows if r["phase"] == "sft"]
    # Linear warmup from 0 over two updates, then a cosine to 0 over the remaining four.
    assert sft == pytest.approx([0.0, 0.005, 0.01, 0.008536, 0.005, 0.001464], abs=1e-6)
    # RL gets the learner's own rate from its first update: no warmup, no decay.
    rl = [r["learning_rate"] for r in rows if r["phase"] == "train"]
    assert rl == pytest.approx([1e-3])
