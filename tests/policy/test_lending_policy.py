"""LendingPolicy: a running loan is judged by the per-step time it measured, not by the model
read on a phase the loan itself changed; a loan that never paid is not proposed again at once."""

import dataclasses

import pytest

from rljax.policy import lending
from rljax.policy.lending import LendDirection, LendingConfig
from rljax.policy.lending_policy import LendingPolicy
from tests.policy.test_lending import GB, stats

ON = LendingConfig(enabled=True)
# Unlent: the learner waits 40 of 100 s on a sampler whose every slot decodes; the model lends.
UNLENT = stats(100, 0, 60, 40)
# Lent: the borrowed replicas took part of the rollout and the step fell to 80 s. Read as an
# unlent phase, the sampler looks window-capped and lightly loaded (its steps are mostly the
# weight read), so the model predicts that lending saves nothing.
LENT = dataclasses.replace(stats(10, 70, 60, 20), decode_step_s=0.0105, decode_fixed_s=0.0104)
# Lent, but the step did not get shorter (the loan cost what it saved).
LENT_NO_GAIN = dataclasses.replace(LENT, sampler_idle_s=90.0, learner_idle_s=40.0)


# Gradients too large to move: lending sampler chips never pays, only one direction is in play.
BYTES = 1000 * GB


def policy():
    """A policy past its first phase (the pipeline fill, on which it lends nothing)."""
    p = LendingPolicy(ON, param_bytes=BYTES)
    assert p.decide(UNLENT, UNLENT.split).direction is LendDirection.NONE
    return p


def test_the_first_phase_is_neither_a_baseline_nor_a_loan():
    # The first phase holds the pipeline fill: read as a baseline, any loan after it would
    # measure the fill as its saving and be kept for good.
    p = LendingPolicy(ON, param_bytes=BYTES)
    first = p.decide(UNLENT, UNLENT.split)
    assert first.direction is LendDirection.NONE and "first phase" in first.reason
    assert p.decide(UNLENT, UNLENT.split).direction is LendDirection.ROLLOUT_ON_TRAIN
    # The fill (a 300 s first step) is not the baseline the loan is measured against.
    p = LendingPolicy(ON, param_bytes=BYTES)
    p.decide(stats(300, 0, 60, 240), UNLENT.split)
    p.decide(UNLENT, UNLENT.split)
    assert p.decide(LENT_NO_GAIN, LENT_NO_GAIN.split).direction is LendDirection.NONE


def test_the_model_alone_returns_a_paying_loan():
    # The defect the policy guards against: decide() on a lent phase says NONE.
    unlent = lending.decide(UNLENT, UNLENT.split, ON, param_bytes=BYTES)
    assert unlent.direction is LendDirection.ROLLOUT_ON_TRAIN
    assert lending.decide(LENT, LENT.split, ON, param_bytes=BYTES).direction is LendDirection.NONE


def test_a_loan_that_measured_a_saving_is_kept():
    p = policy()
    first = p.decide(UNLENT, UNLENT.split)
    assert first.direction is LendDirection.ROLLOUT_ON_TRAIN
    for _ in range(3):
        kept = p.decide(LENT, LENT.split)
        assert (kept.direction, kept.chips, kept.share) == (
            first.direction,
            first.chips,
            first.share,
        )
        assert kept.expected_gain_s == 20.0  # 100 s unlent, 80 s lent
        assert "measured" in kept.reason


def test_a_loan_that_saved_nothing_is_returned_and_not_proposed_again():
    p = policy()
    first = p.decide(UNLENT, UNLENT.split)
    back = p.decide(LENT_NO_GAIN, LENT_NO_GAIN.split)
    assert back.direction is LendDirection.NONE and "returns the loan" in back.reason
    # The next unlent phase predicts the same saving: the failed loan is not tried again.
    again = p.decide(UNLENT, UNLENT.split)
    assert again.direction is LendDirection.NONE and "saved nothing" in again.reason
    # A workload whose idle grew predicts more than the failed loan plus the floor: retried.
    grown = p.decide(stats(100, 0, 40, 60), UNLENT.split)
    assert grown.direction is first.direction
    assert grown.expected_gain_s >= first.expected_gain_s + ON.min_gain_frac * 100


def test_a_loan_is_judged_only_against_the_same_split():
    p = policy()
    p.decide(UNLENT, UNLENT.split)
    moved = dataclasses.replace(LENT, split=lending.Split(40, 24))
    d = p.decide(moved, moved.split)
    # No unlent baseline on 40:24: the model answers, as it would on any unlent phase.
    assert d == lending.decide(moved, moved.split, ON, param_bytes=BYTES)


def test_disabled_policy_never_lends():
    p = LendingPolicy(LendingConfig(), param_bytes=15 * GB)
    for s in (UNLENT, UNLENT, LENT, UNLENT):
        assert p.decide(s, s.split).direction is LendDirection.NONE


def test_both_idles_in_one_step_lend_both_ways():
    # eta 0: the learner waits 40 s for its batch, then trains 60 s while the sampler, every
    # slot busy while it samples, is held back. Both loans pay, in different parts of the step.
    both = stats(40, 60, 60, 40, split=(32, 32))
    d = lending.decide(both, both.split, ON, param_bytes=15 * GB)
    rollout = d.loan(LendDirection.ROLLOUT_ON_TRAIN)
    train = d.loan(LendDirection.TRAIN_ON_ROLL)
    assert rollout is not None and train is not None and d.also is not None
    assert d.loan(LendDirection.NONE) is None
    # The rollout loan is the one the model makes alone (gradients too large to move), and the
    # savings add.
    alone = lending.decide(both, both.split, ON, param_bytes=BYTES)
    assert alone.also is None and (alone.chips, alone.share) == (rollout.chips, rollout.share)
    assert d.expected_gain_s == pytest.approx(alone.expected_gain_s + train.expected_gain_s)


def test_empty_sampler_replicas_are_lent_without_the_pile_up_bound():
    # 4 sampler chips, 12 learner chips: the learner trains 60 s while the window holds the
    # sampler back. Measured busy all the phase, the kept chips may take 1.25x the load: no
    # chip can go. With the replicas empty but 20 s of the phase (eta 0: nothing is live while
    # the learner trains), lending 2 of them piles nothing and the loan is made.
    held = stats(20, 80, 60, 40, split=(4, 12), unit=1)
    assert lending.train_on_roll(held, held.split, ON, 15 * GB)[0] == 0
    empty = dataclasses.replace(held, sampler_engaged_s=20.0)
    chips, share, gain = lending.train_on_roll(empty, empty.split, ON, 15 * GB)
    assert chips >= 2 and share > 0 and gain > 0
