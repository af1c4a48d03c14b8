"""Two-stage weight sync for multislice jobs: cross DCN once, then fan out over ICI.

A one-stage sync (``device_put`` onto the sampler's shardings) makes every sampler replica
pull its own copy from the learner: with the learner on one slice and ``data`` = r sampler
replicas on another, r copies of the weights cross the slow data-centre network. The plan
here moves **one** copy into each sampler slice first and then replicates it inside the slice:

1. stage 1: each leaf goes onto :func:`stage_shardings` of its target: the same partition spec
   on the sub-mesh that keeps, along every mesh axis the spec does not shard over, only the
   first position in each slice. A leaf sharded over ``tensor`` lands on one replica (its
   ``tensor`` devices at ``data`` index 0 of the slice), a replicated leaf on one device per
   slice. That is one copy per sampler slice, the only bytes that cross slices;
2. stage 2: from there onto the full target shardings, all inside the sampler slices (ICI).

Both stages go through :func:`rljax.mesh.transfer.transfer`, which is a ``device_put`` on one
process. The result equals the one-stage sync bit for bit (it is the same values, copied).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rljax.mesh.slices import SliceMap
from rljax.mesh.transfer import transfer


def _is_sharding(x) -> bool:
    return isinstance(x, jax.sharding.Sharding)


def _spec_axes(spec) -> set[str]:
    used: set[str] = set()
    for entry in spec:
        if entry is None:
            continue
        used.update(entry if isinstance(entry, tuple) else (entry,))
    return used


def stage_sharding(target: jax.sharding.Sharding, smap: SliceMap) -> jax.sharding.Sharding:
    """Where stage 1 puts a leaf bound for ``target``: one copy of it per slice of ``target``.

    Shardings that are not ``NamedSharding`` are returned unchanged (one stage for that leaf).
    """
    if not isinstance(target, NamedSharding):
        return target
    mesh, of = target.mesh, dict(smap)
    used = _spec_axes(target.spec)
    keep = []
    for axis, size in enumerate(mesh.devices.shape):
        if mesh.axis_names[axis] in used:
            keep.append(list(range(size)))
            continue
        # The first position along this axis in each slice, reading along the axis at the
        # sub-grid's origin (a hybrid mesh puts the slice boundary on one axis only).
        seen, picks = set(), []
        for p in range(size):
            index = [0] * mesh.devices.ndim
            index[axis] = p
            s = of.get(mesh.devices[tuple(index)].id, 0)
            if s not in seen:
                seen.add(s)
                picks.append(p)
        keep.append(picks)
    sub = Mesh(mesh.devices[np.ix_(*keep)], mesh.axis_names)
    return NamedSharding(sub, target.spec, memory_kind=target.memory_kind)


def stage_shardings(targets, smap: SliceMap):
    """:func:`stage_sharding` of every sharding in the tree ``targets``."""
    return jax.tree.map(lambda s: stage_sharding(s, smap), targets, is_leaf=_is_sharding)


def fan_out(tree, targets, smap: SliceMap):
    """``tree`` moved onto ``targets`` in two stages; returns ``(result, stage-1 tree)``.

    The stage-1 tree is returned for accounting (its bytes are those that crossed slices) and
    for tests; the caller drops it.
    """
    staged = transfer(tree, stage_shardings(targets, smap))
    return transfer(staged, targets), staged


def stage_bytes(staged) -> int:
    """Bytes that stage 1 writes (the slice crossing): every shard of every leaf, on every
    device of every host. Leaves are arrays or ``ShapeDtypeStruct``s with their sharding."""
    return sum(
        len(x.sharding.device_set) * math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        for x in jax.tree.leaves(staged)
    )
