"""One driver, two schedules: lock-step (sync) and threaded (async) share keys and invariants.

Fake sampler, learner and weight sync (rljax.testing.fakes) with no sleeps; the driver, buffer
and controller are the real ones.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rljax.runtime.driver import COUNTERS
from rljax.runtime.rollout import LOCKSTEP_ID_STRIDE, encode_group
from rljax.testing.drivers import NumberedPrompts, fake_driver, run_with_watchdog
from rljax.testing.fakes import FakeLearner, FakeSampler, constant_cost, lognormal_lengths

GROUP, BATCH, SLOTS = 2, 3, 8
WATCHDOG_S = 30.0


def _score(trajs) -> np.ndarray:
    # 0/1 per sample, deterministic, so some groups have no signal.
    return np.array([float((t.group_id + t.sample_index) % 3 == 0) for t in trajs])


def _driver(*, lockstep, eta=0, overprovision=0, dynamic=False, steps=6, on_step=None, **kw):
    """(driver, learner, what its callbacks recorded)."""
    learner = FakeLearner(constant_cost(0.0))
    prompts = kw.pop("prompts", None) or NumberedPrompts(BATCH)
    sampler = FakeSampler(
        slots=SLOTS,
        step_cost_s=constant_cost(0.0),
        length_sampler=lognormal_lengths(4, 1.0, 16),
        seed=0,
        params=learner.params,
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
        prompt=(1, 2),
        prompts=prompts,
        lockstep=lockstep,
        dynamic_sampling=dynamic,
        on_step=on_step,
        prompt_state=prompts.get_state,
        encode_group=encode_group,
        **kw,
    )
    return driver, learner, record


def _run(driver) -> None:
    run_with_watchdog(driver, WATCHDOG_S)  # a hang fails the test, not CI


@pytest.mark.parametrize("overprovision", [0, 2])
@pytest.mark.parametrize("dynamic", [False, True])
def test_lockstep_is_on_policy_and_loses_nothing(overprovision, dynamic):
    steps: list[dict] = []
    driver, learner, record = _driver(
        lockstep=True,
        overprovision=overprovision,
        dynamic=dynamic,
        on_step=lambda step, m: steps.append(m),
    )
    _run(driver)
    consumed, request_ids = record.consumed, list(record.dispatched)
    assert learner.version == 6 and len(steps) == 6
    assert all(m["staleness_max"] == 0 for m in steps)
    assert len(consumed) == len(set(consumed)) == 6 * BATCH
    assert [i for m in steps for i in m["prompt_ids"]] == consumed
    # Lock-step ids come from the step, so a resumed run samples the same requests.
    assert all(i // LOCKSTEP_ID_STRIDE >= 1 for i in request_ids)
    assert request_ids[:BATCH] == [LOCKSTEP_ID_STRIDE + k for k in range(BATCH)]
    # Nothing held over between steps: no reservation, no surplus left open.
    assert driver.buffer.num_pending == 0 and driver.buffer.surplus == []
    assert driver.checkpoint_state()["buffer"]["buffers"] == []
    if not dynamic and not overprovision:
        assert driver.counters["dispatched"] == 6 * BATCH


def test_lockstep_refuses_eta():
    with pytest.raises(ValueError, match="lock-step schedule is on-policy"):
        _driver(lockstep=True, eta=1)


@pytest.mark.parametrize("lockstep,eta", [(True, 0), (False, 0), (False, 2)])
def test_every_mode_logs_the_same_metric_keys(lockstep, eta):
    steps: list[dict] = []
    driver, _, _ = _driver(lockstep=lockstep, eta=eta, on_step=lambda s, m: steps.append(m))
    _run(driver)
    expected = {
        "loss",  # the fake learner's own metrics
        "batch_tokens",
        "step_cost_s",
        "reward",
        "response_length",
        "staleness_hist",
        "staleness_max",
        "prompt_ids",
        "step_s",
        "sampler_busy_s",
        "sampler_idle_s",
        "learner_busy_s",
        "learner_idle_s",
        "reward_s",
        "sampler_tokens_per_s",
        "learner_tokens_per_s",
        "sampler_occupancy",
        "sync_bytes",
        "sync_s",
        "sync_stage_bytes",
        "buffer",
        "version",
        *COUNTERS,
    }
    assert all(set(m) == expected for m in steps), [sorted(set(m) ^ expected) for m in steps]


def test_surplus_reservations_are_closed():
    # Overprovisioned groups still generating when their buffer fills are aborted; their seats
    # must be closed in the buffer too, or its surplus set grows with every step.
    # eta 0: every seat's deadline is its own buffer, so each version admits more groups than
    # it seats and some always become surplus. Under eta > 0 seats float to the next buffer and
    # whether any becomes surplus depends on the threads' timing (CI once saw none at eta 1).
    driver, learner, _ = _driver(lockstep=False, eta=0, overprovision=3, steps=20)
    _run(driver)
    assert learner.version == 20
    assert driver.counters["surplus_aborted"] > 0
    assert len(driver.buffer.surplus) <= BATCH + 3


class DrawingPrompts(NumberedPrompts):
    """Lets a checkpoint land while the sampler thread is inside ``next()``."""

    def __init__(self):
        super().__init__(BATCH)
        self.inside, self.release = threading.Event(), threading.Event()

    def __next__(self):
        if self.drawn >= 4 * BATCH and not self.inside.is_set():
            self.inside.set()
            self.release.wait(WATCHDOG_S)
        return super().__next__()


def test_checkpoint_reads_data_state_with_the_pending_prompts():
    # A snapshot taken while the sampler draws a batch must see the draw either wholly (data
    # state advanced, prompts pending) or not at all. Reading the iterator outside the
    # driver's lock saw the advanced state without the prompts: they were skipped on resume.
    prompts = DrawingPrompts()
    driver, _, _ = _driver(lockstep=False, eta=2, steps=30, prompts=prompts)
    snaps: list[dict] = []
    runner = threading.Thread(target=_run, args=(driver,))
    runner.start()
    assert prompts.inside.wait(WATCHDOG_S)
    taker = threading.Thread(target=lambda: snaps.append(driver.checkpoint_state()))
    taker.start()
    prompts.release.set()
    taker.join(WATCHDOG_S)
    driver.stop()
    runner.join(WATCHDOG_S)
    (snap,) = snaps
    pending = {e["id"] for e in snap["pending"]}
    buffered = {g["group"]["example"]["id"] for b in snap["buffer"]["buffers"] for g in b["groups"]}
    accounted = pending | buffered
    drawn = snap["data"]["drawn"]
    # Every prompt drawn so far is pending, buffered or consumed (ids below the consumed ones).
    consumed = snap["buffer"]["version"] * BATCH
    assert drawn - consumed == len(accounted)
    assert max(accounted) < drawn
