"""Mode "lend": the lending mechanisms keep every group once, staleness <= eta, and follow the
policy (nothing is lent when it declines); a 1,000-step run finishes."""

import dataclasses

import pytest

from rljax.policy import lending
from rljax.policy.lending import LendDirection, LendingConfig
from rljax.policy.lending_policy import LendingPolicy
from rljax.sim import lend as sim_lend
from rljax.sim.simulator import Simulator
from rljax.sim.workload import LengthModel
from tests.sim.test_simulator import COST, check_invariants, small

# Regular lengths (no tail): the sampler is throughput bound, so a loan can pay.
REGULAR = LengthModel(median=300, sigma=0.3, tail_prob=0.0, max_tokens=2048)
# Costs scaled to the toy model's second-long steps.
CHEAP = LendingConfig(
    enabled=True, prepare_s=0.2, release_s=0.05, train_prepare_s=0.1, grad_transfer_s_per_gb=0.01
)
# Rollout-on-TrainPool: two sampler chips with few slots; the learner waits for every batch.
ROLLOUT = dict(sampler_chips=2, max_slots=4, steps=40, phase_steps=4)
# Trainer-on-RollPool: a slow learner (100 N FLOPs per token); the window holds the sampler.
TRAIN = dict(sampler_chips=12, max_slots=32, steps=40, phase_steps=4, train_flops_per_param=100)


def run(config, lengths=REGULAR):
    return Simulator(config, COST, lengths).run()


def lent(result) -> dict:
    return dict(result.lent_steps)


@pytest.mark.parametrize(
    "fields, direction",
    [
        (ROLLOUT, "rollout_on_train"),
        (dict(ROLLOUT, max_staleness=1, sampler_chips=4), "rollout_on_train"),
        (TRAIN, "train_on_roll"),
    ],
    ids=["rollout-on-train-eta2", "rollout-on-train-eta1", "train-on-roll"],
)
def test_loans_lose_no_group_and_keep_staleness(fields, direction):
    config = small("lend", lending=CHEAP, **fields)
    result = run(config)
    assert lent(result)[direction] > 0  # the mechanism ran
    check_invariants(result, config)  # no group lost or duplicated, staleness <= eta
    if direction == "rollout_on_train":
        assert result.migrated > 0  # requests were handed back from the lent replicas
    assert all(d == direction for _, d, _, _ in result.lends)


@pytest.mark.parametrize("fields", [ROLLOUT, TRAIN], ids=["rollout-on-train", "train-on-roll"])
def test_each_loan_changes_the_run(fields):
    # The loans must act (guards a mechanism that is decided but never carried out).
    plain = run(small("async", **{k: v for k, v in fields.items() if k != "phase_steps"}))
    lent_run = run(small("lend", lending=CHEAP, **fields))
    assert lent_run.wall_s != plain.wall_s


@pytest.mark.parametrize(
    "lending_config",
    [
        LendingConfig(enabled=False),
        # Enabled, but a loan costs more than any step is idle: the policy declines.
        dataclasses.replace(CHEAP, prepare_s=1e4, train_prepare_s=1e4),
    ],
    ids=["disabled", "declines"],
)
@pytest.mark.parametrize("fields", [ROLLOUT, TRAIN], ids=["rollout-bound", "learner-bound"])
def test_nothing_is_lent_when_the_policy_declines(lending_config, fields):
    config = small("lend", lending=lending_config, **fields)
    result = run(config)
    assert result.lends == () and result.migrated == 0
    assert set(lent(result).values()) == {0}
    # ... and the run is the async run on the same split, step for step.
    plain = run(dataclasses.replace(config, mode="async"))
    assert result.wall_s == plain.wall_s
    assert result.consumed_prompts == plain.consumed_prompts
    assert result.staleness == plain.staleness


def test_decisions_are_the_policys_on_the_meters_stats(monkeypatch):
    seen = []
    decide = LendingPolicy.decide

    def spy(self, stats, split):
        decision = decide(self, stats, split)
        seen.append((stats, decision))
        return decision

    monkeypatch.setattr(LendingPolicy, "decide", spy)
    config = small("lend", lending=CHEAP, **TRAIN)
    result = run(config)
    assert len(seen) == config.steps // config.phase_steps
    assert all(s.steps == config.phase_steps for s, _ in seen)
    loans = [x for _, d in seen for x in (d, d.also) if x is not None]
    taken = [(d.direction.value, d.chips, d.share) for d in loans]
    taken = [t for t in taken if t[0] != LendDirection.NONE.value]
    assert [tuple(x[1:]) for x in result.lends] == taken


def test_the_simulator_prices_each_loan_with_the_policys_model(monkeypatch):
    # Guards a second copy of the loan-cost formula: the simulator takes (or declines) each
    # Trainer-on-RollPool step by the policy's TrainLoan, at the policy's cost.
    loans = []

    class Spy(lending.TrainLoan):
        def __init__(self, *args):
            super().__init__(*args)
            loans.append(self)

    monkeypatch.setattr(sim_lend, "TrainLoan", Spy)
    result = run(small("lend", lending=CHEAP, **TRAIN))
    assert len([x for x in loans if x.shortens]) == lent(result)["train_on_roll"] > 0
    assert {x.cost_s for x in loans} == {lending.train_loan_cost_s(CHEAP, COST.weight_bytes)}


def test_a_paying_loan_runs_in_every_phase(monkeypatch):
    # Guards the policy reading a lent phase as unlent: the model then sees a sampler whose
    # work the borrowed replicas took, predicts no saving, and returns the loan every other
    # phase. The loan pays here (the lent run is faster), so it must stay lent throughout.
    config = small("lend", lending=CHEAP, **ROLLOUT)
    result = run(config)
    phases = config.steps // config.phase_steps
    assert len(result.lends) == phases - 1  # every decision after the first phase lends
    assert result.wall_s < run(dataclasses.replace(config, mode="async")).wall_s


def test_a_thousand_step_run_with_lending_finishes():
    config = small("lend", lending=CHEAP, **dict(TRAIN, steps=1000, phase_steps=10))
    result = run(config, LengthModel(median=200, sigma=0.5, tail_prob=0.01, max_tokens=1024))
    check_invariants(result, config)
    assert sum(lent(result).values()) > 0
