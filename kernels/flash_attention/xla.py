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

With a sliding ``window`` W the queries go in blocks of :func:`window_block` positions, a
``lax.map`` over the blocks: block i attends only to the band of keys
``[i * block - W + 1, (i + 1) * block)``, the keys outside it are never read, so a local
layer's cost grows with W, not T. The map keeps the program one block long whatever T is (an
unrolled loop of 256 blocks of 16 took minutes to compile).

Values equal :func:`rljax.kernels.flash_attention.reference.flash_attention_reference` up to
f32 rounding; the masks are applied within each block as there, after the soft-cap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from rljax.kernels import dispatch
from rljax.kernels.flash_attention.reference import attention_mask, soft_cap


def window_block(window: int, block_q: int, seq_len: int) -> int:
    """Query positions per block of the windowed path.

    A block's keys span ``block + W - 1`` positions, so the masked triangles at the band's two
    ends cost about ``block / W`` extra work; small blocks lose more to per-block overhead and
    skinny matmuls. Forward + backward on the CPU, T = 4096, 9 query heads over 3 kv heads of
    64: W = 512 ran fastest at 64, W = 64 at 16-32.
    """
    return min(block_q, seq_len, max(16, dispatch.round_up(window // 8, 8)))


def blocked_attention(
    q, k, v, segment_ids, *, causal: bool, sm_scale: float, block_q: int, window=None, softcap=None
):
    """Attention of q [B, T, N, H] over k, v [B, T, K, H]; returns [B, T, N, H] in q's dtype.

    ``block_q`` query positions per block when ``causal`` (the whole sequence otherwise); a
    sequence not a multiple of it ends in a shorter block. ``window`` (an int < T, with
    ``causal``) and ``softcap`` are as in the reference.
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
    if window is None:
        out = _causal_blocks(
            q_rows, k_heads, v_heads, segment_ids, causal=causal, sm_scale=sm_scale,
            block_q=block_q, softcap=softcap,
        )  # fmt: skip
    else:
        out = _window_band(
            q_rows, k_heads, v_heads, segment_ids, sm_scale=sm_scale, softcap=softcap,
            window=window, block=window_block(window, block_q, t),
        )  # fmt: skip
    out = out.reshape(b, kv_heads, t, group, h).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, t, n, h).astype(q.dtype)


def _causal_blocks(q_rows, k_heads, v_heads, segment_ids, *, causal, sm_scale, block_q, softcap):
    """[B, K, T * G, H] outputs: query blocks over the keys up to their last position."""
    t = k_heads.shape[2]
    group = q_rows.shape[2] // t
    mask = jnp.repeat(attention_mask(t, segment_ids, causal=causal), group, axis=1)[:, None]
    step = block_q if causal else t
    outs = []
    for start in range(0, t, step):
        stop = min(start + step, t)
        keys = stop if causal else t  # causal: nothing after the block's last position
        rows = slice(start * group, stop * group)
        scores = jnp.einsum("bkrh,bksh->bkrs", q_rows[:, :, rows], k_heads[:, :, :keys])
        keep = mask[:, :, rows, :keys]
        scores = jnp.where(keep, soft_cap(scores * sm_scale, softcap), -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        outs.append(jnp.einsum("bkrs,bksh->bkrh", probs, v_heads[:, :, :keys]))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)


def _window_band(q_rows, k_heads, v_heads, segment_ids, *, sm_scale, softcap, window, block):
    """[B, K, T * G, H] outputs: each block of ``block`` queries over its band of keys."""
    b, kv_heads, t, h = k_heads.shape
    group = q_rows.shape[2] // t
    blocks = -(-t // block)
    tail = blocks * block - t
    lead = window - 1  # keys before position 0 that the first block's band would start at
    span = block + lead
    q_blocks = jnp.pad(q_rows, ((0, 0), (0, 0), (0, tail * group), (0, 0)))
    q_blocks = jnp.moveaxis(q_blocks.reshape(b, kv_heads, blocks, block * group, h), 2, 0)
    k_band, v_band = (
        jnp.pad(x, ((0, 0), (0, 0), (lead, tail), (0, 0))) for x in (k_heads, v_heads)
    )
    seg_band = None
    if segment_ids is not None:
        seg_band = jnp.pad(segment_ids, ((0, 0), (lead, tail)))
    # Query r of block i is position i * block + r, key c of its band i * block - lead + c; so
    # "key <= query and query - key < W" is 0 <= r + lead - c < W, i.e. r <= c <= r + lead,
    # the same in every block. Queries past T (the last block's tail) see at least their own
    # zero key: finite, then dropped.
    r = jnp.arange(block)[:, None]
    c = jnp.arange(span)[None, :]
    in_window = (c >= r) & (c <= r + lead)

    def attend(i, q_blk):
        start = i * block
        mask = (in_window & (start - lead + c >= 0))[None]  # [1, block, span]; no key before 0
        if seg_band is not None:
            seg_q = jax.lax.dynamic_slice_in_dim(seg_band, start + lead, block, axis=1)
            seg_k = jax.lax.dynamic_slice_in_dim(seg_band, start, span, axis=1)
            mask = mask & (seg_q[:, :, None] == seg_k[:, None, :])
        k_blk, v_blk = (
            jax.lax.dynamic_slice_in_dim(x, start, span, axis=2) for x in (k_band, v_band)
        )
        scores = jnp.einsum("bkrh,bksh->bkrs", q_blk, k_blk)
        scores = soft_cap(scores * sm_scale, softcap).reshape(b, kv_heads, block, group, span)
        scores = jnp.where(mask[:, None, :, None, :], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).reshape(b, kv_heads, block * group, span)
        return jnp.einsum("bkrs,bksh->bkrh", probs, v_blk)

    out = jax.lax.map(lambda xs: attend(*xs), (jnp.arange(blocks), q_blocks))
    out = jnp.moveaxis(out, 0, 2).reshape(b, kv_heads, blocks * block * group, h)
    return out[:, :, : t * group]
