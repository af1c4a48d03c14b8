"""Pallas TPU kernel: fused unembedding matmul + online logsumexp, log-prob and entropy.

Grid (T / block_t, cdiv(V, block_v)); the vocabulary axis is the reduction. Each step
multiplies a [block_t, D] hidden tile by a [D, block_v] unembedding tile into an f32 logit
tile that lives only in VMEM, and folds it into four running [block_t, 1] statistics (max,
sum of exp, sum of exp * logit, target logit; see ``chunked.py`` for the algebra). With a
soft cap c the tile becomes c * tanh(tile / c) before the temperature divides it. A ragged
last vocabulary tile is masked by column index. Outputs per token: log p(target), entropy
and the logsumexp that the backward reuses.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.fused_logprobs.block_sizes import BlockSizes

_LANES = 128


def _kernel(
    targets_ref,  # [block_t, 1] int32
    hidden_ref,  # [block_t, D]
    unembed_ref,  # [D, block_v]
    logp_ref,  # [block_t, 1] f32 out
    ent_ref,  # [block_t, 1] f32 out
    lse_ref,  # [block_t, 1] f32 out
    m_sc,
    l_sc,
    s_sc,
    tgt_sc,
    *,
    inv_temperature: float,
    softcap: float | None,
    vocab: int,
    block_v: int,
):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        s_sc[...] = jnp.zeros(s_sc.shape, jnp.float32)
        tgt_sc[...] = jnp.zeros(tgt_sc.shape, jnp.float32)

    z = jax.lax.dot_general(
        hidden_ref[...],
        unembed_ref[...],
        (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
    )
    if softcap is not None:
        z = softcap * jnp.tanh(z * (1.0 / softcap))
    z = z * inv_temperature
    cols = j * block_v + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    if vocab % block_v:
        # The last tile reads past V; those columns hold padding, possibly NaN.
        valid = cols < vocab
        z_max = jnp.where(valid, z, -jnp.inf)
    else:
        valid = None
        z_max = z
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, z_max.max(axis=-1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    e = jnp.exp(z_max - m_new)
    ez = e * z if valid is None else jnp.where(valid, e * z, 0.0)
    l_sc[...] = alpha * l_sc[...] + e.sum(axis=-1, keepdims=True)
    s_sc[...] = alpha * s_sc[...] + ez.sum(axis=-1, keepdims=True)
    hit = cols == targets_ref[...]
    tgt_sc[...] += jnp.sum(jnp.where(hit, z, 0.0), axis=-1, keepdims=True)
    m_sc[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        row_sum = l_sc[...]
        lse = m_sc[...] + jnp.log(row_sum)
        lse_ref[...] = lse
        logp_ref[...] = tgt_sc[...] - lse
        ent_ref[...] = lse - s_sc[...] / row_sum


def token_logprobs_kernel(
    hidden,
    unembed,
    targets,
    *,
    temperature: float,
    block_sizes: BlockSizes,
    interpret,
    softcap: float | None = None,
):
    """Runs the forward kernel.

    Args:
      hidden: [Tp, D], Tp a multiple of block_sizes.block_t.
      unembed: [D, V]; V need not divide by block_v.
      targets: [Tp] int32.
      temperature: logits divisor, applied after the cap.
      block_sizes: tile sizes (block_t divides Tp).
      interpret: ``pallas_call``'s interpret argument.
      softcap: None, or c > 0: logits become c * tanh(hidden @ unembed / c) / temperature.

    Returns:
      (logprobs [Tp], entropy [Tp], lse [Tp]), all f32.
    """
    tokens, d = hidden.shape
    vocab = unembed.shape[1]
    bt, bv = block_sizes.block_t, block_sizes.block_v
    if not interpret and bv % _LANES and bv != vocab:
        raise ValueError(
            f"BlockSizes.block_v={bv} does not tile a vocabulary of {vocab} for TPU: vocabulary "
            f"tiles must be a multiple of {_LANES} lanes or the whole vocabulary; fit them with "
            "BlockSizes.for_shape."
        )
    kernel = functools.partial(
        _kernel, inv_temperature=1.0 / temperature, softcap=softcap, vocab=vocab, block_v=bv
    )
    row_spec = pl.BlockSpec((bt, 1), lambda i, j: (i, 0))
    stat = jax.ShapeDtypeStruct((tokens, 1), jnp.float32)
    logp, ent, lse = pl.pallas_call(
        kernel,
        grid=(tokens // bt, pl.cdiv(vocab, bv)),
        in_specs=[
            row_spec,
            pl.BlockSpec((bt, d), lambda i, j: (i, 0)),
            pl.BlockSpec((d, bv), lambda i, j: (0, j)),
        ],
        out_specs=[row_spec, row_spec, row_spec],
        out_shape=[stat, stat, stat],
        scratch_shapes=[pltpu.VMEM((bt, 1), jnp.float32) for _ in range(4)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
        name="rljax_token_logprobs",
    )(targets.astype(jnp.int32).reshape(tokens, 1), hidden, unembed)
    return logp[:, 0], ent[:, 0], lse[:, 0]
