"""Lending carried out on a run's devices (``lending.enabled``): :class:`RunLending`.

The lent replica is an engine on the learner's devices, built once per mesh, its KV pool what
they leave free (:func:`kv_pages`); the lent gradients are the learner's step on the sampler's
devices (a :class:`~rljax.learner.loan.GradLoan`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.engine.sampler import Sampler
from rljax.learner.learner import Learner
from rljax.learner.loan import GradLoan
from rljax.mesh.resize import MeshCache
from rljax.mesh.weight_sync import WeightSync
from rljax.models.sharding import make_mesh
from rljax.policy.lending import lent_units
from rljax.runtime.driver import Driver
from rljax.runtime.hosted import HostedRun
from rljax.runtime.lending.hooks import Lending, LendingLearner

# Of the memory a lent device reports free, the part the lent replica's KV pool may take.
KV_MEMORY_FRAC = 0.9


@dataclasses.dataclass
class _Replica:
    engine: PagedEngine
    sync: WeightSync


def build(run: HostedRun) -> RunLending | None:
    """The run's lending (None with ``lending.enabled`` off)."""
    return RunLending(run) if run.cfg.lending.enabled else None


def driver_parts(run: HostedRun) -> dict[str, Any]:
    """``Driver(...)``'s ``sampler``, ``learner``, ``meter`` and ``lender`` for ``run``: with
    ``lending.enabled``, those of ``run.parts.lender`` (:meth:`Lending.driver_parts`); else
    the run's own sampler and learner, reporting to the reallocation's meter if it
    reallocates."""
    lender = run.parts.lender if run.parts is not None else None
    if lender is not None:
        return lender.driver_parts(lambda: run.learner)
    meter = run.reallocation.meter if run.reallocation is not None else None
    return {"sampler": run.sampler, "learner": run.learner, "meter": meter, "lender": None}


class RunLending(Lending):
    """Config-driven lending for a :class:`~rljax.runtime.run.Run` (``lending.enabled``): the
    lent replica is an engine on the learner's devices, the lent gradients a
    :class:`~rljax.learner.learner.GradLoan` on the sampler's; the run calls :meth:`at_boundary`
    after every step."""

    def __init__(self, run: HostedRun):
        super().__init__(
            run.cfg.lending,
            _engine_sampler(run),
            mode=run.cfg.mode,
            max_new_tokens=run.cfg.sampling.max_new_tokens,
            held_threshold=run.cfg.reallocator.held_threshold,
            tp=1,  # single devices: a lent engine or gradient step is one mesh over them
        )
        self.run = run
        self._engines = MeshCache()
        run.step_hooks.append(self.at_boundary)

    def _rewire(self) -> None:
        """A resize hands the driver the bare learner; lending wraps it again."""
        # Lending is one process's (a pod refuses it), where the driver it binds is the Driver.
        driver = cast(Driver | None, self.driver)
        if driver is not None and not isinstance(driver.learner, LendingLearner):
            driver.use_learner(LendingLearner(self, lambda: self.run.learner))

    def at_boundary(self, run: HostedRun, step: int) -> None:
        """Close the step's phase and decide what to lend in the next one."""
        self._rewire()
        split = run.topology.split
        assert split is not None  # lending needs split meshes (the config refuses it otherwise)
        stats = self.meter.stats(
            split=split,
            slots=run.sampler.num_slots,
            buffer_rows=self.driver.buffer_rows() if self.driver is not None else [],
            batch_groups=run.cfg.learner.batch_groups,
            switch_cost_s=0.0,
            granularity=self.tp,
        )
        param_bytes = float(sum(x.nbytes for x in jax.tree.leaves(run.learner.params)))
        self.decide(stats, split, param_bytes)

    def waiting(self, learner: Any) -> None:
        self._rewire()
        super().waiting(self.run.learner)  # the Learner itself: a lent replica takes its mesh

    def serve(self) -> bool:
        start = time.perf_counter()
        served = super().serve()
        if served:
            self.run.timeline.add("lent_generate", start, time.perf_counter(), track="learner")
        return served

    def _open_replica(self, learner: Learner, units: int) -> Sampler:
        replica = self._replica(list(learner.mesh.devices.flat)[: units * self.tp])
        params = replica.sync.copy(learner.params)
        stop_ids = sorted(_engine_sampler(self.run).stop_ids)
        return Sampler(replica.engine, params, version=learner.version, stop_ids=stop_ids)

    def _close_replica(self, replica: Sampler) -> None:
        replica.close()

    def _replica(self, devices: list[Any]) -> _Replica:
        mesh = make_mesh(devices, {"data": len(devices), "tensor": 1})
        return self._engines.get(mesh, lambda: self._build_replica(mesh))

    def _build_replica(self, mesh: Mesh) -> _Replica:
        cfg = self.run.cfg
        model_cfg, graphdef = self.run.sampler_model
        sampling = dataclasses.replace(
            cfg.sampling, num_pages=kv_pages(model_cfg, cfg.sampling, mesh)
        )
        engine = PagedEngine(
            model_cfg, sampling, mesh, graphdef, impl=cfg.kernel_impl, lora=cfg.lora
        )
        sync = WeightSync(
            engine.param_shardings, dtype=cfg.sampling.dtype, adapters_only=cfg.lora.enabled
        )
        return _Replica(engine, sync)

    def _lent_step(
        self, learner: Learner, batch: Any, chips: int, micro_batches: int
    ) -> dict[str, Any]:
        # The gradients run beside the sampler on its devices (nothing is parked): at least one.
        units = lent_units(chips, self.tp)
        devices = list(self.run.topology.sampler.devices.flat)[: units * self.tp]
        return learner.step(batch, loan=GradLoan(tuple(devices), micro_batches))


def _engine_sampler(run: HostedRun) -> Sampler:
    """The run's sampler as lending moves requests off it: one process's engine Sampler (a pod
    refuses lending, :func:`rljax.runtime.pod_hosting.check_pod`)."""
    return cast(Sampler, run.sampler)


def kv_pages(model_cfg: ModelConfig, sampling: SamplingConfig, mesh: Mesh) -> int:
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
