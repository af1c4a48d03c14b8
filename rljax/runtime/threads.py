"""The driver's threaded schedule (mode='async'): a sampler thread and a reward thread beside
the learner (calling) thread.

- the sampler thread admits, reserves seats and generates, and swaps weights between two
  ``generate`` calls; a safe point parks it there (:class:`~rljax.runtime.boundary.SafePoints`);
- the reward thread scores every completed group waiting for it in one call, then places it
  (occupy, or release a seat);
- the learner thread waits for a full buffer (serving a lent replica meanwhile, if the lender
  lends one), consumes it and learns (:class:`rljax.runtime.driver.Driver`).

:class:`ThreadedSchedule` is a part the driver owns: it owns the threads and their errors, and
calls the driver's work through the :class:`DriverWork` the driver hands it. A thread that
fails stops the driver; :meth:`Driver.run` re-raises its error.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable

from rljax.runtime.boundary import SafePoints
from rljax.runtime.clocks import RoleClocks
from rljax.runtime.parts import LearnerPart, LenderPart
from rljax.runtime.rollout import Group

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DriverWork:
    """The driver's work that its threads call; each call takes the driver's lock as it needs.

    Attributes:
      sample: the sampler thread's round: swap weights, admit, generate once; returns the
        groups it completed, or None when the sampler had nothing to generate.
      score: ``score(groups, taken)``: score completed groups in one call and place them, the
        ``taken`` reward-queue items they came from marked done.
      ready: whether the learner's batch is full (called under the lock).
      consume: take the learner's batch out of the buffer (called under the lock).
      learner: the driver's learner now (a resize replaces it).
      stop: stop the driver (a thread failed).
    """

    sample: Callable[[], list[list] | None]
    score: Callable[[list[list], int], None]
    ready: Callable[[], bool]
    consume: Callable[[], list[Group]]
    learner: Callable[[], LearnerPart]
    stop: Callable[[], None]


class ThreadedSchedule:
    """The threads of the driver's threaded schedule, and the learner thread's wait.

    Args:
      work: the driver's work the threads call.
      cond: the driver's lock, which the threads wait on.
      stop: the driver's stop event.
      clocks: the driver's role clocks.
      points: the driver's safe points (the sampler thread parks there).
      rewards: completed groups from the sampler thread to the reward thread (None ends it).
      lender: lends a replica on the learner's chips while it waits, or None.
    """

    def __init__(
        self,
        work: DriverWork,
        *,
        cond: threading.Condition,
        stop: threading.Event,
        clocks: RoleClocks,
        points: SafePoints,
        rewards: queue.Queue,
        lender: LenderPart | None,
    ):
        self._work = work
        self._cond = cond
        self._stop = stop
        self._clocks = clocks
        self._points = points
        self._rewards = rewards
        self._lender = lender
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []  # what the threads raised, first first

    def start(self) -> None:
        """Start the sampler and reward threads."""
        self._threads = [
            threading.Thread(target=self._guard(self._sampler_main), name="sampler", daemon=True),
            threading.Thread(target=self._guard(self._reward_loop), name="rewards", daemon=True),
        ]
        self._points.sampler_starts()
        for t in self._threads:
            t.start()

    def join(self) -> None:
        """End the reward thread's queue and wait for both threads (after a stop)."""
        self._rewards.put(None)
        for t in self._threads:
            t.join()

    # -- the sampler and reward threads -------------------------------------------------------

    def _sampler_loop(self) -> None:
        while not self._stop.is_set():
            self._points.wait_while_parked(self._stop.is_set)
            done = self._work.sample()
            if done is not None:
                for trajs in done:
                    self._rewards.put(trajs)
            else:
                start = time.perf_counter()
                with self._cond:
                    self._cond.wait(timeout=0.05)
                self._clocks.sampler_wait(start, time.perf_counter())

    def _sampler_main(self) -> None:
        try:
            self._sampler_loop()
        finally:
            self._points.sampler_ends()

    def _reward_loop(self) -> None:
        while True:
            items = [self._rewards.get()]
            while items[-1] is not None and not self._rewards.empty():
                items.append(self._rewards.get_nowait())  # every group waiting: one call
            done = [trajs for trajs in items if trajs is not None]
            self._work.score(done, len(done))
            if items[-1] is None:
                return

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # surfaced by run() on the learner thread
                # Logged at once too: on a pod the learner thread may be inside a collective
                # that waits for the work this thread would have done, and never get to raise.
                log.exception("the driver's %s thread failed", threading.current_thread().name)
                self.errors.append(e)
                self._work.stop()

        return run

    # -- the learner thread -------------------------------------------------------------------

    def next_batch(self) -> list[Group] | None:
        """Wait for the learner's batch and consume it (None: stopped, or a thread failed)."""
        start = time.perf_counter()
        if self._lender is not None:
            self._lender.waiting(self._work.learner())
        try:
            with self._cond:
                while not self._work.ready():
                    if self._stop.is_set() or self.errors:
                        return None
                    if not self._serve_lent():
                        self._cond.wait(timeout=0.1)
                groups = self._work.consume()
                self._cond.notify_all()
        finally:
            if self._lender is not None:  # its requests go back to the sampler before the step
                self._lender.ready()
        self._clocks.learner_wait(start, time.perf_counter())
        return groups

    def _serve_lent(self) -> bool:
        """One generate on a replica lent on the learner's chips, outside the lock (held)."""
        if self._lender is None:
            return False
        self._cond.release()
        try:
            return self._lender.serve()
        finally:
            self._cond.acquire()
            self._cond.notify_all()  # the sampler thread collects what it finished
