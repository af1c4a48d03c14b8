"""Mesh arithmetic and the one shard_map entry point that the ops' ``sharded_*`` wrappers share.

``axis_size`` here is the only one in rljax: ``rljax.models.sharding`` re-exports it for the
rule tables, so a kernel wrapper and a model rule count the shards of a mesh axis the same way.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType, NamedSharding


def axis_names(entry) -> tuple[str, ...]:
    """A rule-table or PartitionSpec entry (None, one axis name, or several) as a tuple."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def axis_size(mesh, entry) -> int:
    """How many ways ``entry``'s mesh axes split a dimension (1 when it is replicated).

    Axes the mesh lacks count as 1, so a role's rule table may name an axis that one of its
    meshes does not have; the kernel wrappers check names first (:func:`check_axes`).
    """
    return math.prod(mesh.shape[a] for a in axis_names(entry) if a in mesh.shape)


def present(mesh, entry):
    """``entry`` (None, an axis name, or several) without the axes ``mesh`` lacks: None, one
    name, or a tuple. A rule table names the 'expert' axis that a mesh without experts lacks."""
    axes = tuple(a for a in axis_names(entry) if a in mesh.shape)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def check_axes(mesh, **entries) -> None:
    """Raises a one-line ValueError if an argument names a mesh axis that ``mesh`` lacks."""
    for arg, entry in entries.items():
        missing = [a for a in axis_names(entry) if a not in mesh.shape]
        if missing:
            raise ValueError(
                f"{arg}={entry!r} names mesh axes {missing} that the mesh lacks; pick from "
                f"{tuple(mesh.shape)} or pass None."
            )


def check_divides(what: str, size: int, mesh, entry, fix: str) -> None:
    """Raises a one-line ValueError unless ``entry``'s mesh axes split ``size`` evenly."""
    shards = axis_size(mesh, entry)
    if size % shards:
        raise ValueError(
            f"{what}={size} must divide by the {shards} shards of mesh axes {entry!r}; {fix}."
        )


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
