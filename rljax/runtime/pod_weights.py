"""The weight sync of a pod: the learner's params onto the sampler mesh across hosts.

A plain ``device_put`` between meshes on different processes is refused by the pinned JAX, so
the move is :func:`rljax.mesh.transfer.transfer`, one computation over the union of both
meshes that every process owning one of their devices enters at the same tick. With several
slices it runs in two stages (:mod:`rljax.mesh.fan_out`): one copy into each sampler slice,
then a fan-out inside the slice among the sampler's processes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rljax.mesh.fan_out import stage_shardings
from rljax.mesh.slices import SliceMap, count
from rljax.mesh.transfer import transfer
from rljax.models.sharding import SAMPLER_RULES, state_shardings


class PodWeights:
    """The weight sync of a pod: every process calls :meth:`move` at the same tick.

    ``abstract`` is the learner's params state as ``ShapeDtypeStruct``s with the learner's
    shardings. Learner processes pass their params (cast to the sampler's dtype on the learner
    mesh first); sampler processes pass nothing and get the sampler's copy.
    """

    def __init__(self, abstract, sampler_mesh, dtype: str, slices: SliceMap = ()):
        self.dtype = jnp.dtype(dtype)

        def cast(x):
            floating = jnp.issubdtype(x.dtype, jnp.floating)
            dtype = self.dtype if floating else x.dtype
            return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)

        self.source = jax.tree.map(cast, abstract)
        self.targets = state_shardings(self.source, sampler_mesh, SAMPLER_RULES)
        self._cast = jax.jit(
            lambda tree: jax.tree.map(
                lambda x: x.astype(self.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                tree,
            )
        )
        self.bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.source))
        # Several slices: two stages (rljax.mesh.fan_out), DCN once, then ICI inside a slice.
        self.stages = stage_shardings(self.targets, slices) if count(slices) > 1 else None
        self.stage_bytes = 0 if self.stages is None else _written_bytes(self.source, self.stages)
        me = jax.process_index()
        self._samples = any(d.process_index == me for d in sampler_mesh.devices.flat)

    def move(self, params=None):
        """The sampler's copy (None leaves on learner processes).

        One union transfer, or with several slices two: onto one sampler replica per slice
        (the only bytes that cross slices), then, among the sampler's processes alone, onto
        every replica. The result is the same bit for bit.
        """
        src = self.source if params is None else self._cast(params)
        if self.stages is None:
            out = transfer(src, self.targets)
        else:
            staged = transfer(src, self.stages)
            leaves, treedef = jax.tree.flatten(staged, is_leaf=lambda x: x is None)
            if self._samples:  # a process without stage-1 devices passes their shapes
                shapes = zip(leaves, jax.tree.leaves(self.source), _shardings(self.stages))
                leaves = [
                    jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) if x is None else x
                    for x, a, s in shapes
                ]
                out = transfer(treedef.unflatten(leaves), self.targets)
            else:
                out = treedef.unflatten([None] * len(leaves))
        jax.block_until_ready([x for x in jax.tree.leaves(out) if x is not None])
        return out


def _written_bytes(tree, shardings) -> int:
    """Bytes that putting ``tree`` onto ``shardings`` writes, over every device (all hosts)."""
    return sum(
        len(s.device_set) * math.prod(s.shard_shape(tuple(x.shape))) * x.dtype.itemsize
        for x, s in zip(jax.tree.leaves(tree), _shardings(shardings), strict=True)
    )


def _shardings(tree) -> list[jax.sharding.Sharding]:
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
