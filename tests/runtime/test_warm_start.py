"""Run.warm_start: its own learning-rate schedule (kept apart from RL's) and its teachers."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.config import replace
from rljax.data import teachers
from rljax.runtime import Run


def test_warm_start_schedule_and_teachers(tmp_path, monkeypatch):
    careless, original = [], teachers.TEACHERS["drops_carries"]

    def counting_careless_teacher(example, slip, rng):
        careless.append(example["prompt"])
        return original.answer(example, slip, rng)

    counting = dataclasses.replace(original, answer=counting_careless_teacher)
    monkeypatch.setitem(teachers.TEACHERS, "drops_carries", counting)
    cfg = replace(
        arith_tiny.recipe("small"),
        **{
            "sft.steps": 6,
            "sft.warmup_steps": 2,
            "sft.learning_rate": 0.01,
            "sft.schedule": "cosine",
            "sft.teacher": "drops_carries",
            "sft.teacher_slip": 0.7,
            "sft.exact_steps": 2,
            "learner.learning_rate": 1e-3,
            "num_steps": 1,
        },
    )
    run = Run(cfg, str(tmp_path))
    warm_start_learner, moved = run.warm_start_learner, []

    def watched(learner):  # which of the learner's params the warm start left trained
        before = jax.tree.leaves(jax.device_get(learner.params))
        warm_start_learner(learner)
        after = jax.tree.leaves(jax.device_get(learner.params))
        moved.extend(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))

    run.warm_start_learner = watched
    try:
        run.train()  # the warm start, then one RL step
    finally:
        run.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sft = [r["learning_rate"] for r in rows if r["phase"] == "sft"]
    # Linear warmup from 0 over two updates, then a cosine to 0 over the remaining four.
    assert sft == pytest.approx([0.0, 0.005, 0.01, 0.008536, 0.005, 0.001464], abs=1e-6)
    # The warm start's weights are the learner's: RL starts from them, not from the init.
    assert moved and all(moved)
    # RL gets the learner's own rate from its first update: no warmup, no decay.
    rl = [r["learning_rate"] for r in rows if r["phase"] == "train"]
    assert rl == pytest.approx([1e-3])
    # The first two steps imitate the reference answers; only the last four the careless
    # teacher, one answer per example of the batch.
    assert len(careless) == 4 * cfg.sft.batch_size
