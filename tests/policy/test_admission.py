"""Admission's one max_concurrent rule and routing's replica choice."""

import pytest

from rljax.policy.admission import controller, max_concurrent_groups
from rljax.policy.routing import ReplicaLoad, route


@pytest.mark.parametrize(
    "slots, batch_groups, overprovision, expected",
    [
        (64, 8, 0, 64),  # one group per slot: a straggler holds one slot, not G
        (64, 8, 2, 64),
        (16, 32, 4, 36),  # fewer slots than a batch: a whole batch (and its surplus) in flight
    ],
)
def test_max_concurrent_is_one_group_per_slot_but_at_least_a_batch(
    slots, batch_groups, overprovision, expected
):
    got = max_concurrent_groups(
        slots=slots, group_size=4, batch_groups=batch_groups, overprovision=overprovision
    )
    assert got == expected


def test_controller_caps_groups_in_flight_by_the_rule():
    ctl = controller(slots=16, group_size=4, batch_groups=2, max_staleness=8, overprovision=1)
    assert ctl.max_concurrent == 16 and ctl.overprovision == 1
    # Stragglers: 12 groups each down to one live sequence still leave room for 4 more, where a
    # cap of slots // G = 4 groups would admit nothing.
    assert ctl.capacity(learner_version=0, running=12, accepted=0) == 4


def test_admission_refuses_a_sampler_that_cannot_hold_a_group():
    with pytest.raises(ValueError, match="fewer than group_size=8.*raise max_concurrent_decodes"):
        max_concurrent_groups(slots=4, group_size=8, batch_groups=2)


def test_route_prefers_ready_then_headroom_then_lowest_index():
    loads = [
        ReplicaLoad(0, free_slots=3, queued=0),
        ReplicaLoad(1, free_slots=9, queued=0, ready=False),  # rebuilding after a resize
        ReplicaLoad(2, free_slots=5, queued=2),
        ReplicaLoad(3, free_slots=4, queued=1),
    ]
    assert route(loads) == 0  # 0 and 3 tie at headroom 3; 2 too; the lowest index wins
    assert route(loads + [ReplicaLoad(4, free_slots=6, queued=2)]) == 4
    assert route([ReplicaLoad(7, 8, 0, ready=False), ReplicaLoad(5, 1, 1)]) == 7


def test_route_answers_none_when_every_slot_is_claimed():
    assert route([ReplicaLoad(0, 2, 2), ReplicaLoad(1, 0, 3)]) is None
    assert route([]) is None
    with pytest.raises(ValueError, match="free_slots=-1"):
        route([ReplicaLoad(0, -1, 0)])
