"""Paged decode attention in XLA that reads only the pages the slots hold: the ``impl='xla'`` path.

The reference (``reference.py``) gathers every slot's whole page-table row, so a decode step
reads ``pages_per_seq`` pages per slot however short the sequences are. This path walks the
page table in blocks of ``pages_per_block`` pages with an online softmax and stops after the
block holding the longest slot's last token: a step reads ``B * ceil(max(lengths) / block)``
blocks of pages, whatever the table's width. The trip count is a traced value, so one compiled
step serves every length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# A finite stand-in for -inf: masked scores must not turn the running max into NaN.
_MASKED = -1e30


def paged_decode_attention_xla(
    q, k_pages, v_pages, lengths, page_table, *, sm_scale, pages_per_block
):
    """One decode step over a paged KV cache; arguments as ``paged_decode_attention``.

    Returns [B, N, H] in q's dtype; zeros where ``lengths == 0``.
    """
    b, n, h = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = n // kv_heads
    width = page_table.shape[1]
    c = min(pages_per_block, width)
    blocks = -(-width // c)
    # Pad the table to whole blocks with page 0: a padded column is always masked.
    table = jnp.pad(page_table, ((0, 0), (0, blocks * c - width)))
    lengths = jnp.clip(lengths, 0, width * page_size)
    block_tokens = c * page_size
    q_bkgh = q.reshape(b, kv_heads, group, h).astype(jnp.float32) * sm_scale

    def step(j, carry):
        m_bkg, l_bkg, acc_bkgh = carry
        pages_bc = jax.lax.dynamic_slice_in_dim(table, j * c, c, axis=1)
        # [K, B, c, S, H] -> [K, B, c * S, H]: only this block's pages are read.
        k = k_pages[:, pages_bc].reshape(kv_heads, b, block_tokens, h).astype(jnp.float32)
        v = v_pages[:, pages_bc].reshape(kv_heads, b, block_tokens, h).astype(jnp.float32)
        valid_bl = j * block_tokens + jnp.arange(block_tokens)[None, :] < lengths[:, None]
        # Stale or freed positions may hold anything, NaN included: zero them, so that a
        # masked score's zero weight cannot meet a NaN value.
        v = jnp.where(valid_bl[None, :, :, None], v, 0.0)
        s_bkgl = jnp.einsum("bkgh,kblh->bkgl", q_bkgh, k)
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
    needed = (jnp.max(lengths) + block_tokens - 1) // block_tokens
    _, l_bkg, acc_bkgh = jax.lax.fori_loop(0, needed, step, init)
    out = acc_bkgh / jnp.where(l_bkg > 0, l_bkg, 1.0)[..., None]
    return out.reshape(b, n, h).astype(q.dtype)
