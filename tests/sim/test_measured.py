"""MeasuredCosts: the simulator run on measured per-call seconds (scripts/bench_lending.py
--simulate) charges exactly those seconds, and a forced loan of fewer chips than a replica
still lends one engine, as the runtime does."""

import dataclasses

import pytest

from rljax.models.presets import PRESETS
from rljax.policy.lending import LendDirection, LendingConfig, LendingDecision
from rljax.sim.config import SimConfig
from rljax.sim.measured import MeasuredCosts
from rljax.sim.simulator import Simulator
from rljax.sim.workload import LengthModel
from tests.sim.test_simulator import check_invariants

COST = MeasuredCosts(
    model=PRESETS["qwen2.5-0.5b"],
    tp=6,
    decode_s_per_step=0.01,
    prefill_s_per_group=0.02,
    train_step_s_per_token=0.001,
    learner_chips=2,
    publish_s=0.05,
)
FIVE = LengthModel(median=5, sigma=0.0, tail_prob=0.0, max_tokens=5)  # every response 5 tokens


def config(mode, **overrides):
    fields = dict(
        mode=mode,
        total_chips=8,
        sampler_chips=6,
        steps=20,
        batch_groups=4,
        group_size=8,
        prompt_tokens=8,
        max_staleness=1,
        max_slots=8,
        phase_steps=1,
        granularity=1,
        timeline=False,
    )
    return SimConfig(**{**fields, **overrides})


def test_measured_costs_are_charged_as_measured():
    # Every decode step costs the measured seconds, whatever its batch and KV (the roofline
    # method answers for the measured field, which once shadowed it).
    assert COST.decode_step_s(256, 1e6) == COST.decode_step_s(1, 0) == COST.decode_s_per_step
    assert COST.decode_memory_s(1e6) == COST.decode_s_per_step and COST.decode_compute_s(256) == 0
    assert COST.train_step_s(1000, 2) == pytest.approx(1.0)
    assert COST.train_step_s(1000, 4) == pytest.approx(0.5)  # linear in the chips
    assert COST.sync_s(6, 2) == COST.reshard_local_s() == 0.05
    assert COST.kv_slots(1e9, 32) == 32
    # Sync, eta 0: one step = 4 groups on 8 slots, one group at a time (a group fills them),
    # each a prefill and 5 decode steps; then train 4 x 8 x 13 tokens; then a publish (the
    # run ends when the last step is trained, before its publish).
    result = Simulator(config("sync", max_staleness=0, total_chips=8, steps=3), COST, FIVE).run()
    step = 4 * (0.02 + 5 * 0.01) + 4 * 8 * 13 * 0.001 * 2 / 8 + 0.05
    assert result.wall_s == pytest.approx(3 * step - 0.05)


def test_a_loan_of_fewer_chips_than_a_replica_lends_one_engine():
    # The sampler is one engine on 6 chips; the learner's 2 chips host one lent engine. A
    # fast learner: it waits for every batch, so the loan has a wait to fill.
    cost = dataclasses.replace(COST, train_step_s_per_token=1e-5)
    force = LendingDecision(LendDirection.ROLLOUT_ON_TRAIN, 2, 0.0, 0.0, "forced")
    lend = config("lend", lending=LendingConfig(enabled=True, prepare_s=0.0, release_s=0.0))
    result = Simulator(lend, cost, FIVE, force_lending=force).run()
    check_invariants(result, lend)
    assert dict(result.lent_steps)["rollout_on_train"] > 0 and result.migrated > 0
    plain = Simulator(config("async"), cost, FIVE).run()
    assert result.samples_per_s > plain.samples_per_s
