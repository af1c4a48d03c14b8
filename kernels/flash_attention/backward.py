"""Blockwise-recompute flash attention backward, in jnp.

Given the forward's output and row log-sum-exp, probabilities are recomputed one kv block at
a time (``lax.scan`` over blocks of ``block_kv_bwd`` keys), so the working set is
[B, N, T, block_kv_bwd] rather than the [B, N, T, T] that autodiff of the reference would
keep. Per block, with P = exp(S - lse) and D = rowsum(dO * O):

    dV_j = P_j^T dO,   dP_j = dO V_j^T,   dS_j = P_j * (dP_j - D) * scale,
    dQ  += dS_j K_j,   dK_j = dS_j^T Q.

GQA is handled by summing over the G query heads that share each kv head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def flash_attention_bwd_blockwise(
    q_bnth,
    k_bkth,
    v_bkth,
    segment_ids,
    out_bnth,
    lse_bnt1,
    dout_bnth,
    *,
    causal: bool,
    sm_scale: float,
    kv_len: int,
    block_kv: int,
):
    """Gradients of flash attention wrt q, k, v (heads-major, padded layout).

    Args:
      q_bnth: [B, N, Tp, H]; k_bkth, v_bkth: [B, K, Tp, H]; Tp a multiple of ``block_kv``.
      segment_ids: [B, Tp] int32 or None.
      out_bnth: the forward output [B, N, Tp, H].
      lse_bnt1: the forward's row log-sum-exp [B, N, Tp, 1].
      dout_bnth: the output cotangent [B, N, Tp, H].
      causal, sm_scale, kv_len: as in the forward.
      block_kv: keys per scan step.

    Returns:
      (dq, dk, dv) in the dtypes of q, k, v.
    """
    b, n, tp, h = q_bnth.shape
    kv_heads = k_bkth.shape[1]
    group = n // kv_heads
    num_blocks = tp // block_kv
    f32 = jnp.float32
    q = q_bnth.reshape(b, kv_heads, group, tp, h).astype(f32)
    do = dout_bnth.reshape(b, kv_heads, group, tp, h).astype(f32)
    o = out_bnth.reshape(b, kv_heads, group, tp, h).astype(f32)
    lse = lse_bnt1.reshape(b, kv_heads, group, tp, 1)
    delta = jnp.sum(do * o, axis=-1, keepdims=True)  # [B, K, G, Tp, 1]

    def blocks(x_bkth):
        # [B, K, Tp, H] -> [num_blocks, B, K, block_kv, H] for the scan.
        return jnp.moveaxis(x_bkth.reshape(b, kv_heads, num_blocks, block_kv, h), 2, 0)

    row = jnp.arange(tp)[:, None]

    def step(dq, xs):
        k_j, v_j, j = xs
        k_j = k_j.astype(f32)
        v_j = v_j.astype(f32)
        col = j * block_kv + jnp.arange(block_kv)[None, :]
        mask = col < kv_len
        if causal:
            mask = mask & (col <= row)
        mask = mask[None, None, None]  # [1, 1, 1, Tp, bk]
        if segment_ids is not None:
            seg_j = jax.lax.dynamic_slice_in_dim(segment_ids, j * block_kv, block_kv, axis=1)
            same = segment_ids[:, :, None] == seg_j[:, None, :]
            mask = mask & same[:, None, None]
        s = jnp.einsum("bkgth,bksh->bkgts", q, k_j) * sm_scale
        p = jnp.where(mask, jnp.exp(s - lse), 0.0)
        dv_j = jnp.einsum("bkgts,bkgth->bksh", p, do)
        dp = jnp.einsum("bkgth,bksh->bkgts", do, v_j)
        ds = p * (dp - delta) * sm_scale
        dq = dq + jnp.einsum("bkgts,bksh->bkgth", ds, k_j)
        dk_j = jnp.einsum("bkgts,bkgth->bksh", ds, q)
        return dq, (dk_j, dv_j)

    dq, (dk_blocks, dv_blocks) = jax.lax.scan(
        step,
        jnp.zeros_like(q),
        (blocks(k_bkth), blocks(v_bkth), jnp.arange(num_blocks)),
    )

    def unblock(x):
        return jnp.moveaxis(x, 0, 2).reshape(b, kv_heads, tp, h)

    return (
        dq.reshape(b, n, tp, h).astype(q_bnth.dtype),
        unblock(dk_blocks).astype(k_bkth.dtype),
        unblock(dv_blocks).astype(v_bkth.dtype),
    )
