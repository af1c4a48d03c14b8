"""The fake continuous-batching sampler: decode steps are sleeps from a cost model.

Each ``step()`` is one decode step of every active sequence, costing
``step_cost_s(active_slots)`` seconds. Response lengths come from ``length_sampler``, e.g.
:func:`lognormal_lengths` for the long tail that makes static batching idle. With
``replicas > 1`` the slots belong to that many engines stepping in lock-step on chips of their
own (a step costs the slowest replica's), and whole replicas can be parked (Trainer-on-RollPool,
:mod:`rljax.testing.fake_lending`). ``rljax.testing.fakes`` holds the learner and weight sync.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rljax.engine.sampler import FINISH_LENGTH, FINISH_STOP, Request, Trajectory
from rljax.policy.lending import reprefill_s

LengthSampler = Callable[[np.random.Generator], int]
# A conversation's turns: [(model tokens of the turn, seconds its env step takes after it)].
TurnSampler = Callable[[np.random.Generator], list[tuple[int, float]]]


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


def sleep_cost(seconds: float) -> None:
    """Spend ``seconds`` of a cost model as a sleep (it releases the GIL, as a device call does)."""
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
    # A conversation: after the model token at response position p (a key of ``waits``) the
    # env answers ``waits[p]`` seconds later with ``obs_tokens`` tokens (mask 0, version -1);
    # meanwhile the sample keeps its slot, paused, as the engine keeps a waiting conversation's.
    waits: dict[int, float] = dataclasses.field(default_factory=dict)
    obs_tokens: int = 0
    wait_until: float = 0.0

    @property
    def done(self) -> bool:
        return len(self.versions) >= len(self.tokens)

    def advance(self, version: int, now: float) -> None:
        """Reveal the next model token; a turn's last one brings the env's tokens and a wait."""
        position = len(self.versions)
        self.versions.append(version)
        if position in self.waits:  # the env's tokens, cut where the budget ends
            room = len(self.tokens) - len(self.versions)
            self.versions.extend([-1] * min(self.obs_tokens, room))
            self.wait_until = now + self.waits[position]

    def to_trajectory(self) -> Trajectory:
        r = self.request
        mask = [int(v >= 0) for v in self.versions] if self.waits else None
        logprobs = self.logprobs if mask is None else np.where(mask, self.logprobs, 0.0)
        return Trajectory(
            list(r.prompt_tokens),
            self.tokens.tolist(),
            logprobs.tolist(),
            self.versions,
            self.reason,
            r.request_id,
            self.index,
            r.payload,
            loss_mask=mask,
        )


class FakeSampler:
    """A continuous-batching sampler whose decode step is a sleep from a cost model.

    Implements the driver's :class:`~rljax.runtime.parts.SamplerPart` (and the hand-over of
    :class:`~rljax.runtime.lending.replicas.MovableSampler`) and returns real
    :class:`~rljax.engine.sampler.Trajectory` objects whose per-token versions are the params
    version held when each token was "decoded". An interrupted request's samples are held with
    their tokens so far until it is resumed.

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
      replicas: engines the slots are split between (evenly), stepping in lock-step: a step
        costs ``max(step_cost_s(live sequences of one replica))`` over the replicas with any,
        and a sequence enters the replica with the fewest. 1 (the default) is one engine.
      prefill_s_per_token: what a moved sequence costs to prefill again, per cached token
        (prompt and response so far): samples adopted from another sampler (a loan's hand-back)
        or parked off a replica stall the next step by
        :func:`rljax.policy.lending.reprefill_s` of their tokens. 0 (the default): free.
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
        replicas: int = 1,
        prefill_s_per_token: float = 0.0,
        turns: TurnSampler | None = None,
        obs_tokens: int = 0,
    ):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots={slots!r} must be an int >= 1 (concurrent sequences)")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas={replicas!r} must be an int >= 1 (engines)")
        if slots % replicas:
            raise ValueError(
                f"slots={slots} do not split evenly between replicas={replicas}; make slots a "
                "multiple of replicas"
            )
        if not callable(step_cost_s) or not callable(length_sampler):
            raise TypeError("step_cost_s and length_sampler must be callables (cost models)")
        if prefill_s_per_token < 0:
            raise ValueError(f"prefill_s_per_token={prefill_s_per_token} must be >= 0")
        self.slots = slots
        self.step_cost_s = step_cost_s
        self.prefill_s_per_token = prefill_s_per_token
        self._reprefill_s = 0.0  # owed by the next step: sequences moved here to prefill again
        self.length_sampler = length_sampler
        self.turns = turns  # multi-turn conversations (the env's waits) instead of lengths
        self.obs_tokens = obs_tokens
        self.seed = seed
        self.version = version
        self.params = params
        self.vocab_size = vocab_size
        self._slots: list[_FakeSample | None] = [None] * slots
        self._queue: collections.deque[_FakeSample] = collections.deque()
        self._held: dict[int, list[_FakeSample]] = {}  # interrupted, by request id
        self._staged: tuple[Any, int] | None = None
        self._live: set[int] = set()
        self.replicas = replicas
        self._per_replica = slots // replicas
        self._parked: set[int] = set()
        # Held around the slots and queue, not the step's sleep: park, hand_over and adopt may
        # come from another thread (a lending learner) while a step sleeps.
        self._lock = threading.Lock()
        self.stats: collections.Counter[str] = collections.Counter()

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
        drawn = [self._draw(r, i) for r in requests for i in range(r.num_samples)]
        with self._lock:
            self._live.update(r.request_id for r in requests)
            self._queue.extend(drawn)
        self.stats["submitted"] += len(requests)
        return [r.request_id for r in requests]

    def _draw(self, request: Request, index: int) -> _FakeSample:
        rng = np.random.default_rng([self.seed, request.request_id, index])
        if self.turns is not None:
            return self._draw_conversation(request, index, rng)
        length = int(self.length_sampler(rng))
        if length < 1:
            raise ValueError(f"length_sampler returned {length}; lengths must be >= 1 token")
        reason = FINISH_STOP
        if request.max_new_tokens is not None and length > request.max_new_tokens:
            length, reason = request.max_new_tokens, FINISH_LENGTH
        tokens = rng.integers(0, self.vocab_size, length)
        logprobs = -rng.exponential(1.0, length)
        return _FakeSample(request, index, tokens, logprobs, reason)

    def _draw_conversation(self, request: Request, index: int, rng) -> _FakeSample:
        """A conversation's tokens (model turns with the env's tokens between) and waits."""
        budget = request.max_new_tokens or np.iinfo(np.int64).max
        waits: dict[int, float] = {}
        length, reason = 0, FINISH_STOP
        turns = self.turns(rng)  # type: ignore[misc]
        for i, (tokens, tool_s) in enumerate(turns):
            if tokens < 1 or tool_s < 0:
                raise ValueError(f"a turn of {tokens} tokens and {tool_s} s; need >= 1 and >= 0")
            if length + tokens >= budget:
                length, reason = budget, FINISH_LENGTH
                break
            length += tokens
            if i + 1 < len(turns):
                waits[length - 1] = float(tool_s)
                length += self.obs_tokens
        tokens_ = rng.integers(0, self.vocab_size, length)
        logprobs = -rng.exponential(1.0, length)
        return _FakeSample(
            request, index, tokens_, logprobs, reason, waits=waits, obs_tokens=self.obs_tokens
        )

    @property
    def busy_slots(self) -> int:
        return sum(s is not None for s in self._slots)

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    @property
    def free_slots(self) -> int:
        return self.num_slots - self.busy_slots

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
        with self._lock:
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
            self.stats["aborted_samples"] += len(self._held.pop(request_id, []))
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
        """One decode step: refill free slots, sleep the step cost, advance every active one.

        A conversation waiting for its env holds its slot without decoding; when every
        occupied slot waits, the step sleeps until the first env step returns.
        """
        with self._lock:
            self._apply_staged()
            self._refill()
            now = time.perf_counter()
            loads = [self._load(r, now) for r in range(self.replicas)]
            again, self._reprefill_s = self._reprefill_s, 0.0
            waiting = [s.wait_until for s in self._slots if s is not None and s.wait_until > now]
        sleep_cost(again)
        active = sum(loads)
        if not active and waiting:
            sleep_cost(min(waiting) - now)
            self.stats["env_wait_steps"] += 1
        elif self.replicas == 1:
            sleep_cost(self.step_cost_s(active))
        else:
            sleep_cost(max((self.step_cost_s(n) for n in loads if n), default=0.0))
        with self._lock:
            finished = []
            version = self.version
            advanced = 0  # fewer than ``active`` when a replica was parked during the sleep
            for slot, s in enumerate(self._slots):
                if s is None or s.wait_until > now:
                    continue
                advanced += 1
                s.advance(version, time.perf_counter())
                if s.done:
                    self._slots[slot] = None
                    finished.append(s.to_trajectory())
            # A request leaves the live set with its last sample; which one that is depends on
            # timing, so count the samples still queued or running instead of tracking each.
            if finished:
                self._live &= self.request_ids()
        self.stats["steps"] += 1
        self.stats["tokens"] += advanced
        self.stats["finished"] += len(finished)
        return finished

    def _load(self, replica: int, now: float | None = None) -> int:
        """Live sequences on one replica (with ``now``: those decoding, not waiting for env)."""
        per = self._per_replica
        return sum(
            s is not None and (now is None or s.wait_until <= now)
            for s in self._slots[replica * per : (replica + 1) * per]
        )

    def _refill(self) -> None:
        """Fill free slots from the queue, each into the unparked replica with the fewest."""
        per = self._per_replica
        loads = {r: self._load(r) for r in range(self.replicas) if r not in self._parked}
        while self._queue:
            open_ = [(n, r) for r, n in loads.items() if n < per]
            if not open_:
                return
            _, r = min(open_)
            slot = next(i for i in range(r * per, (r + 1) * per) if self._slots[i] is None)
            self._slots[slot] = self._queue.popleft()
            loads[r] += 1

    # -- moving requests (lending) ----------------------------------------------------------

    def request_ids(self) -> set[int]:
        """Ids of the requests with a sample here, running, queued or held."""
        samples = [s for s in self._slots if s is not None] + list(self._queue)
        return {s.request.request_id for s in samples} | set(self._held)

    def _take(self, request_id: int) -> list[_FakeSample]:
        """Remove a request's running and queued samples; returns them (call under the lock)."""
        out = [s for s in self._slots if s is not None and s.request.request_id == request_id]
        self._slots = [
            None if s is not None and s.request.request_id == request_id else s for s in self._slots
        ]
        out += [s for s in self._queue if s.request.request_id == request_id]
        self._queue = collections.deque(
            s for s in self._queue if s.request.request_id != request_id
        )
        return out

    def interrupt(self, request_id: int) -> int:
        """Hold a request's running and queued samples, with their tokens so far; returns how
        many are held."""
        with self._lock:
            taken = self._take(request_id)
            held = self._held.setdefault(request_id, [])
            held.extend(taken)
            self.stats["interrupted"] += len(taken)
            return len(held)

    def resume(self, request_id: int) -> None:
        """Queue a held request's samples again; they go on from their tokens so far."""
        with self._lock:
            self._queue.extend(self._held.pop(request_id, []))

    def hand_over(self, request_id: int) -> list[_FakeSample]:
        """Take a request's samples out (partial rollouts, for another sampler's ``adopt``)."""
        with self._lock:
            out = self._held.pop(request_id, []) + self._take(request_id)
            self._live.discard(request_id)
        return out

    def adopt(self, samples: Sequence[_FakeSample]) -> None:
        """Queue samples another sampler handed over; they go on from their tokens so far."""
        with self._lock:
            self._queue.extend(samples)
            self._live.update(s.request.request_id for s in samples)
            self._owe_reprefill(samples)

    def park(self, count: int) -> list[int]:
        """Take ``count`` replicas out of decoding (their chips lent); returns their indices.

        The replicas holding the fewest cached tokens go (the least to re-prefill elsewhere);
        their sequences return to the front of the queue, keeping their tokens. At least one
        replica keeps decoding.
        """
        with self._lock:
            free = [r for r in range(self.replicas) if r not in self._parked]
            if not 0 < count < len(free):
                raise ValueError(
                    f"cannot park {count} of {len(free)} decoding replicas; park at least one "
                    "and leave one"
                )
            per = self._per_replica

            def cached(r: int) -> int:
                live = [s for s in self._slots[r * per : (r + 1) * per] if s is not None]
                return sum(len(s.request.prompt_tokens) + len(s.versions) for s in live)

            chosen = sorted(free, key=lambda r: (cached(r), r))[:count]
            moved = []
            for r in chosen:
                for slot in range(r * per, (r + 1) * per):
                    s = self._slots[slot]
                    if s is not None:
                        moved.append(s)
                        self._slots[slot] = None
            self._queue.extendleft(reversed(moved))
            self._owe_reprefill(moved)
            self._parked.update(chosen)
            self.stats["parked_samples"] += len(moved)
        return chosen

    def _owe_reprefill(self, samples: Sequence[_FakeSample]) -> None:
        """The next step prefills these moved samples' cached tokens again (under the lock)."""
        tokens = sum(len(s.request.prompt_tokens) + len(s.versions) for s in samples)
        self._reprefill_s += reprefill_s(tokens, self.prefill_s_per_token)

    def unpark(self, replicas: Sequence[int]) -> None:
        """Return parked replicas to decoding."""
        with self._lock:
            self._parked.difference_update(replicas)

    def run(self, requests: Sequence[Request]) -> list[Trajectory]:
        """Sample ``requests`` to completion (the synchronous mode); returns their trajectories."""
        self.submit(requests)
        out = []
        while self.has_work():
            out.extend(self.step())
        return out
