"""Fake sampler, learner and weight sync with cost models, for driving the real async runtime.

:class:`rljax.runtime.driver.Driver` uses its sampler, learner and weight sync only
through small duck-typed interfaces. These fakes implement them with ``time.sleep`` standing in
for device work: sleeping releases the GIL just as a blocked ``jax`` call does, so the host
threads overlap the way they do around a real engine, and the pipeline's policies (admission,
staleness, batching) run unchanged. Benchmarks measure the pipeline with them; tests check its
invariants without compiling a model.

The sampler (continuous batching over a fixed number of slots, its decode steps sleeps) lives in
:mod:`rljax.testing.fake_sampler` and is importable from here too.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from rljax.mesh.weight_sync import HISTORY, SyncStats
from rljax.testing.fake_sampler import (
    FakeSampler,
    LengthSampler,
    constant_cost,
    lognormal_lengths,
    sleep_cost,
)

# The sampler's names, importable from here as before.
__all__ = [
    "FakeBatch",
    "FakeLearner",
    "FakeSampler",
    "FakeWeightSync",
    "LengthSampler",
    "constant_cost",
    "fake_make_batch",
    "lognormal_lengths",
    "sleep_cost",
]


@dataclasses.dataclass
class FakeBatch:
    """What :func:`fake_make_batch` hands the learner: the groups and their token count."""

    groups: list
    num_sequences: int
    num_tokens: int


def fake_make_batch(groups: list) -> FakeBatch:
    """Packs driver groups into a :class:`FakeBatch` (prompt + response tokens counted)."""
    if not groups:
        raise ValueError("groups is empty; a learner batch needs at least one group")
    trajs = [t for g in groups for t in g.trajectories]
    tokens = sum(len(t.prompt_tokens) + len(t.response_tokens) for t in trajs)
    return FakeBatch(list(groups), len(trajs), tokens)


class FakeLearner:
    """A learner whose step is a sleep from a cost model; each step bumps ``version``.

    Args:
      step_cost_s: seconds of one step given the batch (e.g. proportional to ``num_tokens``).
      version: the starting version (the step count, as on a resume).
    """

    def __init__(self, step_cost_s: Callable[[Any], float], *, version: int = 0):
        if not callable(step_cost_s):
            raise TypeError("step_cost_s must be a callable cost model: batch -> seconds")
        self.step_cost_s = step_cost_s
        self.version = version
        self.tokens = 0

    @property
    def params(self) -> dict[str, int]:
        """Stand-in params: they only need to say which version they are."""
        return {"version": self.version}

    def step(self, batch: Any) -> dict[str, float]:
        """Sleeps the step cost and advances the version; returns step metrics."""
        cost = float(self.step_cost_s(batch))
        sleep_cost(cost)
        return self.commit(batch, cost)

    def commit(self, batch: Any, cost: float) -> dict[str, float]:
        """Advance the version as a step of ``cost`` seconds on ``batch`` (already slept) does."""
        self.version += 1
        tokens = int(getattr(batch, "num_tokens", 0))
        self.tokens += tokens
        return {"loss": 0.0, "step_cost_s": cost, "batch_tokens": tokens}


class FakeWeightSync:
    """A weight hand-off that sleeps ``cost_s`` per publish; the WeightSync interface.

    Args:
      cost_s: seconds per publish (the resharding copy).
      every: publish every ``every`` learner versions.
      param_bytes: bytes reported per publish.
    """

    def __init__(self, *, cost_s: float = 0.0, every: int = 1, param_bytes: int = 0):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r}: publish at least every step (an int >= 1)")
        if not cost_s >= 0:
            raise ValueError(f"cost_s={cost_s!r} must be >= 0 seconds")
        self.cost_s = cost_s
        self.every = every
        self.param_bytes = param_bytes
        self._latest: tuple[Any, int] | None = None
        self.history: collections.deque[SyncStats] = collections.deque(maxlen=HISTORY)

    def due(self, version: int) -> bool:
        return version % self.every == 0

    def publish(self, params: Any, version: int) -> SyncStats:
        start = time.perf_counter()
        sleep_cost(self.cost_s)
        stats = SyncStats(version, self.param_bytes, time.perf_counter() - start)
        # One reference assignment: atomic under the GIL, so no lock is needed for acquire().
        if self._latest is None or version > self._latest[1]:
            self._latest = (params, version)
        self.history.append(stats)
        return stats

    def acquire(self) -> tuple[Any, int] | None:
        return self._latest
