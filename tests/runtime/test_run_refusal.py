"""A Run that refuses to start closes what it had opened (reward workers, checkpoints, files)."""

from __future__ import annotations

import pytest
from rljax.configs import arith_tiny

from rljax.checkpoint import Checkpointer
from rljax.config import ConfigError, replace
from rljax.rewards.pool import RewardPool
from rljax.runtime import Run, hosting


def _count_closes(monkeypatch, cls) -> list:
    closed: list = []
    close = cls.close

    def counting_close(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(cls, "close", counting_close)
    return closed


def test_a_refused_run_closes_its_checkpoints(tmp_path, monkeypatch):
    closed = _count_closes(monkeypatch, Checkpointer)
    # 2 groups of 3 samples cannot be split over 4 data-parallel learner devices: refused once
    # the learner exists, after the checkpoint manager has been opened.
    cfg = replace(
        arith_tiny.recipe("small"),
        **{
            "learner.batch_groups": 2,
            "learner.group_size": 3,
            "sampling.max_concurrent_decodes": 8,
            "checkpoint.enabled": True,
        },
    )
    with pytest.raises(ConfigError, match="learner.batch_groups \\* learner.group_size"):
        Run(cfg, str(tmp_path))
    assert len(closed) == 1


def test_a_run_refused_late_closes_its_reward_workers(tmp_path, monkeypatch):
    closed = _count_closes(monkeypatch, RewardPool)
    ckpts = _count_closes(monkeypatch, Checkpointer)

    def refuse(run):
        assert run.rewards is not None  # the last part built: everything before it is open
        raise ConfigError("refused after the reward pool was built")

    monkeypatch.setattr(hosting, "InPlaceResizer", refuse)
    cfg = replace(arith_tiny.recipe("small"), **{"checkpoint.enabled": True})
    with pytest.raises(ConfigError, match="refused after the reward pool"):
        Run(cfg, str(tmp_path))
    assert len(closed) == 1 and len(ckpts) == 1
