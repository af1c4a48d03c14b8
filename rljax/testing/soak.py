"""Overload and soak harness: the real Driver over fake engines, every host queue measured.

A fast sampler in front of a slow learner must not grow host memory: the driver's admission
(:class:`~rljax.policy.staleness.StalenessController`, the buffer's seats and the slot gate of
:mod:`rljax.policy.routing`) holds every queue to a bound that follows from the config alone.
:func:`queue_lengths` reads each queue; :func:`queue_bounds` gives its bound; a
:class:`QueueProbe` keeps the maximum of each over a run. ``scripts/soak.py`` and
``tests/runtime/test_overload.py`` drive it.

The queues (bounds for the threaded schedule; lock-step is tighter):

==================  ===========================================================================
``buffer_groups``   groups held in the staleness buffer: at most ``(eta + 1) * B``
``reserved``        seats reserved for groups in flight: at most ``max_concurrent``
``surplus``         reservations told to abort, not yet closed: at most ``(eta + 1) * k``
``inflight``        the driver's prompts of requests in flight: at most ``max_concurrent``
``ready_prompts``   prompts drawn but not yet dispatched: one prompt chunk (or the requeue)
``sampler_queue``   samples waiting for a decode slot: at most ``slots + G``
``sampler_live``    requests the sampler holds: at most ``max_concurrent + surplus``
``rewards_queue``   completed groups waiting for the reward thread: at most the live requests
``partial``         groups with some samples finished: at most the live requests
``aborts``          surplus aborts not yet applied: at most the surplus bound
``timeline``        trace spans kept: the Timeline's ``maxlen``
``sync_history``    weight publishes kept: ``rljax.mesh.weight_sync.HISTORY``
``threads``         live Python threads: the threads before the run + sampler + rewards
==================  ===========================================================================
"""

from __future__ import annotations

import threading
from typing import Any

from rljax.mesh.weight_sync import HISTORY

QUEUES = (
    "buffer_groups",
    "reserved",
    "surplus",
    "inflight",
    "ready_prompts",
    "sampler_queue",
    "sampler_live",
    "rewards_queue",
    "partial",
    "aborts",
    "timeline",
    "sync_history",
    "threads",
)


def queue_lengths(driver) -> dict[str, int]:
    """The length of every host queue of ``driver`` now, read under its lock.

    The sampler must report ``queued_samples``; ``sampler_live`` is read from a
    :class:`~rljax.testing.fakes.FakeSampler`'s live set (0 for other samplers).
    """
    with driver._cond:
        rows = driver.buffer.snapshot()
        return {
            "buffer_groups": sum(r["occupied"] for r in rows),
            "reserved": driver.buffer.num_pending,
            "surplus": len(driver.buffer.surplus),
            "inflight": len(driver._inflight),
            "ready_prompts": len(driver._ready_prompts),
            "sampler_queue": driver.sampler.queued_samples,
            "sampler_live": len(getattr(driver.sampler, "_live", ())),
            "rewards_queue": driver._rewards_q.qsize(),
            "partial": len(driver._partial),
            "aborts": len(driver._aborts),
            "timeline": driver.timeline.num_events,
            "sync_history": len(driver.weight_sync.history),
            "threads": threading.active_count(),
        }


def queue_bounds(driver, *, prompt_chunk: int, threads_before: int) -> dict[str, int]:
    """The bound of every queue in :func:`queue_lengths`, from the driver's config alone.

    Args:
      driver: a :class:`~rljax.runtime.driver.Driver` (its buffer, controller, sampler).
      prompt_chunk: prompts per ``next()`` of the driver's prompt iterator.
      threads_before: ``threading.active_count()`` before ``driver.run`` started.
    """
    buffer, controller = driver.buffer, driver.controller
    eta, b, k = buffer.max_staleness, buffer.batch_groups, buffer.overprovision
    g = driver.group_size
    concurrent = b + k if driver.lockstep else controller.max_concurrent
    surplus = (eta + 1) * k
    live = concurrent + surplus
    return {
        "buffer_groups": (eta + 1) * b,
        "reserved": concurrent,
        "surplus": surplus,
        "inflight": concurrent,
        "ready_prompts": max(prompt_chunk, len(driver._ready_prompts)),
        # Lock-step submits its whole batch at once; threaded admission waits for a free slot.
        "sampler_queue": concurrent * g if driver.lockstep else driver.sampler.num_slots + g,
        "sampler_live": live,
        "rewards_queue": live,
        "partial": live,
        "aborts": surplus,
        "timeline": driver.timeline.max_events,
        "sync_history": HISTORY,
        "threads": threads_before + (0 if driver.lockstep else 2),
    }


class QueueProbe:
    """Keeps the maximum of every queue over the samples it is given, and a few snapshots.

    Call :meth:`sample` from any thread (the fakes' ``step`` is a good place: once per decode
    step and once per learner step).
    """

    def __init__(self, driver: Any = None) -> None:
        self.driver = driver
        self.peak: dict[str, int] = dict.fromkeys(QUEUES, 0)
        self.samples = 0
        self._lock = threading.Lock()

    def sample(self) -> dict[str, int]:
        lengths = queue_lengths(self.driver)
        with self._lock:
            self.samples += 1
            for key, value in lengths.items():
                self.peak[key] = max(self.peak[key], value)
        return lengths

    def over(self, bounds: dict[str, int]) -> dict[str, Any]:
        """``{queue: (peak, bound)}`` for every queue whose peak exceeds its bound."""
        with self._lock:
            return {k: (self.peak[k], bounds[k]) for k in QUEUES if self.peak[k] > bounds[k]}
