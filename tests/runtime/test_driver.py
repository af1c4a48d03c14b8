"""Driver invariants with fake engines: nothing lost or duplicated, staleness <= eta.

The driver, StalenessBuffer and StalenessController are the real ones; only the sampler,
learner and weight sync are fakes (rljax.testing.fakes) with millisecond sleeps, so thread
interleavings vary from run to run while the invariants must hold for every one.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.engine.sampler import FINISH_LENGTH, Request, Trajectory
from rljax.policy.staleness import StalenessBuffer
from rljax.rewards.pool import RewardPool
from rljax.runtime.driver import Driver
from rljax.runtime.rollout import Group, decode_group, encode_group
from rljax.testing.drivers import DriverRecord, NumberedPrompts, fake_driver, run_with_watchdog
from rljax.testing.fakes import (
    FakeLearner,
    FakeSampler,
    FakeWeightSync,
    constant_cost,
    fake_make_batch,
    lognormal_lengths,
)

GROUP = 3
BATCH = 2
SLOTS = 6
WATCHDOG_S = 30.0


class RecordingBuffer(StalenessBuffer):
    """The real buffer, also remembering which request ids it returned as surplus."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.surplus_ids: set[int] = set()

    def occupy(self, request_id, group, min_version):
        surplus = super().occupy(request_id, group, min_version)
        self.surplus_ids.update(surplus)
        return surplus


def _rewards(trajs: list[Trajectory]) -> np.ndarray:
    # Deterministic per sample, and 0/1 so some groups have no signal (dynamic sampling).
    return np.array(
        [float(np.random.default_rng([t.group_id, t.sample_index]).random() < 0.5) for t in trajs]
    )


@dataclasses.dataclass
class Record(DriverRecord):
    """What one driver run did, as seen from the callbacks it was given."""

    dropped: set[int] = dataclasses.field(default_factory=set)  # rids without signal
    misaligned: int = 0  # consumed groups whose rewards[i] is not trajectories[i]'s reward


def _driver(
    record: Record,
    *,
    eta: int,
    overprovision: int,
    dynamic: bool,
    lengths,
    num_steps: int,
    prompts: NumberedPrompts,
    learner: FakeLearner,
    weight_sync: FakeWeightSync,
    buffer: StalenessBuffer | None = None,
    score_group=_rewards,
    seed: int = 0,
    **kwargs,
) -> Driver:
    buffer = buffer or RecordingBuffer(
        batch_groups=BATCH, max_staleness=eta, overprovision=overprovision
    )

    def score(trajs):  # one call may hold several groups, samples in order within each
        rewards = score_group(trajs)
        groups = collections.defaultdict(list)
        for t, r in zip(trajs, rewards.tolist(), strict=True):
            groups[t.group_id].append(r)
        for rid, values in groups.items():
            if dynamic and len(set(values)) == 1:
                record.dropped.add(rid)
        return rewards

    def check_alignment(groups: list[Group]):
        if score_group is _rewards:
            # Samples finish out of order; each reward must stay with its own trajectory.
            record.misaligned += sum(
                g.rewards.tolist() != _rewards(g.trajectories).tolist()
                or [t.sample_index for t in g.trajectories] != list(range(GROUP))
                for g in groups
            )

    sampler = FakeSampler(
        slots=SLOTS,
        step_cost_s=constant_cost(0.001),
        length_sampler=lengths,
        seed=seed,
        version=learner.version,
        params=learner.params,
    )
    driver, _ = fake_driver(
        sampler=sampler,
        learner=learner,
        group_size=GROUP,
        batch_groups=BATCH,
        num_steps=num_steps,
        score=score,
        eta=eta,
        overprovision=overprovision,
        prompts=prompts,
        weight_sync=weight_sync,
        buffer=buffer,
        on_batch=check_alignment,
        record=record,
        dynamic_sampling=dynamic,
        **kwargs,
    )
    return driver


