"""Logical axis names -> mesh axes, one rule table per role.

Modules name their axes logically ('embed', 'heads', 'batch', ...). Each role maps those names
onto its own mesh: the learner shards weights FSDP-style over 'fsdp' and splits heads and the
MLP over 'tensor'; the sampler replicates weights over 'data' (each data shard serves its own
slots) and splits heads over 'tensor'. A rule table that would place one mesh axis on two
dimensions of the same array raises instead of silently replicating.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.kernels import dispatch
from rljax.kernels.sharding import axis_names, axis_size, present


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """One role's mapping from logical axis names to mesh axis names (or None: replicate)."""

    role: str
    rules: Mapping[str, str | tuple[str, ...] | None]

    def spec(self, logical: tuple[str | None, ...], *, name: str = "array") -> PartitionSpec:
        """The PartitionSpec for an array whose dimensions carry ``logical`` names."""
        out: list[str | tuple[str, ...] | None] = []
        used: dict[str, str | None] = {}  # mesh axis -> the logical axis it shards
        for axis in logical:
            mesh_axes = self.rules.get(axis) if axis is not None else None
            if axis is not None and axis not in self.rules:
                raise ValueError(
                    f"{self.role} sharding rules have no entry for logical axis {axis!r} of "
                    f"{name}; add it to the rule table (None to replicate)"
                )
            for m in axis_names(mesh_axes):
                if m in used:
                    raise ValueError(
                        f"{self.role} sharding rules map both {used[m]!r} and {axis!r} of {name} "
                        f"to mesh axis {m!r}; an axis can shard one dimension only"
                    )
                used[m] = axis
            out.append(mesh_axes)
        return PartitionSpec(*out)

    def sharding(self, mesh: Mesh, logical, *, shape=None, name="array") -> NamedSharding:
        """A NamedSharding on ``mesh``; checks divisibility when ``shape`` is given. Mesh axes
        the rules name and ``mesh`` lacks are left out (see :meth:`on`)."""
        spec = self.on(mesh, logical, name=name)
        if shape is not None:
            for dim, mesh_axes in enumerate(spec):
                axes, size = axis_names(mesh_axes), axis_size(mesh, mesh_axes)
                if shape[dim] % size:
                    raise ValueError(
                        f"{name} dimension {dim} ({logical[dim]}) has size {shape[dim]}, not "
                        f"divisible by mesh axes {axes} of size {size}; change the "
                        f"{self.role} mesh shape or the model size"
                    )
        return NamedSharding(mesh, spec)

    def on(self, mesh: Mesh, logical: tuple[str | None, ...], *, name="array") -> PartitionSpec:
        """:meth:`spec` on ``mesh``: without the mesh axes it lacks (a dense run's meshes have
        no 'expert' axis; the rules name it for mixture-of-experts runs)."""
        return PartitionSpec(*(present(mesh, e) for e in self.spec(logical, name=name)))

    def axes(self, mesh: Mesh, logical: str):
        """The mesh axes of ``mesh`` that logical axis ``logical`` maps to (None, a name or a
        tuple)."""
        return present(mesh, self.rules.get(logical))


LEARNER_RULES = ShardingRules(
    "learner",
    {
        "batch": ("expert", "fsdp"),
        "seq": None,
        "vocab": "tensor",
        "embed": ("expert", "fsdp"),
        "heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "mlp": "tensor",
        "layers": None,
        "experts": "expert",
        "expert_embed": "fsdp",
        "expert_mlp": "tensor",
    },
)

SAMPLER_RULES = ShardingRules(
    "sampler",
    {
        "batch": ("expert", "data"),
        "seq": None,
        "vocab": "tensor",
        "embed": None,
        "heads": "tensor",
        "kv_heads": "tensor",
        "head_dim": None,
        "mlp": "tensor",
        "layers": None,
        "pages": None,
        "page_slot": None,
        "experts": "expert",
        "expert_embed": None,
        "expert_mlp": "tensor",
    },
)

RULES = {"learner": LEARNER_RULES, "sampler": SAMPLER_RULES}


