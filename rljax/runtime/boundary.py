"""The driver's step boundary: work queued for it, and parking the sampler there.

Mixed into :class:`~rljax.runtime.driver.Driver`, which owns the lock (``_cond``), the sampler,
the in-flight requests and the flags used here. A resize (``Run.resize``) runs at this boundary.
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
from rljax.runtime.parts import SamplerPart

# A call queued for the boundary: the function, the event its caller waits on, and the box its
# result or error goes in.
BoundaryCall = tuple[Callable[[], Any], threading.Event, dict[str, Any]]


class SafePoints:
    """``call_at_boundary`` and ``safe_point`` for the driver (see its docstring)."""

    # The driver's, used here.
    sampler: SamplerPart
    clocks: RoleClocks
    counters: collections.Counter[str]
    _cond: threading.Condition
    _stop: threading.Event
    _errors: list[BaseException]
    _inflight: dict[int, Any]
    _boundary_calls: collections.deque[BoundaryCall]
    _running: bool
    _sampler_alive: bool
    _park: bool
    _parked: bool
    on_learner_thread: Callable[[], bool]
    _apply_aborts: Callable[[], None]

    def call_at_boundary(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the learner thread at the next step boundary; wait for its result.

        From the learner thread itself, or when no run is in progress, ``fn`` runs at once. Work
        still queued when the run ends runs then, after the threads have stopped.
        """
        if self.on_learner_thread():
            return fn()
        done = threading.Event()
        box: dict[str, Any] = {}
        with self._cond:  # checked and queued under the lock: run() drains after it stops
            queued = self._running
            if queued:
                self._boundary_calls.append((fn, done, box))
                self._cond.notify_all()
        if not queued:
            return fn()
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _run_boundary_calls(self) -> None:
        while True:
            with self._cond:
                if not self._boundary_calls:
                    return
                fn, done, box = self._boundary_calls.popleft()
            try:
                box["result"] = fn()
            except BaseException as e:  # handed to the waiting caller
                box["error"] = e
            done.set()

    @contextlib.contextmanager
    def safe_point(self) -> Iterator[list[int]]:
        """Park the sampler thread and interrupt every in-flight request.

        Yields the ids of the requests it interrupted (those with samples still generating).
        Call on the learner thread between steps. Inside, nothing touches the sampler but the
        caller: each interrupted request is held with its partial rollout (tokens, log-probs and
        versions so far), and groups already complete or being scored are untouched. On exit the
        held requests are resumed (re-prefilled from their prefixes) and the sampler goes on.
        """
        with self._cond:
            self._park = True
            self._cond.notify_all()
            while self._sampler_alive and not self._parked and not self._errors:
                self._cond.wait(timeout=0.05)
        ids: list[int] = []
        try:
            with self._cond:
                self._apply_aborts()
                ids = list(self._inflight)
            held = {rid: self.sampler.interrupt(rid) for rid in ids}
            self.counters["interrupted_samples"] += sum(held.values())
            yield [rid for rid, n in held.items() if n]
        finally:
            for rid in ids:
                self.sampler.resume(rid)
            with self._cond:
                self._park = False
                self._cond.notify_all()

    def _wait_while_parked(self) -> None:
        with self._cond:
            if not self._park:
                return
            self._parked = True
            self._cond.notify_all()
            start = time.perf_counter()
            while self._park and not self._stop.is_set():
                self._cond.wait(timeout=0.1)
            self._parked = False
        self.clocks.sampler_parked(start, time.perf_counter())


def install_sigterm(handler):
    """Route SIGTERM to ``handler`` (a stop at the next step boundary); returns the previous
    handler, or None off the main thread, where signals cannot be handled."""
    main = threading.current_thread() is threading.main_thread()
    return signal.signal(signal.SIGTERM, handler) if main else None


def restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
