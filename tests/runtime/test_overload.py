"""Overload: a sampler far faster than the learner keeps every host queue within its bound.

The learner here takes its step only once the sampler is *saturated*: at the newest weights,
its last admission granted nothing, it has no sample to decode and no group awaits its reward.
So the sampler is as far ahead of the learner as the driver ever lets it get (infinitely
faster, not just 10x), and what stopped it can only be backpressure: the staleness
controller, the buffer's seats and the slot gate. Boundedness is checked structurally: the
peak of each queue (rljax.testing.soak) against its bound from the config, never a time.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rljax.metrics import Timeline
from rljax.policy import admission
from rljax.policy.staleness import StalenessController
from rljax.testing.drivers import NumberedPrompts, fake_driver
from rljax.testing.fakes import FakeLearner, FakeSampler, constant_cost, lognormal_lengths
from rljax.testing.soak import QueueProbe, queue_bounds

GROUP, BATCH, SLOTS = 4, 3, 12
WATCHDOG_S = 60.0


class ProbedController(StalenessController):
    """The real controller; remembers the buffer version its last admission saw."""

    seen: int | None = None

    def capacity(self, learner_version, running, accepted):
        self.seen = learner_version
        return super().capacity(learner_version, running, accepted)


class ProbedSampler(FakeSampler):
    """Samples the queues every decode step; notes when an admission left it with no work.

    The driver's sampler thread calls ``has_work`` right after each admission, so ``idle_at``
    is (params version, buffer version) of an admission that granted nothing, with nothing
    left to decode, or None.
    """

    probe: QueueProbe
    controller: ProbedController
    idle_at: tuple[int, int | None] | None = None
    idle_calls = 0  # how many admissions left it idle so far

    def has_work(self) -> bool:
        work = super().has_work()
        self.idle_at = None if work else (self.version, self.controller.seen)
        self.idle_calls += not work
        return work

    def step(self):
        self.probe.sample()
        return super().step()


class SaturatedLearner(FakeLearner):
    """Steps only once the sampler is saturated at this learner's version; records the buffer."""

    def __init__(self, driver_box: list):
        super().__init__(constant_cost(0.0))
        self.driver_box = driver_box
        self.held_when_saturated: list[int] = []

    def step(self, batch):
        driver = self.driver_box[0]
        sampler = driver.sampler
        deadline = time.monotonic() + WATCHDOG_S  # a watchdog, not an interleaving

        def quiet() -> bool:
            return (
                sampler.idle_at == (self.version, driver.buffer.version)
                and driver.buffer.num_pending == 0
                and driver._rewards_q.unfinished_tasks == 0  # none queued or being scored
            )

        # ``idle_at`` can be older than the last placement: a group placed or released after
        # the admission that left the sampler idle may have freed a seat the sampler has not
        # yet seen. So the quiet state must hold across two more idle admissions, the second
        # of them wholly after it was first seen: nothing but the sampler moves by then, and
        # an admission that finds a free seat makes it busy again.
        first_seen = None
        with driver._cond:
            while first_seen is None or not (quiet() and sampler.idle_calls >= first_seen + 2):
                assert time.monotonic() < deadline, "the sampler never saturated"
                if not quiet():
                    first_seen = None
                elif first_seen is None:
                    first_seen = sampler.idle_calls
                driver._cond.wait(timeout=0.01)
            rows = driver.buffer.snapshot()
        self.held_when_saturated.append(sum(r["occupied"] for r in rows))
        driver.sampler.probe.sample()
        return super().step(batch)


def _score(trajs) -> np.ndarray:
    return np.array([float((t.group_id + t.sample_index) % 2) for t in trajs])


def _run(*, lockstep: bool, eta: int, overprovision: int, steps: int):
    box: list = []
    learner = FakeLearner(constant_cost(0.0)) if lockstep else SaturatedLearner(box)
    sampler = ProbedSampler(
        slots=SLOTS, step_cost_s=constant_cost(0.0), length_sampler=lognormal_lengths(4, 1.0, 24)
    )
    prompts = NumberedPrompts(BATCH)
    real = admission.controller(
        slots=SLOTS,
        group_size=GROUP,
        batch_groups=BATCH,
        max_staleness=eta,
        overprovision=overprovision,
    )
    sampler.controller = controller = ProbedController(
        max_staleness=eta,
        batch_groups=BATCH,
        max_concurrent=real.max_concurrent,
        overprovision=overprovision,
    )

    driver, record = fake_driver(
        sampler=sampler,
        learner=learner,
        group_size=GROUP,
        batch_groups=BATCH,
        num_steps=steps,
        score=_score,
        eta=eta,
        overprovision=overprovision,
        prompts=prompts,
        controller=controller,
        lockstep=lockstep,
        timeline=Timeline(max_events=50),  # small, so the soak sees the cap hold
    )
    consumed = record.consumed
    box.append(driver)
    sampler.probe = probe = QueueProbe(driver)
    watchdog = threading.Timer(WATCHDOG_S, driver.stop)
    watchdog.start()
    threads_before = threading.active_count()  # the watchdog included
    bounds = queue_bounds(driver, prompt_chunk=BATCH, threads_before=threads_before)
    try:
        driver.run()
        threads_after = threading.active_count()
    finally:
        watchdog.cancel()
    assert learner.version == steps
    assert threads_after <= threads_before, "the driver left a thread behind"
    assert probe.over(bounds) == {}, "a host queue outgrew its bound"
    # Nothing lost: every prompt drawn is consumed once, aborted as surplus, pending or held.
    state = driver.checkpoint_state()
    held = sum(len(b["groups"]) for b in state["buffer"]["buffers"])
    assert len(consumed) == len(set(consumed)) == steps * BATCH
    surplus = driver.counters["surplus_aborted"]
    assert prompts.drawn == len(consumed) + surplus + len(state["pending"]) + held
    return driver, learner, probe, bounds


@pytest.mark.parametrize("eta", [0, 1, 3])
@pytest.mark.parametrize("overprovision", [0, 2])
def test_saturated_sampler_is_held_by_backpressure(eta, overprovision):
    driver, learner, probe, bounds = _run(
        lockstep=False, eta=eta, overprovision=overprovision, steps=12
    )
    # At saturation every seat a sampler at the learner's version can reach is filled, and no
    # more: eta buffers ahead of the one being trained on, B groups each.
    assert learner.held_when_saturated == [eta * BATCH] * 12
    assert probe.peak["timeline"] == 50  # the trace is capped, and the cap was reached
    if overprovision:
        assert driver.counters["surplus_aborted"] > 0


@pytest.mark.parametrize("overprovision", [0, 2])
def test_lockstep_queues_are_bounded(overprovision):
    _, _, probe, bounds = _run(lockstep=True, eta=0, overprovision=overprovision, steps=12)
    assert probe.peak["reserved"] <= BATCH + overprovision
    # Lockstep starts no thread: the count never exceeds the one before the run. (It may fall
    # below it: a thread another test left winding down in this process can end meanwhile.)
    assert probe.peak["threads"] <= bounds["threads"]
