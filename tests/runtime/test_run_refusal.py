"""A Run that refuses to start closes what it had opened (reward workers, checkpoints, files)."""

from __future__ import annotations

import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.rewards.pool import RewardPool
from rljax.runtime import Run


def test_a_refused_run_closes_its_parts(tmp_path, monkeypatch):
    closed = []
    close = RewardPool.close

    def counting_close(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(RewardPool, "close", counting_close)
    # 2 groups of 3 samples cannot be split over 4 data-parallel learner devices: refused once
    # the learner exists, after the reward pool and the checkpoint manager have been built.
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
