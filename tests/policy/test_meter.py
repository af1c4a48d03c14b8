"""PhaseMeter: one definition of busy, idle, occupancy and decode timings for every driver."""

import pytest

from rljax.policy.meter import Generate, Learn, LearnerWait, PhaseMeter, SamplerIdle, StepEnd
from rljax.policy.reallocation import Split

SPLIT = Split(6, 2)


def close(meter, *, slots=8, rows=(), split=SPLIT, switch=0.5):
    return meter.stats(
        split=split,
        slots=slots,
        buffer_rows=list(rows),
        batch_groups=4,
        switch_cost_s=switch,
        granularity=2,
    )


def test_a_phase_of_events_becomes_phase_stats():
    meter = PhaseMeter(start=10.0)
    # 10 s on 8 slots: 4 s decoding 8 slots, 4 s decoding 2 with 6 held back, 2 s all held back.
    meter.record(Generate(10.0, 14.0, busy_slots=8, total_slots=8, steps=40, tokens=320))
    meter.record(Generate(14.0, 18.0, busy_slots=2, total_slots=8, steps=80, tokens=160))
    meter.record(SamplerIdle(14.0, 18.0, slots=6))
    meter.record(SamplerIdle(18.0, 20.0, slots=8))
    meter.record(LearnerWait(10.0, 16.0))
    meter.record(Learn(16.0, 19.0, tokens=99))
    meter.record(Learn(19.0, 19.5))  # the publish
    meter.record(StepEnd(20.0))
    assert meter.steps == 1
    rows = [{"version": 3, "reserved": 1, "occupied": 2}, {"version": 4, "occupied": 1}]
    stats = close(meter, rows=rows)
    idle = (6 * 4 + 8 * 2) / 8
    assert stats.sampler_idle_s == pytest.approx(idle)
    assert stats.sampler_busy_s == pytest.approx(10 - idle)
    assert stats.sampler_occupancy == pytest.approx((8 * 4 + 2 * 4) / ((10 - idle) * 8))
    assert stats.learner_busy_s == pytest.approx(3.5)
    assert stats.learner_idle_s == pytest.approx(6.0)
    assert (stats.buffer_fill, stats.queued_groups) == (3 / 8, 3)
    assert (stats.split, stats.switch_cost_s, stats.granularity) == (SPLIT, 0.5, 2)
    # Step time 0.1 s at 8 slots, 0.05 s at 2: the line 1/120 s per slot + 1/30 s fixed.
    assert stats.decode_step_s == pytest.approx(8.0 / 120)
    assert stats.decode_fixed_s == pytest.approx(0.05 - 2 * (0.05 / 6))
    assert meter.tokens == {"sampler": 480, "learner": 99}
    assert meter.steps == 0 and meter.phase_start == 20.0  # the next phase began


def test_unavailable_slots_count_as_neither_busy_nor_idle():
    meter = PhaseMeter()
    meter.record(Generate(0.0, 6.0, busy_slots=4, total_slots=4, steps=6))
    meter.record(SamplerIdle(6.0, 8.0, slots=4, held_back=False))  # parked for a resize
    meter.record(StepEnd(8.0))
    stats = close(meter, slots=4)
    assert (stats.sampler_busy_s, stats.sampler_idle_s, stats.sampler_occupancy) == (6, 0, 1)


def test_decode_fixed_part_falls_back_when_every_step_ran_at_one_load():
    meter = PhaseMeter()
    # 5 steps of 0.1 s at 2 slots, 5 of 0.2 s at 6: 0.025 s per slot on top of 0.05 s fixed.
    meter.record(Generate(0.0, 0.5, busy_slots=2, total_slots=8, steps=5))
    meter.record(Generate(0.5, 1.5, busy_slots=6, total_slots=8, steps=5))
    meter.record(StepEnd(2.0))
    first = close(meter)
    assert first.decode_step_s == pytest.approx(0.15)
    assert first.decode_fixed_s == pytest.approx(0.05)
    meter.record(Generate(2.0, 3.0, busy_slots=8, total_slots=8, steps=4))
    meter.record(StepEnd(3.0))
    again = close(meter)  # one load only: the line is undetermined
    assert again.decode_step_s == pytest.approx(0.25)
    assert again.decode_fixed_s == pytest.approx(0.05)  # kept from the last phase
    meter.record(Generate(3.0, 4.0, busy_slots=8, total_slots=8, steps=4))
    meter.record(StepEnd(4.0))
    assert close(meter, split=Split(4, 4)).decode_fixed_s == 0.0  # a new split: not kept


def test_spans_before_the_phase_start_are_clipped_and_caps_hold():
    meter = PhaseMeter(start=5.0)
    meter.record(Learn(0.0, 7.0))  # reported late: only 2 s lie in this phase
    meter.record(LearnerWait(7.0, 20.0))
    meter.record(SamplerIdle(0.0, 9.0, slots=100))
    meter.record(StepEnd(9.0))
    stats = close(meter)
    assert stats.learner_busy_s == 2.0 and stats.learner_idle_s == 2.0
    assert (stats.sampler_idle_s, stats.sampler_busy_s) == (4.0, 0.0)


@pytest.mark.parametrize(
    "event, match",
    [
        (Generate(2.0, 1.0, 1, 8), "ends before it starts"),
        (Generate(0.0, 1.0, 9, 8), "busy_slots=9 of total_slots=8"),
        (SamplerIdle(0.0, 1.0, -1), "slots=-1"),
        ("decode", "takes Generate"),
    ],
)
def test_bad_events_are_refused(event, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PhaseMeter().record(event)


def test_stats_needs_a_step_boundary():
    meter = PhaseMeter()
    meter.record(Learn(0.0, 1.0))
    with pytest.raises(ValueError, match="needs a StepEnd"):
        close(meter)


def test_engaged_time_counts_replicas_holding_a_live_sequence():
    # Two replicas of 4 slots over 10 s: one decodes throughout, the other 3 s then sits empty
    # (a whole idle chip group, lendable without moving a request).
    meter = PhaseMeter()
    meter.record(Generate(0.0, 10.0, busy_slots=1, total_slots=4, steps=100))
    meter.record(Generate(0.0, 3.0, busy_slots=4, total_slots=4, steps=30))
    meter.record(SamplerIdle(0.0, 10.0, slots=3))
    meter.record(SamplerIdle(3.0, 10.0, slots=4))
    meter.record(StepEnd(10.0))
    stats = close(meter)
    assert stats.sampler_engaged_s == pytest.approx((4 * 10 + 4 * 3) / 8)
    assert stats.sampler_busy_s == pytest.approx(10 - (3 * 10 + 4 * 7) / 8)
