"""rljax.policy.staleness: invariants over random schedules, AReaL capacity, error messages."""

import copy
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rljax.policy.staleness import StalenessBuffer, StalenessController, has_signal

_OPS = (
    ["dispatch"] * 4
    + ["dispatch_partial", "release", "release", "resume"]
    + ["complete"] * 4
    + ["consume"] * 2
    + ["sync"] * 2
)


class Harness:
    """Drives a StalenessBuffer like a runtime would and checks every answer against a model.

    Tracks each open request's sampler version, the surplus set, every accepted group and every
    consumed group, so invariants can be checked after each step. Seats float, so the model
    asks only whether the open reservations can all be seated by their deadlines, by Hall's
    condition (counted per deadline, not by the buffer's earliest-deadline-first seating).
    """

    def __init__(self, batch_groups, max_staleness, overprovision):
        self.B, self.eta, self.k = batch_groups, max_staleness, overprovision
        self.buf = StalenessBuffer(
            batch_groups=batch_groups, max_staleness=max_staleness, overprovision=overprovision
        )
        self.ctrl = StalenessController(
            max_staleness=max_staleness,
            batch_groups=batch_groups,
            max_concurrent=10**6,
            overprovision=overprovision,
        )
        self.sampler_version = 0
        self.open = {}  # request id -> sampler_version
        self.surplus = set()
        self.accepted = {}  # group uid -> group
        self.consumed = []
        self.next_id = 0
        self.resumes = 0

    @property
    def version(self):
        return self.buf.version

    def seatable(self, versions):
        """Whether reservations of these sampler versions all fit by their deadlines (Hall)."""
        rows = self.buf.snapshot()
        free = [0 if r["occupied"] >= self.B else self.B + self.k - r["occupied"] for r in rows]
        if any(v + self.eta < self.version for v in versions):
            return False
        for d in range(self.version, self.version + self.eta + 1):
            due = sum(1 for v in versions if v + self.eta <= d)
            if due > sum(free[: d - self.version + 1]):
                return False
        return True

    def pending_versions(self):
        return [v for rid, v in self.open.items() if rid not in self.surplus]

    def dispatch(self, sampler_version):
        rid = f"r{self.next_id}"
        self.next_id += 1
        fits = self.seatable(self.pending_versions() + [sampler_version])
        s = self.buf.reserve(rid, sampler_version)
        if s is None:
            assert not fits
            return
        assert fits and self.version <= s <= sampler_version + self.eta
        self.open[rid] = sampler_version

    def complete(self, pick, lag, drop):
        if not self.open:
            return
        rid = sorted(self.open)[pick % len(self.open)]
        v = self.open.pop(rid)
        if drop:
            self.buf.release(rid)
            self.surplus.discard(rid)
            return
        # In-flight weight swaps can make the oldest token newer than the dispatch version.
        min_version = v + lag % (self.version - v + 1)
        uid = f"{rid}@{self.resumes}"
        group = {"uid": uid, "min_version": min_version}
        discarded = self.buf.discarded
        before = self.buf.snapshot()
        newly_surplus = self.buf.occupy(rid, group, min_version)
        if rid in self.surplus:
            self.surplus.discard(rid)
            assert newly_surplus == [] and self.buf.discarded == discarded + 1
            return
        self.accepted[uid] = group
        if newly_surplus:
            # Only overprovision strands a reservation, and only when a buffer fills.
            assert self.k > 0
            after = self.buf.snapshot()
            assert any(
                a["occupied"] == self.B > b["occupied"] for a, b in zip(after, before[: len(after)])
            )
            assert not self.surplus & set(newly_surplus)
            self.surplus |= set(newly_surplus)
        # The group went to the earliest buffer it could take without stranding anyone more.
        held = [r["occupied"] for r in self.buf.snapshot()]
        assert sum(held) == sum(r["occupied"] for r in before) + 1

    def consume(self):
        rows = self.buf.snapshot()
        if not self.buf.ready(self.version):
            assert rows[0]["occupied"] < self.B
            return
        assert rows[0]["occupied"] == self.B
        v = self.version
        groups = self.buf.consume(v)
        assert self.buf.version == v + 1
        assert len(groups) == self.B
        for g in groups:
            assert 0 <= v - g["min_version"] <= self.eta
        self.consumed.extend(groups)

    def sync(self):
        self.sampler_version = self.version
        if self.k == 0:
            # AReaL's staleness term equals the seats reserve() hands out at the learner version.
            cap = self.ctrl.capacity(self.version, self.buf.num_pending, self.buf.accepted)
            probe = copy.deepcopy(self.buf)
            granted = 0
            while probe.reserve(f"probe{granted}", self.version) is not None:
                granted += 1
            assert cap == granted

    def resume(self):
        before = self.buf.snapshot()
        state = json.loads(json.dumps(self.buf.state_dict()))
        self.buf = StalenessBuffer.from_state_dict(state)
        pending = {r for r in self.open if r not in self.surplus}
        assert sorted(self.buf.lost_reservations) == sorted(pending)
        assert len(self.buf.lost_reservations) == len(pending)
        after = self.buf.snapshot()
        assert [r["occupied"] for r in after] == [r["occupied"] for r in before]
        assert all(r["reserved"] == 0 for r in after)
        # The sampler died with its requests; the restarted one loads the learner's params.
        self.open.clear()
        self.surplus.clear()
        self.sampler_version = self.version
        self.resumes += 1

    def check(self):
        rows = self.buf.snapshot()
        pending = self.pending_versions()
        for row in rows:
            assert row["occupied"] <= self.B
            assert row["occupied"] + row["reserved"] <= self.B + self.k
            if row["occupied"] == self.B:
                assert row["reserved"] == 0  # a full buffer seats no reservation
        assert self.buf.num_pending == len(pending) == sum(r["reserved"] for r in rows)
        assert self.seatable(pending), "an open reservation lost its seat"
        assert self.buf.accepted == len(self.accepted)
        assert sorted(self.buf.surplus) == sorted(self.surplus)

    def held(self):
        state = self.buf.state_dict()
        return [g["group"] for b in state["buffers"] for g in b["groups"]]

    def drain(self):
        """Closes every request, then fills and consumes buffers until none holds a group."""
        for rid in list(self.open):
            self.buf.release(rid)
        self.open.clear()
        self.surplus.clear()
        self.sync()
        while self.held():
            while not self.buf.ready(self.version):
                self.dispatch(self.version)
                assert self.open, "the current buffer must always have a seat after a sync"
                self.complete(0, 0, drop=False)
            self.consume()
            self.sampler_version = self.version


