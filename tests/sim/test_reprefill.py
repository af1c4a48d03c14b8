"""Re-prefill on hand-back: one formula (rljax.policy.lending.reprefill_s), charged by the
simulator's lending mechanisms and by the fakes' sampler alike."""

import dataclasses

import pytest

from rljax.engine.sampler import Request
from rljax.models.presets import PRESETS
from rljax.policy.lending import LendDirection, LendingConfig, LendingDecision, reprefill_s
from rljax.sim.measured import MeasuredCosts
from rljax.sim.simulator import Simulator
from rljax.sim.workload import LengthModel
from rljax.testing import fake_sampler
from rljax.testing.fakes import FakeSampler
from tests.sim.test_simulator import COST, small


def test_reprefill_is_the_cached_tokens_at_the_per_token_rate():
    assert reprefill_s(300, 0.002) == pytest.approx(0.6)
    assert reprefill_s(0, 0.5) == 0.0
    with pytest.raises(ValueError, match="must be >= 0"):
        reprefill_s(-1, 0.1)


def test_the_roofline_prefill_per_token_is_the_linear_rate():
    assert COST.prefill_s(1000) == pytest.approx(1000 * COST.prefill_s_per_token)


def _measured(per_token: float) -> MeasuredCosts:
    return MeasuredCosts(
        model=PRESETS["smollm2-135m"],
        decode_s_per_step=0.02,
        train_step_s_per_token=2e-5,
        learner_chips=8,
        publish_s=0.05,
        reprefill_s_per_token=per_token,
    )


def test_a_loans_hand_back_costs_the_sampler_its_reprefill():
    # A forced Rollout-on-TrainPool loan hands requests back every step: with a per-token
    # re-prefill the resumed sequences wait on it, so the same run takes longer.
    force = LendingDecision(LendDirection.ROLLOUT_ON_TRAIN, 8, 0.5, 0.0, "test")
    cfg = small(
        "lend",
        sampler_chips=2,
        max_slots=8,
        steps=16,
        phase_steps=2,
        lending=LendingConfig(enabled=True, prepare_s=0.0, release_s=0.0),
    )
    lengths = LengthModel(median=200, sigma=0.3, tail_prob=0.0, max_tokens=1024)

    def run(per_token):
        return Simulator(cfg, _measured(per_token), lengths, force_lending=force).run()

    free, charged = run(0.0), run(1e-3)
    assert free.migrated > 0 and charged.migrated > 0  # requests were handed back
    assert charged.wall_s > free.wall_s


def test_measured_costs_refuse_a_negative_reprefill():
    with pytest.raises(ValueError, match="seconds >= 0"):
        dataclasses.replace(_measured(0.0), reprefill_s_per_token=-1.0)


def _sampler(per_token: float) -> FakeSampler:
    return FakeSampler(
        slots=8,
        replicas=4,
        step_cost_s=lambda active: 0.0,
        length_sampler=lambda rng: 6,
        prefill_s_per_token=per_token,
    )


@pytest.fixture
def slept(monkeypatch):
    """The seconds the fakes sleep, recorded instead of slept."""
    calls: list[float] = []
    monkeypatch.setattr(fake_sampler, "sleep_cost", calls.append)
    return calls


def test_adopted_samples_stall_the_next_step_by_their_reprefill(slept):
    a, b = _sampler(0.01), _sampler(0.01)
    a.submit([Request([1, 2, 3], 2, request_id=4)])
    a.step()
    a.step()
    moved = a.hand_over(4)  # 2 samples, 3 prompt + 2 decoded tokens each
    slept.clear()
    b.adopt(moved)
    b.step()
    assert slept[0] == pytest.approx(reprefill_s(2 * (3 + 2), 0.01))
    slept.clear()
    b.step()
    assert slept[0] == 0.0  # owed once


def test_parked_sequences_are_prefilled_again(slept):
    s = _sampler(0.5)
    s.submit([Request([1], 8, request_id=7)])
    s.step()  # 8 sequences, 1 prompt + 1 decoded token each, 2 per replica
    s.park(3)
    slept.clear()
    s.step()
    assert slept[0] == pytest.approx(reprefill_s(6 * 2, 0.5))


def test_a_free_reprefill_stalls_nothing(slept):
    a, b = _sampler(0.0), _sampler(0.0)
    a.submit([Request([1, 2, 3], 2, request_id=4)])
    a.step()
    b.adopt(a.hand_over(4))
    slept.clear()
    b.step()
    assert slept[0] == 0.0
