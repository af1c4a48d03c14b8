"""Moving a pytree of arrays between meshes whose devices sit on different processes.

On one process ``jax.device_put`` moves arrays between any two meshes. In a multi-controller
program (several hosts, one ``jax.distributed`` world) the pinned JAX refuses a reshard between
different device sets ("input and target sharding should have the same set of devices"), and a
``jit`` cannot write outputs onto devices its inputs do not use. :func:`transfer` is therefore
one computation over the **union** of the two meshes' devices, a ``shard_map`` in which every
device holds one block: its shard of the source if it has one, zeros of that shape if not.

**Point to point** (the weight sync's case). Cut every dimension at every shard boundary of
either sharding; when the cells this makes are all one shape, each destination device needs a
list of whole cells, and each cell sits whole in some source device's shard. Each destination
cell is fetched from one source device (itself if it holds one, else the holder sending least
so far), and the sends are packed into rounds in which every device sends at most one cell
and receives at most one, each round one ``ppermute``. Every destination device receives its
shard's bytes once, as a reshard on one process would move them: a learner sharded 4 ways
feeding 4 sampler replicas is 4 rounds, each learner device sending its shard to a different
replica (on a TPU slice, point-to-point transfers over ICI).

**All-reduce** (any other pair of shardings, such as fsdp 4 -> 6 in a resize, whose cells are
of several sizes). A device that holds the first copy of a distinct source shard writes it at
the shard's offset into a zero buffer of the leaf's full shape, a ``psum`` over the union gives
every device the whole leaf, and each destination device slices out its shard: about twice the
leaf's bytes through every device of the union, but one code path for every pair.

Either way the destination array is assembled from the per-device results, with no further
copy. Every process that owns a device of either mesh must call :func:`transfer` with the same
arguments, in the same order as every other collective; a process that owns no source device
passes the source as ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)``. On a process that
owns no destination device the result's leaves are None; a process that owns no device of
either mesh enters nothing and gets None leaves too.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
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
                seen.setdefault(d.id, d)  # type: ignore[attr-defined]  # jax: unresolved Device
    return sorted(seen.values(), key=lambda d: (d.process_index, d.id))


def needs_union(src: Sequence[jax.sharding.Sharding], dst: Sequence[jax.sharding.Sharding]) -> bool:
    """Whether a plain ``device_put`` cannot do this move (several processes, other devices)."""
    if jax.process_count() == 1:
        return False
    return any(set(a.device_set) != set(b.device_set) for a, b in zip(src, dst, strict=True))


def _boxes(sharding, shape) -> dict[jax.Device, tuple[tuple[int, int], ...]]:
    """Each device's shard as [start, stop) per dimension."""
    return {
        d: tuple(
            (sl.start or 0, n if sl.stop is None else sl.stop)
            for sl, n in zip(idx, shape, strict=True)
        )
        for d, idx in sharding.devices_indices_map(shape).items()
    }


def _starts(sharding, shape) -> dict[jax.Device, tuple[int, ...]]:
    """Each device's shard offset in a leaf of ``shape``."""
    return {d: tuple(lo for lo, _ in box) for d, box in _boxes(sharding, tuple(shape)).items()}


def _plan(shape, src, dst, union):
    """The all-reduce path's tables: shard offsets in the source and target, owned shards."""
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


def _cell(src_boxes, dst_boxes, shape) -> tuple[int, ...] | None:
    """The shape of the cells both shardings' boundaries cut, or None if they differ in size."""
    cell = []
    for k, n in enumerate(shape):
        cuts = {0, n} | {c for b in (*src_boxes.values(), *dst_boxes.values()) for c in b[k]}
        sizes = {b - a for a, b in itertools.pairwise(sorted(cuts))}
        if len(sizes) != 1:
            return None
        cell.append(sizes.pop())
    return tuple(cell)


@functools.lru_cache(maxsize=1024)
def _p2p_plan(shape, src, dst, union: tuple[jax.Device, ...]) -> tuple | None:
    """Point-to-point tables for one leaf, or None when its cells are of several sizes.

    Cached: a pod's weight sync plans the same moves every publish.

    Returns (cell shape, perms, send offsets [R, U, ndim], receive offsets [R, U, ndim],
    receive mask [R, U]): in round r each (sender, receiver) pair of ``perms[r]`` moves one
    cell, which the sender cuts at its send offset and the receiver writes at its receive
    offset (a device may be both ends: a cell it keeps).
    """
    src_boxes, dst_boxes = _boxes(src, shape), _boxes(dst, shape)
    cell = _cell(src_boxes, dst_boxes, shape)
    if cell is None:
        return None
    pos = {d: i for i, d in enumerate(union)}

    def cells(box):
        return itertools.product(*(range(lo, hi, c) for (lo, hi), c in zip(box, cell)))

    holders: dict[tuple[int, ...], list[jax.Device]] = {}
    for d in union:
        if d in src_boxes:
            for c in cells(src_boxes[d]):
                holders.setdefault(c, []).append(d)
    sends: Counter = Counter()
    rounds: list[dict] = []  # per round: {sender: (receiver, send offset, receive offset)}
    for d in union:
        if d not in dst_boxes:
            continue
        for c in cells(dst_boxes[d]):
            owners = holders[c]
            sender = d if d in owners else min(owners, key=lambda s: (sends[s], pos[s]))
            sends[sender] += 1
            piece = (
                pos[d],
                tuple(a - b[0] for a, b in zip(c, src_boxes[sender])),
                tuple(a - b[0] for a, b in zip(c, dst_boxes[d])),
            )
            for r in rounds:  # the first round where both ends are free
                if pos[sender] not in r and all(p[0] != pos[d] for p in r.values()):
                    r[pos[sender]] = piece
                    break
            else:
                rounds.append({pos[sender]: piece})
    n, ndim = len(union), len(shape)
    send_off = np.zeros((len(rounds), n, ndim), np.int32)
    recv_off = np.zeros((len(rounds), n, ndim), np.int32)
    recv = np.zeros((len(rounds), n), bool)
    perms = []
    for i, moves in enumerate(rounds):
        perms.append(tuple(sorted((s, p[0]) for s, p in moves.items())))
        for s, (to, so, ro) in moves.items():
            send_off[i, s], recv_off[i, to], recv[i, to] = so, ro, True
    return cell, tuple(perms), send_off, recv_off, recv


