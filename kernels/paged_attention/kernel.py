"""Pallas TPU kernel: one decode step of GQA attention over a paged KV cache.

Grid: (B, K), one program per (slot, kv head). All G = N // K query heads that share a kv
head are scored together, so each K/V page is read from HBM once per slot, not G times.

The page table and lengths are scalar-prefetched into SMEM. K/V pages stay in HBM
(``pl.ANY``); the kernel DMAs ``pages_per_block`` pages at a time into a double-buffered VMEM
scratch and runs an online softmax over the blocks. The loop runs only over the
ceil(length / S) valid pages, and each page copy is guarded, so pages at or past that count
are never read: a decode step's cost follows the slot's length, not the table's width.

With a sliding window of W keys, each slot's loop starts at its first in-window page,
``max(0, length - W) // S`` (computed from the scalar-prefetched length), so the pages wholly
before the window are never DMA'd and may be freed by the engine: a step's cost follows
min(length, W). Soft-capping (``c * tanh(s / c)``) is applied to the scores before the mask.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.paged_attention import window as window_lib
from rljax.kernels.paged_attention.block_sizes import BlockSizes


@dataclasses.dataclass(frozen=True)
class _PageCopies:
    """The DMAs of one (slot, kv head)'s K/V pages from HBM into the VMEM double buffer."""

    page_table_ref: Any  # [B * pages_per_seq] int32 in SMEM
    layer: Any  # the layer read (traced)
    k_hbm: Any  # [L, K, P, S, H] in HBM
    v_hbm: Any
    k_buf: Any  # [2, pages_per_block, S, H] in VMEM
    v_buf: Any
    sems: Any  # [2 (k/v), 2 (slot), pages_per_block]
    b: Any  # this program's slot and kv head (traced)
    kv_head: Any
    num_pages: Any  # the slot's valid pages (traced)
    first_page: Any  # the slot's first in-window page (traced), None without a window
    pages_per_seq: int
    pages_per_block: int

    def _column(self, block, j):
        """The page-table column of page j of ``block``: blocks count from ``first_page``."""
        column = block * self.pages_per_block + j
        return column if self.first_page is None else self.first_page + column

    def _copies(self, block, slot, j) -> tuple:
        row = self.b * self.pages_per_seq
        if self.first_page is not None:
            row = row + self.first_page
        page = self.page_table_ref[row + block * self.pages_per_block + j]
        at = (self.layer, self.kv_head, page)
        k_src, v_src = self.k_hbm.at[at], self.v_hbm.at[at]
        return (
            pltpu.make_async_copy(k_src, self.k_buf.at[slot, j], self.sems.at[0, slot, j]),
            pltpu.make_async_copy(v_src, self.v_buf.at[slot, j], self.sems.at[1, slot, j]),
        )

    def for_valid_pages(self, block, slot, action) -> None:
        """``action(copy)`` for each K and V page copy of ``block`` into buffer ``slot``,
        guarded so pages at or past the slot's valid count are never read."""
        for j in range(self.pages_per_block):

            @pl.when(self._column(block, j) < self.num_pages)
            def _(j=j):
                for copy in self._copies(block, slot, j):
                    action(copy)


