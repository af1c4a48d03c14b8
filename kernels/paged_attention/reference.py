"""Plain-jnp paged decode attention: the test oracle and the ``impl='xla'`` path."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def paged_decode_attention_reference(
    q, k_pages, v_pages, lengths, page_table, *, sm_scale, window=None, softcap=None
):
    """One decode step of attention over a paged KV cache, in plain jnp.

    Gathers every slot's pages into a dense [B, K, pages_per_seq * S, H] cache, so it reads
    all pages including unused ones; the Pallas kernel reads only the valid ones. Masks by
    position on its own (not through ``window.py``), so that it checks the fast paths.

    Args:
      q: [B, N, H] queries (one token per slot).
      k_pages: [K, P, S, H] key page pool.
      v_pages: [K, P, S, H] value page pool.
      lengths: [B] int32 valid cached tokens per slot; clamped to pages_per_seq * S.
      page_table: [B, pages_per_seq] int32 page indices into the pool.
      sm_scale: softmax scale applied to q.k.
      window: None (attend every cached token) or W >= 1: slot b's query, at position
        lengths[b] - 1, attends positions [max(0, lengths[b] - W), lengths[b]).
      softcap: None or c > 0: scores become c * tanh(scores / c) before the mask.

    Returns:
      [B, N, H] attention outputs in q's dtype; zeros where lengths == 0.
    """
    b, n, h = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = n // kv_heads
    pages_per_seq = page_table.shape[1]
    # [K, B, pages_per_seq, S, H] -> [B, K, L, H], L = pages_per_seq * S.
    k = k_pages[:, page_table].reshape(kv_heads, b, pages_per_seq * page_size, h)
    v = v_pages[:, page_table].reshape(kv_heads, b, pages_per_seq * page_size, h)
    k = k.transpose(1, 0, 2, 3).astype(jnp.float32)
    v = v.transpose(1, 0, 2, 3).astype(jnp.float32)
    q_bkgh = q.reshape(b, kv_heads, group, h).astype(jnp.float32)
    s_bkgl = jnp.einsum("bkgh,bklh->bkgl", q_bkgh, k) * sm_scale
    if softcap is not None:
        s_bkgl = softcap * jnp.tanh(s_bkgl / softcap)
    pos_l = jnp.arange(pages_per_seq * page_size)
    valid_bl = pos_l[None, :] < lengths[:, None]
    if window is not None:
        # Hugging Face Gemma 2/3 keep key j for query i when i - j < W.
        query_b = jnp.minimum(lengths, pages_per_seq * page_size) - 1
        valid_bl &= query_b[:, None] - pos_l[None, :] < window
    s_bkgl = jnp.where(valid_bl[:, None, None, :], s_bkgl, -jnp.inf)
    # Rows with no valid token (length 0) would be all -inf: give them zeros, not NaN.
    any_valid_b = (lengths > 0)[:, None, None, None]
    p_bkgl = jax.nn.softmax(jnp.where(any_valid_b, s_bkgl, 0.0), axis=-1)
    p_bkgl = jnp.where(any_valid_b & valid_bl[:, None, None, :], p_bkgl, 0.0)
    out = jnp.einsum("bkgl,bklh->bkgh", p_bkgl, v)
    return out.reshape(b, n, h).astype(q.dtype)
