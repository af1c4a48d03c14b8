"""Lending policy: declines when nothing is idle or costs eat the idle time, picks the direction
whose idle time it can reclaim, sizes the loan, is deterministic and validates its config."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.policy import lending
from rljax.policy.lending import LendDirection, LendingConfig
from rljax.policy.reallocation import PhaseStats, Split

ON = LendingConfig(enabled=True)
GB = 1e9


def stats(s_busy, s_idle, l_busy, l_idle, *, split=(32, 32), occupancy=1.0, steps=1, unit=4):
    return PhaseStats(
        sampler_busy_s=s_busy,
        sampler_idle_s=s_idle,
        learner_busy_s=l_busy,
        learner_idle_s=l_idle,
        buffer_fill=0.5,
        queued_groups=4,
        split=Split(*split),
        switch_cost_s=30.0,
        granularity=unit,
        sampler_occupancy=occupancy,
        steps=steps,
    )


def decide(s, config=ON, param_bytes=15 * GB):
    return lending.decide(s, s.split, config, param_bytes=param_bytes)


def test_held_threshold_decides_whether_the_window_caps_the_sampler():
    # The sampler held back 10 % of the phase: above the threshold its live sequences count as
    # capped by the staleness window, so lent replicas speed up only its decoding share.
    s = stats(90, 10, 60, 40, occupancy=0.5)
    capped = lending.decide(s, s.split, ON, held_threshold=0.05)
    free = lending.decide(s, s.split, ON, held_threshold=0.5)
    assert capped.direction is free.direction is LendDirection.ROLLOUT_ON_TRAIN
    # (40 - 2 prepare) * (1 - 1 / speedup) - 0.5 release, speedup 2 (free) or 1.45 (capped).
    assert free.expected_gain_s == pytest.approx(38 * 0.5 - 0.5)
    assert capped.expected_gain_s == pytest.approx(38 * (1 - 1 / 1.45) - 0.5)


def test_disabled_never_lends():
    d = decide(stats(100, 0, 50, 50), LendingConfig())
    assert d.direction is LendDirection.NONE and d.chips == 0 and d.share == 0.0
    assert "disabled" in d.reason


def test_declines_when_nothing_idle():
    d = decide(stats(100, 0, 95, 5))
    assert d.direction is LendDirection.NONE
    assert d.chips == 0 and d.expected_gain_s == 0.0
    assert "nothing idle" in d.reason


def test_learner_waiting_on_a_throughput_bound_sampler_lends_learner_chips():
    # The learner waits 40 of 100 s while every sampler slot decodes: extra replicas help.
    d = decide(stats(100, 0, 60, 40))
    assert d.direction is LendDirection.ROLLOUT_ON_TRAIN
    assert d.chips == 32  # every learner chip, in whole units
    # (40 - 2 prepare) * 32 / 64 - 0.5 release.
    assert d.expected_gain_s == pytest.approx(38 * 0.5 - 0.5)
    assert 0 < d.share < 1


def test_window_capped_sampler_gains_only_the_per_sequence_part_of_a_decode_step():
    # The window held 30% of the slots back: more replicas spread the same sequences thinner;
    # a step is 10 ms, 8 of them the weight read, so doubling the chips saves 1 ms of 10.
    s = dataclasses.replace(stats(70, 30, 60, 40), decode_step_s=0.010, decode_fixed_s=0.008)
    d = decide(s)
    assert d.direction is LendDirection.ROLLOUT_ON_TRAIN
    speedup = 0.010 / (0.008 + 0.002 / 2)
    assert d.expected_gain_s == pytest.approx(38 * (1 - 1 / speedup) - 0.5)


def test_learner_waiting_on_stragglers_does_not_lend():
    # The learner waits, but the sampler decoded in 5% of its slots: a few long stragglers pace
    # the step and more replicas would not finish them sooner.
    # (Gradients too large to move, so lending sampler chips is off the table.)
    d = decide(stats(20, 80, 60, 40, occupancy=0.25), param_bytes=1000 * GB)
    assert d.direction is LendDirection.NONE


def test_sampler_held_back_while_learner_trains_lends_sampler_chips():
    # The learner trains 90 of 100 s; the window holds the sampler back for 60 s of it.
    d = decide(stats(40, 60, 90, 10))
    assert d.direction is LendDirection.TRAIN_ON_ROLL
    # Piling the lent chips' sequences onto the rest may load them 1.25x at most: 32 / 28.
    assert d.chips == 4
    cost = 1.0 + 0.5 + 0.1 * 15
    share = (90 - cost) / (90 * (1 + 32 / 4))
    assert d.share == pytest.approx(share)
    # The sampler waited on the learner for 60 of its 90 s: that much of the saving counts.
    assert d.expected_gain_s == pytest.approx(share * 90 * 60 / 90)


def test_publishing_is_not_shortened_by_lending():
    plain = decide(stats(40, 60, 90, 10))
    s = dataclasses.replace(stats(40, 60, 90, 10), learner_publish_s=30.0)
    d = decide(s)
    assert d.direction is LendDirection.TRAIN_ON_ROLL
    share = (60 - 3.0) / (60 * (1 + 32 / 4))
    assert d.share == pytest.approx(share) and d.expected_gain_s < plain.expected_gain_s


def test_share_is_capped():
    d = decide(stats(10, 90, 90, 0, split=(96, 32)), dataclasses.replace(ON, max_share=0.1))
    assert d.direction is LendDirection.TRAIN_ON_ROLL
    assert d.share == 0.1


@pytest.mark.parametrize(
    "s, config",
    [
        # The wait (3 s) barely exceeds the preparation (2 s) plus release.
        (stats(10, 0, 7, 3), ON),
        # A short step whose gradient transfer (150 GB at 0.1 s/GB) exceeds the training.
        (stats(4, 6, 10, 0), ON),
        # Idle enough, but the saving is under min_gain_frac of the step.
        (stats(100, 0, 85, 15), dataclasses.replace(ON, min_gain_frac=0.2)),
    ],
    ids=["wait-below-prepare", "transfer-above-step", "below-min-gain"],
)
def test_declines_when_costs_exceed_the_idle_time(s, config):
    d = decide(s, config, param_bytes=150 * GB if s.learner_busy_s == 10 else 15 * GB)
    assert d.direction is LendDirection.NONE
    assert d.chips == 0 and d.share == 0.0
    assert "below" in d.reason


def test_chips_are_whole_units_and_bounded_by_max_lend_frac():
    d = decide(stats(100, 0, 60, 40, unit=8), dataclasses.replace(ON, max_lend_frac=0.5))
    assert d.direction is LendDirection.ROLLOUT_ON_TRAIN
    assert d.chips == 16
    d = decide(stats(100, 0, 60, 40, split=(32, 6), unit=8))
    assert d.direction is LendDirection.NONE  # fewer learner chips than one unit


def test_per_step_figures_do_not_depend_on_phase_length():
    one = decide(stats(100, 0, 60, 40))
    ten = decide(stats(1000, 0, 600, 400, steps=10))
    assert (one.direction, one.chips) == (ten.direction, ten.chips)
    assert one.expected_gain_s == pytest.approx(ten.expected_gain_s)
    assert one.share == pytest.approx(ten.share)


def test_picks_the_larger_gain_when_both_sides_idle():
    # Both idle; the learner's wait is long, the sampler's idle short.
    d = decide(stats(85, 15, 40, 60))
    assert d.direction is LendDirection.ROLLOUT_ON_TRAIN
    d = decide(stats(30, 70, 85, 15))
    assert d.direction is LendDirection.TRAIN_ON_ROLL


@settings(max_examples=200, deadline=None)
@given(
    s_busy=st.floats(0, 500),
    s_idle=st.floats(0, 500),
    l_busy=st.floats(0, 500),
    l_idle=st.floats(0, 500),
    occupancy=st.floats(0, 1),
    sampler=st.integers(1, 16),
    learner=st.integers(1, 16),
    steps=st.integers(1, 20),
)
def test_deterministic_and_well_formed(
    s_busy, s_idle, l_busy, l_idle, occupancy, sampler, learner, steps
):
    s = stats(
        s_busy,
        s_idle,
        l_busy,
        l_idle,
        split=(4 * sampler, 4 * learner),
        occupancy=occupancy,
        steps=steps,
    )
    a, b = decide(s), decide(dataclasses.replace(s))
    assert a == b
    if a.direction is LendDirection.NONE:
        assert (a.chips, a.share, a.expected_gain_s) == (0, 0.0, 0.0)
    else:
        lender = (
            s.split.learner_chips
            if a.direction is LendDirection.ROLLOUT_ON_TRAIN
            else (s.split.sampler_chips)
        )
        assert 0 < a.chips <= lender and a.chips % 4 == 0
        assert 0 < a.share <= 1 and a.expected_gain_s > 0


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("enabled", 1, "True or False"),
        ("min_idle_frac", 1.0, "[0, 1)"),
        ("min_idle_frac", -0.1, "[0, 1)"),
        ("prepare_s", -1.0, ">= 0"),
        ("release_s", True, ">= 0"),
        ("grad_transfer_s_per_gb", "x", ">= 0"),
        ("max_lend_frac", 0.0, "(0, 1]"),
        ("max_share", 1.5, "(0, 1]"),
        ("min_gain_frac", 1.0, "[0, 1)"),
    ],
)
def test_bad_config_one_line_error_naming_the_key(field, value, fix):
    with pytest.raises(ValueError) as err:
        LendingConfig(**{field: value})
    message = str(err.value)
    assert f"lending.{field}" in message and fix in message and "\n" not in message


def test_negative_param_bytes_refused():
    with pytest.raises(ValueError, match="param_bytes"):
        decide(stats(100, 0, 60, 40), param_bytes=-1)


def test_a_train_loan_takes_the_longer_part_and_is_taken_only_if_it_shortens_the_step():
    # 8 learner chips, 4 lent; a 10 s step; 1 s of costs (the policy, the simulator and the
    # fakes all price a Trainer-on-RollPool loan with this one model).
    loan = lending.TrainLoan(train_s=10.0, share=0.4, learner_chips=8, lent_chips=4, cost_s=1.0)
    assert (loan.own_s, loan.lent_s, loan.step_s) == pytest.approx((6.0, 9.0, 9.0))
    assert loan.shortens
    # Half the batch on half as many chips: 1 + 0.5 * 10 * 2 = 11 s, longer than the step.
    longer = dataclasses.replace(loan, share=0.5)
    assert longer.step_s == pytest.approx(11.0) and not longer.shortens
    small = dataclasses.replace(loan, share=0.05)
    assert small.shortens and not dataclasses.replace(small, lent_chips=0).shortens  # no chip
    # prepare 1 s + release 0.5 s + 15 GB of gradients at 0.1 s/GB.
    assert lending.train_loan_cost_s(ON, 15 * GB) == pytest.approx(3.0)


@pytest.mark.parametrize(
    "chips, tp, want",
    [(0, 4, 0), (3, 4, 0), (4, 4, 1), (7.9, 4, 1), (8, 4, 2), (5, 1, 5), (-1, 2, 0)],
)
def test_units_are_whole_replicas(chips, tp, want):
    assert lending.units(chips, tp) == want
    # A loan starts one replica at least; a parked loan leaves one sampler replica sampling.
    assert lending.lent_units(chips, tp) == max(1, want)
    assert lending.parked_units(chips, tp, sampler_units=2) == min(want, 1)


def test_units_refuse_an_empty_unit():
    with pytest.raises(ValueError, match="a unit is >= 1 chip"):
        lending.units(4, 0)