def _mine(table, i):
    """Device ``i``'s rows of ``table`` [..., U, ndim] as nested lists of scalar offsets.

    One dynamic index per table, then static slices: far fewer operations to trace and
    compile than indexing each offset with ``i``."""
    rows = jax.lax.dynamic_index_in_dim(table, i, axis=table.ndim - 2, keepdims=False)

    def unstack(x):
        return [unstack(y) for y in x] if x.ndim > 1 else list(x)

    return unstack(rows)


def _slice(x, at, size):
    return jax.lax.dynamic_slice(x, at, size, allow_negative_indices=False)


def _update(x, y, at):
    return jax.lax.dynamic_update_slice(x, y, at, allow_negative_indices=False)


@functools.lru_cache(maxsize=64)
def _mover(mesh: Mesh, specs: tuple):
    """One jitted shard_map over the union for leaves described by ``specs``.

    ``specs``: per leaf (shape, src shard shape, dst shard shape, cell shape and perms or
    None for the all-reduce); offsets are traced inputs.
    """

    def all_reduce(spec, x, so, do, i):
        shape, _, dst_shard, _ = spec
        full = jax.lax.psum(_update(jnp.zeros(shape, x.dtype), x, _mine(so, i)), "u")
        return _slice(full, _mine(do, i), dst_shard)

    def point_to_point(spec, x, tables, i):
        _, _, dst_shard, (cell, perms) = spec
        sends, receives = _mine(tables[0], i), _mine(tables[1], i)
        keeps = jax.lax.dynamic_index_in_dim(tables[2], i, axis=1, keepdims=False)
        out = jnp.zeros(dst_shard, x.dtype)
        for r, perm in enumerate(perms):
            got = jax.lax.ppermute(_slice(x, sends[r], cell), "u", perm)
            kept = _slice(out, receives[r], cell)
            out = _update(out, jnp.where(keeps[r], got, kept), receives[r])
        return out

    def body(blocks, tables):
        i = jax.lax.axis_index("u")
        out = []
        for spec, x, t in zip(specs, blocks, tables, strict=True):
            y = all_reduce(spec, x, *t, i) if spec[3] is None else point_to_point(spec, x, t, i)
            out.append(y)
        return out

    n = len(specs)
    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=([P("u")] * n, [P()] * n),
        out_specs=[P("u")] * n,
        check_vma=False,
    )
    return jax.jit(fn)


def transfer(tree, dst_shardings, *, force_union: bool = False, force_all_reduce: bool = False):
    """``tree`` moved onto ``dst_shardings`` (a matching pytree of shardings).

    A plain ``jax.device_put`` when it can (one process, or the same devices); otherwise the
    union computation described in the module docstring, which every process must enter.
    ``force_union`` takes the union path on one process too (tests compare the two), and
    ``force_all_reduce`` the all-reduce for every leaf (the baseline the benchmark measures).
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
    blocks, tables, specs = [], [], []
    for x, s, d in zip(leaves, src, dst, strict=True):
        shape = tuple(x.shape) or (1,)  # a scalar moves as one element
        src_shard = tuple(s.shard_shape(shape))
        p2p = None if force_all_reduce else _p2p_plan(shape, s, d, tuple(union))
        if p2p is None:
            owned, so, do = _plan(shape, s, d, union)
            tables.append((so, do))
            route = None
        else:  # any holder of a shard may be asked to send it
            owned = set(s.device_set)
            tables.append(p2p[2:])
            route = p2p[:2]
        specs.append((shape, src_shard, tuple(d.shard_shape(shape)), route))
        local = {}
        if isinstance(x, jax.Array):
            local = {sh.device: _as_shape(sh.data, src_shard) for sh in x.addressable_shards}
        parts = [
            local[dev] if dev in owned else jax.device_put(np.zeros(src_shard, x.dtype), dev)
            for dev in union
            if dev.process_index == me
        ]
        # The devices' blocks stacked along the first axis: each device's shard is its block
        # as it is, so no per-device reshape is compiled on the way in or out.
        blocks.append(
            jax.make_array_from_single_device_arrays(
                (len(union) * src_shard[0], *src_shard[1:]), NamedSharding(mesh, P("u")), parts
            )
        )
    moved = _mover(mesh, tuple(specs))(blocks, tables)
    out: list[jax.Array | None] = []  # None: a leaf with no device on this process
    for x, y, d in zip(leaves, moved, dst, strict=True):
        mine = {sh.device: sh.data for sh in y.addressable_shards}
        targets = [dev for dev in d._addressable_device_assignment]  # noqa: SLF001
        if not targets:
            out.append(None)
            continue
        shape = tuple(x.shape)
        parts = [_as_shape(mine[dev], d.shard_shape(shape)) for dev in targets]
        out.append(jax.make_array_from_single_device_arrays(shape, d, parts))
    return jax.tree.unflatten(treedef, out)


def _as_shape(data: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A single-device array as ``shape``, which differs only for a scalar moved as one element
    (through the host: a reshape on the device would compile a program per device)."""
    if tuple(data.shape) == tuple(shape):
        return data
    return jax.device_put(np.asarray(data).reshape(shape), data.devices().pop())
