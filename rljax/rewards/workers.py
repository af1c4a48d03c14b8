"""Where a verifier call runs: one worker thread or one spawned process per pool worker.

:class:`rljax.rewards.pool.RewardPool` owns the policy (validation, counters, what a failure
scores); a runner only executes ``fn(completion, example)`` (or the batched
``fn(completions, examples)``) and reports ``(status, value)``: ``("ok", result)``,
``("error", message)`` or ``("timeout", None)``. See the pool's module docstring for how each
mode handles a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import threading
from collections.abc import Callable

# A spawned child imports the verifier's module; allow for a slow import before giving up.
PROCESS_START_TIMEOUT_S = 120.0


def _run_verifier(fn, completion, example) -> tuple[str, object]:
    try:
        return "ok", fn(completion, example)
    except BaseException as exc:  # noqa: BLE001 - any failure of the verifier is reported.
        return "error", f"{type(exc).__name__}: {exc}"


def _thread_worker(fn, inbox: queue.SimpleQueue, outbox: queue.SimpleQueue) -> None:
    while (item := inbox.get()) is not None:
        outbox.put(_run_verifier(fn, *item))


def _process_worker(fn, conn) -> None:
    """Child-process loop: receive (completion, example), send (status, value)."""
    conn.send(("ready", None))
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        status, value = _run_verifier(fn, *item)
        try:
            conn.send((status, value))
        except Exception as exc:  # noqa: BLE001 - pickling can fail many ways.
            conn.send(("error", f"result of type {type(value).__name__} is not picklable: {exc}"))


class ThreadRunner:
    """Runs calls on one worker thread; replaces the thread when a call hangs."""

    def __init__(self, fn, on_abandon: Callable[[], None]):
        self._fn = fn
        self._on_abandon = on_abandon
        self._start()

    def _start(self) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(
            target=_thread_worker,
            args=(self._fn, self._inbox, self._outbox),
            name="rljax-reward-thread",
            daemon=True,
        ).start()

    def run(self, completion, example, timeout_s: float) -> tuple[str, object]:
        self._inbox.put((completion, example))
        try:
            return self._outbox.get(timeout=timeout_s)
        except queue.Empty:
            # Tell the hung thread to exit once its call returns; its result goes to an
            # outbox nobody reads. A fresh thread takes over this runner's work.
            self._inbox.put(None)
            self._on_abandon()
            self._start()
            return "timeout", None

    def close(self) -> None:
        self._inbox.put(None)


class ProcessRunner:
    """Runs calls in one spawned child process; kills and restarts it on a hang or crash."""

    def __init__(self, fn, on_restart: Callable[[], None]):
        self._fn = fn
        self._on_restart = on_restart
        self._ctx = multiprocessing.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self._conn, child_conn = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=_process_worker,
            args=(self._fn, child_conn),
            name="rljax-reward-process",
            daemon=True,
        )
        self._proc.start()
        child_conn.close()
        self._ready = False

    def _wait_ready(self) -> str | None:
        if self._ready:
            return None
        try:
            if self._conn.poll(PROCESS_START_TIMEOUT_S):
                self._conn.recv()
                self._ready = True
                return None
            return f"worker process did not start within {PROCESS_START_TIMEOUT_S:.0f}s"
        except (EOFError, OSError) as exc:
            return f"worker process died while starting ({type(exc).__name__})"

    def _restart(self) -> None:
        self._kill()
        self._on_restart()
        self._start()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5.0)
        self._conn.close()

    def run(self, completion, example, timeout_s: float) -> tuple[str, object]:
        problem = self._wait_ready()
        if problem is not None:
            self._restart()
            return "error", problem
        try:
            self._conn.send((completion, example))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            return "error", f"completion/example is not picklable: {exc}"
        except OSError as exc:
            self._restart()
            return "error", f"worker process is gone ({type(exc).__name__})"
        try:
            if not self._conn.poll(timeout_s):
                self._restart()
                return "timeout", None
            return self._conn.recv()
        except (EOFError, OSError):
            exitcode = self._proc.exitcode
            self._restart()
            return "error", f"worker process died (exit code {exitcode})"

    def close(self) -> None:
        # The child may already be dead; killing it below is all that is left to do.
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(timeout=2.0)
        self._kill()
