"""Paged decode attention in XLA that reads only the pages the slots hold: the ``impl='xla'`` path.

The reference (``reference.py``) gathers every slot's whole page-table row, so a decode step
reads ``pages_per_seq`` pages per slot however short the sequences are. This path walks the
page table in blocks of ``pages_per_block`` pages with an online softmax and stops after the
block holding the longest slot's last token: a step reads ``B * ceil(max(lengths) / block)``
blocks of pages, whatever the table's width. The trip count is a traced value, so one compiled
step serves every length.

With a sliding window of W keys, each slot's walk starts at its own first in-window page
(``window.first_page``): block j of slot b holds table columns ``first_page[b] + j * c`` on,
gathered per slot with ``take_along_axis``. The trip count is the most blocks any slot's
window spans, ``ceil(max_b(last_page[b] + 1 - first_page[b]) / c)``, so every slot reads
about ``min(W, max(lengths)) / S + 1`` pages rounded up to a block, and no page wholly before a
slot's window is read: the engine may hand those back to the pool. Starting one shared loop at
the minimum first page over the slots would instead read everything between the shortest and
the longest slot; gathering a fixed ``ceil(W / S) + 1`` pages per slot would read W tokens
even when every slot is far shorter than W (Gemma 2's W is 4096).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from rljax.kernels.paged_attention import window as window_lib

# A finite stand-in for -inf: masked scores must not turn the running max into NaN.
_MASKED = -1e30


# A pool of dtype BITS holds BITS_OF numbers' bits: the engine's bfloat16 cache on the CPU
# (rljax.models.paged_kv.pool_dtype), which both paths read through :func:`as_values`.
BITS, BITS_OF = jnp.dtype(jnp.uint16), jnp.dtype(jnp.bfloat16)


def as_values(pages):
    """``pages``, or the bfloat16 numbers whose bits a uint16 pool holds."""
    return jax.lax.bitcast_convert_type(pages, BITS_OF) if pages.dtype == BITS else pages


def _block(pages_lkpsh, layer, pages_bc):
    """Pages ``pages_bc`` [B, c] of layer ``layer``, [K, B, c, S, H] in float32, gathered from
    every layer's pool in one gather (the bits of a uint16 pool read after the gather)."""
    x = jnp.moveaxis(pages_lkpsh[layer, :, pages_bc], 2, 0)  # the indexed dims lead: [B, c, K]
    return as_values(x).astype(jnp.float32)


def block_walk(lengths, *, page_size, pages_per_block, window):
    """Where each slot's walk starts and how many blocks the loop runs.

    Args:
      lengths: [B] int32, already clamped to the table.
      page_size, pages_per_block: S and c.
      window: None or W.

    Returns:
      (first_page_b, num_blocks): [B] int32 first table column of each slot's walk (None
      without a window: every walk starts at column 0) and the traced trip count.
    """
    if window is None:
        block_tokens = pages_per_block * page_size
        return None, (jnp.max(lengths) + block_tokens - 1) // block_tokens
    num_pages_b = (lengths + page_size - 1) // page_size
    first_page_b = window_lib.first_page(lengths, window, page_size)
    span_b = num_pages_b - first_page_b
    return first_page_b, (jnp.max(span_b) + pages_per_block - 1) // pages_per_block


def paged_decode_attention_xla(
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    layer,
    *,
    sm_scale,
    pages_per_block,
    window=None,
    softcap=None,
):
    """One decode step over a paged KV cache; arguments as ``paged_decode_attention``, the
    pools every layer's [L, K, P, S, H] and ``layer`` the one read (an int32 scalar).

    Returns [B, N, H] in q's dtype; zeros where ``lengths == 0``.
    """
    b, n, h = q.shape
    _, kv_heads, _, page_size, _ = k_pages.shape
    group = n // kv_heads
    width = page_table.shape[1]
    c = min(pages_per_block, width)
    blocks = -(-width // c)
    # Pad the table to whole blocks with page 0: a padded column is always masked.
    table = jnp.pad(page_table, ((0, 0), (0, blocks * c - width)))
    lengths = jnp.clip(lengths, 0, width * page_size)
    block_tokens = c * page_size
    q_bkgh = q.reshape(b, kv_heads, group, h).astype(jnp.float32) * sm_scale

    def block_pages(j):
        """Block j's [B, c] page indices: table columns from the slot's walk start."""
        if first_page_b is None:
            return jax.lax.dynamic_slice_in_dim(table, j * c, c, axis=1)
        cols_bc = first_page_b[:, None] + j * c + jnp.arange(c)[None, :]
        # Columns past the table are past every length, so always masked: clamp them.
        return jnp.take_along_axis(table, jnp.minimum(cols_bc, blocks * c - 1), axis=1)

    def block_positions(j):
        """Block j's [B or 1, c * S] key positions."""
        if first_page_b is None:
            return j * block_tokens + jnp.arange(block_tokens)[None, :]
        return (first_page_b[:, None] + j * c) * page_size + jnp.arange(block_tokens)[None, :]

    def step(j, carry):
        m_bkg, l_bkg, acc_bkgh = carry
        pages_bc = block_pages(j)
        # [K, B, c * S, H]: only this block's pages of the layer are read.
        k = _block(k_pages, layer, pages_bc).reshape(kv_heads, b, block_tokens, h)
        v = _block(v_pages, layer, pages_bc).reshape(kv_heads, b, block_tokens, h)
        valid_bl = window_lib.attended(block_positions(j), lengths[:, None], window)
        # Stale or freed positions may hold anything, NaN included: zero them, so that a
        # masked score's zero weight cannot meet a NaN value.
        v = jnp.where(valid_bl[None, :, :, None], v, 0.0)
        s_bkgl = window_lib.soft_cap(jnp.einsum("bkgh,kblh->bkgl", q_bkgh, k), softcap)
        s_bkgl = jnp.where(valid_bl[:, None, None, :], s_bkgl, _MASKED)
        m_new = jnp.maximum(m_bkg, s_bkgl.max(axis=-1))
        p_bkgl = jnp.exp(s_bkgl - m_new[..., None]) * valid_bl[:, None, None, :]
        scale = jnp.exp(m_bkg - m_new)
        l_new = l_bkg * scale + p_bkgl.sum(axis=-1)
        acc_new = acc_bkgh * scale[..., None] + jnp.einsum("bkgl,kblh->bkgh", p_bkgl, v)
        return m_new, l_new, acc_new

    init = (
        jnp.full((b, kv_heads, group), _MASKED, jnp.float32),
        jnp.zeros((b, kv_heads, group), jnp.float32),
        jnp.zeros((b, kv_heads, group, h), jnp.float32),
    )
    first_page_b, needed = block_walk(
        lengths, page_size=page_size, pages_per_block=c, window=window
    )
    _, l_bkg, acc_bkgh = jax.lax.fori_loop(0, needed, step, init)
    out = acc_bkgh / jnp.where(l_bkg > 0, l_bkg, 1.0)[..., None]
    return out.reshape(b, n, h).astype(q.dtype)
