"""The asynchronous pipeline: sampler, reward and learner threads around a staleness buffer.

    sampler thread:  admit (StalenessController) -> reserve seat (StalenessBuffer) -> generate
                     -> completed group ------------------------------+
    reward thread:   score group (RewardPool) -> occupy seat, or release it (dynamic sampling)
    learner thread:  wait until buffer[version] is full -> consume -> step -> WeightSync.publish
                     -> sampler swaps to the new params at its next generate boundary

The policies (admission, placement, staleness) are the pure objects in :mod:`rljax.policy.staleness`;
this module only supplies threads, a lock and clocks. It depends on the sampler and learner
through small duck-typed interfaces, so benchmarks can drive it with fake engines:

- sampler: ``version``, ``submit(requests)``, ``step() -> finished``, ``has_work()``,
  ``set_params(params, version)``, ``abort(request_id)``; for :meth:`AsyncDriver.safe_point`
  also ``interrupt(request_id)`` and ``resume(request_id)``; slot occupancy is measured when
  it has ``busy_slots`` and ``engine.max_concurrent_decodes``;
- learner: ``version``, ``step(batch) -> metrics``, ``params``.

Step boundary: after each learner step and before its weights are published, the learner
thread calls ``on_boundary`` and runs any :meth:`AsyncDriver.call_at_boundary` work. That is the
safe point where the runtime resizes the meshes (``Run.resize``): :meth:`AsyncDriver.safe_point`
parks the sampler thread between two ``generate`` calls and interrupts every in-flight request,
keeping its partial rollout, and resumes them afterwards. With eta = 0 nothing is in flight at
that point (the next batch waits for the new weights), so a resize changes no sample.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rljax.policy.staleness import StalenessBuffer, StalenessController, has_signal
from rljax.metrics import Timeline


@dataclasses.dataclass
class Group:
    """A completed, scored GRPO group: the unit the buffer stores and the learner consumes."""

    request_id: int
    example: Any
    trajectories: list
    rewards: np.ndarray
    min_version: int


@dataclasses.dataclass
class RoleClock:
    """Busy and idle seconds of one role since the last report."""

    busy: float = 0.0
    idle: float = 0.0
    tokens: int = 0
    fill: float = 0.0  # sum over generate calls of the fraction of slots in use
    calls: int = 0

    def take(self) -> dict[str, float]:
        out = {"busy_s": self.busy, "idle_s": self.idle, "tokens": self.tokens}
        if self.calls:
            out["occupancy"] = self.fill / self.calls
        self.busy = self.idle = self.fill = 0.0
        self.tokens = self.calls = 0
        return out


class AsyncDriver:
    """Runs the three threads until ``num_steps`` learner steps are done or ``stop()``."""

    def __init__(
        self,
        *,
        sampler,
        learner,
        weight_sync,
        buffer: StalenessBuffer,
        controller: StalenessController,
        prompts: Iterator[list],
        make_request: Callable[[Any, int], Any],
        score_group: Callable[[list], np.ndarray],
        make_batch: Callable[[list[Group]], Any],
        group_size: int,
        num_steps: int,
        dynamic_sampling: bool = False,
        on_step: Callable[[int, dict], None] | None = None,
        timeline: Timeline | None = None,
        on_checkpoint: Callable[[AsyncDriver], None] | None = None,
        requeue: list | None = None,
        next_request_id: int = 0,
        encode_group: Callable[[Group], Any] | None = None,
        on_boundary: Callable[[int, dict, dict], None] | None = None,
    ):
        self.sampler = sampler
        self.learner = learner
        self.weight_sync = weight_sync
        self.buffer = buffer
        self.controller = controller
        self._prompts = prompts
        self._make_request = make_request
        self._score_group = score_group
        self._make_batch = make_batch
        self.group_size = group_size
        self.num_steps = num_steps
        self.dynamic_sampling = dynamic_sampling
        self._on_step = on_step or (lambda step, metrics: None)
        self._on_checkpoint = on_checkpoint
        self._encode_group = encode_group
        self.timeline = timeline or Timeline()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._rewards_q: queue.Queue = queue.Queue()
        self._aborts: collections.deque[int] = collections.deque()
        self._ready_prompts: collections.deque = collections.deque(requeue or [])
        self._inflight: dict[int, Any] = {}  # request id -> example, until scored
        self._partial: dict[int, list] = collections.defaultdict(list)
        self._next_id = next_request_id
        self.sampler_clock = RoleClock()
        self.learner_clock = RoleClock()
        self.counters = collections.Counter()
        self._on_boundary = on_boundary
        self._boundary_calls: collections.deque = collections.deque()
        self._learner_thread: threading.Thread | None = None
        self._running = False
        self._sampler_alive = False
        self._park = False  # the learner asks the sampler thread to stop between generates
        self._parked = False

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every thread to finish at its next safe point (the learner after its step)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

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

    def call_at_boundary(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the learner thread at the next step boundary; wait for its result.

        From the learner thread itself, or when no run is in progress, ``fn`` runs at once. Work
        still queued when the run ends runs then, after the threads have stopped.
        """
        if self.on_learner_thread():
            return fn()
        done, box = threading.Event(), {}
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
    def safe_point(self):
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
            while self._park and not self._stop.is_set():
                self._cond.wait(timeout=0.1)
            self._parked = False

    def checkpoint_state(self) -> dict[str, Any]:
        """A consistent, JSON-safe snapshot: buffered groups, prompts to re-dispatch, next id.

        Taken under the lock, so each group is either in the buffer (occupied) or among the
        pending prompts (dispatched, not yet scored), never both and never neither.
        """
        with self._cond:
            return {
                "buffer": self.buffer.state_dict(self._encode_group),
                "pending": list(self._inflight.values()) + list(self._ready_prompts),
                "next_request_id": self._next_id,
            }

    # -- sampler thread ---------------------------------------------------------------------

    def _next_prompt(self):
        if not self._ready_prompts:
            self._ready_prompts.extend(next(self._prompts))
        return self._ready_prompts.popleft()

    def _swap_weights(self) -> None:
        latest = self.weight_sync.acquire()
        if latest is not None and latest[1] > self.sampler.version:
            self.sampler.set_params(*latest)

    def _apply_aborts(self) -> None:
        """Drop surplus requests from the sampler (call under the lock)."""
        while self._aborts:
            rid = self._aborts.popleft()
            self.sampler.abort(rid)
            self._partial.pop(rid, None)

    def _dispatch(self) -> None:
        requests = []
        with self._cond:
            self._apply_aborts()
            cap = self.controller.capacity(
                self.buffer.version, self.buffer.num_pending, self.buffer.accepted
            )
            for _ in range(cap):
                example = self._next_prompt()
                # An id is spent only on a granted seat, so ids (and the sampling seeds derived
                # from them) do not depend on how often admission was retried.
                rid = self._next_id
                if self.buffer.reserve(rid, self.sampler.version) is None:
                    self._ready_prompts.appendleft(example)
                    break
                self._next_id += 1
                self._inflight[rid] = example
                requests.append(self._make_request(example, rid))
        if requests:
            self.sampler.submit(requests)
            self.counters["dispatched"] += len(requests)

    def _sampler_loop(self) -> None:
        while not self._stop.is_set():
            self._wait_while_parked()
            self._swap_weights()
            self._dispatch()
            if self.sampler.has_work():
                start = time.perf_counter()
                finished = self.sampler.step()
                end = time.perf_counter()
                self.sampler_clock.busy += end - start
                self._measure_occupancy(len(finished))
                self.timeline.add("generate", start, end, track="sampler")
                for t in finished:
                    self.sampler_clock.tokens += len(t.response_tokens)
                    group = self._partial[t.group_id]
                    group.append(t)
                    if len(group) == self.group_size:
                        self._rewards_q.put(self._partial.pop(t.group_id))
            else:
                start = time.perf_counter()
                with self._cond:
                    self._cond.wait(timeout=0.05)
                self.sampler_clock.idle += time.perf_counter() - start

    def _measure_occupancy(self, finished: int) -> None:
        busy = getattr(self.sampler, "busy_slots", None)
        engine = getattr(self.sampler, "engine", None)
        if busy is None or engine is None:
            return
        # Slots used by this generate: those still running plus those it just finished.
        self.sampler_clock.fill += min(1.0, (busy + finished) / engine.max_concurrent_decodes)
        self.sampler_clock.calls += 1

    def _sampler_main(self) -> None:
        self._sampler_alive = True
        try:
            self._sampler_loop()
        finally:
            with self._cond:
                self._sampler_alive = False
                self._cond.notify_all()

    # -- reward thread ----------------------------------------------------------------------

    def _reward_loop(self) -> None:
        while True:
            trajs = self._rewards_q.get()
            if trajs is None:
                return
            # Completion order is not sample order: sort first, so rewards[i] is trajs[i]'s.
            trajs = sorted(trajs, key=lambda t: t.sample_index)
            start = time.perf_counter()
            rewards = self._score_group(trajs)
            self.timeline.add("reward", start, time.perf_counter(), track="rewards")
            rid = trajs[0].group_id
            min_version = min(t.min_version for t in trajs)
            with self._cond:
                example = self._inflight.pop(rid, None)
                if self.dynamic_sampling and not has_signal(list(rewards)):
                    self.buffer.release(rid)
                    self.counters["dropped_no_signal"] += 1
                else:
                    group = Group(
                        rid,
                        example,
                        trajs,
                        np.asarray(rewards),
                        min_version,
                    )
                    surplus = self.buffer.occupy(rid, group, min_version)
                    for s in surplus:
                        self._inflight.pop(s, None)
                    self._aborts.extend(surplus)
                    self.counters["surplus_aborted"] += len(surplus)
                self._cond.notify_all()

    # -- learner (calling) thread -----------------------------------------------------------

    def _wait_for_batch(self) -> list[Group] | None:
        start = time.perf_counter()
        with self._cond:
            while not self.buffer.ready(self.learner.version):
                if self._stop.is_set() or self._errors:
                    return None
                self._cond.wait(timeout=0.1)
            # Completion order varies with thread timing; request-id order does not.
            groups = sorted(self.buffer.consume(self.learner.version), key=lambda g: g.request_id)
            self._cond.notify_all()
        end = time.perf_counter()
        self.learner_clock.idle += end - start
        self.timeline.add("wait", start, end, track="learner")
        return groups

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run():
            try:
                fn()
            except BaseException as e:  # surfaced by run() on the learner thread
                self._errors.append(e)
                self.stop()

        return run

    def run(self, start_step: int = 0) -> None:
        """Train until ``num_steps``; re-raises any thread's exception here."""
        threads = [
            threading.Thread(target=self._guard(self._sampler_main), name="sampler", daemon=True),
            threading.Thread(target=self._guard(self._reward_loop), name="rewards", daemon=True),
        ]
        self._learner_thread = threading.current_thread()
        self._sampler_alive = True  # until the thread says otherwise, safe_point waits for it
        self._running = True
        for t in threads:
            t.start()
        try:
            for step in range(start_step, self.num_steps):
                groups = self._wait_for_batch()
                if groups is None:
                    break
                self._learn(step, groups)
                if self._stop.is_set():
                    break
        finally:
            self._stop.set()
            with self._cond:
                self._cond.notify_all()
            self._rewards_q.put(None)
            for t in threads:
                t.join()
            with self._cond:
                self._running = False
            self._run_boundary_calls()
        if self._errors:
            raise self._errors[0]

    def _learn(self, step: int, groups: list[Group]) -> None:
        version = self.learner.version
        staleness = collections.Counter(version - g.min_version for g in groups)
        start = time.perf_counter()
        batch = self._make_batch(groups)
        metrics = self.learner.step(batch)
        end = time.perf_counter()
        self.learner_clock.busy += end - start
        self.learner_clock.tokens += getattr(batch, "num_tokens", 0)
        self.timeline.add("learn", start, end, track="learner")
        sampler, learner = self.sampler_clock.take(), self.learner_clock.take()
        # The safe point: the step is done and its weights are not yet out (a resize may run).
        if self._on_boundary is not None:
            self._on_boundary(step, sampler, learner)
        self._run_boundary_calls()
        sync = None
        latest = self.weight_sync.acquire()
        if latest is not None and latest[1] >= self.learner.version:
            sync = self.weight_sync.history[-1]  # a resize at the boundary published it
        elif self.weight_sync.due(self.learner.version):
            start = time.perf_counter()
            sync = self.weight_sync.publish(self.learner.params, self.learner.version)
            self.timeline.add("weight_sync", start, start + sync.seconds, track="learner")
            with self._cond:  # wake an idle sampler: new weights may unblock admission
                self._cond.notify_all()
        with self._cond:
            snapshot = self.buffer.snapshot()
        rewards = np.concatenate([g.rewards for g in groups])
        metrics.update(
            reward=float(rewards.mean()),
            response_length=float(
                np.mean([len(t.response_tokens) for g in groups for t in g.trajectories])
            ),
            staleness_hist={str(k): v for k, v in sorted(staleness.items())},
            staleness_max=max(staleness),
            sampler_busy_s=sampler["busy_s"],
            sampler_idle_s=sampler["idle_s"],
            learner_busy_s=learner["busy_s"],
            learner_idle_s=learner["idle_s"],
            sampler_tokens_per_s=sampler["tokens"] / max(sampler["busy_s"], 1e-9),
            **({"sampler_occupancy": sampler["occupancy"]} if "occupancy" in sampler else {}),
            learner_tokens_per_s=learner["tokens"] / max(learner["busy_s"], 1e-9),
            buffer=snapshot,
            version=self.learner.version,
            **({"sync_bytes": sync.bytes, "sync_s": sync.seconds} if sync else {}),
            **{k: v for k, v in self.counters.items()},
        )
        self._on_step(step, metrics)
        if self._on_checkpoint is not None:
            self._on_checkpoint(self)
