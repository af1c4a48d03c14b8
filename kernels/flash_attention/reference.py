"""Plain-jnp attention with causal, sliding-window and segment masks and a score soft-cap: the
test oracle, written as Hugging Face's Gemma 2/3 eager attention computes it."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_mask(seq_len, segment_ids, *, causal, window=None):
    """[B or 1, T, T] boolean mask: True where query t may attend to key s.

    ``window`` W (with ``causal``) also requires t - s < W: the W keys ending at the query.
    """
    row = jnp.arange(seq_len)[:, None]
    col = jnp.arange(seq_len)[None, :]
    mask = (col <= row) if causal else jnp.ones((seq_len, seq_len), bool)
    if window is not None:
        mask = mask & (row - col < window)
    mask = mask[None]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    return mask


def soft_cap(scores, softcap):
    """``softcap * tanh(scores / softcap)``; ``scores`` unchanged when ``softcap`` is None."""
    if softcap is None:
        return scores
    return softcap * jnp.tanh(scores / softcap)


def flash_attention_reference(
    q, k, v, segment_ids=None, *, causal=True, sm_scale, window=None, softcap=None
):
    """Materialised-scores attention in f32, differentiable by plain autodiff.

    Args:
      q: [B, T, N, H] queries.
      k: [B, T, K, H] keys; N % K == 0, query head n uses kv head n // (N // K).
      v: [B, T, K, H] values.
      segment_ids: [B, T] int32 or None; queries attend only to keys of the same segment.
      causal: also require key index <= query index.
      sm_scale: softmax scale.
      window: None, or W >= 1 (with ``causal``): query t sees only keys s with t - s < W.
      softcap: None, or c > 0: scores become c * tanh(q.k * sm_scale / c) before the masks.

    Returns:
      [B, T, N, H] in q's dtype.
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    group = n // kv_heads
    q_btkgh = q.reshape(b, t, kv_heads, group, h).astype(jnp.float32)
    s = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k.astype(jnp.float32)) * sm_scale
    s = soft_cap(s, softcap)
    mask = attention_mask(t, segment_ids, causal=causal, window=window)[:, None, None]
    s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bkgts,bskh->btkgh", p, v.astype(jnp.float32))
    return out.reshape(b, t, n, h).astype(q.dtype)
