"""The one step loop of every mode: admit, sample, score, buffer, consume, learn, publish.

Both schedules drive the same pure policies (:class:`StalenessController` admits,
:class:`StalenessBuffer` places, releases and hands out batches) and assemble, learn, publish,
checkpoint and log with the same code and metric keys:

- **lock-step** (mode='sync', eta = 0): one thread. Each step admits a batch, generates until
  enough groups are complete, scores them in one call (one all-gather on several processes),
  places them, and learns. Every decision follows from the step alone.
- **threaded** (mode='async'): a sampler thread (admit, reserve, generate), a reward thread
  (score, occupy or release) and the learner (calling) thread (wait for a full buffer, consume,
  learn, publish; the sampler swaps weights at its next generate boundary).

The sampler, learner, weight sync and lender are parts (:mod:`rljax.runtime.parts`): an engine
or a pod's stand-in at run time, the fakes of ``rljax.testing.fakes`` in tests and benchmarks.

The step boundary (after a learner step, before its weights go out) runs ``on_boundary`` and
:meth:`Driver.call_at_boundary` work on the learner thread: the safe point for resizes, where
:meth:`Driver.safe_point` parks the sampler and interrupts in-flight requests as partial
rollouts.

The driver owns two parts and calls them: its :class:`~rljax.runtime.boundary.SafePoints` (the
calls queued for the boundary, the sampler thread's parking) and its
:class:`~rljax.runtime.threads.ThreadedSchedule` (the sampler and reward threads, the learner's
wait); it owns the requests, the buffer and the lock they share.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from rljax.metrics import Timeline
from rljax.policy.meter import PhaseMeter
from rljax.policy.routing import ReplicaLoad, route
from rljax.policy.staleness import StalenessBuffer, StalenessController, has_signal
from rljax.runtime.boundary import SafePoints
from rljax.runtime.clocks import RoleClocks, step_metrics
from rljax.runtime.parts import LearnerPart, LenderPart, SamplerPart, WeightSyncPart
from rljax.runtime.rollout import Group, lockstep_request_id, make_group
from rljax.runtime.threads import DriverWork, ThreadedSchedule

# Counters every step's metrics carry, in every mode (zero when nothing happened).
COUNTERS = (
    "dispatched",
    "dropped_no_signal",
    "dropped_reward_failure",
    "surplus_aborted",
    "surplus_discarded",
    "interrupted_samples",
)

log = logging.getLogger(__name__)


class Driver:
    """Runs ``num_steps`` learner steps (or until ``stop()``) in either schedule."""

    def __init__(
        self,
        *,
        sampler: SamplerPart,
        learner: LearnerPart,
        weight_sync: WeightSyncPart,
        buffer: StalenessBuffer,
        controller: StalenessController,
        prompts: Iterator[list],
        make_request: Callable[[Any, int], Any],
        score: Callable[[list], np.ndarray],
        make_batch: Callable[[list[Group]], Any],
        group_size: int,
        num_steps: int,
        lockstep: bool = False,
        dynamic_sampling: bool = False,
        on_step: Callable[[int, dict], None] | None = None,
        on_checkpoint: Callable[[Driver], None] | None = None,
        on_boundary: Callable[[int], None] | None = None,
        timeline: Timeline | None = None,
        meter: PhaseMeter | None = None,
        prompt_state: Callable[[], Any] | None = None,
        requeue: list | None = None,
        next_request_id: int = 0,
        encode_group: Callable[[Group], Any] | None = None,
        counters: dict[str, int] | None = None,
        lender: LenderPart | None = None,  # a replica on the learner's chips while it waits
    ):
        if lockstep and buffer.max_staleness != 0:
            raise ValueError(
                f"the lock-step schedule is on-policy but the buffer allows eta = "
                f"{buffer.max_staleness}; use lockstep=False (mode='async') or max_staleness=0"
            )
        self.sampler = sampler
        self._learner = learner
        self.weight_sync = weight_sync
        self.buffer = buffer
        self.controller = controller
        self.lockstep = lockstep
        self._prompts = prompts
        self._make_request = make_request
        self._score = score
        self._make_batch = make_batch
        self.group_size = group_size
        self.num_steps = num_steps
        self.dynamic_sampling = dynamic_sampling
        self._on_step = on_step or (lambda step, metrics: None)
        self._on_checkpoint = on_checkpoint
        self._on_boundary = on_boundary
        self._prompt_state = prompt_state
        self._encode_group = encode_group
        self._lender = lender
        self.timeline = timeline or Timeline()
        self.clocks = RoleClocks(meter)
        self.counters = collections.Counter({k: 0 for k in COUNTERS})
        self.counters.update(counters or {})  # a resumed run goes on counting from its checkpoint
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._rewards_q: queue.Queue = queue.Queue()  # sampler thread -> reward thread
        self._aborts: collections.deque[int] = collections.deque()
        self._ready_prompts: collections.deque = collections.deque(requeue or [])
        self._inflight: dict[int, Any] = {}  # request id -> example, until placed or aborted
        self._partial: dict[int, list] = collections.defaultdict(list)
        self._next_id = next_request_id
        self._lockstep_admitted = 0  # requests admitted at the current version (lock-step ids)
        self._learner_thread: threading.Thread | None = None
        self._running = False
        self._points, self._schedule = self._own_threads(lender)
        if lender is not None:  # it reads the buffer, and wakes the learner to serve its replica
            lender.bind(self)

    def _own_threads(self, lender: LenderPart | None) -> tuple[SafePoints, ThreadedSchedule]:
        """The two parts the driver owns (module docstring), on its lock, calling its steps."""
        points = SafePoints(
            self._cond,
            self.clocks,
            running=lambda: self._running,
            on_learner_thread=self.on_learner_thread,
            failed=lambda: bool(self._schedule.errors),
        )
        work = DriverWork(
            sample=self._sample,
            score=self._score_and_place,
            ready=lambda: self.buffer.ready(self._learner.version),
            consume=self._consume,
            learner=lambda: self._learner,
            stop=self.stop,
        )
        schedule = ThreadedSchedule(
            work,
            cond=self._cond,
            stop=self._stop,
            clocks=self.clocks,
            points=points,
            rewards=self._rewards_q,
            lender=lender,
        )
        return points, schedule

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every thread to finish at its next safe point (the learner after its step)."""
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        """Wake every thread waiting on the driver's lock (new work or weights, a stop)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        """Whether a stop was asked for."""
        return self._stop.is_set()

    @property
    def learner(self) -> LearnerPart:
        """The learner the driver steps."""
        return self._learner

    def use_learner(self, learner: LearnerPart) -> None:
        """Step ``learner`` from the next step on (a resize rebuilt it, or lending wraps it).

        Call at the step boundary, on the learner thread (:meth:`call_at_boundary`).
        """
        self._learner = learner

    def call_at_boundary(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the learner thread at the next step boundary; wait for its result.

        From the learner thread itself, or when no run is in progress, ``fn`` runs at once. Work
        still queued when the run ends runs then, after the threads have stopped.
        """
        return self._points.call(fn)

    @contextlib.contextmanager
    def safe_point(self) -> Iterator[list[int]]:
        """Park the sampler thread and interrupt every in-flight request.

        Yields the ids of the requests it interrupted (those with samples still generating).
        Call on the learner thread between steps. Inside, nothing touches the sampler but the
        caller: each interrupted request is held with its partial rollout (tokens, log-probs and
        versions so far), and groups already complete or being scored are untouched. On exit the
        held requests are resumed (re-prefilled from their prefixes) and the sampler goes on.
        """
        with self._points.parked():
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

    @property
    def running(self) -> bool:
        """Whether ``run`` is in progress (its threads may be using the sampler)."""
        return self._running

    def on_learner_thread(self) -> bool:
        """Whether the caller is the thread running ``run`` (step hooks run there)."""
        return threading.current_thread() is self._learner_thread

    def buffer_rows(self) -> list[dict[str, int]]:
        """``StalenessBuffer.snapshot()``, taken under the lock."""
        with self._cond:
            return self.buffer.snapshot()

    def checkpoint_state(self) -> dict[str, Any]:
        """A consistent, JSON-safe snapshot: buffer, prompts to re-dispatch, next id, running
        counts, data state.

        Taken under the lock that the sampler holds while it draws prompts, so each prompt is
        either in the buffer (occupied), among the pending prompts (drawn, not yet placed), or
        still in the data iterator (``data``, its state), never two of them and never none.
        """
        with self._cond:
            return {
                "buffer": self.buffer.state_dict(self._encode_group),
                "pending": list(self._inflight.values()) + list(self._ready_prompts),
                "next_request_id": self._next_id,
                "counters": dict(self.counters),
                **({"data": self._prompt_state()} if self._prompt_state else {}),
            }

    # -- admission and generation (the sampler's side; a thread of its own when threaded) ----

    def _next_prompt(self) -> Any:
        if not self._ready_prompts:
            self._ready_prompts.extend(next(self._prompts))
        return self._ready_prompts.popleft()

    def _swap_weights(self) -> None:
        latest = self.weight_sync.acquire()
        if latest is not None and latest[1] > self.sampler.version:
            self.sampler.set_params(*latest)

    def _apply_aborts(self) -> None:
        """Drop surplus requests from the sampler and close their seats (call under the lock)."""
        surplus = set(self.buffer.surplus)
        while self._aborts:
            rid = self._aborts.popleft()
            self.sampler.abort(rid)
            self._partial.pop(rid, None)
            if rid in surplus:  # not yet discarded by occupy(): its group never completed
                self.buffer.release(rid)

    def _new_id(self) -> int:
        if self.lockstep:
            return lockstep_request_id(self.buffer.version, self._lockstep_admitted)
        return self._next_id

    def _dispatch(self) -> int:
        """Admit what the controller allows; returns the number of requests submitted."""
        requests = []
        with self._cond:
            self._apply_aborts()
            cap = self.controller.capacity(
                self.buffer.version, self.buffer.num_pending, self.buffer.accepted
            )
            queued = self._queued_samples()
            for _ in range(cap):
                # Threaded: a group goes out only while a slot is free that no queued sample
                # claims (rljax.policy.routing, as in the simulator); lock-step admits its whole
                # batch at once and the sampler queues what does not fit.
                if queued is not None and route([self._load(queued)]) is None:
                    break
                example = self._next_prompt()
                # An id is spent only on a granted seat, so ids (and the sampling seeds derived
                # from them) do not depend on how often admission was retried.
                rid = self._new_id()
                if self.buffer.reserve(rid, self.sampler.version) is None:
                    self._ready_prompts.appendleft(example)
                    break
                self._next_id += 1
                self._lockstep_admitted += 1
                self._inflight[rid] = example
                requests.append(self._make_request(example, rid))
                if queued is not None:
                    queued += self.group_size
        if requests:
            self.sampler.submit(requests)
            self.counters["dispatched"] += len(requests)
        return len(requests)

    def _queued_samples(self) -> int | None:
        """Samples waiting for a slot, or None when admission is not held to the slots."""
        return None if self.lockstep else self.sampler.queued_samples

    def _load(self, queued: int) -> ReplicaLoad:
        return ReplicaLoad(0, free_slots=self.sampler.free_slots, queued=queued)

    def _generate(self) -> list[list]:
        """One ``generate`` call; returns the groups it completed (their trajectories)."""
        start = time.perf_counter()
        finished = self.sampler.step()
        end = time.perf_counter()
        self.clocks.generate(start, end, finished, self.sampler)
        self.timeline.add("generate", start, end, track="sampler")
        done = []
        for t in finished:
            group = self._partial[t.group_id]
            group.append(t)
            if len(group) == self.group_size:
                done.append(self._partial.pop(t.group_id))
        return done

    def _sample(self) -> list[list] | None:
        """The sampler thread's round: swap weights, admit, and generate once; returns the
        groups it completed, or None when there was nothing to generate."""
        self._swap_weights()
        self._dispatch()
        return self._generate() if self.sampler.has_work() else None

    def _place(self, trajs: list, rewards: Any) -> None:
        """Occupy a scored group's seat, or release it (no signal); call under the lock."""
        rid = trajs[0].group_id
        if rid not in self._inflight:  # aborted as surplus while it was being scored
            self.counters["surplus_discarded"] += 1
            return
        example = self._inflight.pop(rid)
        # A non-finite reward marks a failed verifier call under reward.on_failure='drop'
        # (rljax.rewards.pool); such a group cannot be trained on, so its seat goes to another.
        if not np.all(np.isfinite(rewards)):
            self.buffer.release(rid)
            self.counters["dropped_reward_failure"] += 1
            return
        if self.dynamic_sampling and not has_signal(list(rewards)):
            self.buffer.release(rid)
            self.counters["dropped_no_signal"] += 1
            return
        group = make_group(example, trajs, rewards)
        # The driver reserves int ids only (the buffer also takes str ids).
        surplus = cast(list[int], self.buffer.occupy(rid, group, group.min_version))
        for s in surplus:
            self._inflight.pop(s, None)
        self._aborts.extend(surplus)
        self.counters["surplus_aborted"] += len(surplus)

    # -- lock-step schedule -----------------------------------------------------------------

    def _lockstep_batch(self) -> list[Group] | None:
        """Admit, generate, score and place until the current buffer is full; then consume."""
        start = time.perf_counter()
        while not self.buffer.ready(self.buffer.version):
            if self._stop.is_set():
                return None
            self._swap_weights()
            admitted = self._dispatch()
            held = sum(row["occupied"] for row in self.buffer.snapshot()[:1])
            needed = self.buffer.batch_groups - held
            done: list[list] = []
            while self.sampler.has_work() and len(done) < needed:
                done.extend(self._generate())
            if not done and not admitted:
                raise RuntimeError(
                    f"lock-step driver stalled at version {self.buffer.version}: nothing admitted "
                    f"and nothing generating with {held}/{self.buffer.batch_groups} groups held"
                )
            # Requests still generating once the batch can fill are overprovisioned surplus.
            with self._cond:
                for rid in list(self._inflight):
                    if not any(g[0].group_id == rid for g in done):
                        self._inflight.pop(rid)
                        self.buffer.release(rid)
                        self._aborts.append(rid)
                        self.counters["surplus_aborted"] += 1
                self._apply_aborts()
            self._score_and_place(done)
        with self._cond:
            groups = self._consume()
        self.clocks.learner_wait(start, time.perf_counter())
        return groups

    def _score_and_place(self, done: list[list], taken: int = 0) -> None:
        """Scores ``done`` (groups) in one call and places them; ``taken``: the reward-queue
        items they came from, marked done under the lock (a reader seeing none unfinished sees
        every group placed)."""
        if not done:
            return
        done = [sorted(g, key=lambda t: t.sample_index) for g in sorted(done, key=_group_id)]
        flat = [t for g in done for t in g]
        start = time.perf_counter()
        rewards = np.asarray(self._score(flat), np.float32)
        self.clocks.reward(start, time.perf_counter())
        self.timeline.add("reward", start, time.perf_counter(), track="rewards")
        with self._cond:
            offset = 0
            for g in done:
                self._place(g, rewards[offset : offset + len(g)])
                offset += len(g)
            for _ in range(taken):
                self._rewards_q.task_done()
            self._cond.notify_all()

    def _consume(self) -> list[Group]:
        # Completion order varies with thread timing; request-id order does not.
        return sorted(self.buffer.consume(self._learner.version), key=_group_request_id)

    # -- the loop -----------------------------------------------------------------------------

    def run(self, start_step: int = 0) -> None:
        """Train until ``num_steps``; re-raises any thread's exception here."""
        self._learner_thread = threading.current_thread()
        with self._cond:
            self._running = True
        self.clocks.start()
        if not self.lockstep:
            self._schedule.start()
        next_batch = self._lockstep_batch if self.lockstep else self._schedule.next_batch
        try:
            for step in range(start_step, self.num_steps):
                groups = next_batch()
                if groups is None:
                    break
                self._learn(step, groups)
                if self._stop.is_set():
                    break
        finally:
            self.stop()
            if not self.lockstep:
                self._schedule.join()
            with self._cond:
                self._running = False
            self._points.run_calls()
        if self._schedule.errors:
            raise self._schedule.errors[0]

    def _learn(self, step: int, groups: list[Group]) -> None:
        version = self._learner.version
        staleness = collections.Counter(version - g.min_version for g in groups)
        start = time.perf_counter()
        batch = self._make_batch(groups)
        metrics = self._learner.step(batch)
        end = time.perf_counter()
        self.clocks.learn(start, end, getattr(batch, "num_tokens", 0))
        self.timeline.add("learn", start, end, track="learner")
        self._lockstep_admitted = 0
        self.clocks.step_end()
        # The safe point: the step is done and its weights are not yet out (a resize may run).
        if self._on_boundary is not None:
            self._on_boundary(step)
        self._points.run_calls()
        sync = None
        latest = self.weight_sync.acquire()
        if latest is not None and latest[1] >= self._learner.version:
            sync = self.weight_sync.history[-1]  # a resize at the boundary published it
        elif self.weight_sync.due(self._learner.version):
            start = time.perf_counter()
            sync = self.weight_sync.publish(self._learner.params, self._learner.version)
            self.clocks.publish(start, start + sync.seconds)
            self.timeline.add("weight_sync", start, start + sync.seconds, track="learner")
            self.wake()  # an idle sampler: new weights may unblock admission
        with self._cond:
            snapshot = self.buffer.snapshot()
        metrics.update(step_metrics(groups, staleness, self.clocks.take(), sync))
        metrics.update(buffer=snapshot, version=self._learner.version, **self.counters)
        self._on_step(step, metrics)
        if self._on_checkpoint is not None:
            self._on_checkpoint(self)


def _group_id(trajs: list) -> int:
    return trajs[0].group_id


def _group_request_id(g: Group) -> int:
    return g.request_id