def _run(harness, ops):
    for op, a, b in ops:
        if op == "dispatch":
            harness.dispatch(harness.sampler_version)
        elif op == "dispatch_partial":
            # A resumed partial rollout reserves with the version of its oldest prefix token.
            # Prefixes up to one version too old exercise the denial path too.
            low = min(harness.sampler_version, max(0, harness.version - harness.eta - 1))
            harness.dispatch(low + a % (harness.sampler_version - low + 1))
        elif op == "complete":
            harness.complete(a, b, drop=False)
        elif op == "release":
            # Abort, failure and a dynamic-sampling drop all look the same to the buffer.
            harness.complete(a, b, drop=True)
        elif op == "consume":
            harness.consume()
        elif op == "sync":
            harness.sync()
        elif op == "resume":
            harness.resume()
        harness.check()


_configs = st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(0, 2))
_programs = st.lists(
    st.tuples(st.sampled_from(_OPS), st.integers(0, 99), st.integers(0, 99)), max_size=120
)


@settings(max_examples=250, deadline=None)
@given(config=_configs, ops=_programs)
# Random search rarely reaches this one: at version 1, a version-0 group whose buffer it would
# fill (stranding two overprovisioned version-0 reservations) must still land there, never in
# buffer 2 past its deadline (staleness 2 > eta = 1) to spare them.
@example(
    config=(2, 1, 2),
    ops=[("dispatch", 0, 0)] * 5
    + [("complete", 0, 0)] * 2
    + [("consume", 0, 0), ("sync", 0, 0), ("dispatch", 0, 0), ("complete", 3, 0)]
    + [("complete", 0, 0)],
)
def test_random_schedules_keep_every_invariant(config, ops):
    harness = Harness(*config)
    _run(harness, ops)
    consumed_before_drain = len(harness.consumed)
    harness.drain()
    uids = [g["uid"] for g in harness.consumed]
    assert len(uids) == len(set(uids)), "a group was consumed twice"
    assert set(uids) == set(harness.accepted), "an accepted group was lost"
    assert len(harness.consumed) % harness.B == 0
    assert len(harness.consumed) >= consumed_before_drain


