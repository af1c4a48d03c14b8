"""Fake sampler, learner and weight sync with cost models, for driving the real async runtime.

:class:`rljax.runtime.driver.Driver` uses its sampler, learner and weight sync only
through small duck-typed interfaces. These fakes implement them with ``time.sleep`` standing in
for device work: sleeping releases the GIL just as a blocked ``jax`` call does, so the host
threads overlap the way they do around a real engine, and the pipeline's policies (admission,
staleness, batching) run unchanged. Benchmarks measure the pipeline with them; tests check its
invariants without compiling a model.

The sampler does continuous batching over a fixed number of slots: each ``step()`` is one
decode step of every active sequence, costing ``step_cost_s(active_slots)`` seconds. Response
lengths come from ``length_sampler``, e.g. :func:`lognormal_lengths` for the long tail that
makes static batching idle.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.engine.sampler import FINISH_LENGTH, FINISH_STOP, Request, Trajectory
from rljax.mesh.weight_sync import HISTORY, SyncStats

LengthSampler = Callable[[np.random.Generator], int]


def lognormal_lengths(median: float, sigma: float, max_len: int) -> LengthSampler:
    """A long-tailed response length distribution: lognormal, rounded, clipped to [1, max_len].

    Args:
      median: the median length in tokens (``exp(mu)``), > 0.
      sigma: the log-space standard deviation, >= 0; 1.0 gives a heavy tail.
      max_len: the longest response (the engine's token budget), >= 1.
    """
    if not median > 0:
        raise ValueError(f"median={median!r} must be > 0 tokens")
    if not sigma >= 0:
        raise ValueError(f"sigma={sigma!r} must be >= 0 (0 gives fixed lengths)")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len={max_len!r} must be an int >= 1 (the token budget)")
    mu = math.log(median)

    def draw(rng: np.random.Generator) -> int:
        return int(min(max_len, max(1, round(rng.lognormal(mu, sigma)))))

    return draw


def constant_cost(seconds: float) -> Callable[[Any], float]:
    """A cost model that charges ``seconds`` whatever the load (0 measures host overhead)."""
    if not seconds >= 0:
        raise ValueError(f"seconds={seconds!r} must be >= 0")
    return lambda _: seconds


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"a cost model returned {seconds!r} s; costs must be >= 0")
    if seconds > 0:
        time.sleep(seconds)


@dataclasses.dataclass
class _FakeSample:
    request: Request
    index: int
    tokens: np.ndarray  # the whole response, drawn at submit; revealed one token per step
    logprobs: np.ndarray
    reason: str
    versions: list[int] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.versions) == len(self.tokens)

    def to_trajectory(self) -> Trajectory:
        r = self.request
        return Trajectory(
            list(r.prompt_tokens),
            self.tokens.tolist(),
            self.logprobs.tolist(),
            self.versions,
            self.reason,
            r.request_id,
            self.index,
            r.payload,
        )


class FakeSampler:
    """A continuous-batching sampler whose decode step is a sleep from a cost model.

    Implements the sampler interface of :class:`rljax.runtime.driver.Driver` (``version``,
    ``submit``, ``step``, ``has_work``, ``set_params``, ``abort``) and returns real
    :class:`~rljax.engine.sampler.Trajectory` objects whose per-token versions are the params
    version held when each token was "decoded".

    Each sample's length and tokens depend only on ``(seed, request_id, sample index)``, so a
    rerun samples the same workload whatever the thread timing.

    Args:
      slots: concurrent sequences (the engine's ``max_concurrent_decodes``), >= 1.
      step_cost_s: seconds of one decode step given the number of active slots.
      length_sampler: draws one response length (>= 1) from a numpy Generator.
      seed: base seed of the per-sample generators.
      version: the params version held at start (the learner version on a resume).
      params: the params object held at start (opaque).
      vocab_size: fake token ids are drawn in ``[0, vocab_size)``.
    """

    def __init__(
        self,
        *,
        slots: int,
        step_cost_s: Callable[[int], float],
        length_sampler: LengthSampler,
        seed: int = 0,
        version: int = 0,
        params: Any = None,
        vocab_size: int = 32_000,
    ):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots={slots!r} must be an int >= 1 (concurrent sequences)")
        if not callable(step_cost_s) or not callable(length_sampler):
            raise TypeError("step_cost_s and length_sampler must be callables (cost models)")
        self.slots = slots
        self.step_cost_s = step_cost_s
        self.length_sampler = length_sampler
        self.seed = seed
        self.version = version
        self.params = params
        self.vocab_size = vocab_size
        self._slots: list[_FakeSample | None] = [None] * slots
        self._queue: collections.deque[_FakeSample] = collections.deque()
        self._staged: tuple[Any, int] | None = None
        self._live: set[int] = set()
        self.stats = collections.Counter()

    # -- requests ---------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Queue requests (each ``num_samples`` samples); checks all before queueing any."""
        for r in requests:
            if r.num_samples < 1:
                raise ValueError(f"num_samples={r.num_samples} must be >= 1")
            if r.request_id < 0:
                raise ValueError(
                    f"request_id={r.request_id} is unset; FakeSampler needs caller-chosen ids "
                    ">= 0 (the driver names requests by buffer reservation)"
                )
            if r.request_id in self._live:
                raise ValueError(
                    f"request_id={r.request_id} is already running; give each request a new id"
                )
        for r in requests:
            self._live.add(r.request_id)
            for i in range(r.num_samples):
                self._queue.append(self._draw(r, i))
        self.stats["submitted"] += len(requests)
        return [r.request_id for r in requests]

    def _draw(self, request: Request, index: int) -> _FakeSample:
        rng = np.random.default_rng([self.seed, request.request_id, index])
        length = int(self.length_sampler(rng))
        if length < 1:
            raise ValueError(f"length_sampler returned {length}; lengths must be >= 1 token")
        reason = FINISH_STOP
        if request.max_new_tokens is not None and length > request.max_new_tokens:
            length, reason = request.max_new_tokens, FINISH_LENGTH
        tokens = rng.integers(0, self.vocab_size, length)
        logprobs = -rng.exponential(1.0, length)
        return _FakeSample(request, index, tokens, logprobs, reason)

    @property
    def busy_slots(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    @property
    def queued_samples(self) -> int:
        return len(self._queue)

    @property
    def kv_tokens(self) -> int:
        return sum(len(s.request.prompt_tokens) + len(s.versions) for s in self._slots if s)

    def has_work(self) -> bool:
        return bool(self._queue) or self.busy_slots > 0

    def abort(self, request_id: int) -> None:
        """Drop every queued and running sample of a request (e.g. redundant-rollout surplus)."""
        if request_id not in self._live:
            return  # already finished: the driver's abort raced the completion
        self._live.discard(request_id)
        kept = [s for s in self._queue if s.request.request_id != request_id]
        self.stats["aborted_samples"] += len(self._queue) - len(kept)
        self._queue = collections.deque(kept)
        for slot, s in enumerate(self._slots):
            if s is not None and s.request.request_id == request_id:
                self._slots[slot] = None
                self.stats["aborted_samples"] += 1
        self.stats["aborted"] += 1

    # -- params -----------------------------------------------------------------------------

    def set_params(self, params: Any, version: int) -> None:
        """Stage params; they apply at the next step boundary, or at once when idle."""
        self._staged = (params, version)
        if not self.busy_slots:
            self._apply_staged()

    def _apply_staged(self) -> None:
        if self._staged is not None:
            self.params, self.version = self._staged
            self._staged = None
            self.stats["swaps"] += 1

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[Trajectory]:
        """One decode step: refill free slots, sleep the step cost, advance every active one."""
        self._apply_staged()
        for slot in range(self.slots):
            if self._slots[slot] is None and self._queue:
                self._slots[slot] = self._queue.popleft()
        active = self.busy_slots
        _sleep(self.step_cost_s(active))
        finished = []
        version = self.version
        for slot, s in enumerate(self._slots):
            if s is None:
                continue
            s.versions.append(version)
            if s.done:
                self._slots[slot] = None
                finished.append(s.to_trajectory())
        # A request leaves the live set with its last sample; which one that is depends on
        # timing, so count the samples still queued or running instead of tracking each.
        if finished:
            running = {s.request.request_id for s in self._queue}
            running.update(s.request.request_id for s in self._slots if s is not None)
            self._live &= running
        self.stats["steps"] += 1
        self.stats["tokens"] += active
        self.stats["finished"] += len(finished)
        return finished

    def run(self, requests: Sequence[Request]) -> list[Trajectory]:
        """Sample ``requests`` to completion (the synchronous mode); returns their trajectories."""
        self.submit(requests)
        out = []
        while self.has_work():
            out.extend(self.step())
        return out


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
        _sleep(cost)
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
        _sleep(self.cost_s)
        stats = SyncStats(version, self.param_bytes, time.perf_counter() - start)
        # One reference assignment: atomic under the GIL, so no lock is needed for acquire().
        if self._latest is None or version > self._latest[1]:
            self._latest = (params, version)
        self.history.append(stats)
        return stats

    def acquire(self) -> tuple[Any, int] | None:
        return self._latest
