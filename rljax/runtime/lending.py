"""Lending inside a step: the mechanisms behind :func:`rljax.policy.lending.decide`.

At every step boundary :class:`Lending` closes a one-step phase of its
:class:`~rljax.policy.meter.PhaseMeter` (the driver reports to it) and asks the pure policy what
to lend during the next step (``lending.*`` keys; ``Lending.force`` pins a decision instead):

- **Rollout-on-TrainPool** (async runs): while the learner waits for its batch, an engine
  replica on the learner's chips serves requests. Its weights are the learner's params, cast to
  ``sampling.dtype`` and ``device_put`` into the engine's layout on the same chips; its KV pool
  takes the memory the learner leaves free (``memory_stats``; on the CPU, which reports none,
  the sampler's own ``sampling.num_pages``); the engine is built once per mesh. The driver's
  sampler is a :class:`ReplicaSet`: admission counts the lent replica's slots and
  :func:`rljax.policy.routing.route` sends each group to one replica. The learner thread steps
  the lent replica while it waits. When the batch is ready, the replica's requests are
  interrupted and handed to the sampler, which resumes them as partial rollouts: their tokens
  keep the versions that produced them, so the staleness buffer's accounting holds (the lent
  replica's version is the learner's, never older than the sampler's).
- **Trainer-on-RollPool** (any mode): the learner's step computes the gradients of a share of
  its micro-batches on the sampler's chips (:class:`rljax.learner.learner.GradLoan`) and sums
  them into its own update; it stays the only optimiser and version authority.

Single-process, and not combined with ``mesh.reallocate`` yet (:func:`check_lending`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rljax.config import ConfigError
from rljax.engine.engine import Engine
from rljax.engine.sampler import Request, Sampler, Trajectory
from rljax.learner.learner import GradLoan
from rljax.mesh.resize import MeshCache
from rljax.mesh.weight_sync import WeightSync
from rljax.models.sharding import make_mesh
from rljax.policy.lending import LendDirection, LendingDecision, LendingPolicy
from rljax.policy.meter import PhaseMeter
from rljax.policy.routing import ReplicaLoad, route

NONE = LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, "nothing measured yet")
# Of the memory a lent device reports free, the part the lent replica's KV pool may take.
KV_MEMORY_FRAC = 0.9


def check_lending(cfg, process_count: int) -> None:
    """Refuse, with a one-line error, a lending setup this runtime cannot run yet."""
    if not cfg.lending.enabled:
        return
    if cfg.mesh.reallocate:
        raise ConfigError(
            "config keys 'lending.enabled' and 'mesh.reallocate' are both True; the runtime "
            "lends or reallocates, not both yet: turn one off"
        )
    if process_count > 1:
        raise ConfigError(
            f"config key 'lending.enabled' = True is single-process for now; turn it off for "
            f"this {process_count}-process run"
        )


class ReplicaSet:
    """The driver's sampler: the run's sampler, plus a lent replica on the learner's chips.

    The sampler thread drives ``main`` as before (``step``, ``submit``, ``set_params``,
    ``abort``); the learner thread drives the lent replica (:meth:`serve`) between
    :meth:`lend` and :meth:`release`. Requests routed to the lent replica wait in an inbox the
    learner thread takes; what it finishes, and the samples it hands back at release, wait
    until the sampler thread's next call, so only that thread touches ``main``. Locks: ``_serve``
    around any use of the lent sampler, then ``_lock`` (short) around the lent pointer, the
    inbox and the lent load; always in that order. ``busy_slots``, ``num_slots`` and
    ``kv_tokens`` are the main sampler's (the PhaseMeter measures it); ``lent_free_slots`` is
    what admission adds while a replica is lent.
    """

    def __init__(self, main: Sampler):
        self.main = main
        self.lent: Sampler | None = None
        self._serve = threading.Lock()
        self._lock = threading.Lock()
        self._inbox: collections.deque[Request] = collections.deque()
        # Handed back: a started request's samples (a list) or a request no replica started.
        self._returns: collections.deque[list | Request] = collections.deque()
        self._lent_load = (0, 0)  # (free slots, queued samples) after its last step
        # Trajectories the lent replica finished, returned by the sampler thread's next step.
        self._finished: collections.deque[Trajectory] = collections.deque()
        self.on_routed = lambda: None  # wakes the learner thread serving the lent replica
        self.stats: collections.Counter = collections.Counter()

    # -- the sampler interface the driver uses ----------------------------------------------

    @property
    def version(self) -> int:
        return self.main.version

    @property
    def engine(self) -> Engine:
        return self.main.engine

    @property
    def busy_slots(self) -> int:
        return self.main.busy_slots

    @property
    def num_slots(self) -> int:
        return self.main.num_slots

    @property
    def kv_tokens(self) -> int:
        return self.main.kv_tokens

    @property
    def lent_free_slots(self) -> int:
        with self._lock:
            return self._lent_load[0] if self.lent is not None else 0

    @property
    def queued_samples(self) -> int:
        with self._lock:
            lent = self._lent_load[1] + sum(r.num_samples for r in self._inbox)
        return self._main_queued() + lent

    @property
    def returning_samples(self) -> int:
        """Samples handed back that the main sampler has not adopted yet."""
        return sum(_samples(x) for x in list(self._returns))

    def _main_queued(self) -> int:
        return self.main.queued_samples + self.returning_samples

    def has_work(self) -> bool:
        return bool(self._returns or self._finished) or self.main.has_work()

    def submit(self, requests: Sequence[Request]) -> list[int]:
        """Route each group to a replica with an unclaimed slot (the main one when none has)."""
        main, lent = [], []
        with self._lock:  # a release cannot slip between routing and the inbox
            load = [ReplicaLoad(0, self.main.num_slots - self.main.busy_slots, self._main_queued())]
            if self.lent is not None:
                inbox = sum(r.num_samples for r in self._inbox)
                load.append(ReplicaLoad(1, self._lent_load[0], self._lent_load[1] + inbox))
            for r in requests:
                i = route(load) or 0
                load[i] = load[i]._replace(queued=load[i].queued + r.num_samples)
                (lent if i else main).append(r)
            if lent:
                self._check(lent)
                self._inbox.extend(lent)
                self.stats["routed_groups"] += len(lent)
        ids = self.main.submit(main) if main else []
        if lent:
            self.on_routed()
        return ids + [r.request_id for r in lent]

    def step(self) -> list[Trajectory]:
        """One generate on the main sampler, plus what the lent replica finished meanwhile."""
        self._adopt()
        lent = [self._finished.popleft() for _ in range(len(self._finished))]
        return self.main.step() + lent

    def set_params(self, params, version: int) -> None:
        self.main.set_params(params, version)

    def abort(self, request_id: int) -> None:
        self._adopt()
        self.main.abort(request_id)
        with self._serve:
            with self._lock:
                self._drop_inbox(request_id)
                lent = self.lent
            if lent is not None:
                lent.abort(request_id)

    def interrupt(self, request_id: int) -> int:
        """Hold the request on the main sampler, wherever its samples were (resume reads it)."""
        self._adopt()
        with self._serve:
            with self._lock:
                waiting, lent = self._drop_inbox(request_id), self.lent
            self.main.submit(waiting)
            if lent is not None:
                self.main.adopt(lent.hand_over(request_id))
        return self.main.interrupt(request_id)

    def resume(self, request_id: int) -> None:
        self.main.resume(request_id)

    # -- lending ----------------------------------------------------------------------------

    def lend(self, replica: Sampler) -> None:
        """Start serving on ``replica`` (its weights loaded, its slots empty)."""
        with self._lock:
            self.lent = replica
            self._lent_load = (replica.num_slots, 0)
            self.stats["lends"] += 1

    def serve(self) -> bool:
        """One generate on the lent replica; False when none is lent or it has nothing to do.

        What it finishes goes to the main sampler's caller with its next ``step``.
        """
        with self._serve:
            with self._lock:
                lent = self.lent
                new = [self._inbox.popleft() for _ in range(len(self._inbox))]
            if lent is None:
                return False
            if new:
                lent.submit(new)
            if not lent.has_work():
                return False
            tokens = lent.stats["tokens"]
            self._finished.extend(lent.step())
            with self._lock:
                self.stats["served_tokens"] += lent.stats["tokens"] - tokens
                self.stats["served_steps"] += 1
                self._lent_load = (lent.num_slots - lent.busy_slots, lent.queued_samples)
            return True

    def release(self) -> Sampler | None:
        """Stop lending: the replica's requests go back to the main sampler; returns it."""
        with self._serve, self._lock:
            lent, self.lent = self.lent, None
            self._lent_load = (0, 0)
            if lent is None:
                return None
            self.stats["handed_over_samples"] += sum(r.num_samples for r in self._inbox)
            self._returns.extend(self._inbox)
            self._inbox.clear()
            for rid in sorted(lent.request_ids()):
                samples = lent.hand_over(rid)
                self.stats["handed_over_samples"] += len(samples)
                self._returns.append(samples)
        return lent

    def _adopt(self) -> None:
        """Queue the samples the lent replica handed back (on the thread driving ``main``)."""
        while self._returns:
            item = self._returns.popleft()
            self.stats["adopted_samples"] += _samples(item)
            if isinstance(item, Request):
                self.main.submit([item])
            else:
                self.main.adopt(item)

    def _drop_inbox(self, request_id: int) -> list[Request]:
        """Take a request out of the inbox (call under ``_lock``)."""
        out = [r for r in self._inbox if r.request_id == request_id]
        for r in out:
            self._inbox.remove(r)
        return out

    def _check(self, requests: list[Request]) -> None:
        budget = self.main.engine.sampling_cfg.max_new_tokens
        for r in requests:
            if r.request_id < 0:
                raise ValueError("a request routed to a lent replica needs its own request_id")
            if r.max_new_tokens is None:
                r.max_new_tokens = budget


