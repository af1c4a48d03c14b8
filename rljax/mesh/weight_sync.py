"""Versioned weight hand-off from the learner mesh to the sampler mesh.

``publish(params, version)`` reshards the learner's params onto the sampler's shardings with
``jax.device_put`` (a jit cannot write onto a disjoint mesh), optionally casting to bfloat16
first on the learner side so half the bytes cross. ``acquire()`` returns the newest published
``(params, version)``; the sampler takes it at its next generate boundary, per its swap mode.
Every publish is timed and its bytes counted.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

# Publishes kept in WeightSync.history (the newest; the driver and reallocator read the last).
HISTORY = 64


@dataclasses.dataclass(frozen=True)
class SyncStats:
    version: int
    bytes: int
    seconds: float


class WeightSync:
    """Holds the newest sampler-side copy of the learner's params."""

    def __init__(
        self,
        target_shardings: Callable,
        *,
        cast_bf16: bool = False,
        every: int = 1,
    ):
        if every < 1:
            raise ValueError(f"every={every}: publish at least every step (>= 1)")
        self._target_shardings = target_shardings
        self.cast_bf16 = cast_bf16
        self.every = every
        self._lock = threading.Lock()
        self._latest: tuple[object, int] | None = None
        # The newest publishes only (one a step; a long run must not grow host memory).
        self.history: collections.deque[SyncStats] = collections.deque(maxlen=HISTORY)
        self._cast = jax.jit(
            lambda tree: jax.tree.map(
                lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                tree,
            )
        )

    def retarget(self, target_shardings: Callable) -> None:
        """Publish onto new sampler shardings from now on (a resize rebuilt the sampler mesh).

        The held copy lives on the old mesh, so it is dropped: ``acquire()`` returns None until
        the next ``publish``. The history is kept.
        """
        with self._lock:
            self._target_shardings = target_shardings
            self._latest = None

    def due(self, version: int) -> bool:
        """Whether ``version`` should be published (every ``every`` learner steps)."""
        return version % self.every == 0

    def publish(self, params, version: int, *, block: bool = True) -> SyncStats:
        """Copy ``params`` to the sampler shardings and make them the newest version."""
        start = time.perf_counter()
        src = self._cast(params) if self.cast_bf16 else params
        copy = jax.device_put(src, self._target_shardings(src), may_alias=False)
        if block:
            jax.block_until_ready(copy)
        nbytes = sum(x.nbytes for x in jax.tree.leaves(copy))
        stats = SyncStats(version, nbytes, time.perf_counter() - start)
        with self._lock:
            if self._latest is None or version > self._latest[1]:
                self._latest = (copy, version)
            self.history.append(stats)
        return stats

    def acquire(self) -> tuple[object, int] | None:
        """The newest ``(params, version)``, or None before the first publish."""
        with self._lock:
            return self._latest

    @property
    def latest_version(self) -> int:
        with self._lock:
            return -1 if self._latest is None else self._latest[1]