def fitted_sharding(mesh: Mesh, rules: ShardingRules, logical, shape, name) -> NamedSharding:
    """Like ``rules.sharding`` but replicates a dimension its mesh axes do not divide.

    Small models (a 2-kv-head toy on a 4-way tensor axis) must still run; a real model whose
    weights would silently replicate is caught by the memory plan, not here.
    """
    spec = list(rules.on(mesh, logical, name=name))
    for dim, mesh_axes in enumerate(spec):
        if shape[dim] % axis_size(mesh, mesh_axes):
            spec[dim] = None
    return NamedSharding(mesh, PartitionSpec(*spec))


def state_shardings(state: nnx.State, mesh: Mesh, rules: ShardingRules) -> nnx.State:
    """NamedShardings for every Variable in ``state``, from its logical ``out_sharding``."""

    def one(path, var):
        logical = var.get_metadata().get("out_sharding") or (None,) * len(var.shape)
        name = "/".join(str(p) for p in path)
        return fitted_sharding(mesh, rules, tuple(logical), var.shape, name)

    flat, treedef = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    return jax.tree_util.tree_unflatten(treedef, [one(path, var) for path, var in flat])


def with_shardings(tree, shardings):
    """``tree``'s arrays as ``jax.ShapeDtypeStruct``s placed by ``shardings``.

    ``tree`` holds arrays or ShapeDtypeStructs (an ``nnx.eval_shape`` state works); only shapes
    and dtypes are read. ``shardings`` has one NamedSharding per array, in the same order (as
    :func:`state_shardings` gives, with bare shardings where ``tree`` holds nnx Variables).
    """
    leaves, treedef = jax.tree.flatten(tree)
    flat = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(flat) != len(leaves):
        raise ValueError(f"{len(flat)} shardings for {len(leaves)} arrays")
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(leaves, flat)]
    return treedef.unflatten(structs)


def make_mesh(devices, axes: dict[str, int]) -> Mesh:
    """A Mesh over ``devices`` with the given axis sizes (-1 absorbs the remainder)."""
    devices = list(devices)
    sizes = dict(axes)
    free = [a for a, s in sizes.items() if s == -1]
    known = math.prod(s for s in sizes.values() if s != -1)
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {free}")
    if free:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices cannot fill mesh axes {axes}: fixed axes need a "
                f"multiple of {known}"
            )
        sizes[free[0]] = len(devices) // known
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(
            f"mesh axes {sizes} need {math.prod(sizes.values())} devices but {len(devices)} "
            f"were given; change the mesh.* axis sizes"
        )
    arr = np.array(devices, dtype=object).reshape(tuple(sizes.values()))
    return Mesh(arr, tuple(sizes))


def kernel_mesh_axes(
    sharding: tuple[Mesh, ShardingRules] | None, impl: str, dims: tuple[tuple[str, int], ...]
) -> tuple[Mesh, tuple] | None:
    """The mesh and per-dimension mesh axes a Pallas kernel's ``shard_map`` splits over.

    A ``pallas_call`` has no GSPMD partitioning rule, so on a multi-device mesh the model and
    the learner run the kernels per shard, split as the role's rules place these dimensions.

    Args:
      sharding: ``(mesh, rules)`` of the role, or None.
      impl: the kernels' ``impl``; only a Pallas backend needs ``shard_map``.
      dims: ``(logical name, size)`` for each dimension the kernel can split, in order.

    Returns:
      None when the kernel should be called directly: no sharding given, a one-device mesh,
      or the XLA path (GSPMD partitions it). Otherwise ``(mesh, axes)`` with one entry per
      dimension: the mesh axes the rules map it to that the mesh has, or None (replicated)
      when there are none, they do not divide its size (2 kv heads on a 4-way 'tensor' axis, a
      batch of 1 prefill on a 2-way 'data' axis), or already split an earlier dimension.
    """
    if sharding is None:
        return None
    mesh, rules = sharding
    if mesh.size == 1 or not dispatch.resolve_impl(impl).use_pallas:
        return None
    used: set[str] = set()
    out: list[str | tuple[str, ...] | None] = []
    for name, size in dims:
        axes = axis_names(rules.axes(mesh, name))  # the axes this mesh has of the rule's
        if not axes or size % axis_size(mesh, axes) or used.intersection(axes):
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    return mesh, tuple(out)