@settings(max_examples=100, deadline=None)
@given(config=_configs, ops=_programs, cut=st.integers(0, 120))
def test_resume_mid_stream_matches_uninterrupted_state(config, ops, cut):
    """A round trip changes nothing but the dropped reservations: same groups, same versions."""
    harness = Harness(*config)
    _run(harness, ops[:cut])
    state = harness.buf.state_dict()
    restored = StalenessBuffer.from_state_dict(json.loads(json.dumps(state)))
    again = restored.state_dict()
    for b in state["buffers"]:
        b["reservations"] = []
    state["buffers"] = [b for b in state["buffers"] if b["groups"]]
    assert again == state


def test_eta_zero_is_synchronous_on_policy():
    buf = StalenessBuffer(batch_groups=2, max_staleness=0)
    assert [buf.reserve(i, 0) for i in range(3)] == [0, 0, None]
    assert buf.occupy(0, "a", 0) == [] and buf.occupy(1, "b", 0) == []
    assert buf.consume(0) == ["a", "b"]
    assert buf.reserve(2, 0) is None, "a version-0 sampler must sync before feeding buffer 1"
    assert buf.reserve(2, 1) == 1
    assert buf.snapshot() == [{"version": 1, "reserved": 1, "occupied": 0}]


def test_redundant_rollout_aborts_exactly_the_surplus():
    buf = StalenessBuffer(batch_groups=2, max_staleness=0, overprovision=2)
    assert [buf.reserve(f"r{i}", 0) for i in range(5)] == [0, 0, 0, 0, None]
    assert buf.occupy("r2", "g2", 0) == []
    assert buf.occupy("r0", "g0", 0) == ["r1", "r3"]  # no later buffer to seat them in
    assert buf.surplus == ["r1", "r3"] and buf.num_pending == 0
    assert buf.occupy("r3", "late", 0) == []  # completed before its abort landed
    assert buf.discarded == 1
    buf.release("r1")
    assert buf.surplus == [] and buf.consume(0) == ["g2", "g0"]
    assert buf.accepted == 2


def test_a_surplus_reservation_with_a_later_seat_is_kept():
    buf = StalenessBuffer(batch_groups=2, max_staleness=1, overprovision=2)
    assert [buf.reserve(f"r{i}", 0) for i in range(6)] == [0, 0, 0, 0, 1, 1]
    assert buf.occupy("r2", "g2", 0) == []
    # Buffer 0 fills; r1 and r3 still reach buffer 1 (deadline 0 + eta), so nothing is aborted.
    assert buf.occupy("r0", "g0", 0) == []
    assert buf.snapshot()[1] == {"version": 1, "reserved": 4, "occupied": 0}


def test_a_fast_group_fills_the_current_buffer_past_slower_reservations():
    buf = StalenessBuffer(batch_groups=2, max_staleness=1)
    assert [buf.reserve(r, 0) for r in ("slow", "a", "fast")] == [0, 0, 1]
    buf.occupy("fast", "fast", 0)
    buf.occupy("a", "a", 0)
    # "slow" (deadline 1) still has a seat in buffer 1, so the learner need not wait for it.
    assert buf.ready(0) and buf.consume(0) == ["fast", "a"]
    assert buf.snapshot()[0] == {"version": 1, "reserved": 1, "occupied": 0}


def test_a_group_never_takes_the_seat_a_reservation_due_now_needs():
    buf = StalenessBuffer(batch_groups=2, max_staleness=1)
    for r in ("x", "y"):
        buf.reserve(r, 0)
        buf.occupy(r, r, 0)
    buf.consume(0)
    assert buf.reserve("old", 0) == 1  # its prefix is from version 0: due in buffer 1
    assert [buf.reserve(r, 1) for r in ("n1", "n2")] == [1, 2]
    buf.occupy("n1", "n1", 1)
    buf.occupy("n2", "n2", 1)  # buffer 1 has one seat left and "old" needs it
    assert buf.snapshot() == [
        {"version": 1, "reserved": 1, "occupied": 1},
        {"version": 2, "reserved": 0, "occupied": 1},
    ]


