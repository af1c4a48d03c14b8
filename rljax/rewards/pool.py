"""RewardPool: scores completions with a verifier on worker threads or processes.

A verifier is untrusted code as far as the training loop is concerned: it may raise, hang, or
return garbage. The pool turns every such failure into reward 0.0 plus a counter in
:attr:`RewardPool.stats`, so the caller never crashes and never waits longer than
``timeout_s`` per completion.

How a hang is handled depends on ``mode``:

* ``"thread"`` (default; cheapest, and the only choice for closures and lambdas): Python
  cannot kill a thread. When a call overruns ``timeout_s`` the pool *abandons* that worker
  thread (it is told to exit as soon as the call returns, and its late result is dropped) and
  starts a fresh thread in its place, so capacity is restored at once. An abandoned thread that
  never returns leaks, and if it spins it still competes for the GIL; ``stats.abandoned``
  counts them. Use process mode for verifiers that can loop forever.
* ``"process"``: each worker is a spawned child process. An overrunning child is killed and
  replaced, so nothing leaks. ``fn`` must be picklable (a module-level function). Each child
  reports ready before it takes work, so its start-up time never counts against ``timeout_s``.
  Children are spawned (forking a process that holds a JAX runtime is unsafe), so a script
  that builds a process-mode pool needs the ``if __name__ == "__main__":`` guard.

Timeouts run from the moment a worker starts a completion, not from submission, so a long
queue never turns into spurious timeouts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import multiprocessing
import numbers
import pickle
import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

_LOG = logging.getLogger(__name__)
_MODES = ("thread", "process")
# A spawned child imports the verifier's module; allow for a slow import before giving up.
_PROCESS_START_TIMEOUT_S = 120.0
_LOGGED_FAILURES = 10


@dataclasses.dataclass(frozen=True)
class RewardStats:
    """Counters since the pool was created. The failure counters are disjoint.

    Attributes:
      calls: completions scored (successes and failures).
      errors: calls that raised, returned a non-number, or whose worker process died.
      timeouts: calls that overran ``timeout_s``.
      nans: calls that returned NaN or +-inf.
      abandoned: hung worker threads left behind (thread mode only).
      restarts: worker processes killed or found dead and replaced (process mode only).
      last_error: a one-line description of the most recent failure, or "".
    """

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    nans: int = 0
    abandoned: int = 0
    restarts: int = 0
    last_error: str = ""

    @property
    def failures(self) -> int:
        """All calls that were scored 0.0 because of a failure."""
        return self.errors + self.timeouts + self.nans


def _run_verifier(fn, completion, example) -> tuple[str, object]:
    try:
        return "ok", fn(completion, example)
    except BaseException as exc:  # noqa: BLE001 - any failure of the verifier becomes a 0.0.
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


class _ThreadRunner:
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


class _ProcessRunner:
    """Runs calls in one spawned child process; kills and restarts it on a hang or crash."""

    def __init__(self, fn, on_restart: Callable[[], None]):
        self._fn = fn
        self._on_restart = on_restart
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
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
            if self._conn.poll(_PROCESS_START_TIMEOUT_S):
                self._conn.recv()
                self._ready = True
                return None
            return f"worker process did not start within {_PROCESS_START_TIMEOUT_S:.0f}s"
        except (EOFError, OSError) as exc:
            return f"worker process died while starting ({type(exc).__name__})"

    def _restart(self) -> None:
        self._kill()
        self._on_restart()
        self._start()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
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


class _Batch:
    """Collects the rewards of one submit() call and resolves its future when complete."""

    def __init__(self, size: int):
        self.rewards = np.zeros(size, dtype=np.float32)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._remaining = size
        self._lock = threading.Lock()
        if size == 0:
            self.future.set_result(self.rewards)

    def set(self, index: int, reward: float) -> None:
        self.rewards[index] = reward
        with self._lock:
            self._remaining -= 1
            done = self._remaining == 0
        if done:
            self.future.set_result(self.rewards)


class RewardPool:
    """Scores ``fn(completion, example) -> float`` for many completions in parallel.

    Args:
      fn: the verifier, e.g. ``rljax.rewards.get_reward("math_answer")``.
      num_workers: number of calls that run at once.
      timeout_s: longest a single call may run before it scores 0.0 as a timeout.
      mode: ``"thread"`` or ``"process"``; see the module docstring for the trade-off.
    """

    def __init__(
        self,
        fn: Callable[[str, dict], float],
        *,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        mode: str = "thread",
    ):
        if not callable(fn):
            raise TypeError(f"RewardPool needs a callable verifier, got {type(fn).__name__}.")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a positive int.")
        if not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds.")
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r} is not supported; use one of {list(_MODES)}.")
        if mode == "process":
            try:
                pickle.dumps(fn)
            except Exception as exc:
                raise ValueError(
                    f"RewardPool(mode='process') needs a picklable verifier, and "
                    f"{getattr(fn, '__qualname__', fn)!r} is not ({type(exc).__name__}); "
                    "define it at module level or use mode='thread'."
                ) from None
        self._fn = fn
        self._timeout_s = float(timeout_s)
        self._mode = mode
        self._lock = threading.Lock()
        self._stats = RewardStats()
        self._failures_logged = 0
        self._closed = False
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._dispatchers = [
            threading.Thread(target=self._dispatch, name=f"rljax-reward-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for thread in self._dispatchers:
            thread.start()

    @property
    def stats(self) -> RewardStats:
        """A snapshot of the counters."""
        with self._lock:
            return self._stats

    def _bump(self, **deltas) -> None:
        with self._lock:
            changes = {k: getattr(self._stats, k) + v for k, v in deltas.items()}
            self._stats = dataclasses.replace(self._stats, **changes)

    def _make_runner(self):
        if self._mode == "thread":
            return _ThreadRunner(self._fn, on_abandon=lambda: self._bump(abandoned=1))
        return _ProcessRunner(self._fn, on_restart=lambda: self._bump(restarts=1))

    def _dispatch(self) -> None:
        runner = None
        try:
            while (task := self._tasks.get()) is not None:
                batch, index, completion, example = task
                try:
                    if runner is None:
                        runner = self._make_runner()
                    status, value = runner.run(completion, example, self._timeout_s)
                except Exception as exc:  # noqa: BLE001 - a broken worker must not hang callers.
                    # Drop the runner; the next task builds a fresh one.
                    runner = None
                    status, value = "error", f"reward worker failed: {type(exc).__name__}: {exc}"
                batch.set(index, self._to_reward(status, value))
        finally:
            if runner is not None:
                runner.close()

    def _to_reward(self, status: str, value: object) -> float:
        """Validates one result; every failure becomes 0.0 and bumps one counter."""
        if status == "timeout":
            return self._fail("timeouts", f"verifier exceeded timeout_s={self._timeout_s}")
        if status != "ok":
            return self._fail("errors", str(value))
        is_scalar_array = isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0
        if not (isinstance(value, numbers.Real) or is_scalar_array):
            return self._fail("errors", f"verifier returned {type(value).__name__}, not a float")
        try:
            reward = float(value)
        except (TypeError, ValueError) as exc:
            return self._fail("errors", f"verifier returned a non-float: {exc}")
        if not math.isfinite(reward):
            return self._fail("nans", f"verifier returned {reward}")
        self._bump(calls=1)
        return reward

    def _fail(self, counter: str, message: str) -> float:
        with self._lock:
            self._stats = dataclasses.replace(
                self._stats,
                calls=self._stats.calls + 1,
                last_error=message,
                **{counter: getattr(self._stats, counter) + 1},
            )
            should_log = self._failures_logged < _LOGGED_FAILURES
            self._failures_logged += 1
        if should_log:
            _LOG.warning("Reward scored 0.0 (%s): %s", counter, message)
        return 0.0

    def submit(
        self, completions: Sequence[str], examples: Sequence[dict]
    ) -> concurrent.futures.Future:
        """Queues completions for scoring; the future resolves to a float32 array of rewards."""
        if isinstance(completions, str):
            raise TypeError("completions must be a list of strings, got a single str.")
        if len(completions) != len(examples):
            raise ValueError(
                f"Got {len(completions)} completions but {len(examples)} examples; pass one "
                "example per completion (repeat each prompt's example for its group)."
            )
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardPool is closed; create a new pool to score more.")
            batch = _Batch(len(completions))
            for index, (completion, example) in enumerate(zip(completions, examples)):
                self._tasks.put((batch, index, completion, example))
        return batch.future

    def score(self, completions: Sequence[str], examples: Sequence[dict]) -> np.ndarray:
        """Scores completions, blocking until done; returns float32 rewards, 0.0 on failure."""
        return self.submit(completions, examples).result()

    def close(self) -> None:
        """Finishes queued work, then stops the workers. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._dispatchers:
                self._tasks.put(None)
        for thread in self._dispatchers:
            thread.join()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
