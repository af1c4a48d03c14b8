"""Lending inside a step: the mechanisms behind :func:`rljax.policy.lending.decide`.

At every step boundary :class:`Lending` closes a one-step phase of its
:class:`~rljax.policy.meter.PhaseMeter` (the driver reports to it) and asks the pure policy what
to lend during the next step (``lending.*`` keys; ``Lending.force`` pins a decision instead):

- **Rollout-on-TrainPool** (async runs): while the learner waits for its batch, an engine
  replica on the learner's chips serves requests. Its weights are the learner's params, cast to
  ``sampling.dtype`` and ``device_put`` into the engine's layout on the same chips; its KV pool
  takes the memory the learner leaves free (``memory_stats``; on the CPU, which reports none,
  the sampler's own ``sampling.num_pages``); the engine is built once per mesh. The driver's
  sampler is a :class:`~rljax.runtime.replica_set.ReplicaSet`: admission counts the lent
  replica's slots and :func:`rljax.policy.routing.route` sends each group to one replica. The
  learner thread steps the lent replica while it waits. When the batch is ready, the replica's
  requests are interrupted and handed to the sampler, which resumes them as partial rollouts:
  their tokens keep the versions that produced them, so the staleness buffer's accounting holds
  (the lent replica's version is the learner's, never older than the sampler's).
- **Trainer-on-RollPool** (any mode): the learner's step computes the gradients of a share of
  its micro-batches on the sampler's chips (:class:`rljax.learner.learner.GradLoan`) and sums
  them into its own update; it stays the only optimiser and version authority.

Single-process (a pod refuses it: :func:`rljax.runtime.pod_hosting.check_pod`), and not
combined with ``mesh.reallocate`` yet (the config refuses that: :class:`rljax.config.RunConfig`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from rljax.engine.engine import Engine
from rljax.engine.sampler import Sampler
from rljax.learner.learner import GradLoan
from rljax.mesh.resize import MeshCache
from rljax.mesh.weight_sync import WeightSync
from rljax.models.sharding import make_mesh
from rljax.policy.lending import (
    HELD_THRESHOLD,
    LendDirection,
    LendingConfig,
    LendingDecision,
    LendingPolicy,
)
from rljax.policy.meter import PhaseMeter
from rljax.policy.reallocation import PhaseStats, Split
from rljax.runtime.replica_set import ReplicaSet

NONE = LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, "nothing measured yet")
# Of the memory a lent device reports free, the part the lent replica's KV pool may take.
KV_MEMORY_FRAC = 0.9


@dataclasses.dataclass
class _Replica:
    engine: Engine
    sync: WeightSync


def build(run) -> RunLending | None:
    """The run's lending (None with ``lending.enabled`` off)."""
    return RunLending(run) if run.cfg.lending.enabled else None


def driver_parts(run) -> dict[str, Any]:
    """``Driver(...)``'s ``sampler``, ``learner``, ``meter`` and ``lender`` for ``run``: with
    ``lending.enabled``, those of ``run.lending`` (:meth:`Lending.driver_parts`); else the run's
    own sampler and learner, reporting to the reallocation's meter if it reallocates."""
    if run.lending is not None:
        return run.lending.driver_parts(lambda: run.learner)
    meter = run.reallocation.meter if run.reallocation is not None else None
    return {"sampler": run.sampler, "learner": run.learner, "meter": meter, "lender": None}


class LendingLearner:
    """The driver's learner: ``learner()``, whose step lends as decided (Trainer-on-RollPool)
    and whose metrics carry the step's lending record."""

    def __init__(self, lending: Lending, learner: Callable[[], Any]):
        self._lending = lending
        self._learner = learner

    @property
    def version(self) -> int:
        return self._learner().version

    @property
    def params(self) -> Any:
        return self._learner().params

    def step(self, batch) -> dict[str, Any]:
        metrics = self._lending.learn(self._learner(), batch)
        metrics.update(self._lending.metrics())
        return metrics


