"""EnvPool: env steps off the sampler thread, each under a timeout, failures counted by kind.

The Sampler must never wait for an env (docs/agents.md), so a conversation hands each
``Env.step`` to this pool and gets a future back at once. Every call runs on a worker thread
(:class:`rljax.rewards.workers.ThreadRunner`, the reward pool's): a call that overruns
``timeout_s`` is abandoned, its worker replaced, and it resolves as ``("timeout", None)``; a
call that raises resolves as ``("error", message)``; otherwise ``("ok", value)``. A future
never holds an exception. An env is a stateful Python object, so threads (not processes) run
it; code that may loop forever belongs in a sandboxed subprocess (``rljax.envs.sandbox``),
whose limits stop it whatever the thread does.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any

from rljax.rewards.workers import ThreadRunner


def _apply(call: Callable[..., Any], args: tuple) -> Any:
    return call(*args)


class EnvPool:
    """Runs ``call(*args)`` on ``num_workers`` threads, each call under ``timeout_s``.

    ``stats`` counts ``calls``, ``timeouts``, ``raised`` and ``abandoned`` threads.
    """

    def __init__(self, *, num_workers: int = 4, timeout_s: float = 10.0):
        if num_workers < 1 or timeout_s <= 0:
            raise ValueError(
                f"EnvPool needs num_workers >= 1 and timeout_s > 0, got {num_workers} and "
                f"{timeout_s}"
            )
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._stats: collections.Counter[str] = collections.Counter()
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"rljax-env-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for t in self._threads:
            t.start()

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def _bump(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def submit(self, call: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """A future of ``(status, value)``: 'ok', 'error' (value: the message) or 'timeout'."""
        if self._closed:
            raise RuntimeError("EnvPool.submit after close(): the run is shutting down")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._tasks.put((future, call, args))
        return future

    def _work(self) -> None:
        runner = ThreadRunner(_apply, on_abandon=lambda: self._bump("abandoned"))
        while (task := self._tasks.get()) is not None:
            future, call, args = task
            self._bump("calls")
            status, value = runner.run(call, args, self.timeout_s)
            if status == "timeout":
                self._bump("timeouts")
            elif status != "ok":
                self._bump("raised")
            future.set_result((status, value))
        runner.close()

    def close(self) -> None:
        """Stop the workers once the queued calls are done (a hung call is abandoned)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._tasks.put(None)

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