def _samples(item: list | Request) -> int:
    return item.num_samples if isinstance(item, Request) else len(item)


@dataclasses.dataclass
class _Replica:
    engine: Engine
    sync: WeightSync


def build(run) -> Lending | None:
    """The run's lending (None with ``lending.enabled`` off); refuses what cannot run yet."""
    check_lending(run.cfg, run.shard_count)
    return Lending(run) if run.cfg.lending.enabled else None


def attach(run, driver):
    """Wire ``run.lending`` into a new driver: its sampler, learner and meter; returns it."""
    lend = getattr(run, "lending", None)  # a PodRun builds none
    if lend is not None:
        driver.sampler, driver.learner = lend.replicas, LendingLearner(lend)
        driver.clocks.meter = lend.meter
        driver._lender = lend  # as Driver(lender=...) would: built by Run, wired here

        def wake():
            with driver._cond:
                driver._cond.notify_all()

        lend.replicas.on_routed = wake
    return driver


class LendingLearner:
    """The driver's learner: the run's current one, whose step lends as decided
    (Trainer-on-RollPool) and whose metrics carry the step's lending record."""

    def __init__(self, lending: Lending):
        self._lending = lending

    def __getattr__(self, name: str):
        return getattr(self._lending.run.learner, name)

    def step(self, batch) -> dict[str, Any]:
        metrics = self._lending.learn(self._lending.run.learner, batch)
        metrics.update(self._lending.metrics())
        return metrics


