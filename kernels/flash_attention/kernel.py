"""Pallas TPU kernel: flash attention forward with GQA, causal, window and segment masks.

Layout: heads-major, q [B, N, T, H] and k, v [B, K, T, H], so every tile's last two dims are
(sequence, head_dim) as TPU tiling wants. Grid (B, N, T/block_q, T/block_kv), or with a
window (B, N, T/block_q, the widest band's key tiles); the last axis is the reduction, carried
in VMEM scratch (running max m, running sum l, accumulator acc).
Query head n reads kv head n // G straight from the index map: K/V are never repeated.

Causal tiles wholly above the diagonal are skipped twice over: compute is guarded by
``pl.when``, and the K/V index map clamps to the last needed tile, so the pipeline sees an
unchanged block index and issues no DMA for them. With a sliding window the last grid axis
walks only the band of key tiles the window reaches (``band.py``): tiles wholly before it
are not grid steps at all. Scores are soft-capped (``softcap * tanh(s / softcap)``) before
the masks, as in Gemma 2.

Segment ids arrive pre-broadcast as [B, T, 128] (queries, lane-broadcast) and [B, 8, T] (keys,
sublane-broadcast), the layouts TPU tiling accepts for a per-row and a per-column vector.

Besides the output, the kernel writes the row log-sum-exp [B, N, T, 1] that the backward
needs to recompute probabilities without a second softmax pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.flash_attention.band import TileBand
from rljax.kernels.flash_attention.block_sizes import BlockSizes

# Finite, so a row whose tiles so far are all masked gets exp(0) garbage that the first
# unmasked tile wipes (alpha = 0), instead of NaN from -inf - -inf.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_LANES = 128
_SUBLANES = 8


def check_lane_tile(name: str, block: int, padded_len: int, interpret) -> None:
    """Raises a one-line ValueError if a key tile would not lower for TPU.

    Key tiles sit on the lanes (the [8, block] segment-id tile, the [block_q, block] scores),
    so Mosaic needs a multiple of 128 or the whole padded sequence. Interpret mode has no
    such rule, and the tests use small tiles there to get many tiles on short sequences.
    """
    if not interpret and block % _LANES and block != padded_len:
        raise ValueError(
            f"BlockSizes.{name}={block} does not tile a {padded_len}-row sequence for TPU: key "
            f"tiles must be a multiple of {_LANES} or the whole sequence; fit them with "
            "BlockSizes.for_seq_len."
        )


def _init_scratch(m_sc, l_sc, acc_sc) -> None:
    """Empty running statistics before a query tile's first kv tile."""
    m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)


def soft_cap_and_tanh(s, softcap):
    """``softcap * tanh(s / softcap)`` and the tanh (for the backward's slope), or (s, None)."""
    if softcap is None:
        return s, None
    tanh = jnp.tanh(s * (1.0 / softcap))
    return softcap * tanh, tanh


def _masked_scores(q, k, qi, kj, qseg_ref, kvseg_ref, *, cfg):
    """Scaled, soft-capped scores of one [block_q, block_kv] tile, MASK_VALUE where a query
    may not look: above the diagonal (causal), outside the window, at padded keys, across
    segments."""
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s, _ = soft_cap_and_tanh(s * cfg["sm_scale"], cfg["softcap"])
    mask = None
    col = kj * cfg["block_kv"] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    if cfg["causal"]:
        row = qi * cfg["block_q"] + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        mask = col <= row
        if cfg["window"] is not None:
            mask = mask & (row - col < cfg["window"])
    if cfg["kv_len"] < cfg["padded_len"]:
        in_range = col < cfg["kv_len"]
        mask = in_range if mask is None else mask & in_range
    if qseg_ref is not None:
        same = qseg_ref[:, :1] == kvseg_ref[:1, :]
        mask = same if mask is None else mask & same
    if mask is not None:
        s = jnp.where(mask, s, MASK_VALUE)
    return s


def _online_softmax_update(s, v_ref, m_sc, l_sc, acc_sc) -> None:
    """Folds one tile's scores into the running max, sum and accumulator (rescaled by
    alpha = exp(m_prev - m_new))."""
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + p.sum(axis=-1, keepdims=True)
    v = v_ref[...]
    pv = jax.lax.dot_general(
        p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )
    acc_sc[...] = alpha * acc_sc[...] + pv
    m_sc[...] = m_new


def _finalise(o_ref, lse_ref, m_sc, l_sc, acc_sc) -> None:
    """Writes the normalised output and the row log-sum-exp after the last kv tile."""
    row_sum = l_sc[...]
    o_ref[...] = (acc_sc[...] / row_sum).astype(o_ref.dtype)
    lse_ref[...] = m_sc[...] + jnp.log(row_sum)


