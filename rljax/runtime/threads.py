"""The driver's threaded schedule (mode='async'): a sampler thread and a reward thread beside
the learner (calling) thread.

- the sampler thread admits, reserves seats and generates, and swaps weights between two
  ``generate`` calls;
- the reward thread scores every completed group waiting for it in one call, then places it
  (occupy, or release a seat);
- the learner thread waits for a full buffer (serving a lent replica meanwhile, if the lender
  lends one), consumes it and learns (:class:`rljax.runtime.driver.Driver`).

A thread that fails stops the driver; :meth:`Driver.run` re-raises its error.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from rljax.policy.staleness import StalenessBuffer
from rljax.runtime.clocks import RoleClocks
from rljax.runtime.parts import LearnerPart, LenderPart, SamplerPart
from rljax.runtime.rollout import Group

log = logging.getLogger(__name__)


class ThreadedSchedule:
    """The threads of :class:`~rljax.runtime.driver.Driver`'s threaded schedule."""

    # The driver's, used here.
    sampler: SamplerPart
    learner: LearnerPart
    buffer: StalenessBuffer
    clocks: RoleClocks
    _cond: threading.Condition
    _stop: threading.Event
    _errors: list[BaseException]
    _rewards_q: queue.Queue
    _lender: LenderPart | None
    _sampler_alive: bool

    stop: Callable[[], None]
    _wait_while_parked: Callable[[], None]
    _swap_weights: Callable[[], None]
    _dispatch: Callable[[], int]
    _generate: Callable[[], list[list]]
    _score_and_place: Callable[..., None]
    _consume: Callable[[], list[Group]]

    def _sampler_loop(self) -> None:
        while not self._stop.is_set():
            self._wait_while_parked()
            self._swap_weights()
            self._dispatch()
            if self.sampler.has_work():
                for trajs in self._generate():
                    self._rewards_q.put(trajs)
            else:
                start = time.perf_counter()
                with self._cond:
                    self._cond.wait(timeout=0.05)
                self.clocks.sampler_wait(start, time.perf_counter())

    def _sampler_main(self) -> None:
        self._sampler_alive = True
        try:
            self._sampler_loop()
        finally:
            with self._cond:
                self._sampler_alive = False
                self._cond.notify_all()

    def _reward_loop(self) -> None:
        while True:
            items = [self._rewards_q.get()]
            while items[-1] is not None and not self._rewards_q.empty():
                items.append(self._rewards_q.get_nowait())  # every group waiting: one call
            done = [trajs for trajs in items if trajs is not None]
            self._score_and_place(done, taken=len(done))
            if items[-1] is None:
                return

    def _threaded_batch(self) -> list[Group] | None:
        start = time.perf_counter()
        if self._lender is not None:
            self._lender.waiting(self.learner)
        try:
            with self._cond:
                while not self.buffer.ready(self.learner.version):
                    if self._stop.is_set() or self._errors:
                        return None
                    if not self._serve_lent():
                        self._cond.wait(timeout=0.1)
                groups = self._consume()
                self._cond.notify_all()
        finally:
            if self._lender is not None:  # its requests go back to the sampler before the step
                self._lender.ready()
        self.clocks.learner_wait(start, time.perf_counter())
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

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run():
            try:
                fn()
            except BaseException as e:  # surfaced by run() on the learner thread
                # Logged at once too: on a pod the learner thread may be inside a collective
                # that waits for the work this thread would have done, and never get to raise.
                log.exception("the driver's %s thread failed", threading.current_thread().name)
                self._errors.append(e)
                self.stop()

        return run
