"""Lending's wiring without a run: the meter's phase goes to the policy at each boundary, a
forced decision overrides it, and a Trainer-on-RollPool decision becomes the learner's loan."""

import types

import jax
import pytest

from rljax.policy import meter as m
from rljax.policy.lending import LendDirection, LendingConfig, LendingDecision, decide
from rljax.policy.reallocation import ReallocatorConfig, Split
from rljax.runtime.lending import RunLending

SPLIT = Split(6, 2)


class _Learner:
    def __init__(self):
        self.cfg = types.SimpleNamespace(micro_batches=4)
        self.params = {"w": jax.numpy.zeros((4, 4))}
        self.loans = []

    def step(self, batch, loan=None):
        self.loans.append(loan)
        return {"loss": 0.0}


def _run(mode="async", reallocator=None, **lending):
    cfg = types.SimpleNamespace(
        mode=mode,
        lending=LendingConfig(enabled=True, **lending),
        reallocator=reallocator or ReallocatorConfig(),
        learner=types.SimpleNamespace(batch_groups=4),
        sampling=types.SimpleNamespace(max_new_tokens=8),
    )
    devices = jax.devices()
    topology = types.SimpleNamespace(
        split=SPLIT, sampler=types.SimpleNamespace(devices=types.SimpleNamespace(flat=devices[:6]))
    )
    sampler = types.SimpleNamespace(num_slots=8)
    run = types.SimpleNamespace(
        cfg=cfg, topology=topology, sampler=sampler, driver=None, learner=_Learner(), step_hooks=[]
    )
    return run, RunLending(run)


def test_the_policy_reads_the_reallocators_held_threshold():
    _, lend = _run(reallocator=ReallocatorConfig(held_threshold=0.3))
    assert lend.policy.held_threshold == 0.3


def _phase(meter, *, learner_wait: float) -> None:
    """A 10 s step: the sampler decodes with every slot busy, the learner waits then trains."""
    meter.phase_start = 0.0
    meter.record(m.Generate(0.0, 10.0, 8, 8, steps=100, tokens=800, kv_tokens=100))
    meter.record(m.LearnerWait(0.0, learner_wait))
    meter.record(m.Learn(learner_wait, 10.0))
    meter.record(m.StepEnd(10.0))


def test_each_boundary_decides_from_the_meters_phase():
    run, lending = _run(prepare_s=0.1, release_s=0.1)
    assert run.step_hooks == [lending.at_boundary]
    _phase(lending.meter, learner_wait=8.0)
    lending.at_boundary(run, 0)  # the first step holds the compiles: nothing is lent
    assert lending.decision.direction is LendDirection.NONE
    _phase(lending.meter, learner_wait=8.0)
    lending.at_boundary(run, 1)
    stats = lending.last_stats
    assert stats.learner_idle_s == pytest.approx(8.0) and stats.split == SPLIT
    assert lending.decision == decide(stats, SPLIT, run.cfg.lending, param_bytes=64.0)
    assert lending.decision.direction is LendDirection.ROLLOUT_ON_TRAIN
    assert lending.metrics()["lending/direction"] == "rollout_on_train"
    # A lock-step run has no wait to fill: the same phase lends nothing there.
    run, lending = _run(mode="sync", prepare_s=0.1, release_s=0.1)
    for step in range(2):
        _phase(lending.meter, learner_wait=8.0)
        lending.at_boundary(run, step)
    assert lending.decision.direction is LendDirection.NONE


def test_a_loan_that_shortened_the_step_is_kept():
    # The runtime decides through the same LendingPolicy as the simulator: the step after a
    # loan is judged by its measured time (7 s against the unlent 10 s), not re-predicted.
    run, lending = _run(prepare_s=0.1, release_s=0.1)
    for step in range(2):  # the first step only warms up
        _phase(lending.meter, learner_wait=8.0)
        lending.at_boundary(run, step)
    first = lending.decision
    assert first.direction is LendDirection.ROLLOUT_ON_TRAIN
    lending.meter.record(m.Generate(10.0, 17.0, 4, 8, steps=100, tokens=400, kv_tokens=50))
    lending.meter.record(m.LearnerWait(10.0, 15.0))
    lending.meter.record(m.Learn(15.0, 17.0))
    lending.meter.record(m.StepEnd(17.0))
    lending.at_boundary(run, 1)
    kept = lending.decision
    assert (kept.direction, kept.chips, kept.share) == (first.direction, first.chips, first.share)
    assert kept.expected_gain_s == pytest.approx(3.0) and "measured" in kept.reason


def test_a_forced_decision_wins_and_train_on_roll_lends_micro_batches():
    run, lending = _run()
    for share, lent in ((0.5, 2), (0.01, 1), (1.0, 4)):
        lending.force = LendingDecision(LendDirection.TRAIN_ON_ROLL, 3, share, 0.0, "test")
        _phase(lending.meter, learner_wait=0.0)
        lending.at_boundary(run, 0)
        assert lending.decision is lending.force
        lending.learn(run.learner, batch=None)
        loan = run.learner.loans[-1]
        assert loan.micro_batches == lent and loan.devices == tuple(jax.devices()[:3])
    assert lending.metrics()["lending/lent_micro_batches"] == 2 + 1 + 4
    lending.force = None
    lending.decision = LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, "idle")
    lending.learn(run.learner, batch=None)
    assert run.learner.loans[-1] is None
    assert lending.metrics()["lending/lent_micro_batches"] == 0


def _mesh(free_bytes, n=2):
    stats = None if free_bytes is None else {"bytes_limit": free_bytes + 100, "bytes_in_use": 100}
    devices = [types.SimpleNamespace(memory_stats=lambda: stats) for _ in range(n)]
    return types.SimpleNamespace(devices=types.SimpleNamespace(flat=devices, size=n))


def test_the_lent_kv_pool_takes_the_memory_the_learner_leaves():
    from rljax.config import ModelConfig, SamplingConfig
    from rljax.runtime.lending import KV_MEMORY_FRAC, kv_pages

    model = ModelConfig(num_layers=2, num_kv_heads=2, head_dim=4)
    sampling = SamplingConfig(max_concurrent_decodes=4, page_size=8, num_pages=7)
    page = 2 * 2 * 2 * 4 * 4 * 8  # k and v, layers, kv heads, head dim, f32, tokens per page
    assert kv_pages(model, sampling, _mesh(None)) == 7  # the CPU reports nothing: the config's
    assert kv_pages(model, sampling, _mesh(10 * page / KV_MEMORY_FRAC + 1)) == 2 * 10
    # Never more than the slots can use: 4 slots of max_seq_len / page_size pages, plus one.
    enough = 4 * -(-sampling.max_seq_len // 8) + 2
    assert kv_pages(model, sampling, _mesh(10**12)) == enough
    with pytest.raises(RuntimeError, match="not one KV page"):
        kv_pages(model, sampling, _mesh(page // 2))
