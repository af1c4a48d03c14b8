"""The ``'xla'`` path of flash attention: causal query blocks over time-major GQA rows.

What runs off the TPU (the CPU, a GPU), differentiated by plain autodiff. Two choices make it
1.5-3x faster than the materialised-scores reference at SmolLM2's training shapes on the CPU
(forward + backward, 8 rows of 256 tokens; ``scripts/bench_kernels.py``, docs/benchmarks.md,
"Learner"):

- **Time-major rows.** A kv head's G query heads are laid out as rows ``t * G + g`` of one
  [T * G, H] matrix, so each product is one batched GEMM per (row, kv head) whose query rows
  for a span of positions are contiguous.
- **Causal query blocks.** With ``causal``, the queries are cut into blocks of ``block_q``
  positions; block i attends only to keys ``[0, (i + 1) * block_q)``: the scores above the
  diagonal blocks are never computed, and each block's [rows, keys] scores stay small enough
  to be reused from cache by the softmax and its backward.

Values equal :func:`rljax.kernels.flash_attention.reference.flash_attention_reference` up to
f32 rounding; the segment mask is applied within each block as there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from rljax.kernels.flash_attention.reference import attention_mask


def blocked_attention(q, k, v, segment_ids, *, causal: bool, sm_scale: float, block_q: int):
    """Attention of q [B, T, N, H] over k, v [B, T, K, H]; returns [B, T, N, H] in q's dtype.

    ``block_q`` query positions per block when ``causal`` (the whole sequence otherwise); a
    sequence not a multiple of it ends in a shorter block.
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    group = n // kv_heads
    f32 = jnp.float32
    # [B, T, K, G, H] -> [B, K, T * G, H]: row t * G + g is position t of query head (kv, g).
    q_rows = q.astype(f32).reshape(b, t, kv_heads, group, h).transpose(0, 2, 1, 3, 4)
    q_rows = q_rows.reshape(b, kv_heads, t * group, h)
    k_heads = k.astype(f32).transpose(0, 2, 1, 3)  # [B, K, S, H]
    v_heads = v.astype(f32).transpose(0, 2, 1, 3)
    mask = jnp.repeat(attention_mask(t, segment_ids, causal=causal), group, axis=1)[:, None]
    step = block_q if causal else t
    outs = []
    for start in range(0, t, step):
        stop = min(start + step, t)
        keys = stop if causal else t  # causal: nothing after the block's last position
        rows = slice(start * group, stop * group)
        scores = jnp.einsum("bkrh,bksh->bkrs", q_rows[:, :, rows], k_heads[:, :, :keys])
        scores = jnp.where(mask[:, :, rows, :keys], scores * sm_scale, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        outs.append(jnp.einsum("bkrs,bksh->bkrh", probs, v_heads[:, :, :keys]))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
    out = out.reshape(b, kv_heads, t, group, h).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, t, n, h).astype(q.dtype)