def _kernel(*refs, cfg):
    if cfg["has_segments"]:
        q_ref, k_ref, v_ref, qseg_ref, kvseg_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
        qseg_ref = kvseg_ref = None
    band = cfg["band"]
    qi = pl.program_id(2)
    step = pl.program_id(3)
    kj = band.kv_tile(qi, step)
    num_steps = pl.num_programs(3)

    @pl.when(step == 0)
    def _():
        _init_scratch(m_sc, l_sc, acc_sc)

    @pl.when(band.kv_run(qi, kj))
    def _():
        s = _masked_scores(q_ref[...], k_ref[...], qi, kj, qseg_ref, kvseg_ref, cfg=cfg)
        _online_softmax_update(s, v_ref, m_sc, l_sc, acc_sc)

    @pl.when(step == num_steps - 1)
    def _():
        _finalise(o_ref, lse_ref, m_sc, l_sc, acc_sc)


def segment_args(segment_ids, padded_len: int) -> list:
    """A kernel's segment-id inputs: query ids lane-broadcast to [B, Tp, 128], key ids
    sublane-broadcast to [B, 8, Tp] (the layouts TPU tiling accepts for a per-row and a
    per-column vector); [] without segments."""
    if segment_ids is None:
        return []
    b = segment_ids.shape[0]
    seg = segment_ids.astype(jnp.int32)
    return [
        jnp.broadcast_to(seg[:, :, None], (b, padded_len, _LANES)),
        jnp.broadcast_to(seg[:, None, :], (b, _SUBLANES, padded_len)),
    ]


def segment_specs(block_q: int, block_kv: int, *, qi_of, kj_of) -> list:
    """The BlockSpecs of :func:`segment_args`, on a grid whose first index is the batch;
    ``qi_of(*grid_index)`` and ``kj_of(*grid_index)`` give the query and key tiles."""
    return [
        pl.BlockSpec((None, block_q, _LANES), lambda *ix: (ix[0], qi_of(*ix), 0)),
        pl.BlockSpec((None, _SUBLANES, block_kv), lambda *ix: (ix[0], 0, kj_of(*ix))),
    ]


def flash_attention_fwd_kernel(
    q_bnth,
    k_bkth,
    v_bkth,
    segment_ids,
    *,
    causal: bool,
    sm_scale: float,
    kv_len: int,
    block_sizes: BlockSizes,
    interpret,
    window: int | None = None,
    softcap: float | None = None,
):
    """Runs the forward kernel on heads-major, padded inputs.

    Args:
      q_bnth: [B, N, Tp, H], Tp a multiple of both block sizes.
      k_bkth, v_bkth: [B, K, Tp, H].
      segment_ids: [B, Tp] int32 or None.
      causal: causal mask.
      sm_scale: softmax scale.
      kv_len: the unpadded length T; keys at or past it are masked out.
      block_sizes: tile sizes dividing Tp.
      interpret: ``pallas_call``'s interpret argument.
      window: None, or W >= 1 (with ``causal``): a query sees only the W keys ending at it.
      softcap: None, or c > 0: scores become c * tanh(scores / c) before the masks.

    Returns:
      (out [B, N, Tp, H] in q's dtype, lse [B, N, Tp, 1] f32).
    """
    b, n, tp, h = q_bnth.shape
    group = n // k_bkth.shape[1]
    bq, bk = block_sizes.block_q, block_sizes.block_kv
    check_lane_tile("block_kv", bk, tp, interpret)
    band = TileBand(block_q=bq, block_kv=bk, padded_len=tp, causal=causal, window=window)

    def kv_index(bi, ni, qi, step):
        kj = band.kv_fetch(qi, band.kv_tile(qi, step))
        return (bi, jax.lax.div(ni, jnp.int32(group)), kj, 0)

    q_spec = pl.BlockSpec((None, None, bq, h), lambda bi, ni, qi, step: (bi, ni, qi, 0))
    kv_spec = pl.BlockSpec((None, None, bk, h), kv_index)
    in_specs = [q_spec, kv_spec, kv_spec]
    if segment_ids is not None:
        in_specs += segment_specs(
            bq, bk, qi_of=lambda *ix: ix[2], kj_of=lambda *ix: kv_index(*ix)[2]
        )
    cfg = dict(
        sm_scale=sm_scale, causal=causal, has_segments=segment_ids is not None, kv_len=kv_len,
        padded_len=tp, block_q=bq, block_kv=bk, window=window, softcap=softcap, band=band,
    )  # fmt: skip
    return pl.pallas_call(
        functools.partial(_kernel, cfg=cfg),
        grid=(b, n, tp // bq, band.kv_steps()),
        in_specs=in_specs,
        out_specs=[
            q_spec,
            pl.BlockSpec((None, None, bq, 1), lambda bi, ni, qi, step: (bi, ni, qi, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct(q_bnth.shape, q_bnth.dtype),
            jax.ShapeDtypeStruct((b, n, tp, 1), jnp.float32),
        ],
        scratch_shapes=[
            pltpu.VMEM((bq, 1), jnp.float32),
            pltpu.VMEM((bq, 1), jnp.float32),
            pltpu.VMEM((bq, h), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
        name="rljax_flash_attention_fwd",
    )(q_bnth, k_bkth, v_bkth, *segment_args(segment_ids, tp))
