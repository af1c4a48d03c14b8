"""Moving a pytree of arrays between meshes whose devices sit on different processes.

On one process ``jax.device_put`` moves arrays between any two meshes. In a multi-controller
program (several hosts, one ``jax.distributed`` world) the pinned JAX refuses a reshard between
different device sets ("input and target sharding should have the same set of devices"), and a
``jit`` cannot write outputs onto devices its inputs do not use. :func:`transfer` is therefore
one computation over the **union** of the two meshes' devices:

1. every device of the union contributes one block: a source device that owns a distinct shard
   of a leaf contributes that shard, every other device zeros of the same shape (so a shard
   replicated over several source devices is counted once);
2. inside a ``shard_map`` over the union, each device writes its block at the shard's offset
   into a buffer of the leaf's full shape, and a ``psum`` over the union gives every device
   the whole leaf (on a TPU slice, an all-reduce over ICI);
3. each destination device slices out its target shard, and the destination array is
   assembled from those per-device slices, with no further copy.

Every process that owns a device of either mesh must call :func:`transfer` with the same
arguments, in the same order as every other collective; a process that owns no source device
passes the source as ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)``. On a process that
owns no destination device the result's leaves are None; a process that owns no device of
either mesh enters nothing and gets None leaves too.

Bytes on the wire: the all-reduce moves about twice the leaf's bytes through every device of
the union, against the leaf's bytes once for an ideal point-to-point reshard; the simplicity
buys one code path for every pair of shardings (weight sync, and resizing a mesh across hosts).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def sharding_leaves(tree) -> list[jax.sharding.Sharding]:
    """The shardings of a pytree of shardings, in leaf order (a sharding is a leaf here)."""
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def union_devices(*shardings: Sequence[jax.sharding.Sharding]) -> list[jax.Device]:
    """The devices of every sharding, each once, by process then id: one order for every
    transfer over the same devices, so they share one set of collective contexts."""
    seen: dict[int, jax.Device] = {}
    for tree in shardings:
        for s in tree:
            for d in s.device_set:
                seen.setdefault(d.id, d)
    return sorted(seen.values(), key=lambda d: (d.process_index, d.id))


def needs_union(src: Sequence[jax.sharding.Sharding], dst: Sequence[jax.sharding.Sharding]) -> bool:
    """Whether a plain ``device_put`` cannot do this move (several processes, other devices)."""
    if jax.process_count() == 1:
        return False
    return any(set(a.device_set) != set(b.device_set) for a, b in zip(src, dst, strict=True))


def _starts(sharding, shape) -> dict[jax.Device, tuple[int, ...]]:
    """Each device's shard offset in a leaf of ``shape``."""
    return {
        d: tuple(sl.start or 0 for sl in idx)
        for d, idx in sharding.devices_indices_map(tuple(shape)).items()
    }


def _plan(leaf, src, dst, union):
    """Per-union-device tables: shard offsets in the source and target, and owned shards."""
    shape = tuple(leaf.shape)
    src_starts, dst_starts = _starts(src, shape), _starts(dst, shape)
    owned, seen = set(), set()
    for d in union:  # the first device holding each distinct shard contributes it
        if d in src_starts and src_starts[d] not in seen:
            seen.add(src_starts[d])
            owned.add(d)
    zero = (0,) * len(shape)
    src_off = np.array([src_starts.get(d, zero) for d in union], np.int32).reshape(len(union), -1)
    dst_off = np.array([dst_starts.get(d, zero) for d in union], np.int32).reshape(len(union), -1)
    return owned, src_off, dst_off


@functools.lru_cache(maxsize=64)
def _mover(mesh: Mesh, specs: tuple):
    """One jitted shard_map over the union for leaves described by ``specs``.

    ``specs``: per leaf (shape, src shard shape, dst shard shape); offsets are traced inputs.
    """

    def body(blocks, src_offs, dst_offs):
        i = jax.lax.axis_index("u")
        out = []
        for (shape, _, dst_shard), x, so, do in zip(specs, blocks, src_offs, dst_offs, strict=True):
            full = jax.lax.dynamic_update_slice(jnp.zeros(shape, x.dtype), x[0], tuple(so[i]))
            full = jax.lax.psum(full, "u")
            out.append(jax.lax.dynamic_slice(full, tuple(do[i]), dst_shard)[None])
        return out

    n = len(specs)
    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=([P("u")] * n, [P()] * n, [P()] * n),
        out_specs=[P("u")] * n,
        check_vma=False,
    )
    return jax.jit(fn)


def transfer(tree, dst_shardings, *, force_union: bool = False):
    """``tree`` moved onto ``dst_shardings`` (a matching pytree of shardings).

    A plain ``jax.device_put`` when it can (one process, or the same devices); otherwise the
    union computation described in the module docstring, which every process must enter.
    ``force_union`` takes the union path on one process too (tests compare the two).
    """
    leaves, treedef = jax.tree.flatten(tree)
    # Shardings may stand where a leaf's wrapper node is (an nnx.State of shardings has no
    # Param nodes): match them to the leaves in order.
    dst = sharding_leaves(dst_shardings)
    if len(dst) != len(leaves):
        raise ValueError(
            f"transfer: {len(leaves)} arrays but {len(dst)} target shardings; give one sharding "
            "per leaf of the tree"
        )
    src = [x.sharding for x in leaves]
    if not leaves:
        return tree
    if not force_union and not needs_union(src, dst):
        return jax.device_put(tree, dst_shardings, may_alias=False)
    union = union_devices(src, dst)
    me = jax.process_index()
    if all(d.process_index != me for d in union):  # not this process's move: nothing to enter
        return jax.tree.unflatten(treedef, [None] * len(leaves))
    mesh = Mesh(np.array(union), ("u",))
    blocks, src_offs, dst_offs, specs = [], [], [], []
    for x, s, d in zip(leaves, src, dst, strict=True):
        owned, so, do = _plan(x, s, d, union)
        src_shard = tuple(s.shard_shape(tuple(x.shape)))
        specs.append((tuple(x.shape), src_shard, tuple(d.shard_shape(tuple(x.shape)))))
        local = {}
        if isinstance(x, jax.Array):
            local = {sh.device: sh.data for sh in x.addressable_shards}
        parts = [
            local[dev][None]
            if dev in owned
            else jax.device_put(np.zeros((1, *src_shard), x.dtype), dev)
            for dev in union
            if dev.process_index == me
        ]
        blocks.append(
            jax.make_array_from_single_device_arrays(
                (len(union), *src_shard), NamedSharding(mesh, P("u")), parts
            )
        )
        src_offs.append(so)
        dst_offs.append(do)
    moved = _mover(mesh, tuple(specs))(blocks, src_offs, dst_offs)
    out = []
    for y, d, (shape, _, dst_shard) in zip(moved, dst, specs, strict=True):
        mine = {sh.device: sh.data for sh in y.addressable_shards}
        targets = [dev for dev in d._addressable_device_assignment]  # noqa: SLF001
        if not targets:
            out.append(None)
            continue
        parts = [mine[dev].reshape(dst_shard) for dev in targets]
        out.append(jax.make_array_from_single_device_arrays(shape, d, parts))
    return jax.tree.unflatten(treedef, out)
