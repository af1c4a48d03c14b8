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
unrolled loop of 256 blocks of 16 took minutes to compile). Its backward is written by hand,
flash attention's: each block's probabilities are recomputed from its saved log-sum-exp and its
key and value gradients added into the band, so nothing block-sized is saved (autodiff of the
map saved every block's probabilities and ran the backward 2.6x slower than the forward's rate
per score; scripts/bench_kernels.py --only-window).

Values equal :func:`rljax.kernels.flash_attention.reference.flash_attention_reference` up to
f32 rounding; the masks are applied within each block as there, after the soft-cap.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

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
    q_blocks = jnp.pad(q_rows, ((0, 0), (0, 0), (0, tail * group), (0, 0)))
    q_blocks = jnp.moveaxis(q_blocks.reshape(b, kv_heads, blocks, block * group, h), 2, 0)
    k_band, v_band = (
        jnp.pad(x, ((0, 0), (0, 0), (lead, tail), (0, 0))) for x in (k_heads, v_heads)
    )
    seg_band = None
    if segment_ids is not None:
        seg_band = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (lead, tail)))
    band = _Band(block, lead, group, sm_scale, softcap)
    out = _band_attention(band, q_blocks, k_band, v_band, seg_band)
    out = jnp.moveaxis(out, 0, 2).reshape(b, kv_heads, blocks * block * group, h)
    return out[:, :, : t * group]


class _Band(NamedTuple):
    """The static shape of the windowed path: ``block`` queries a block, ``lead`` = W - 1 keys
    before a block's first query, ``group`` query heads a kv head, the scale and the cap."""

    block: int
    lead: int
    group: int
    sm_scale: float
    softcap: float | None

    @property
    def span(self) -> int:
        return self.block + self.lead

    def keep(self, i, seg_band):
        """Block i's mask, [B or 1, block * G, span]: query r of block i is position
        i * block + r, key c of its band i * block - lead + c; "key <= query and query - key
        < W" is r <= c <= r + lead in every block. No key before position 0; with segments,
        the query's own. A query always keeps its own key (padding past T too: finite)."""
        start = i * self.block
        r = jnp.arange(self.block)[:, None]
        c = jnp.arange(self.span)[None, :]
        mask = ((c >= r) & (c <= r + self.lead) & (start - self.lead + c >= 0))[None]
        if seg_band is not None:
            seg_q = jax.lax.dynamic_slice_in_dim(seg_band, start + self.lead, self.block, axis=1)
            seg_k = jax.lax.dynamic_slice_in_dim(seg_band, start, self.span, axis=1)
            mask = mask & (seg_q[:, :, None] == seg_k[:, None, :])
        return jnp.repeat(mask, self.group, axis=1)[:, None]  # [B or 1, 1, rows, span]

    def keys(self, i, band):
        return jax.lax.dynamic_slice_in_dim(band, i * self.block, self.span, axis=2)

    def scores(self, q_blk, k_blk):
        """(raw scaled scores, capped scores) [B, K, rows, span]."""
        raw = jnp.einsum("bkrh,bksh->bkrs", q_blk, k_blk) * self.sm_scale
        return raw, soft_cap(raw, self.softcap)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _band_attention(band: _Band, q_blocks, k_band, v_band, seg_band):
    """Each block's attention over its band: [blocks, B, K, rows, H]. A hand-written backward
    recomputes each block's probabilities from its saved log-sum-exp, as flash attention's
    does: autodiff of the block map saved every block's probabilities and ran its backward at
    about half the forward's rate per score."""
    return _band_fwd(band, q_blocks, k_band, v_band, seg_band)[0]


def _band_fwd(band, q_blocks, k_band, v_band, seg_band):
    def attend(xs):
        i, q_blk = xs
        _, capped = band.scores(q_blk, band.keys(i, k_band))
        capped = jnp.where(band.keep(i, seg_band), capped, -jnp.inf)
        lse = jax.nn.logsumexp(capped, axis=-1)
        probs = jnp.exp(capped - lse[..., None])
        return jnp.einsum("bkrs,bksh->bkrh", probs, band.keys(i, v_band)), lse

    blocks = q_blocks.shape[0]
    out, lse = jax.lax.map(attend, (jnp.arange(blocks), q_blocks))
    return out, (q_blocks, k_band, v_band, seg_band, out, lse)


def _band_bwd(band, residuals, d_out):
    q_blocks, k_band, v_band, seg_band, out, lse = residuals

    def step(carry, xs):
        dk_band, dv_band = carry
        i, q_blk, o_blk, do_blk, lse_blk = xs
        k_blk, v_blk = band.keys(i, k_band), band.keys(i, v_band)
        raw, capped = band.scores(q_blk, k_blk)
        keep = band.keep(i, seg_band)
        probs = jnp.where(keep, jnp.exp(capped - lse_blk[..., None]), 0.0)
        d_v = jnp.einsum("bkrs,bkrh->bksh", probs, do_blk)
        d_probs = jnp.einsum("bkrh,bksh->bkrs", do_blk, v_blk)
        delta = jnp.sum(do_blk * o_blk, axis=-1, keepdims=True)
        d_scores = probs * (d_probs - delta)
        if band.softcap is not None:  # d/dx c tanh(x / c) = 1 - tanh^2
            d_scores = d_scores * (1.0 - jnp.square(capped / band.softcap))
        d_scores = d_scores * band.sm_scale
        d_q = jnp.einsum("bkrs,bksh->bkrh", d_scores, k_blk)
        d_k = jnp.einsum("bkrs,bkrh->bksh", d_scores, q_blk)
        start = i * band.block
        dk_band = jax.lax.dynamic_update_slice_in_dim(
            dk_band, band.keys(i, dk_band) + d_k, start, axis=2
        )
        dv_band = jax.lax.dynamic_update_slice_in_dim(
            dv_band, band.keys(i, dv_band) + d_v, start, axis=2
        )
        return (dk_band, dv_band), d_q

    blocks = q_blocks.shape[0]
    init = (jnp.zeros_like(k_band), jnp.zeros_like(v_band))
    xs = (jnp.arange(blocks), q_blocks, out, d_out, lse)
    (dk_band, dv_band), d_q = jax.lax.scan(step, init, xs)
    return d_q, dk_band, dv_band, None


_band_attention.defvjp(_band_fwd, _band_bwd)