def test_without_overprovision_nothing_is_ever_surplus():
    buf = StalenessBuffer(batch_groups=2, max_staleness=0)
    buf.reserve("a", 0), buf.reserve("b", 0)
    assert buf.occupy("a", 1, 0) == [] and buf.occupy("b", 2, 0) == []


def test_group_lands_in_an_earlier_buffer_with_a_free_seat():
    buf = StalenessBuffer(batch_groups=2, max_staleness=1)
    assert [buf.reserve(i, 0) for i in range(3)] == [0, 0, 1]
    buf.release(0)
    buf.occupy(2, "early", 0)
    assert buf.snapshot() == [
        {"version": 0, "reserved": 1, "occupied": 1},
        {"version": 1, "reserved": 0, "occupied": 0},
    ]
    assert buf.reserve(3, 0) == 1  # the seat it left behind is free again


def test_newer_min_version_is_accepted_and_partial_rollouts_reserve_old():
    buf = StalenessBuffer(batch_groups=1, max_staleness=2)
    buf.reserve("a", 0)
    buf.occupy("a", "a", 0)
    buf.consume(0)
    buf.reserve("fresh", 0)  # dispatched at 0; a swap to 1 came before its first token
    buf.occupy("fresh", "fresh", 1)
    assert buf.reserve("partial", 0) == 2  # prefix from version 0 reaches buffer 0 + eta
    assert buf.reserve("too_old", 0) is None


def test_resume_reports_lost_reservations_and_frees_their_seats():
    buf = StalenessBuffer(batch_groups=2, max_staleness=1)
    for rid in ("a", "b", "c"):
        buf.reserve(rid, 0)
    buf.occupy("b", ("tuple", 1), 0)
    state = buf.state_dict(encode=list)
    restored = StalenessBuffer.from_state_dict(json.loads(json.dumps(state)), decode=tuple)
    assert restored.lost_reservations == ["a", "c"]
    assert restored.num_pending == 0 and restored.accepted == 1
    assert [restored.reserve(r, 0) for r in ("a", "c", "d", "e")] == [0, 1, 1, None]
    restored.occupy("a", ("x",), 0)
    assert restored.consume(0) == [("tuple", 1), ("x",)]


def test_capacity_matches_hand_computed_areal_values():
    ctrl = StalenessController(max_staleness=2, batch_groups=4, max_concurrent=10)
    assert ctrl.capacity(0, 0, 0) == 10  # min(10, 3*4 - 0)
    assert ctrl.capacity(0, 3, 0) == 7  # min(7, 12 - 3)
    assert ctrl.capacity(1, 8, 5) == 2  # min(2, 16 - 13)
    assert ctrl.capacity(1, 6, 8) == 2  # min(4, 16 - 14)
    assert ctrl.capacity(0, 12, 0) == 0  # clamped
    assert ctrl.capacity(5, 0, 20) == 10  # min(10, 32 - 20)
    sync = StalenessController(max_staleness=0, batch_groups=4, max_concurrent=100)
    assert [sync.capacity(0, 0, 0), sync.capacity(0, 4, 0), sync.capacity(1, 0, 4)] == [4, 0, 4]
    assert sync.capacity(1, 1, 6) == 1  # min(99, 8 - 7)
    redundant = StalenessController(
        max_staleness=1, batch_groups=2, max_concurrent=100, overprovision=1
    )
    assert redundant.capacity(0, 0, 0) == 6  # (1+0+1)*2 + (1+1)*1


def test_has_signal():
    assert has_signal([0.0, 1.0, 1.0])
    assert not has_signal([1.0, 1.0])
    assert not has_signal([0.5])
    assert not has_signal([0.0, 0.05], atol=0.1)


def _full_state():
    buf = StalenessBuffer(batch_groups=1, max_staleness=1)
    buf.reserve("a", 0)
    buf.occupy("a", "g", 0)
    return buf.state_dict()


def _bad_state(edit):
    state = _full_state()
    edit(state)
    return state