class Lending:
    """Lending inside a step, whatever the chips: the policy, its meter and the loans' hooks.

    The driver reports its events to ``meter``, uses ``replicas`` as its sampler and calls the
    hooks :meth:`waiting`, :meth:`serve`, :meth:`ready`, :meth:`learn` and :meth:`metrics`
    (build it with :meth:`driver_parts`; the driver then binds itself, :meth:`bind`); the owner
    calls :meth:`decide` after every step. How a loan is
    carried out is a subclass's: :class:`RunLending` on a run's devices,
    ``rljax.testing.fake_lending.FakeLending`` over the fakes' cost models. Set ``force`` to a
    LendingDecision to lend that way every step whatever the policy says (tests, benchmarks).

    Args:
      config: the policy's knobs (``RunConfig.lending``).
      sampler: the sampler the driver would use; ``replicas`` wraps it.
      mode: the run's mode; Rollout-on-TrainPool needs ``'async'``.
      max_new_tokens: the token budget of a routed request that names none.
      held_threshold: ``reallocator.held_threshold``, which the policy reads too.
    """

    def __init__(
        self,
        config: LendingConfig,
        sampler,
        *,
        mode: str = "async",
        max_new_tokens: int | None = None,
        held_threshold: float = HELD_THRESHOLD,
    ):
        self.config = config
        self.mode = mode
        self.meter = PhaseMeter()
        self.policy = LendingPolicy(config, held_threshold=held_threshold)
        self.replicas = ReplicaSet(sampler, max_new_tokens=max_new_tokens)
        self.replicas.on_routed = self._wake_driver
        self.driver = None  # the driver lending through this; it binds itself when built
        self.force: LendingDecision | None = None
        self.decision = NONE
        self.decisions: list[LendingDecision] = []
        self.last_stats: PhaseStats | None = None  # what the last decision read
        self.stats: collections.Counter = collections.Counter()
        self._reported: collections.Counter = collections.Counter()

    # -- the driver -------------------------------------------------------------------------

    def driver_parts(self, learner: Callable[[], Any]) -> dict[str, Any]:
        """``Driver(...)``'s ``sampler``, ``learner``, ``meter`` and ``lender`` that make it lend
        through this: ``replicas``, a :class:`LendingLearner` over ``learner()`` (read at each
        step: a resize replaces it), ``meter`` and this lending itself."""
        lent = LendingLearner(self, learner)
        return {"sampler": self.replicas, "learner": lent, "meter": self.meter, "lender": self}

    def bind(self, driver) -> None:
        """Called by ``Driver(lender=self)``: the driver whose buffer a loan reads and whose
        learner thread a group routed to the lent replica wakes."""
        self.driver = driver

    def _wake_driver(self) -> None:
        if self.driver is not None:
            self.driver.wake()

    # -- the policy -------------------------------------------------------------------------

    def decide(self, stats: PhaseStats, split: Split, param_bytes: float) -> LendingDecision:
        """Decide what to lend in the next step from the step just measured (``stats``)."""
        self.policy.param_bytes = param_bytes
        self.last_stats = stats
        decided = self.policy.decide(stats, split)
        if decided.loan(LendDirection.ROLLOUT_ON_TRAIN) and self.mode != "async":
            why = "Rollout-on-TrainPool needs mode='async' (a lock-step learner has no wait)"
            if decided.direction is LendDirection.ROLLOUT_ON_TRAIN:
                decided = decided.also or LendingDecision(LendDirection.NONE, 0, 0.0, 0.0, why)
            else:
                decided = dataclasses.replace(decided, also=None)
        self.decision = self.force or decided
        self.policy.running = self.decision  # the policy judges the loan the next step runs
        self.decisions.append(self.decision)
        return self.decision

    @property
    def _current(self) -> LendingDecision:
        return self.force or self.decision

    # -- Rollout-on-TrainPool ---------------------------------------------------------------

    def waiting(self, learner) -> None:
        """The learner starts waiting for a batch: lend its chips to rollout if so decided."""
        d = self._current.loan(LendDirection.ROLLOUT_ON_TRAIN)
        if d is None or self.replicas.lent is not None or self._batch_ready(learner):
            return  # no loan, one running, or no wait to fill
        self.replicas.lend(self._open_replica(learner, max(1, d.chips)))
        self.stats["rollout_lends"] += 1

    def serve(self) -> bool:
        """One generate on the lent replica (the learner thread, while it waits)."""
        return self.replicas.serve()

    def ready(self) -> None:
        """The batch is ready: give the learner's chips back before it trains."""
        lent = self.replicas.release()
        if lent is not None:
            self._close_replica(lent)

    # -- Trainer-on-RollPool ----------------------------------------------------------------

    def learn(self, learner, batch) -> dict[str, Any]:
        """The learner's step, with a share of its micro-batches on the sampler's chips if so
        decided."""
        d = self._current.loan(LendDirection.TRAIN_ON_ROLL)
        if d is None:
            return learner.step(batch)
        micro = self._micro_batches(learner)
        lent = int(min(micro, max(1, round(d.share * micro))))
        self.stats["lent_micro_batches"] += lent
        self.stats["train_lends"] += 1
        return self._lent_step(learner, batch, max(1, d.chips), lent)

    # -- how a loan is carried out (subclasses) -----------------------------------------------

    def _batch_ready(self, learner) -> bool:
        """Whether the learner's batch is ready already (then there is no wait to lend)."""
        return self.driver is not None and self.driver.buffer.ready(learner.version)

    def _open_replica(self, learner, chips: int):
        """A sampler on ``chips`` of the learner's chips, holding its weights and version."""
        raise NotImplementedError

    def _close_replica(self, replica) -> None:
        """Free what a released replica holds (its requests have been handed back)."""

    def _micro_batches(self, learner) -> int:
        """How many micro-batches the learner's step is cut into (the unit a loan takes)."""
        return learner.cfg.micro_batches

    def _lent_step(self, learner, batch, chips: int, micro_batches: int) -> dict[str, Any]:
        """The learner's step with its last ``micro_batches`` on ``chips`` sampler chips."""
        raise NotImplementedError

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


