"""Pallas TPU kernels: flash attention backward (FlashAttention-2 style, two kernels).

With P = exp(S - lse) recomputed per tile from the forward's log-sum-exp, and
D = rowsum(dO * O) precomputed in jnp:

    dV_j = sum_i P_ij^T dO_i,   dS_ij = P_ij * (dO_i V_j^T - D_i) * scale,
    dK_j = sum_i dS_ij^T Q_i,   dQ_i = sum_j dS_ij K_j.

With a soft-cap c the scores are c * tanh(scale * Q K^T / c), and dS takes the tanh's slope,
a factor (1 - tanh^2).

- dK/dV kernel, grid (B, K, T/block_kv_bwd, G, T/block_q): one kv tile stays resident while
  the G query heads that share it and all query tiles stream past; the GQA sum is just more
  reduction steps, so K/V gradients are never materialised per query head.
- dQ kernel, grid (B, N, T/block_q, T/block_kv_bwd): the forward's iteration order.

Causal tiles that are entirely masked are skipped with ``pl.when``, and their index maps are
clamped so the pipeline issues no DMA for them. With a sliding window each kernel's last grid
axis walks only the band of tiles the window reaches (``band.py``), as in the forward. Layout
and segment-id broadcasting are as in ``kernel.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.flash_attention.band import TileBand
from rljax.kernels.flash_attention.block_sizes import BlockSizes
from rljax.kernels.flash_attention.kernel import (
    check_lane_tile,
    segment_args,
    segment_specs,
    soft_cap_and_tanh,
)

_DIMS_T = (((1,), (1,)), ((), ()))  # a @ b.T
_DIMS_N = (((1,), (0,)), ((), ()))  # a @ b
_DIMS_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _probs_and_dscores(q, k, v, do, lse, delta, q_block, kv_block, qseg_ref, kvseg_ref, *, cfg):
    """Recomputes P and dS (wrt the unscaled Q K^T) for one [block_q, block_kv] tile; masked
    entries are exactly 0."""
    s = jax.lax.dot_general(q, k, _DIMS_T, preferred_element_type=jnp.float32) * cfg["scale"]
    s, tanh = soft_cap_and_tanh(s, cfg["softcap"])
    col = kv_block * cfg["bk"] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    mask = col < cfg["kv_len"]
    if cfg["causal"]:
        row = q_block * cfg["bq"] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        mask = mask & (col <= row)
        if cfg["window"] is not None:
            mask = mask & (row - col < cfg["window"])
    if qseg_ref is not None:
        mask = mask & (qseg_ref[:, :1] == kvseg_ref[:1, :])
    p = jnp.where(mask, jnp.exp(s - lse), 0.0)
    dp = jax.lax.dot_general(do, v, _DIMS_T, preferred_element_type=jnp.float32)
    ds = p * (dp - delta)
    if tanh is not None:  # d(c * tanh(x / c)) / dx
        ds = ds * (1.0 - tanh * tanh)
    ds = ds * cfg["scale"]
    return p, ds


def _dkv_kernel(*refs, cfg):
    if cfg["has_segments"]:
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kvseg_ref) = refs[:8]
        dk_ref, dv_ref, dk_acc, dv_acc = refs[8:]
    else:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
        dk_ref, dv_ref, dk_acc, dv_acc = refs[6:]
        qseg_ref = kvseg_ref = None
    band = cfg["band"]
    kj, g, step = pl.program_id(2), pl.program_id(3), pl.program_id(4)
    qi = band.q_tile(kj, step)

    @pl.when((g == 0) & (step == 0))
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    @pl.when(band.q_run(kj, qi))
    def _():
        q, do = q_ref[...], do_ref[...]
        p, ds = _probs_and_dscores(
            q, k_ref[...], v_ref[...], do, lse_ref[...], delta_ref[...], qi, kj,
            qseg_ref, kvseg_ref, cfg=cfg,
        )  # fmt: skip
        dv_acc[...] += jax.lax.dot_general(
            p.astype(do.dtype), do, _DIMS_TN, preferred_element_type=jnp.float32
        )
        dk_acc[...] += jax.lax.dot_general(
            ds.astype(q.dtype), q, _DIMS_TN, preferred_element_type=jnp.float32
        )

    @pl.when((g == pl.num_programs(3) - 1) & (step == pl.num_programs(4) - 1))
    def _():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _dq_kernel(*refs, cfg):
    if cfg["has_segments"]:
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kvseg_ref) = refs[:8]
        dq_ref, dq_acc = refs[8:]
    else:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
        dq_ref, dq_acc = refs[6:]
        qseg_ref = kvseg_ref = None
    band = cfg["band"]
    qi, step = pl.program_id(2), pl.program_id(3)
    kj = band.kv_tile(qi, step)

    @pl.when(step == 0)
    def _():
        dq_acc[...] = jnp.zeros(dq_acc.shape, jnp.float32)

    @pl.when(band.kv_run(qi, kj))
    def _():
        k = k_ref[...]
        _, ds = _probs_and_dscores(
            q_ref[...], k, v_ref[...], do_ref[...], lse_ref[...], delta_ref[...], qi, kj,
            qseg_ref, kvseg_ref, cfg=cfg,
        )  # fmt: skip
        dq_acc[...] += jax.lax.dot_general(
            ds.astype(k.dtype), k, _DIMS_N, preferred_element_type=jnp.float32
        )

    @pl.when(step == pl.num_programs(3) - 1)
    def _():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)


def flash_attention_bwd_kernel(
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
    block_sizes: BlockSizes,
    interpret,
    window: int | None = None,
    softcap: float | None = None,
):
    """Gradients wrt q, k, v on the heads-major, padded layout of ``kernel.py``.

    Args:
      q_bnth: [B, N, Tp, H]; k_bkth, v_bkth: [B, K, Tp, H].
      segment_ids: [B, Tp] int32 or None.
      out_bnth, lse_bnt1: the forward's output and log-sum-exp [B, N, Tp, 1].
      dout_bnth: the output cotangent [B, N, Tp, H].
      causal, sm_scale, kv_len, window, softcap: as in the forward.
      block_sizes: block_q (query tiles) and block_kv_bwd (key tiles) must divide Tp.
      interpret: ``pallas_call``'s interpret argument.

    Returns:
      (dq, dk, dv) in the dtypes of q, k, v.
    """
    tp = q_bnth.shape[2]
    bq, bk = block_sizes.block_q, block_sizes.block_kv_bwd
    check_lane_tile("block_kv_bwd", bk, tp, interpret)
    delta = jnp.sum(
        dout_bnth.astype(jnp.float32) * out_bnth.astype(jnp.float32), axis=-1, keepdims=True
    )
    dout = dout_bnth.astype(q_bnth.dtype)
    cfg = dict(
        scale=sm_scale, bq=bq, bk=bk, kv_len=kv_len, causal=causal,
        has_segments=segment_ids is not None, window=window, softcap=softcap,
        band=TileBand(block_q=bq, block_kv=bk, padded_len=tp, causal=causal, window=window),
    )  # fmt: skip
    args = [q_bnth, k_bkth, v_bkth, dout, lse_bnt1, delta, *segment_args(segment_ids, tp)]
    dk, dv = _dkv_call(args, cfg=cfg, interpret=interpret)
    dq = _dq_call(args, cfg=cfg, interpret=interpret)
    return dq, dk, dv


def _block_specs(q_index, kv_index, *, head_dim: int, cfg):
    """BlockSpecs for the kernels' inputs, given index maps returning (b, q_head, q_tile) and
    (b, kv_head, kv_tile); also the kv-tile and query-row specs, for the outputs."""
    bq, bk = cfg["bq"], cfg["bk"]
    q_tile = lambda *ix: (*q_index(*ix), 0)
    kv_tile = lambda *ix: (*kv_index(*ix), 0)
    row = pl.BlockSpec((None, None, bq, head_dim), q_tile)
    stat = pl.BlockSpec((None, None, bq, 1), q_tile)
    kv = pl.BlockSpec((None, None, bk, head_dim), kv_tile)
    out = [row, kv, kv, row, stat, stat]
    if cfg["has_segments"]:
        qi_of = lambda *ix: q_index(*ix)[2]
        kj_of = lambda *ix: kv_index(*ix)[2]
        out += segment_specs(bq, bk, qi_of=qi_of, kj_of=kj_of)
    return out, kv, row


def _dkv_call(args, *, cfg, interpret):
    """dK and dV: grid (B, K, kv tile, G, q tile)."""
    q_bnth, k_bkth, v_bkth = args[:3]
    b, n, tp, h = q_bnth.shape
    kv_heads = k_bkth.shape[1]
    group = n // kv_heads
    band = cfg["band"]

    def q_index(bi, ki, kj, g, step):
        qi = band.q_fetch(kj, band.q_tile(kj, step))
        return bi, ki * group + g, qi

    kv_index = lambda bi, ki, kj, g, step: (bi, ki, kj)
    in_specs, kv_spec, _ = _block_specs(q_index, kv_index, head_dim=h, cfg=cfg)
    return pl.pallas_call(
        functools.partial(_dkv_kernel, cfg=cfg),
        grid=(b, kv_heads, band.kv_tiles, group, band.q_steps()),
        in_specs=in_specs,
        out_specs=[kv_spec, kv_spec],
        out_shape=[
            jax.ShapeDtypeStruct(k_bkth.shape, k_bkth.dtype),
            jax.ShapeDtypeStruct(v_bkth.shape, v_bkth.dtype),
        ],
        scratch_shapes=[pltpu.VMEM((band.block_kv, h), jnp.float32) for _ in ("dk", "dv")],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")
        ),
        interpret=interpret,
        name="rljax_flash_attention_dkv",
    )(*args)


def _dq_call(args, *, cfg, interpret):
    """dQ: grid (B, N, q tile, kv tile), the forward's iteration order."""
    q_bnth, k_bkth = args[:2]
    b, n, tp, h = q_bnth.shape
    group = n // k_bkth.shape[1]
    band = cfg["band"]

    def kv_index(bi, ni, qi, step):
        kj = band.kv_fetch(qi, band.kv_tile(qi, step))
        return bi, jax.lax.div(ni, jnp.int32(group)), kj

    q_index = lambda bi, ni, qi, step: (bi, ni, qi)
    in_specs, _, row_spec = _block_specs(q_index, kv_index, head_dim=h, cfg=cfg)
    return pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid=(b, n, band.q_tiles, band.kv_steps()),
        in_specs=in_specs,
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct(q_bnth.shape, q_bnth.dtype),
        scratch_shapes=[pltpu.VMEM((band.block_q, h), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
        name="rljax_flash_attention_dq",
    )(*args)
