"""The driver's step boundary: work queued for it, and parking the sampler thread there.

:class:`SafePoints` is a part the :class:`~rljax.runtime.driver.Driver` owns. It owns the calls
queued for the boundary and the parking handshake with the sampler thread; the driver passes it
the lock its threads share and asks it to park the sampler at a safe point
(:meth:`Driver.safe_point`, where a resize, ``Run.resize``, runs).
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rljax.runtime.clocks import RoleClocks

# A call queued for the boundary: the function, the event its caller waits on, and the box its
# result or error goes in.
BoundaryCall = tuple[Callable[[], Any], threading.Event, dict[str, Any]]


class SafePoints:
    """Calls run at the learner's step boundary, and the sampler thread parked there.

    Args:
      cond: the driver's lock (its threads wait on it); ``running()`` is read under it.
      clocks: where the sampler's parked time is recorded.
      running: whether the driver's ``run`` is in progress (it drains the queue when it ends).
      on_learner_thread: whether the caller is the thread running the driver's ``run``.
      failed: whether one of the driver's threads failed (a safe point stops waiting for it).
    """

    def __init__(
        self,
        cond: threading.Condition,
        clocks: RoleClocks,
        *,
        running: Callable[[], bool],
        on_learner_thread: Callable[[], bool],
        failed: Callable[[], bool],
    ):
        self._cond = cond
        self._clocks = clocks
        self._running = running
        self._on_learner_thread = on_learner_thread
        self._failed = failed
        self._calls: collections.deque[BoundaryCall] = collections.deque()
        self._sampler_alive = False  # a sampler thread runs that a safe point must park
        self._park = False  # the learner asks the sampler thread to stop between generates
        self._parked = False

    # -- calls at the boundary ----------------------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the learner thread at the next step boundary; wait for its result.

        From the learner thread itself, or when no run is in progress, ``fn`` runs at once. Work
        still queued when the run ends runs then, after the threads have stopped.
        """
        if self._on_learner_thread():
            return fn()
        done = threading.Event()
        box: dict[str, Any] = {}
        with self._cond:  # checked and queued under the lock: run() drains after it stops
            queued = self._running()
            if queued:
                self._calls.append((fn, done, box))
                self._cond.notify_all()
        if not queued:
            return fn()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def run_calls(self) -> None:
        """Run every queued call (on the learner thread, at the boundary or when ``run`` ends)."""
        while True:
            with self._cond:
                if not self._calls:
                    return
                fn, done, box = self._calls.popleft()
            try:
                box["result"] = fn()
            except BaseException as e:  # handed to the waiting caller
                box["error"] = e
            done.set()

    # -- parking the sampler thread -----------------------------------------------------------

    def sampler_starts(self) -> None:
        """A sampler thread is about to start: safe points from now on wait for it to park."""
        with self._cond:
            self._sampler_alive = True

    def sampler_ends(self) -> None:
        """The sampler thread is done: nothing is left to park (called on that thread)."""
        with self._cond:
            self._sampler_alive = False
            self._cond.notify_all()

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """Hold the sampler thread between two ``generate`` calls until the block exits.

        Returns at once without a sampler thread (the lock-step schedule), and stops waiting if
        a thread failed.
        """
        with self._cond:
            self._park = True
            self._cond.notify_all()
            while self._sampler_alive and not self._parked and not self._failed():
                self._cond.wait(timeout=0.05)
        try:
            yield
        finally:
            with self._cond:
                self._park = False
                self._cond.notify_all()

    def wait_while_parked(self, stopped: Callable[[], bool]) -> None:
        """The sampler thread, between two ``generate`` calls: wait here while a safe point
        holds it (or until ``stopped()``)."""
        with self._cond:
            if not self._park:
                return
            self._parked = True
            self._cond.notify_all()
            start = time.perf_counter()
            while self._park and not stopped():
                self._cond.wait(timeout=0.1)
            self._parked = False
        self._clocks.sampler_parked(start, time.perf_counter())


def install_sigterm(handler: Any) -> Any:
    """Route SIGTERM to ``handler`` (a stop at the next step boundary); returns the previous
    handler, or None off the main thread, where signals cannot be handled."""
    main = threading.current_thread() is threading.main_thread()
    return signal.signal(signal.SIGTERM, handler) if main else None


def restore_sigterm(previous: Any) -> None:
    """Put back the SIGTERM handler :func:`install_sigterm` replaced."""
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
