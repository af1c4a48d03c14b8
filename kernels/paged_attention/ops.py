"""Public paged decode attention: argument checks, backend dispatch, and a shard_map wrapper."""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import PartitionSpec as P
from rljax.kernels import dispatch, sharding, validation
from rljax.kernels.paged_attention import block_sizes as block_sizes_lib
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel
from rljax.kernels.paged_attention.reference import paged_decode_attention_reference

_Q = "[B, N, H]"
_PAGES = "[K, P, S, H]"
_LENGTHS = "[B]"
_TABLE = "[B, pages_per_seq]"


def _validate(q, k_pages, v_pages, lengths, page_table):
    b, n, h = validation.check_array("q", q, _Q, 3)
    kv_heads, _, _, _ = validation.check_array("k_pages", k_pages, _PAGES, 4)
    k_shape = tuple(k_pages.shape)
    validation.check_dim("k_pages", k_shape, _PAGES, 3, h)
    v_shape = validation.check_array("v_pages", v_pages, _PAGES, 4)
    if v_shape != k_shape:
        raise ValueError(
            f"v_pages must have shape {_PAGES} = {k_shape} like k_pages, got {v_shape}."
        )
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(
            f"q has N={n} heads, which must be a multiple of k_pages' K={kv_heads} kv heads "
            "(GQA); check k_pages' shape [K, P, S, H]."
        )
    validation.check_floating("q", q, _Q)
    lengths_shape = validation.check_array("lengths", lengths, _LENGTHS, 1)
    validation.check_dim("lengths", lengths_shape, _LENGTHS, 0, b)
    validation.check_integer("lengths", lengths, _LENGTHS)
    table_shape = validation.check_array("page_table", page_table, _TABLE, 2)
    validation.check_dim("page_table", table_shape, _TABLE, 0, b)
    if table_shape[1] == 0:
        raise ValueError(f"page_table must have shape {_TABLE} with pages_per_seq >= 1.")
    validation.check_integer("page_table", page_table, _TABLE)


@functools.partial(jax.jit, static_argnames=("sm_scale", "use_pallas", "interpret", "block_sizes"))
def _paged_decode_attention(
    q, k_pages, v_pages, lengths, page_table, *, sm_scale, use_pallas, interpret, block_sizes
):
    if use_pallas:
        return paged_decode_attention_kernel(
            q,
            k_pages,
            v_pages,
            lengths,
            page_table,
            sm_scale=sm_scale,
            block_sizes=block_sizes,
            interpret=interpret,
        )
    return paged_decode_attention_reference(
        q, k_pages, v_pages, lengths, page_table, sm_scale=sm_scale
    )


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    *,
    sm_scale: float | None = None,
    impl: str = "auto",
    block_sizes: block_sizes_lib.BlockSizes | None = None,
):
    """One decode step of (grouped-query) attention over a paged KV cache. Forward only.

    Query head n attends with kv head n // (N // K). Slot b attends to its first
    ``lengths[b]`` cached tokens, stored in pages ``page_table[b, :ceil(lengths[b] / S)]``;
    the rest of its page table is never read, so it may hold any in-range index.

    Args:
      q: [B, N, H] float queries, one token per slot.
      k_pages: [K, P, S, H] key page pool (K kv heads, P pages, S tokens per page).
      v_pages: [K, P, S, H] value page pool.
      lengths: [B] int32 valid cached tokens per slot. 0 gives a zero output; values above
        pages_per_seq * S are clamped to it.
      page_table: [B, pages_per_seq] int32 page indices into the pool, in [0, P).
      sm_scale: softmax scale; defaults to 1 / sqrt(H).
      impl: 'auto' (Pallas on TPU, XLA elsewhere), 'pallas' (interpret mode off TPU) or 'xla'.
      block_sizes: override the tuned ``BlockSizes`` for this chip.

    Returns:
      [B, N, H] attention outputs in q's dtype.

    Raises:
      ValueError: a misshaped argument (named in the message) or an unknown ``impl``; raised
        before anything is traced.
    """
    _validate(q, k_pages, v_pages, lengths, page_table)
    backend = dispatch.resolve_impl(impl)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    validation.check_positive_scalar("sm_scale", sm_scale)
    if block_sizes is None:
        block_sizes = block_sizes_lib.for_device()
    if not isinstance(block_sizes, block_sizes_lib.BlockSizes):
        raise ValueError(
            f"block_sizes must be a paged_attention BlockSizes or None, got {block_sizes!r}."
        )
    return _paged_decode_attention(
        q,
        k_pages,
        v_pages,
        lengths,
        page_table,
        sm_scale=float(sm_scale),
        use_pallas=backend.use_pallas,
        interpret=backend.interpret,
        block_sizes=block_sizes.for_pages_per_seq(page_table.shape[1]),
    )


def sharded_paged_decode_attention(
    mesh,
    batch_axes,
    head_axis,
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    **kwargs,
):
    """``paged_decode_attention`` under ``shard_map``: slots over ``batch_axes``, heads over
    ``head_axis``.

    Every device keeps the whole page pool for its kv heads (the pool is sharded over K only),
    so a slot's pages may live anywhere in the pool. Query heads are split in contiguous
    blocks, which keeps each GQA group with its kv head.

    Args:
      mesh: the ``jax.sharding.Mesh``.
      batch_axes: mesh axis name (or tuple of names, or None) sharding B.
      head_axis: mesh axis name (or None) sharding N and K; both must divide by its size.
      q, k_pages, v_pages, lengths, page_table: as in ``paged_decode_attention``.
      **kwargs: ``sm_scale``, ``impl``, ``block_sizes``.

    Returns:
      [B, N, H] outputs, sharded like q.
    """
    _validate(q, k_pages, v_pages, lengths, page_table)
    batch_shards = sharding.axis_size(mesh, batch_axes)
    if q.shape[0] % batch_shards:
        raise ValueError(
            f"q's B={q.shape[0]} must divide by the {batch_shards} shards of mesh axes "
            f"{batch_axes!r}; pad the batch."
        )
    if head_axis is not None:
        heads = sharding.axis_size(mesh, head_axis)
        if q.shape[1] % heads or k_pages.shape[0] % heads:
            raise ValueError(
                f"q's N={q.shape[1]} and k_pages' K={k_pages.shape[0]} heads must both divide "
                f"by mesh axis {head_axis!r} of size {heads}; pick another head_axis."
            )
    kwargs.setdefault("sm_scale", 1.0 / math.sqrt(q.shape[-1]))
    fn = functools.partial(paged_decode_attention, **kwargs)
    pages_spec = P(head_axis, None, None, None)
    in_specs = (
        P(batch_axes, head_axis, None),
        pages_spec,
        pages_spec,
        P(batch_axes),
        P(batch_axes, None),
    )
    args = (q, k_pages, v_pages, lengths, page_table)
    return sharding.run_sharded(fn, mesh, in_specs, P(batch_axes, head_axis, None), args)