def _run(driver: Driver, start_step: int = 0) -> None:
    run_with_watchdog(driver, WATCHDOG_S, start_step=start_step)  # a hang fails the test


def _example_of(group) -> dict:
    """A buffered group's example, whether the driver encodes groups for JSON or not."""
    return group["example"] if isinstance(group, dict) else group.example


def _check_run(record: Record, driver: Driver, eta: int) -> set[int]:
    """Asserts the per-run invariants; returns the example ids still pending at stop."""
    assert record.batch_sizes and set(record.batch_sizes) == {BATCH}
    assert max(record.staleness) <= eta
    assert len(record.consumed) == len(set(record.consumed)), "a group was consumed twice"
    assert record.misaligned == 0, "rewards were attached to the wrong samples"
    state = driver.checkpoint_state()
    pending = {e["id"] for e in state["pending"]}
    buffered = {
        _example_of(g["group"])["id"] for b in state["buffer"]["buffers"] for g in b["groups"]
    }
    surplus = driver.buffer.surplus_ids
    consumed = set(record.consumed)
    assert not consumed & buffered and not consumed & pending and not buffered & pending
    for rid, example in record.dispatched.items():
        closed = example in consumed or example in buffered or example in pending
        assert closed or rid in record.dropped or rid in surplus, f"request {rid} was lost"
        if rid in surplus or rid in record.dropped:
            assert example not in consumed and example not in buffered
    return pending


def _lengths(median: float, sigma: float):
    return lognormal_lengths(median, sigma, 24)


@pytest.mark.parametrize("eta", [0, 1, 2])
@pytest.mark.parametrize("overprovision", [0, 2])
@pytest.mark.parametrize("dynamic", [False, True])
def test_driver_invariants(eta, overprovision, dynamic):
    record, learner = Record(), FakeLearner(constant_cost(0.002))
    driver = _driver(
        record,
        eta=eta,
        overprovision=overprovision,
        dynamic=dynamic,
        lengths=_lengths(4, 1.0),
        num_steps=5,
        prompts=NumberedPrompts(BATCH),
        learner=learner,
        weight_sync=FakeWeightSync(cost_s=0.001),
    )
    _run(driver)
    assert learner.version == 5
    _check_run(record, driver, eta)
    if dynamic:
        # Groups without signal are released and counted, except those aborted as surplus
        # while they were being scored (counted as surplus_discarded; which ones is timing).
        dropped = record.dropped - driver.buffer.surplus_ids
        assert driver.counters["dropped_no_signal"] == len(dropped)


@settings(max_examples=8, deadline=None)
@given(
    eta=st.integers(0, 2),
    overprovision=st.sampled_from([0, 2]),
    dynamic=st.booleans(),
    median=st.floats(1.0, 12.0),
    sigma=st.floats(0.0, 1.5),
    seed=st.integers(0, 2**16),
)
def test_driver_invariants_random_lengths(eta, overprovision, dynamic, median, sigma, seed):
    record, learner = Record(), FakeLearner(constant_cost(0.001))
    driver = _driver(
        record,
        eta=eta,
        overprovision=overprovision,
        dynamic=dynamic,
        lengths=_lengths(median, sigma),
        num_steps=4,
        prompts=NumberedPrompts(BATCH),
        learner=learner,
        weight_sync=FakeWeightSync(),
        seed=seed,
    )
    _run(driver)
    assert learner.version == 4
    _check_run(record, driver, eta)


