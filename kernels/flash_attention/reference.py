"""Plain-jnp attention with causal and segment masks: the test oracle and the ``'xla'`` path."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(seq_len, segment_ids, *, causal):
    """[B or 1, T, T] boolean mask: True where query t may attend to key s."""
    row = jnp.arange(seq_len)[:, None]
    col = jnp.arange(seq_len)[None, :]
    mask = (col <= row) if causal else jnp.ones((seq_len, seq_len), bool)
    mask = mask[None]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    return mask


def flash_attention_reference(q, k, v, segment_ids=None, *, causal=True, sm_scale):
    """Materialised-scores attention in f32, differentiable by plain autodiff.

    Args:
      q: [B, T, N, H] queries.
      k: [B, T, K, H] keys; N % K == 0, query head n uses kv head n // (N // K).
      v: [B, T, K, H] values.
      segment_ids: [B, T] int32 or None; queries attend only to keys of the same segment.
      causal: also require key index <= query index.
      sm_scale: softmax scale.

    Returns:
      [B, T, N, H] in q's dtype.
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    group = n // kv_heads
    q_btkgh = q.reshape(b, t, kv_heads, group, h).astype(jnp.float32)
    s = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k.astype(jnp.float32)) * sm_scale
    mask = attention_mask(t, segment_ids, causal=causal)[:, None, None]
    s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgts,bskh->btkgh", p, v.astype(jnp.float32))
    return out.reshape(b, t, n, h).astype(q.dtype)