class Lending:
    """Config-driven lending for a :class:`~rljax.runtime.run.Run` (``lending.enabled``).

    The driver reports its events to ``meter``, uses ``replicas`` as its sampler and calls the
    hooks :meth:`waiting`, :meth:`serve`, :meth:`ready`, :meth:`learn` and :meth:`metrics`;
    the run calls :meth:`at_boundary` after every step. Set ``force`` to a LendingDecision to
    lend that way every step whatever the policy says (tests, benchmarks).
    """

    def __init__(self, run):
        self.run = run
        self.config = run.cfg.lending
        self.meter = PhaseMeter()
        self.policy = LendingPolicy(self.config)
        self.replicas = ReplicaSet(run.sampler)
        self.force: LendingDecision | None = None
        self.decision = NONE
        self.decisions: list[LendingDecision] = []
        self.last_stats = None  # the PhaseStats the last decision read
        self.stats: collections.Counter = collections.Counter()
        self._engines = MeshCache()
        self._reported: collections.Counter = collections.Counter()
        run.step_hooks.append(self.at_boundary)

    # -- the policy -------------------------------------------------------------------------

    def _rewire(self) -> None:
        """A resize hands the driver the bare learner; lending wraps it again."""
        driver = self.run.driver
        if driver is not None and not isinstance(driver.learner, LendingLearner):
            driver.learner = LendingLearner(self)

    def at_boundary(self, run, step: int) -> None:
        """Close the step's phase and decide what to lend in the next one."""
        self._rewire()
        split = run.topology.split
        stats = self.meter.stats(
            split=split,
            slots=run.sampler.num_slots,
            buffer_rows=run.driver.buffer_rows() if run.driver is not None else [],
            batch_groups=run.cfg.learner.batch_groups,
            switch_cost_s=0.0,
            granularity=1,
        )
        self.policy.param_bytes = float(sum(x.nbytes for x in jax.tree.leaves(run.learner.params)))
        self.last_stats = stats
        decided = self.policy.decide(stats, split)
        if decided.loan(LendDirection.ROLLOUT_ON_TRAIN) and run.cfg.mode != "async":
            why = "Rollout-on-TrainPool needs mode='async' (a lock-step learner has no wait)"
            if decided.direction is LendDirection.ROLLOUT_ON_TRAIN:
                decided = decided.also or LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, why)
            else:
                decided = dataclasses.replace(decided, also=None)
        self.decision = self.force or decided
        self.policy.running = self.decision  # the policy judges the loan the next step runs
        self.decisions.append(self.decision)

    @property
    def _current(self) -> LendingDecision:
        return self.force or self.decision

    # -- Rollout-on-TrainPool ---------------------------------------------------------------

    def waiting(self, learner) -> None:
        """The learner starts waiting for a batch: lend its chips to rollout if so decided."""
        self._rewire()
        d = self._current.loan(LendDirection.ROLLOUT_ON_TRAIN)
        if d is None or self.replicas.lent is not None:
            return
        driver = self.run.driver
        if driver is not None and driver.buffer.ready(learner.version):
            return  # no wait to fill
        devices = list(learner.mesh.devices.flat)[: max(1, d.chips)]
        replica = self._replica(devices)
        params = replica.sync.copy(learner.params)
        stop_ids = sorted(self.run.sampler.stop_ids)
        self.replicas.lend(
            Sampler(replica.engine, params, version=learner.version, stop_ids=stop_ids)
        )
        self.stats["rollout_lends"] += 1

    def serve(self) -> bool:
        """One generate on the lent replica (the learner thread, while it waits)."""
        start = time.perf_counter()
        served = self.replicas.serve()
        if served:
            self.run.timeline.add("lent_generate", start, time.perf_counter(), track="learner")
        return served

    def ready(self) -> None:
        """The batch is ready: give the learner's chips back before it trains."""
        lent = self.replicas.release()
        if lent is not None:  # its KV pool and weight copy go; the engine stays compiled
            lent.state = lent.params = None

    def _replica(self, devices: list) -> _Replica:
        mesh = make_mesh(devices, {"data": len(devices), "tensor": 1})
        return self._engines.get(mesh, lambda: self._build_replica(mesh))

    def _build_replica(self, mesh) -> _Replica:
        cfg = self.run.cfg
        model_cfg, graphdef = self.run.sampler_model
        sampling = dataclasses.replace(
            cfg.sampling, num_pages=kv_pages(model_cfg, cfg.sampling, mesh)
        )
        engine = Engine(model_cfg, sampling, mesh, graphdef, impl=cfg.kernel_impl)
        return _Replica(engine, WeightSync(engine.param_shardings, dtype=cfg.sampling.dtype))

    # -- Trainer-on-RollPool ----------------------------------------------------------------

    def learn(self, learner, batch) -> dict[str, Any]:
        """The learner's step, with a share of its micro-batches on the sampler's chips if so
        decided."""
        d = self._current.loan(LendDirection.TRAIN_ON_ROLL)
        if d is None:
            return learner.step(batch)
        devices = list(self.run.topology.sampler.devices.flat)[: max(1, d.chips)]
        micro = learner.cfg.micro_batches
        lent = int(min(micro, max(1, round(d.share * micro))))
        self.stats["lent_micro_batches"] += lent
        self.stats["train_lends"] += 1
        return learner.step(batch, loan=GradLoan(tuple(devices), lent))

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """This step's lending record: the decision in force and what lending did since the
        last call."""
        now = self.stats + self.replicas.stats
        delta = {k: now[k] - self._reported[k] for k in now}
        self._reported = collections.Counter(now)
        d = self._current
        return {
            "lending/direction": d.direction.value
            + (f"+{d.also.direction.value}" if d.also else ""),
            "lending/chips": d.chips,
            "lending/share": d.share,
            **{f"lending/{k}": int(v) for k, v in sorted(delta.items())},
        }