class RunLending(Lending):
    """Config-driven lending for a :class:`~rljax.runtime.run.Run` (``lending.enabled``): the
    lent replica is an engine on the learner's devices, the lent gradients a
    :class:`~rljax.learner.learner.GradLoan` on the sampler's; the run calls :meth:`at_boundary`
    after every step."""

    def __init__(self, run):
        super().__init__(
            run.cfg.lending,
            run.sampler,
            mode=run.cfg.mode,
            max_new_tokens=run.cfg.sampling.max_new_tokens,
            held_threshold=run.cfg.reallocator.held_threshold,
        )
        self.run = run
        self._engines = MeshCache()
        run.step_hooks.append(self.at_boundary)

    def _rewire(self) -> None:
        """A resize hands the driver the bare learner; lending wraps it again."""
        driver = self.driver
        if driver is not None and not isinstance(driver.learner, LendingLearner):
            driver.use_learner(LendingLearner(self, lambda: self.run.learner))

    def at_boundary(self, run, step: int) -> None:
        """Close the step's phase and decide what to lend in the next one."""
        self._rewire()
        split = run.topology.split
        stats = self.meter.stats(
            split=split,
            slots=run.sampler.num_slots,
            buffer_rows=self.driver.buffer_rows() if self.driver is not None else [],
            batch_groups=run.cfg.learner.batch_groups,
            switch_cost_s=0.0,
            granularity=1,
        )
        param_bytes = float(sum(x.nbytes for x in jax.tree.leaves(run.learner.params)))
        self.decide(stats, split, param_bytes)

    def waiting(self, learner) -> None:
        self._rewire()
        super().waiting(self.run.learner)  # the Learner itself: a lent replica takes its mesh

    def serve(self) -> bool:
        start = time.perf_counter()
        served = super().serve()
        if served:
            self.run.timeline.add("lent_generate", start, time.perf_counter(), track="learner")
        return served

    def _open_replica(self, learner, chips: int) -> Sampler:
        replica = self._replica(list(learner.mesh.devices.flat)[:chips])
        params = replica.sync.copy(learner.params)
        stop_ids = sorted(self.run.sampler.stop_ids)
        return Sampler(replica.engine, params, version=learner.version, stop_ids=stop_ids)

    def _close_replica(self, replica: Sampler) -> None:
        replica.close()

    def _replica(self, devices: list) -> _Replica:
        mesh = make_mesh(devices, {"data": len(devices), "tensor": 1})
        return self._engines.get(mesh, lambda: self._build_replica(mesh))

    def _build_replica(self, mesh) -> _Replica:
        cfg = self.run.cfg
        model_cfg, graphdef = self.run.sampler_model
        sampling = dataclasses.replace(
            cfg.sampling, num_pages=kv_pages(model_cfg, cfg.sampling, mesh)
        )
        engine = Engine(model_cfg, sampling, mesh, graphdef, impl=cfg.kernel_impl, lora=cfg.lora)
        sync = WeightSync(
            engine.param_shardings, dtype=cfg.sampling.dtype, adapters_only=cfg.lora.enabled
        )
        return _Replica(engine, sync)

    def _lent_step(self, learner, batch, chips: int, micro_batches: int) -> dict[str, Any]:
        devices = list(self.run.topology.sampler.devices.flat)[:chips]
        return learner.step(batch, loan=GradLoan(tuple(devices), micro_batches))


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
