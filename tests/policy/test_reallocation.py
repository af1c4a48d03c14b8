"""Reallocator policy: direction, benefit vs switch cost, hysteresis and bounds."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.policy.reallocation import (
    Direction,
    PhaseStats,
    Reallocator,
    ReallocatorConfig,
    Split,
    reallocator_settings,
)


def stats(s_busy, s_idle, l_busy, l_idle, split=(32, 32), fill=0.5, cost=10.0, unit=8):
    return PhaseStats(
        sampler_busy_s=s_busy,
        sampler_idle_s=s_idle,
        learner_busy_s=l_busy,
        learner_idle_s=l_idle,
        buffer_fill=fill,
        queued_groups=4,
        split=Split(*split),
        switch_cost_s=cost,
        granularity=unit,
    )


LEARNER_BOUND = stats(40.0, 60.0, 100.0, 0.0, fill=1.0)
SAMPLER_BOUND = stats(100.0, 0.0, 30.0, 70.0, fill=0.0)


def run(policy, phase, n):
    return [policy.decide(phase) for _ in range(n)]


def test_learner_bottleneck_moves_chips_to_learner():
    policy = Reallocator(ReallocatorConfig(patience=2))
    decisions = run(policy, LEARNER_BOUND, 2)
    assert decisions[0] is None  # patience: one phase is not enough
    # W_s = 40 * 32, W_l = 100 * 32 chip-s: 24 and 16 sampler chips both give an 80 s
    # phase (vs 100 s); the policy takes the smaller move.
    assert decisions[1] == Split(24, 40)
    very_skewed = stats(10.0, 90.0, 100.0, 0.0)
    uncapped = ReallocatorConfig(patience=1, max_move_fraction=1.0)
    assert Reallocator(uncapped).decide(very_skewed) == Split(8, 56)
    # By default one decision moves at most a quarter of the chips (16 of 64).
    assert Reallocator(ReallocatorConfig(patience=1)).decide(very_skewed) == Split(16, 48)


def test_starving_buffer_moves_chips_to_sampler():
    policy = Reallocator(ReallocatorConfig(patience=1))
    target = policy.decide(SAMPLER_BOUND)
    assert target is not None and target.sampler_chips > 32
    assert target.total == 64 and target.sampler_chips % 8 == 0


def test_no_move_when_benefit_below_switch_cost():
    # Saving per phase is ~20 s; over a 2-phase horizon that is 40 s < 1.5 * 1000 s.
    policy = Reallocator(ReallocatorConfig(patience=1, horizon=2))
    assert run(policy, stats(40.0, 60.0, 100.0, 0.0, cost=1000.0), 5) == [None] * 5
    assert Reallocator(ReallocatorConfig(patience=1, horizon=2)).decide(LEARNER_BOUND)


def test_alternating_imbalance_never_moves():
    policy = Reallocator(ReallocatorConfig(patience=2))
    decisions = [policy.decide(p) for p in [LEARNER_BOUND, SAMPLER_BOUND] * 10]
    assert decisions == [None] * 20


def test_cooldown_suppresses_immediate_second_move():
    policy = Reallocator(ReallocatorConfig(patience=1, cooldown=3))
    decisions = run(policy, LEARNER_BOUND, 5)
    assert decisions[0] == Split(24, 40)
    assert decisions[1:4] == [None] * 3
    assert decisions[4] is not None  # stale stats would move again once cooldown expires


def test_full_buffer_vetoes_move_to_sampler():
    policy = Reallocator(ReallocatorConfig(patience=1))
    assert policy.imbalance(stats(100.0, 0.0, 30.0, 70.0, fill=0.95)) is Direction.NONE
    assert policy.imbalance(stats(50.0, 50.0, 50.0, 50.0)) is Direction.NONE


def test_minimum_chips_respected():
    cfg = ReallocatorConfig(patience=1, min_sampler_chips=24, min_learner_chips=24)
    target = Reallocator(cfg).decide(stats(10.0, 90.0, 100.0, 0.0))
    assert target == Split(24, 40)  # unbounded, it would go to Split(8, 56)
    target = Reallocator(cfg).decide(SAMPLER_BOUND)
    assert target == Split(40, 24)  # unbounded, it would go to Split(48, 16) (a quarter's move)


@settings(max_examples=200, deadline=None)
@given(
    s_busy=st.floats(0.0, 500.0),
    s_idle=st.floats(0.0, 500.0),
    l_busy=st.floats(0.0, 500.0),
    l_idle=st.floats(0.0, 500.0),
    sampler_units=st.integers(1, 15),
    unit=st.sampled_from([1, 4, 8]),
    fill=st.floats(0.0, 1.0),
)
def test_decisions_stay_in_bounds(s_busy, s_idle, l_busy, l_idle, sampler_units, unit, fill):
    cfg = ReallocatorConfig(patience=1, cooldown=0, min_sampler_chips=4, min_learner_chips=4)
    split = (sampler_units * 4, 64 - sampler_units * 4)
    phase = stats(s_busy, s_idle, l_busy, l_idle, split=split, fill=fill, cost=1.0, unit=unit)
    target = Reallocator(cfg).decide(phase)
    if target is not None:
        assert target.total == 64
        assert target.sampler_chips >= 4 and target.learner_chips >= 4
        assert abs(target.sampler_chips - split[0]) % unit == 0


def test_bad_input_messages():
    with pytest.raises(ValueError, match="at least one chip per role"):
        Split(0, 8)
    with pytest.raises(ValueError, match="buffer_fill must be a fraction"):
        stats(1.0, 1.0, 1.0, 1.0, fill=3.0)
    with pytest.raises(ValueError, match="granularity must be >= 1 chip"):
        stats(1.0, 1.0, 1.0, 1.0, unit=0)
    with pytest.raises(ValueError, match="times must be non-negative"):
        stats(-1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="below the configured minimum"):
        Reallocator(ReallocatorConfig(min_learner_chips=40)).decide(LEARNER_BOUND)
    with pytest.raises(ValueError, match="reallocator.margin. = 0.0 is invalid"):
        ReallocatorConfig(margin=0.0)


def timed(s_busy, s_idle, l_busy, l_idle, split, unit=8, fill=0.5, step=0.010, fixed=0.002):
    """A phase with decode timings, so the policy uses its decode-aware model."""
    return PhaseStats(
        sampler_busy_s=s_busy,
        sampler_idle_s=s_idle,
        learner_busy_s=l_busy,
        learner_idle_s=l_idle,
        buffer_fill=fill,
        queued_groups=4,
        split=Split(*split),
        switch_cost_s=10.0,
        granularity=unit,
        decode_step_s=step,
        decode_fixed_s=fixed,
    )


# The window held 80% of the sampler's slots back, yet the learner waited 30% of the phase:
# stragglers pace the pipeline. Decode steps cost 5x their fixed part, so spreading the live
# sequences over more replicas makes every step, and the stragglers, faster.
LATENCY_BOUND = timed(20.0, 80.0, 70.0, 30.0, split=(32, 32))


def test_latency_bound_sampler_gets_chips_where_the_linear_model_took_them_away():
    linear = dataclasses.replace(LATENCY_BOUND, decode_step_s=0.0, decode_fixed_s=0.0)
    policy = ReallocatorConfig(patience=1)
    assert Reallocator(policy).decide(linear).sampler_chips < 32  # reads held slots as spare
    # Decode-aware: at 40 chips the step is 0.002 + 0.008 * 32/40 s, so the sampler needs
    # 100 / 1.19 = 84 s and the learner 70 * 32/24 = 93 s; 48 chips would starve the learner.
    model = Reallocator(policy)
    assert model.predict(LATENCY_BOUND, 40) == pytest.approx(70.0 * 32 / 24)
    assert model.predict(LATENCY_BOUND, 48) == pytest.approx(70.0 * 32 / 16)
    assert model.decide(LATENCY_BOUND) == Split(40, 24)


def test_fixed_step_cost_caps_what_more_sampler_chips_buy():
    # When the weight read is the whole step, more replicas do not speed the stragglers up.
    all_fixed = dataclasses.replace(LATENCY_BOUND, decode_fixed_s=0.010)
    policy = Reallocator(ReallocatorConfig(patience=1))
    assert policy.predict(all_fixed, 40) == pytest.approx(100.0)
    assert policy.decide(all_fixed) is None


def test_slot_bound_sampler_scales_with_chips():
    # No slot held back: the live sequences grow with the slots, so throughput is linear.
    full = timed(100.0, 0.0, 50.0, 50.0, split=(32, 32))
    assert Reallocator().predict(full, 40) == pytest.approx(100.0 * 32 / 40)


def test_learner_bound_sampler_shrinks_one_host_or_half_way_from_a_sliver():
    # The learner never waited; the sampler filled a sliver (5%) of its slots, so it moves half
    # the way to the predicted best split (32) at once; filling 30% it moves one host.
    policy = ReallocatorConfig(patience=1)
    sliver = timed(5.0, 95.0, 100.0, 0.0, split=(48, 16), unit=4, step=0.003)
    assert Reallocator(policy).decide(sliver) == Split(40, 24)
    busier = timed(30.0, 70.0, 100.0, 0.0, split=(48, 16), unit=4, step=0.003)
    assert Reallocator(policy).decide(busier) == Split(44, 20)


def test_gain_within_model_error_does_not_move():
    # About 2% predicted: below min_gain (3%), whatever the switch cost.
    small_gain = timed(20.0, 80.0, 70.0, 30.0, split=(32, 32), step=0.0022)
    policy = Reallocator(ReallocatorConfig(patience=1))
    assert 0 < 100.0 - policy.predict(small_gain, 40) < 3.0
    assert policy.decide(small_gain) is None
    eager = Reallocator(ReallocatorConfig(patience=1, min_gain=0.0, margin=0.01))
    assert eager.decide(small_gain) == Split(40, 24)


def test_reversed_move_is_barred_for_reversal_block_phases():
    policy = Reallocator(ReallocatorConfig(patience=1, cooldown=0, reversal_block=3))
    assert policy.decide(LEARNER_BOUND) is not None  # to the learner
    assert policy.decide(SAMPLER_BOUND) is not None  # back: a reversal
    assert run(policy, LEARNER_BOUND, 3) == [None] * 3  # barred
    assert policy.decide(LEARNER_BOUND) is not None
    # Without a reversal nothing is barred.
    plain = Reallocator(ReallocatorConfig(patience=1, cooldown=0, reversal_block=3))
    assert [plain.decide(LEARNER_BOUND) is not None for _ in range(3)] == [True] * 3


def test_decode_timing_and_knob_errors():
    with pytest.raises(ValueError, match="times must be non-negative"):
        timed(1.0, 1.0, 1.0, 1.0, split=(32, 32), step=-0.001)
    with pytest.raises(ValueError, match="reallocator.min_gain. = 1.5 is invalid"):
        ReallocatorConfig(min_gain=1.5)
    with pytest.raises(ValueError, match="reallocator.reversal_block. = -1 is invalid"):
        ReallocatorConfig(reversal_block=-1)


@pytest.mark.parametrize("eta, fill", [(0, 0.9), (1, 0.45), (3, 0.675)])
def test_settings_scale_full_fill_to_the_rows_a_learner_bound_pipeline_holds(eta, fill):
    # At a phase's end a learner-bound pipeline holds about eta of its eta + 1 rows full.
    got = reallocator_settings(ReallocatorConfig(), max_staleness=eta, granularity=1)
    assert got.full_fill == pytest.approx(fill)
    assert dataclasses.replace(got, full_fill=0.9) == ReallocatorConfig()  # nothing else moves


def test_settings_floor_each_side_at_a_move_its_own_floor_and_the_section():
    section = ReallocatorConfig(min_sampler_chips=1, min_learner_chips=6)
    got = reallocator_settings(
        section, max_staleness=0, granularity=4, sampler_floor=2, learner_floor=3
    )
    assert (got.min_sampler_chips, got.min_learner_chips) == (4, 6)
    got = reallocator_settings(
        section, max_staleness=0, granularity=1, sampler_floor=2, learner_floor=8
    )
    assert (got.min_sampler_chips, got.min_learner_chips) == (2, 8)


@pytest.mark.parametrize(
    "field, value", [("max_staleness", -1), ("granularity", 0), ("learner_floor", 1.5)]
)
def test_settings_refuse_bad_run_figures_in_one_line(field, value):
    kwargs = dict(max_staleness=1, granularity=1, sampler_floor=1, learner_floor=1)
    with pytest.raises(ValueError, match=f"{field}={value!r} must be an integer") as err:
        reallocator_settings(ReallocatorConfig(), **{**kwargs, field: value})
    assert "\n" not in str(err.value)
