"""The driver's safe point with fakes: the sampler parked, nothing lost, requests resumed."""

from __future__ import annotations

import threading
import time

import numpy as np

from rljax.testing.drivers import fake_driver, run_with_watchdog
from rljax.testing.fakes import (
    FakeLearner,
    FakeSampler,
    FakeWeightSync,
    constant_cost,
    lognormal_lengths,
)


def test_driver_safe_point_parks_the_sampler_and_loses_nothing():
    eta, batch, group, steps = 1, 2, 3, 8
    consumed, boundaries, paused = [], [], []  # consumed: request ids
    learner = FakeLearner(constant_cost(0.001))
    weight_sync = FakeWeightSync()
    sampler = FakeSampler(
        slots=6,
        step_cost_s=constant_cost(0.002),  # slower than the learner: requests stay in flight
        length_sampler=lognormal_lengths(20, 0.5, 60),
        params=learner.params,
    )

    def on_boundary(step):
        latest = weight_sync.acquire()
        boundaries.append((step, learner.version, None if latest is None else latest[1]))
        if step % 3 == 1:
            with driver.safe_point() as ids:
                before = sampler.stats["steps"]
                time.sleep(0.03)  # a parked sampler thread takes no step meanwhile
                paused.append((ids, sampler.has_work(), sampler.stats["steps"] - before))

    driver, record = fake_driver(
        sampler=sampler,
        learner=learner,
        group_size=group,
        batch_groups=batch,
        num_steps=steps,
        score=lambda trajs: np.arange(len(trajs), dtype=float),
        eta=eta,
        max_concurrent=2,
        prompt=(1, 2),
        weight_sync=weight_sync,
        on_batch=lambda groups: consumed.extend(g.request_id for g in groups),
        on_boundary=on_boundary,
    )
    seen = {}

    def from_another_thread():
        while not driver.running:
            time.sleep(0.001)
        seen["result"] = driver.call_at_boundary(
            lambda: (driver.on_learner_thread(), learner.version, weight_sync.acquire())
        )

    caller = threading.Thread(target=from_another_thread)
    caller.start()
    try:
        run_with_watchdog(driver, 30.0)
    finally:
        caller.join()
    staleness, dispatched = record.staleness, list(record.dispatched)

    # The boundary comes after each step and before its weights are published.
    assert [b[:2] for b in boundaries] == [(s, s + 1) for s in range(steps)]
    assert all(latest in (None, step) for step, _, latest in boundaries)
    on_learner, version, latest = seen["result"]
    assert on_learner and (latest is None if version == 1 else latest[1] == version - 1)

    # Inside the safe point the sampler holds nothing in its slots and takes no step.
    assert len(paused) == 3
    assert all(not has_work and took == 0 for _, has_work, took in paused)
    assert driver.counters["interrupted_samples"] > 0
    # Interrupted requests resumed: every batch full, nothing lost or duplicated.
    assert len(consumed) == steps * batch == len(set(consumed))
    assert max(staleness) <= eta
    assert consumed == sorted(consumed[:batch]) + consumed[batch:]  # a batch is in id order
    held = {
        item["request_id"]
        for b in driver.buffer.state_dict()["buffers"]
        for item in b["groups"] + b["reservations"]
    }
    assert set(dispatched) == set(consumed) | held and not set(consumed) & held
    assert dispatched == list(range(len(dispatched)))  # ids are spent only on granted seats
