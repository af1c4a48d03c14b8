"""Lending in a real run on 8 CPU devices (a 6/2 split): both directions, forced on.

- Trainer-on-RollPool: the same lock-step run with and without lending consumes the same groups
  in the same order and ends with the same learner parameters (float tolerance).
- Rollout-on-TrainPool: an async run whose learner serves a replica on its own chips while it
  waits loses and duplicates no group, keeps staleness <= eta, and the lent replica did serve.
"""

import threading

import jax
import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.config import ConfigError, replace
from rljax.policy.lending import LendDirection, LendingDecision
from rljax.runtime import Run
from rljax.testing import audit

pytestmark = pytest.mark.slow


def _cfg(**changes):
    return replace(
        arith_tiny.recipe("small"),
        **{
            "mesh.mode": "split",
            "mesh.sampler_devices": 6,
            "mesh.learner_devices": 2,
            "lending.enabled": True,
            "num_steps": 2,
            **changes,
        },
    )


def _train(cfg, workdir, force: LendingDecision | None = None):
    run = Run(cfg, str(workdir))
    # A run that stalls (a lost group never fills its batch) stops and fails the audits
    # instead of hanging the suite; it never fires in a passing run.
    watchdog = threading.Timer(600, run.request_stop)
    watchdog.start()
    try:
        if force is not None:
            run.parts.lender.force = force
        run.train()
    finally:
        watchdog.cancel()
        run.close()
    return run


def _train_records(workdir):
    return [r for r in audit.read_metrics(workdir) if r["phase"] == "train"]


def test_trainer_on_rollpool_equals_the_unlent_run(tmp_path):
    cfg = _cfg(**{"learner.micro_batches": 2})
    plain = _train(replace(cfg, **{"lending.enabled": False}), tmp_path / "plain")
    force = LendingDecision(LendDirection.TRAIN_ON_ROLL, 6, 0.5, 0.0, "test")
    lent = _train(cfg, tmp_path / "lent", force)
    want, got = _train_records(tmp_path / "plain"), _train_records(tmp_path / "lent")
    assert [r["prompt_ids"] for r in got] == [r["prompt_ids"] for r in want]
    assert [r["lending/lent_micro_batches"] for r in got] == [1, 1]  # half of 2, every step
    for key in ("loss", "grad_norm", "reward"):
        np.testing.assert_allclose([r[key] for r in got], [r[key] for r in want], rtol=1e-5)
    assert lent.learner.version == plain.learner.version == 2
    _assert_same_params(lent.learner.params, plain.learner.params, max_move=3 * 1e-3 * 2)


def _assert_same_params(got, want, *, max_move: float) -> None:
    """Equal within rtol 1e-5, but for elements whose summed gradient is rounding noise: Adam's
    normalisation can flip their update with the order of the micro-batch sum (rare, and at
    most ``max_move``); a lost or doubled share moves most elements off."""
    got, want = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (got, want))
    diff = np.abs(got - want)
    off = diff > 1e-6 + 1e-5 * np.abs(want)
    assert off.mean() <= 1e-3, f"{off.sum()} of {off.size} parameters differ"
    assert diff.max() <= max_move, f"a parameter moved {diff.max()} > {max_move}"


def test_rollout_on_trainpool_loses_nothing_and_keeps_eta(tmp_path):
    eta, steps = 1, 4
    cfg = _cfg(
        **{
            "mode": "async",
            "buffer.max_staleness": eta,
            # One group's slots on the sampler: a batch of 4 groups needs the lent replica.
            "sampling.max_concurrent_decodes": 8,
            "checkpoint.enabled": True,
            "checkpoint.async_save": False,
            "num_steps": steps,
        }
    )
    force = LendingDecision(LendDirection.ROLLOUT_ON_TRAIN, 2, 0.0, 0.0, "test")
    run = _train(cfg, tmp_path, force)
    records = audit.read_metrics(tmp_path)
    meta = audit.read_meta(tmp_path, steps)
    leftover = audit.leftover_prompts(meta)
    assert audit.audit_steps(records, steps) == []
    assert audit.audit_staleness(records, eta) == []
    assert audit.audit_prompts(records, leftover, audit.drawn_prompts(cfg, meta["data"])) == []
    train = [r for r in records if r["phase"] == "train"]
    assert all(sum(r["staleness_hist"].values()) == 4 for r in train)
    # No group completed twice (a duplicate would be discarded as surplus without overprovision).
    assert train[-1]["surplus_discarded"] == 0
    # The lent replica served, and what it held at each release went back to the sampler.
    replicas = run.parts.lender.replicas
    assert replicas.stats["served_tokens"] > 0 and replicas.stats["routed_groups"] > 0
    assert sum(r["lending/served_tokens"] for r in train) == replicas.stats["served_tokens"]
    assert replicas.stats["lends"] == run.parts.lender.stats["rollout_lends"] >= 1
    handed = replicas.stats["handed_over_samples"]
    assert handed == replicas.stats["adopted_samples"] + replicas.returning_samples


def test_lending_refuses_what_it_cannot_run():
    with pytest.raises(ConfigError, match="lending.enabled"):
        _cfg(**{"mesh.mode": "colocated", "mesh.sampler_devices": 0, "mesh.learner_devices": 0})
    with pytest.raises(ConfigError, match="not both"):
        _cfg(**{"mode": "async", "buffer.max_staleness": 1, "mesh.reallocate": True})