def kv_pages(model_cfg, sampling, mesh) -> int:
    """KV pages for a replica on ``mesh``: what its devices report free, or ``sampling``'s own.

    The pool is split into one shard per device when the slots divide evenly (else every device
    holds all of it), each with every kv head; the pages per shard are what the device with the
    least free memory holds, capped at what the slots can use. Devices that report no memory
    (the CPU) get ``sampling.num_pages``.
    """
    stats = [d.memory_stats() for d in mesh.devices.flat]
    if not all(s and "bytes_limit" in s for s in stats):
        return sampling.num_pages
    free = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
    itemsize = jnp.dtype(sampling.dtype).itemsize
    page = 2 * model_cfg.num_layers * model_cfg.num_kv_heads * model_cfg.head_dim * itemsize
    per_shard = int(KV_MEMORY_FRAC * free // (page * sampling.page_size))
    if per_shard < 1:
        raise RuntimeError(
            f"the learner leaves {free} bytes free per device, not one KV page; lend fewer "
            "learner chips (lending.max_lend_frac) or shrink the learner's footprint"
        )
    slots, n = sampling.max_concurrent_decodes, mesh.devices.size
    shards = n if slots % n == 0 else 1
    per_slot = -(-sampling.max_seq_len // sampling.page_size)
    return min(per_shard * shards, slots * per_slot + shards)
