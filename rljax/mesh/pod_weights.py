"""The weight sync of a pod: the learner's params onto the sampler mesh across hosts.

A plain ``device_put`` between meshes on different processes is refused by the pinned JAX, so
the move is :func:`rljax.mesh.transfer.transfer`, one computation over the union of both
meshes that every process owning one of their devices enters at the same tick. With several
slices it runs in two stages (:mod:`rljax.mesh.fan_out`): one copy into each sampler slice,
then a fan-out inside the slice among the sampler's processes.

A LoRA run (``adapters_only``) moves the whole params once, after which the sampler processes
keep the frozen base; every later move carries the adapters alone. Every process builds the
same :class:`PodWeights` at the same time (at start and at each resize) and moves in the same
order, so all agree on which plan the next move runs without a word exchanged.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rljax.mesh.fan_out import stage_bytes, stage_shardings
from rljax.mesh.slices import SliceMap, count
from rljax.mesh.transfer import sharding_leaves, transfer
from rljax.mesh.weight_sync import AdapterMoves, cast_floating
from rljax.models.lora import split_adapters
from rljax.models.sharding import SAMPLER_RULES, state_shardings


class PodWeights:
    """The weight sync of a pod: every process calls :meth:`move` at the same tick.

    ``abstract`` is the learner's params state as ``ShapeDtypeStruct``s with the learner's
    shardings. Learner processes pass their params (cast to the sampler's dtype on the learner
    mesh first); sampler processes pass nothing and get the sampler's copy. ``bytes`` and
    ``stage_bytes`` are those of the last move.
    """

    def __init__(
        self,
        abstract: Any,
        sampler_mesh: Mesh,
        dtype: str,
        slices: SliceMap = (),
        *,
        adapters_only: bool = False,
    ):
        self.full = _Plan(abstract, sampler_mesh, dtype, slices)  # the whole params' plan
        self.adapters = AdapterMoves(adapters_only)
        self._adapters = None
        if adapters_only:
            self._adapters = _Plan(split_adapters(abstract)[0], sampler_mesh, dtype, slices)
        self._last = self.full

    @property
    def bytes(self) -> int:
        return self._last.bytes

    @property
    def stage_bytes(self) -> int:
        return self._last.stage_bytes

    def move(self, params: Any = None) -> Any:
        """The sampler's copy (None leaves on learner processes); see :meth:`_Plan.move`."""
        plan = self.full if self.adapters.whole or self._adapters is None else self._adapters
        self._last = plan
        return self.adapters.arrived(plan.move(self.adapters.outgoing(params)))


class _Plan:
    """One transfer plan of a params tree from the learner's shardings to the sampler's."""

    def __init__(self, abstract: Any, sampler_mesh: Mesh, dtype: str, slices: SliceMap = ()):
        self.dtype = jnp.dtype(dtype)

        def cast(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
            floating = jnp.issubdtype(x.dtype, jnp.floating)
            dtype = self.dtype if floating else x.dtype
            return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)

        self.source = jax.tree.map(cast, abstract)
        self.targets = state_shardings(self.source, sampler_mesh, SAMPLER_RULES)
        self.bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.source))
        # Several slices: two stages (rljax.mesh.fan_out), DCN once, then ICI inside a slice.
        self.stages = stage_shardings(self.targets, slices) if count(slices) > 1 else None
        # Stage 1's result as shapes, in leaf order: what a process without its devices passes.
        self._staged = []
        if self.stages is not None:
            leaves = zip(jax.tree.leaves(self.source), sharding_leaves(self.stages), strict=True)
            self._staged = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in leaves]
        self.stage_bytes = stage_bytes(self._staged)
        me = jax.process_index()
        self._samples = any(d.process_index == me for d in sampler_mesh.devices.flat)

    def move(self, params: Any = None) -> Any:
        """The sampler's copy (None leaves on learner processes).

        One union transfer, or with several slices two: onto one sampler replica per slice
        (the only bytes that cross slices), then, among the sampler's processes alone, onto
        every replica. The result is the same bit for bit.
        """
        src = self.source if params is None else cast_floating(params, self.dtype)
        if self.stages is None:
            out = transfer(src, self.targets)
        else:
            staged = transfer(src, self.stages)
            leaves, treedef = jax.tree.flatten(staged, is_leaf=lambda x: x is None)
            if self._samples:
                leaves = [s if x is None else x for x, s in zip(leaves, self._staged, strict=True)]
                out = transfer(jax.tree.unflatten(treedef, leaves), self.targets)
            else:
                out = jax.tree.unflatten(treedef, [None] * len(leaves))
        jax.block_until_ready([x for x in jax.tree.leaves(out) if x is not None])
        return out