@pytest.mark.parametrize("eta,overprovision", [(1, 0), (2, 2)])
def test_resume_mid_run(eta, overprovision):
    prompts, learner, sync = (
        NumberedPrompts(BATCH),
        FakeLearner(constant_cost(0.002)),
        FakeWeightSync(),
    )
    common = dict(
        eta=eta,
        overprovision=overprovision,
        dynamic=True,
        lengths=_lengths(4, 1.0),
        prompts=prompts,
        learner=learner,
        weight_sync=sync,
    )
    first = Record()
    stop_at = 3

    def on_step(step, metrics):
        if step == stop_at:
            driver.stop()

    driver = _driver(first, num_steps=10, on_step=on_step, encode_group=encode_group, **common)
    _run(driver)
    assert learner.version == stop_at + 1
    pending_1 = _check_run(first, driver, eta)
    # Through JSON, as the checkpoint stores it.
    state = json.loads(json.dumps(driver.checkpoint_state()))
    surplus_1 = {first.dispatched[r] for r in driver.buffer.surplus_ids}
    dropped_1 = {first.dispatched[r] for r in first.dropped}

    second = Record()
    buffer = RecordingBuffer.from_state_dict(state["buffer"], decode=decode_group)
    assert buffer.version == learner.version
    resumed = _driver(
        second,
        num_steps=8,
        buffer=buffer,
        requeue=state["pending"],
        next_request_id=state["next_request_id"],
        **common,
    )
    _run(resumed, start_step=learner.version)
    assert learner.version == 8
    assert not set(second.dispatched) & set(first.dispatched), "request ids were reused"
    pending_2 = _check_run(second, resumed, eta)
    consumed = first.consumed + second.consumed
    assert len(consumed) == len(set(consumed)) == 8 * BATCH, "a group was lost or duplicated"
    assert max(first.staleness + second.staleness) <= eta
    # Every prompt the stream issued is consumed, dropped, aborted as surplus or still pending.
    surplus_2 = {second.dispatched[r] for r in resumed.buffer.surplus_ids}
    dropped_2 = {second.dispatched[r] for r in second.dropped}
    buffered_2 = {
        g.example["id"] for slot in resumed.buffer._slots.values() for _, _, g in slot.groups
    }
    accounted = set(consumed) | surplus_1 | dropped_1 | surplus_2 | dropped_2 | pending_2
    assert set(prompts.issued) == accounted | buffered_2
    # Prompts pending at the checkpoint were re-dispatched, not forgotten.
    redispatched = set(second.dispatched.values())
    assert pending_1 <= redispatched | pending_2


def _flaky_verifier(completion: str, example: dict) -> float:
    kind = example["id"] % 3
    if kind == 0:
        raise RuntimeError("verifier bug")
    if kind == 1:
        time.sleep(0.5)  # hangs past the pool's timeout
    return float(len(completion) % 2)


def test_failing_reward_does_not_crash_driver():
    record, learner = Record(), FakeLearner(constant_cost(0.001))
    with RewardPool(_flaky_verifier, num_workers=GROUP, timeout_s=0.05) as pool:

        def score_group(trajs):
            return pool.score([str(t.response_tokens) for t in trajs], [t.payload for t in trajs])

        driver = _driver(
            record,
            eta=1,
            overprovision=0,
            dynamic=False,
            lengths=_lengths(4, 0.5),
            num_steps=4,
            prompts=NumberedPrompts(BATCH),
            learner=learner,
            weight_sync=FakeWeightSync(),
            score_group=score_group,
        )
        _run(driver)
        stats = pool.stats
    assert learner.version == 4
    assert stats.errors > 0 and stats.timeouts > 0
    _check_run(record, driver, 1)


# -- the fakes themselves ---------------------------------------------------------------------


def _sampler(**kwargs) -> FakeSampler:
    defaults = dict(slots=2, step_cost_s=constant_cost(0.0), length_sampler=lambda rng: 3)
    return FakeSampler(**{**defaults, **kwargs})


def test_fake_sampler_tags_versions_and_swaps_at_step_boundary():
    s = _sampler()
    s.submit([Request([1], 2, request_id=7)])
    s.step()
    s.set_params("p1", 1)  # staged: two sequences are running
    assert s.version == 0
    s.step()
    out = s.step()
    assert sorted(t.sample_index for t in out) == [0, 1]
    assert all(t.versions == [0, 1, 1] and t.min_version == 0 for t in out)
    assert all(t.group_id == 7 and len(t.response_tokens) == 3 for t in out)
    s.set_params("p2", 2)  # idle: applies at once
    assert (s.params, s.version) == ("p2", 2)