def _online_softmax_step(q, k, v, start, length, carry, *, window, softcap):
    """Folds one block of keys (positions ``start`` on) into the running max, sum and
    accumulator; keys at or past ``length``, or before the window, are masked."""
    m_prev, l_prev, acc_prev = carry
    tokens_per_block = k.shape[0]
    pos = start + jax.lax.broadcasted_iota(jnp.int32, (1, tokens_per_block), 1)
    # [1, T_blk]; buffer rows of pages outside [first_page, num_pages) hold stale or garbage data.
    valid = window_lib.attended(pos, length, window)
    s = jax.lax.dot_general(
        q, k.astype(jnp.float32), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )
    s = window_lib.soft_cap(s, softcap)
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_new = alpha * l_prev + p.sum(axis=-1, keepdims=True)
    # Zero invalid V rows too: 0 * NaN garbage would poison the accumulator.
    v = jnp.where(valid.reshape(tokens_per_block, 1), v.astype(jnp.float32), 0.0)
    pv = jax.lax.dot_general(p, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return m_new, l_new, alpha * acc_prev + pv


def _normalised(l_fin, acc):
    """acc / l; l == 0 only when length == 0, and the output is then defined as zeros."""
    return jnp.where(l_fin > 0, acc / jnp.where(l_fin > 0, l_fin, 1.0), 0.0)


def _kernel(
    # Scalar prefetch (SMEM).
    lengths_ref,  # [B] int32
    page_table_ref,  # [B * pages_per_seq] int32, flattened: 2-D SMEM arrays pad badly.
    layer_ref,  # [1] int32: the layer of the pools read.
    # Inputs.
    q_ref,  # [G, H] block: this slot's queries for this kv head.
    k_hbm,  # [L, K, P, S, H] in HBM: every layer's pool, read at layer_ref[0] only.
    v_hbm,  # [L, K, P, S, H] in HBM.
    # Output.
    o_ref,  # [G, H] block.
    # Scratch.
    k_buf,  # [2, pages_per_block, S, H] VMEM double buffer.
    v_buf,  # [2, pages_per_block, S, H] VMEM double buffer.
    sems,  # DMA semaphores [2 (k/v), 2 (slot), pages_per_block].
    *,
    sm_scale: float,
    window: int | None,
    softcap: float | None,
    pages_per_seq: int,
    pages_per_block: int,
    page_size: int,
):
    b = pl.program_id(0)
    kv_head = pl.program_id(1)
    # Lengths past the table are clamped, matching the reference.
    length = jnp.minimum(lengths_ref[b], pages_per_seq * page_size)
    num_pages = pl.cdiv(length, page_size)
    if window is None:
        first_page = None
        num_blocks = pl.cdiv(num_pages, pages_per_block)
    else:
        # Block 0 holds the window's first position, so the running max is finite after it.
        first_page = window_lib.first_page(length, window, page_size)
        num_blocks = pl.cdiv(num_pages - first_page, pages_per_block)
    tokens_per_block = pages_per_block * page_size
    pages = _PageCopies(
        page_table_ref, layer_ref[0], k_hbm, v_hbm, k_buf, v_buf, sems, b, kv_head, num_pages,
        first_page, pages_per_seq, pages_per_block,
    )  # fmt: skip

    @pl.when(num_blocks > 0)
    def _():
        pages.for_valid_pages(0, 0, lambda c: c.start())

    q = q_ref[...].astype(jnp.float32) * sm_scale
    group, head_dim = q.shape

    def body(block, carry):
        slot = block % 2

        # Prefetch the next block into the other slot while this one is scored.
        @pl.when(block + 1 < num_blocks)
        def _():
            pages.for_valid_pages(block + 1, 1 - slot, lambda c: c.start())

        pages.for_valid_pages(block, slot, lambda c: c.wait())
        k = k_buf[slot].reshape(tokens_per_block, head_dim)
        v = v_buf[slot].reshape(tokens_per_block, head_dim)
        start = block * tokens_per_block
        if first_page is not None:
            start = first_page * page_size + start
        return _online_softmax_step(q, k, v, start, length, carry, window=window, softcap=softcap)

    init = (
        jnp.full((group, 1), -jnp.inf, jnp.float32),
        jnp.zeros((group, 1), jnp.float32),
        jnp.zeros((group, head_dim), jnp.float32),
    )
    _, l_fin, acc = jax.lax.fori_loop(0, num_blocks, body, init)
    o_ref[...] = _normalised(l_fin, acc).astype(o_ref.dtype)


def paged_decode_attention_kernel(
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    layer,
    *,
    sm_scale,
    block_sizes: BlockSizes,
    interpret,
    window: int | None = None,
    softcap: float | None = None,
):
    """Runs the Pallas kernel. Shapes as in ``ops.paged_decode_attention``, already validated.

    Args:
      q: [B, N, H].
      k_pages, v_pages: every layer's pools, [L, K, P, S, H]; the DMAs read layer ``layer``
        in place (no copy of the layer's pool).
      lengths: [B] int32.
      page_table: [B, pages_per_seq] int32.
      layer: int32 scalar.
      sm_scale: softmax scale.
      block_sizes: BlockSizes, already clamped to pages_per_seq.
      interpret: ``pallas_call``'s interpret argument (False on TPU).
      window: None, or W: each slot attends its last W positions and reads only their pages.
      softcap: None, or c > 0: scores become c * tanh(scores / c) before the mask.

    Returns:
      [B, N, H] in q's dtype.
    """
    b, n, h = q.shape
    _, kv_heads, _, page_size, _ = k_pages.shape
    group = n // kv_heads
    pages_per_seq = page_table.shape[1]
    ppb = block_sizes.pages_per_block
    q_bkgh = q.reshape(b, kv_heads, group, h)
    kernel = functools.partial(
        _kernel,
        sm_scale=sm_scale,
        window=window,
        softcap=softcap,
        pages_per_seq=pages_per_seq,
        pages_per_block=ppb,
        page_size=page_size,
    )
    qo_spec = pl.BlockSpec((None, None, group, h), lambda bi, ki, *_: (bi, ki, 0, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(b, kv_heads),
        in_specs=[
            qo_spec,
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=qo_spec,
        scratch_shapes=[
            pltpu.VMEM((2, ppb, page_size, h), k_pages.dtype),
            pltpu.VMEM((2, ppb, page_size, h), v_pages.dtype),
            pltpu.SemaphoreType.DMA((2, 2, ppb)),
        ],
    )
    out = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q_bkgh.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret,
        name="rljax_paged_decode_attention",
    )(
        lengths.astype(jnp.int32),
        page_table.astype(jnp.int32).reshape(-1),
        jnp.asarray(layer, jnp.int32).reshape(1),
        q_bkgh,
        k_pages,
        v_pages,
    )
    return out.reshape(b, n, h)
