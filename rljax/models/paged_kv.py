"""One decode step's paged KV cache: where each slot's new key and value go, and attention
over each slot's pages (:meth:`rljax.models.call_paths.CallPaths.decode`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.config import ModelConfig
from rljax.kernels.paged_attention import paged_decode_attention, sharded_paged_decode_attention
from rljax.kernels.paged_attention.xla import BITS, BITS_OF
from rljax.kernels.sharding import run_sharded
from rljax.models.layer_runs import layer_window


def pool_rows(cfg: ModelConfig, num_pools: int):
    """``rows(i)``: the row of layer ``i`` (a Python or traced int) in its page pool.

    One pool holds every layer at its own index. Two pools (the engine's, for a model with
    local layers: rljax.engine.pools) hold the global layers and the local ones, each layer at
    its index among the layers of its kind.
    """
    if num_pools == 1:
        return lambda i: i
    kinds = [layer_window(cfg, i) is not None for i in range(cfg.num_layers)]
    table = tuple(kinds[:i].count(kinds[i]) for i in range(cfg.num_layers))
    rows = jnp.asarray(table, jnp.int32)
    return lambda i: table[i] if isinstance(i, int) else rows[i]


def pool_dtype(dtype: str, cpu: bool) -> jnp.dtype:
    """The dtype the engine stores a KV cache of ``dtype`` in: its own, or on CPU devices
    (``cpu``) a bfloat16 cache's bits as uint16.

    XLA's CPU backend scatters into a bfloat16 array by converting all of it to float32 and
    back, and a bitcast of a bfloat16 array is a copy there: either costs every page of the
    pool in every decode step. A uint16 pool is written in place (:func:`set_bits`) and read
    through bitcasts of only the pages gathered (rljax.kernels.paged_attention).
    """
    dt = jnp.dtype(dtype)
    return BITS if cpu and dt == BITS_OF else dt


def set_bits(pool: jax.Array, index, values: jax.Array) -> jax.Array:
    """``pool.at[index].set(values)``, values cast to the pool's dtype; a uint16 pool holds
    bfloat16 bits (:func:`pool_dtype`), so the values' bfloat16 bits are stored there."""
    if pool.dtype == BITS:
        values = jax.lax.bitcast_convert_type(values.astype(BITS_OF), BITS)
    return pool.at[index].set(values.astype(pool.dtype))


class PagedKV:
    """One decode step's paged KV cache, split into ``kv_shards`` (see :meth:`CallPaths.decode`):
    where each slot's new key and value go, and attention over each slot's pages."""

    def __init__(self, page_table_bm, positions_b, page_size, kv_shards, split, impl):
        self.page_table_bm = page_table_bm
        self.kv_shards = kv_shards
        self.split = split  # the kernel's (mesh, (batch axes, head axis)), or None
        self.impl = impl
        page_m1 = (positions_b // page_size)[:, None]
        self.page_b = jnp.take_along_axis(page_table_bm, page_m1, axis=1)[:, 0]
        self.offset_b = positions_b % page_size
        self.lengths_b = positions_b + 1

    def per_shard(self, x):  # [B, ...] -> [kv_shards, B / kv_shards, ...]
        return x.reshape(self.kv_shards, x.shape[0] // self.kv_shards, *x.shape[1:])

    def by_shard(self, pages):  # [..., P, Z, H] -> [..., kv_shards, P / kv_shards, Z, H]
        *lead, p, z_, h = pages.shape
        return pages.reshape(*lead, self.kv_shards, p // self.kv_shards, z_, h)

    def write(self, pool, layer, new_bkh):
        """Each slot's new key (or value) into layer ``layer`` of the [L, K, P, Z, H] pool.

        The whole pool is the layer loop's carry and is updated in place: a pool passed as the
        scan's xs and ys would need a second pool-sized buffer.
        """

        def one(pool_lkpzh, page, offset, new_bkh):
            # Scalar layer + two index arrays around a slice: indexed dims lead, [B, K, H].
            return set_bits(pool_lkpzh, (layer, slice(None), page, offset), new_bkh)

        if self.kv_shards == 1:
            return one(pool, self.page_b, self.offset_b, new_bkh)
        shard = self.per_shard
        out = jax.vmap(one, in_axes=(2, 0, 0, 0), out_axes=2)(
            self.by_shard(pool), shard(self.page_b), shard(self.offset_b), shard(new_bkh)
        )
        return out.reshape(pool.shape)

    def attend(self, q, kp, vp, layer, **options):
        """Each slot's query [B, N, H] against its pages of layer ``layer`` (an int or a traced
        int) of the [L, K, P, Z, H] pools, read in place (slicing the layer out would copy its
        whole pool in every step); ``options``: the kernel's ``window``, ``softcap`` and
        ``sm_scale``."""
        args = (q, kp, vp, self.lengths_b, self.page_table_bm)
        fn = functools.partial(paged_decode_attention, impl=self.impl, **options)
        if self.split is not None:
            mesh, (batch_axes, head_axis) = self.split
            if self.kv_shards == 1:
                return sharded_paged_decode_attention(
                    mesh, batch_axes, head_axis, *args, layer, impl=self.impl, **options
                )
            # Each device holds its shard's pages: the pool is split over P by batch_axes.
            pages = PartitionSpec(None, head_axis, batch_axes, None, None)
            slots = PartitionSpec(batch_axes)
            specs = (PartitionSpec(batch_axes, head_axis, None), pages, pages, slots, slots)
            out = PartitionSpec(batch_axes, head_axis, None)
            layer = jnp.asarray(layer, jnp.int32)
            return run_sharded(
                lambda *a: fn(*a[:-1], layer=a[-1]), mesh, (*specs, PartitionSpec()), out,
                (*args, layer),
            )  # fmt: skip
        if self.kv_shards == 1:
            return fn(*args, layer=layer)
        out = jax.vmap(functools.partial(fn, layer=layer), in_axes=(0, 2, 2, 0, 0))(
            self.per_shard(q),
            self.by_shard(kp),
            self.by_shard(vp),
            self.per_shard(self.lengths_b),
            self.per_shard(self.page_table_bm),
        )
        return out.reshape(q.shape)
