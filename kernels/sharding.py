"""The one shard_map entry point the ops' ``sharded_*`` wrappers share."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding


def axis_size(mesh, axes) -> int:
    """Number of shards along a mesh axis name, a tuple of names, or None (1)."""
    if axes is None:
        return 1
    if isinstance(axes, str):
        return mesh.shape[axes]
    size = 1
    for axis in axes:
        size *= axis_size(mesh, axis)
    return size


def run_sharded(fn, mesh, in_specs, out_specs, args):
    """Runs ``fn`` per shard under ``jax.shard_map``.

    On a mesh with Explicit axes, shard_map demands that arguments already carry exactly
    ``in_specs``; they are resharded first so callers can pass arrays laid out any way. Auto
    meshes (the default ``Mesh(devices, names)``) need no reshard: jit inserts it.
    ``check_vma`` is off because ``pallas_call`` does not annotate varying mesh axes.
    """
    if any(t == AxisType.Explicit for t in mesh.axis_types):
        args = tuple(jax.reshard(x, NamedSharding(mesh, spec)) for x, spec in zip(args, in_specs))
    return jax.shard_map(
        fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs, check_vma=False
    )(*args)