def _used_buffer():
    buf = StalenessBuffer(batch_groups=2, max_staleness=0)
    buf.reserve("a", 0)
    buf.reserve("b", 0)
    buf.occupy("a", "g", 0)
    return buf


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: StalenessBuffer(batch_groups=0, max_staleness=0), "batch_groups=0 is invalid"),
        (lambda: StalenessBuffer(batch_groups=2, max_staleness=-1), "max_staleness=-1 is invalid"),
        (
            lambda: StalenessBuffer(batch_groups=2, max_staleness=0, overprovision=-1),
            "overprovision=-1 is invalid: use an int k >= 0",
        ),
        (lambda: StalenessBuffer(batch_groups=2.0, max_staleness=0), "batch_groups=2.0"),
        (lambda: _used_buffer().reserve(1.5, 0), "request_id=1.5 is invalid: use an int or a str"),
        (lambda: _used_buffer().reserve("b", 0), "request_id='b' already holds an open"),
        (lambda: _used_buffer().reserve("c", 1), "sampler_version=1 is ahead of the learner"),
        (lambda: _used_buffer().reserve("c", -1), "sampler_version=-1 is invalid"),
        (lambda: _used_buffer().occupy("zz", "g", 0), "request_id='zz' holds no reservation"),
        (lambda: _used_buffer().occupy("a", "g", 0), "request_id='a' holds no reservation"),
        (lambda: _used_buffer().occupy("b", "g", 3), "min_version=3 is ahead of the learner"),
        (lambda: _used_buffer().occupy("b", "g", -1), "min_version=-1 is invalid"),
        (lambda: _used_buffer().release("a"), "an occupied group cannot be released"),
        (lambda: _used_buffer().ready(1), "learner_version=1 does not match the buffer version 0"),
        (lambda: _used_buffer().consume(0), r"buffer 0 is not full \(1/2 groups\)"),
        (
            lambda: StalenessBuffer.from_state_dict({"batch_groups": 1}),
            "not a valid StalenessBuffer.state_dict.*KeyError.*max_staleness",
        ),
        (
            lambda: StalenessBuffer.from_state_dict(
                _bad_state(lambda s: s["buffers"][0]["groups"][0].update(min_version=-5))
            ),
            "group 'a' in buffer 0 exceeds eta",
        ),
        (
            lambda: StalenessBuffer.from_state_dict(_bad_state(lambda s: s.update(version=3))),
            r"buffer 0 lies outside \[version, version \+ eta\]",
        ),
        (
            lambda: StalenessBuffer.from_state_dict(
                _bad_state(lambda s: s["buffers"].append(s["buffers"][0]))
            ),
            "buffer 0 appears twice",
        ),
        (
            lambda: StalenessBuffer.from_state_dict(
                _bad_state(lambda s: s["buffers"][0]["groups"].append(s["buffers"][0]["groups"][0]))
            ),
            "buffer 0 holds 2 groups > batch_groups",
        ),
        (
            lambda: StalenessBuffer.from_state_dict(_bad_state(lambda s: s.update(accepted=5))),
            r"accepted=5 != version \* batch_groups \+ 1 held groups",
        ),
        (
            lambda: StalenessController(max_staleness=-1, batch_groups=1, max_concurrent=1),
            "max_staleness=-1 is invalid",
        ),
        (
            lambda: StalenessController(max_staleness=0, batch_groups=1, max_concurrent=0),
            "max_concurrent=0 is invalid: use an int >= 1",
        ),
        (
            lambda: StalenessController(max_staleness=0, batch_groups=1, max_concurrent=1).capacity(
                0, -1, 0
            ),
            "running=-1 is invalid",
        ),
        (
            lambda: StalenessController(max_staleness=0, batch_groups=1, max_concurrent=1).capacity(
                0, 0, -2
            ),
            "accepted=-2 is invalid: use StalenessBuffer.accepted",
        ),
        (lambda: has_signal([]), "rewards is empty; pass the G rewards of one group"),
        (lambda: has_signal([1.0, float("nan")]), "contains NaN; fix the reward function"),
        (lambda: has_signal([1.0], atol=-1.0), "atol=-1.0 is negative"),
    ],
)
def test_error_messages(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_partial_rollout_older_than_its_reservation_is_rejected():
    buf = StalenessBuffer(batch_groups=1, max_staleness=1)
    buf.reserve("a", 0)
    buf.occupy("a", "g", 0)
    buf.consume(0)
    buf.reserve("b", 1)
    with pytest.raises(ValueError, match="min_version=0 is older than the reservation's"):
        buf.occupy("b", "g", 0)
