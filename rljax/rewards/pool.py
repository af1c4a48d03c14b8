"""RewardPool: scores completions with a verifier on worker threads or processes.

A verifier is untrusted code as far as the training loop is concerned: it may raise, hang, or
return garbage. The pool isolates every such failure, counts it by kind in
:attr:`RewardPool.stats`, and scores the failed completion as ``on_failure`` says, so the
caller never crashes and never waits longer than ``timeout_s`` per call. The kinds
(:data:`FAILURE_KINDS`) are:

* ``raised``: the call raised (or its worker process died, or its input or result could not be
  pickled), or a batched verifier returned an exception in a completion's place;
* ``timeout``: the call overran ``timeout_s``;
* ``nan`` / ``inf``: it returned NaN or +-inf;
* ``type``: it returned something that is not a real number (a string, None, a list; for a
  batched verifier, something that is not a sequence of numbers);
* ``count``: a batched verifier returned a sequence of the wrong length.

Counts are completions, so a batched call that fails counts once per completion it held.

``on_failure`` decides what a failed completion scores: ``"zero"`` (0.0, the group trains
with it) or ``"drop"`` (NaN, which the driver reads as "drop this group": it releases the
group's seat and counts it in ``dropped_reward_failure``; see ``rljax.runtime.driver``).

A verifier is per completion, ``fn(completion, example) -> float``, or, with ``batched=True``,
per call, ``fn(completions, examples) -> sequence of floats`` over everything one
:meth:`RewardPool.submit` holds (the driver submits the groups waiting for its reward thread when
threaded, one step's groups when lock-step); ``timeout_s`` then bounds the whole call. A batched
verifier fails one completion alone by returning an exception in its place (counted as
``raised``, its message the ``last_error``): a judge's unparsable verdict fails its completion,
not the batch (``rljax.rewards.judge``).

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

Timeouts run from the moment a worker starts a call, not from submission, so a long queue
never turns into spurious timeouts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import math
import numbers
import pickle
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import SupportsFloat, cast

import numpy as np

from rljax.rewards.workers import ProcessRunner, ThreadRunner

_LOG = logging.getLogger(__name__)
_MODES = ("thread", "process")
ON_FAILURE = ("zero", "drop")
FAILURE_KINDS = ("raised", "timeout", "nan", "inf", "type", "count")
_LOGGED_FAILURES = 10


@dataclasses.dataclass(frozen=True)
class RewardStats:
    """Counters since the pool was created, in completions. The failure counters are disjoint.

    Attributes:
      calls: completions scored (successes and failures).
      raised: the verifier raised, its worker process died, or pickling failed.
      timeouts: the call overran ``timeout_s``.
      nans: the verifier returned NaN.
      infs: the verifier returned +-inf.
      wrong_types: the verifier returned something that is not a real number.
      wrong_counts: a batched verifier returned the wrong number of rewards.
      abandoned: hung worker threads left behind (thread mode only; in calls, not completions).
      restarts: worker processes killed or found dead and replaced (process mode only).
      last_error: a one-line description of the most recent failure, or "".
    """

    calls: int = 0
    raised: int = 0
    timeouts: int = 0
    nans: int = 0
    infs: int = 0
    wrong_types: int = 0
    wrong_counts: int = 0
    abandoned: int = 0
    restarts: int = 0
    last_error: str = ""

    @property
    def errors(self) -> int:
        """Completions whose call raised or returned the wrong type or count."""
        return self.raised + self.wrong_types + self.wrong_counts

    @property
    def failures(self) -> int:
        """All completions scored as failures (0.0 or NaN, as ``on_failure`` says)."""
        return sum(self.by_kind().values())

    def by_kind(self) -> dict[str, int]:
        """``{kind: count}`` for every kind in :data:`FAILURE_KINDS`."""
        return {kind: getattr(self, field) for kind, field in _FIELDS.items()}


# Failure kind -> RewardStats field.
_FIELDS = {
    "raised": "raised",
    "timeout": "timeouts",
    "nan": "nans",
    "inf": "infs",
    "type": "wrong_types",
    "count": "wrong_counts",
}


def failure_metrics(counts: Mapping[str, int]) -> dict[str, int]:
    """The metric keys of reward failures: ``reward_errors`` (all) and ``reward_errors/<kind>``.

    Args:
      counts: failures by kind (:meth:`RewardStats.by_kind`, maybe summed over processes);
        missing kinds count 0, unknown kinds are refused.
    """
    unknown = sorted(set(counts) - set(FAILURE_KINDS))
    if unknown:
        raise ValueError(f"unknown reward failure kinds {unknown}; use {list(FAILURE_KINDS)}")
    out = {"reward_errors": int(sum(counts.values()))}
    out.update({f"reward_errors/{k}": int(counts.get(k, 0)) for k in FAILURE_KINDS})
    return out


def _positive_real(x: object) -> bool:
    # Typed as object: mypy holds float and numbers.Real disjoint, and would skip the code after
    # an isinstance check of a float-typed argument as unreachable.
    return isinstance(x, numbers.Real) and float(x) > 0


def _check_value(value: object) -> tuple[float, str | None, str]:
    """(reward, failure kind or None, message) for one value a verifier returned."""
    if isinstance(value, BaseException):  # a batched verifier's failure of one completion
        return 0.0, "raised", f"{type(value).__name__}: {value}"
    is_scalar_array = isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0
    if not (isinstance(value, numbers.Real) or is_scalar_array):
        return 0.0, "type", f"verifier returned {type(value).__name__}, not a float"
    try:
        reward = float(cast(SupportsFloat, value))  # a real number or a 0-d array, as checked
    except (TypeError, ValueError) as exc:
        return 0.0, "type", f"verifier returned a non-float: {exc}"
    if math.isnan(reward):
        return 0.0, "nan", "verifier returned nan"
    if math.isinf(reward):
        return 0.0, "inf", f"verifier returned {reward}"
    return reward, None, ""


class _Batch:
    """Collects the rewards of one submit() call and resolves its future when complete."""

    def __init__(self, size: int):
        self.rewards = np.zeros(size, dtype=np.float32)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._remaining = size
        self._lock = threading.Lock()
        if size == 0:
            self.future.set_result(self.rewards)

    def set(self, start: int, rewards: np.ndarray) -> None:
        self.rewards[start : start + len(rewards)] = rewards
        with self._lock:
            self._remaining -= len(rewards)
            done = self._remaining == 0
        if done:
            self.future.set_result(self.rewards)


class RewardPool:
    """Scores ``fn(completion, example) -> float`` for many completions in parallel.

    Args:
      fn: the verifier, e.g. ``rljax.rewards.get_reward("math_answer")``; with ``batched``,
        ``fn(completions, examples) -> sequence of floats``.
      num_workers: number of calls that run at once.
      timeout_s: longest a single call may run before its completions fail as a timeout.
      mode: ``"thread"`` or ``"process"``; see the module docstring for the trade-off.
      on_failure: what a failed completion scores: ``"zero"`` (0.0) or ``"drop"`` (NaN, the
        driver's mark to drop its group).
      batched: call ``fn`` once per :meth:`submit` with lists, instead of once per completion.
    """

    @classmethod
    def from_config(
        cls, fn: Callable[[str, dict], float], cfg, batched: bool | None = None
    ) -> RewardPool:
        """A pool with a run config's ``reward`` section (``rljax.config.RewardConfig``);
        ``batched`` (None: ``cfg.batched``) is what ``rljax.rewards.registry.build_reward``
        says of the reward it built ('model', 'judge' and 'weighted' are batched)."""
        return cls(
            fn,
            num_workers=cfg.num_workers,
            timeout_s=cfg.timeout_s,
            mode=cfg.mode,
            on_failure=cfg.on_failure,
            batched=cfg.batched if batched is None else batched,
        )

    def __init__(
        self,
        fn: Callable[[str, dict], float],
        *,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        mode: str = "thread",
        on_failure: str = "zero",
        batched: bool = False,
    ):
        if not callable(fn):
            raise TypeError(f"RewardPool needs a callable verifier, got {type(fn).__name__}.")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a positive int.")
        if not _positive_real(timeout_s):
            raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds.")
        if mode not in _MODES:
            raise ValueError(f"mode={mode!r} is not supported; use one of {list(_MODES)}.")
        if on_failure not in ON_FAILURE:
            raise ValueError(
                f"on_failure={on_failure!r} is not supported; use one of {list(ON_FAILURE)}."
            )
        if not isinstance(batched, bool):
            raise ValueError(f"batched={batched!r} must be True or False.")
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
        self._failed_value = 0.0 if on_failure == "zero" else math.nan
        self._batched = batched
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
            return ThreadRunner(self._fn, on_abandon=lambda: self._bump(abandoned=1))
        return ProcessRunner(self._fn, on_restart=lambda: self._bump(restarts=1))

    def _dispatch(self) -> None:
        runner = None
        try:
            while (task := self._tasks.get()) is not None:
                batch, start, completions, examples = task
                args = (completions, examples) if self._batched else (completions[0], examples[0])
                try:
                    if runner is None:
                        runner = self._make_runner()
                    status, value = runner.run(*args, self._timeout_s)
                except Exception as exc:  # noqa: BLE001 - a broken worker must not hang callers.
                    # Drop the runner; the next task builds a fresh one.
                    runner = None
                    status, value = "error", f"reward worker failed: {type(exc).__name__}: {exc}"
                batch.set(start, self._to_rewards(status, value, len(completions)))
        finally:
            if runner is not None:
                runner.close()

    def _to_rewards(self, status: str, value: object, n: int) -> np.ndarray:
        """Validates one call's result; each failed completion bumps the counter of its kind."""
        if status == "timeout":
            return self._record(
                n, ["timeout"] * n, f"verifier exceeded timeout_s={self._timeout_s}"
            )
        if status != "ok":
            return self._record(n, ["raised"] * n, str(value))
        if not self._batched:
            reward, kind, message = _check_value(value)
            return self._record(n, [kind], message, [reward])
        if isinstance(value, str | bytes | Mapping) or not (
            isinstance(value, Sequence) or (isinstance(value, np.ndarray) and value.ndim == 1)
        ):
            message = f"batched verifier returned {type(value).__name__}, not a list of floats"
            return self._record(n, ["type"] * n, message)
        if len(value) != n:
            message = f"batched verifier returned {len(value)} rewards for {n} completions"
            return self._record(n, ["count"] * n, message)
        checked = [_check_value(v) for v in value]
        message = next((m for _, kind, m in reversed(checked) if kind), "")
        return self._record(n, [k for _, k, _ in checked], message, [r for r, _, _ in checked])

    def _record(
        self, n: int, kinds: list, message: str, rewards: list[float] | None = None
    ) -> np.ndarray:
        """Counts ``n`` completions and their failures (``kinds``, None for a success)."""
        out = np.asarray(rewards if rewards is not None else [0.0] * n, np.float32)
        failed = [i for i, kind in enumerate(kinds) if kind is not None]
        out[failed] = self._failed_value
        counts = collections.Counter(_FIELDS[kinds[i]] for i in failed)
        with self._lock:
            changes = {k: getattr(self._stats, k) + v for k, v in counts.items()}
            if failed:
                changes["last_error"] = message
            self._stats = dataclasses.replace(self._stats, calls=self._stats.calls + n, **changes)
            should_log = bool(failed) and self._failures_logged < _LOGGED_FAILURES
            self._failures_logged += bool(failed)
        if should_log:
            _LOG.warning(
                "Reward of %d completion(s) failed (%s): %s",
                len(failed),
                ", ".join(sorted({kinds[i] for i in failed})),
                message,
            )
        return out

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
            if self._batched:
                if completions:
                    self._tasks.put((batch, 0, list(completions), list(examples)))
            else:
                for index, (completion, example) in enumerate(zip(completions, examples)):
                    self._tasks.put((batch, index, [completion], [example]))
        return batch.future

    def score(self, completions: Sequence[str], examples: Sequence[dict]) -> np.ndarray:
        """Scores completions, blocking until done; returns float32 rewards (failures as
        ``on_failure`` says: 0.0 or NaN)."""
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