def test_fake_sampler_continuous_batching_and_abort():
    lengths = iter([1, 5, 1])  # drawn at submit, in sample order
    s = _sampler(length_sampler=lambda rng: next(lengths))
    s.submit([Request([1], 3, request_id=0)])
    assert len(s.step()) == 1  # sample 0 done; its slot takes sample 2 at the next step
    assert s.busy_slots == 1 and len(s.step()) == 1 and s.busy_slots == 1
    s.abort(0)
    assert not s.has_work() and s.stats["aborted_samples"] == 1


def test_fake_sampler_max_new_tokens_and_determinism():
    a = _sampler(length_sampler=lognormal_lengths(50, 1.0, 400), seed=3)
    b = _sampler(length_sampler=lognormal_lengths(50, 1.0, 400), seed=3)
    req = lambda: [Request([1], 4, max_new_tokens=20, request_id=5)]  # noqa: E731
    ta, tb = a.run(req()), b.run(req())
    assert [t.response_tokens for t in ta] == [t.response_tokens for t in tb]
    assert all(len(t.response_tokens) <= 20 for t in ta)
    assert any(t.finish_reason == FINISH_LENGTH for t in ta)


def test_fake_learner_and_sync():
    learner, sync = FakeLearner(lambda batch: 0.0), FakeWeightSync(every=2, param_bytes=10)
    traj = Trajectory([1, 2], [3], [-0.1], [0], "stop", 0, 0)
    batch = fake_make_batch([Group(0, None, [traj], np.zeros(1), 0)])
    assert batch.num_tokens == 3 and batch.num_sequences == 1
    assert learner.step(batch)["batch_tokens"] == 3 and learner.version == 1
    assert sync.acquire() is None and not sync.due(1) and sync.due(2)
    stats = sync.publish(learner.params, 1)
    assert stats.bytes == 10 and sync.acquire() == ({"version": 1}, 1)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: _sampler(slots=0), "slots=0 must be an int >= 1"),
        (lambda: lognormal_lengths(0, 1.0, 8), "median=0 must be > 0"),
        (lambda: lognormal_lengths(4, 1.0, 0), "max_len=0 must be an int >= 1"),
        (lambda: FakeWeightSync(every=0), "every=0: publish at least every step"),
        (lambda: _sampler().submit([Request([1], 1)]), "request_id=-1 is unset"),
        (lambda: fake_make_batch([]), "groups is empty"),
        (lambda: constant_cost(-1.0), "seconds=-1.0 must be >= 0"),
        (lambda: FakeLearner(lambda b: -1.0).step(None), "costs must be >= 0"),
    ],
)
def test_fakes_reject_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_fake_sampler_rejects_duplicate_running_id():
    s = _sampler()
    s.submit([Request([1], 1, request_id=4)])
    with pytest.raises(ValueError, match="request_id=4 is already running"):
        s.submit([Request([1], 1, request_id=4)])


def test_zero_length_sampler_is_rejected():
    s = _sampler(length_sampler=lambda rng: 0)
    with pytest.raises(ValueError, match="lengths must be >= 1 token"):
        s.submit([Request([1], 1, request_id=0)])


def test_counts_match_driver_counters():
    record, learner = Record(), FakeLearner(constant_cost(0.001))
    driver = _driver(
        record,
        eta=1,
        overprovision=2,
        dynamic=False,
        lengths=_lengths(6, 1.2),
        num_steps=4,
        prompts=NumberedPrompts(BATCH),
        learner=learner,
        weight_sync=FakeWeightSync(),
    )
    _run(driver)
    assert driver.counters["dispatched"] == len(record.dispatched)
    counts = collections.Counter(record.batch_sizes)
    assert counts == {BATCH: 4}
