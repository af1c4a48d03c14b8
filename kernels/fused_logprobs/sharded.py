"""``token_logprobs_and_entropy`` under shard_map: tokens over batch axes, optionally the
vocabulary over a model axis (vocab-parallel unembedding).

Vocab-parallel combine. Each device holds unembed[:, shard] and computes, over its own
columns, a local log-sum-exp lse_i, a local entropy H_i and (if the target falls in its
shard) the target logit. With E_i[z] = lse_i - H_i the local mean logit:

    lse = log sum_i exp(lse_i)                     (pmax + psum, numerically stable)
    E[z] = sum_i exp(lse_i - lse) * E_i[z]         (psum)
    entropy = lse - E[z],   log p(target) = psum(z_target) - lse.

The combine reads only the final (capped, tempered) logits' statistics, so a soft cap changes
nothing here: each device's forward and backward apply it to their own columns.

The backward needs no new algebra: with the global lse and entropy, each device's chunked
backward gives its exact slice of d_unembed and a partial d_hidden over its columns, which
shard_map's transpose sums over the vocabulary axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from rljax.kernels import sharding
from rljax.kernels.fused_logprobs import ops
from rljax.kernels.fused_logprobs.chunked import logprob_grads_chunked


def _local_targets(targets, vocab_local, vocab_axis):
    """Targets shifted into this shard's column range; -1 (matches no column) elsewhere."""
    offset = jax.lax.axis_index(vocab_axis) * vocab_local
    local = targets.astype(jnp.int32) - offset
    return jnp.where((local >= 0) & (local < vocab_local), local, -1)


def _combine(logp_i, ent_i, lse_i, local_targets, vocab_axis):
    hit_logit = jnp.where(local_targets >= 0, logp_i + lse_i, 0.0)
    m = jax.lax.pmax(lse_i, vocab_axis)
    weight = jnp.exp(lse_i - m)
    total = jax.lax.psum(weight, vocab_axis)
    lse = m + jnp.log(total)
    mean_logit = jax.lax.psum(weight * (lse_i - ent_i), vocab_axis) / total
    return jax.lax.psum(hit_logit, vocab_axis) - lse, lse - mean_logit, lse


@functools.partial(
    jax.custom_vjp,
    nondiff_argnames=(
        "vocab_axis",
        "temperature",
        "softcap",
        "block_sizes",
        "use_pallas",
        "interpret",
    ),
)
def _vocab_parallel(
    hidden, unembed, targets, vocab_axis, temperature, softcap, block_sizes, use_pallas, interpret
):
    out, _ = _vocab_parallel_fwd(
        hidden,
        unembed,
        targets,
        vocab_axis,
        temperature,
        softcap,
        block_sizes,
        use_pallas,
        interpret,
    )
    return out


def _vocab_parallel_fwd(
    hidden, unembed, targets, vocab_axis, temperature, softcap, block_sizes, use_pallas, interpret
):
    local_targets = _local_targets(targets, unembed.shape[1], vocab_axis)
    logp_i, ent_i, lse_i = ops.forward_stats(
        hidden, unembed, local_targets, temperature, softcap, block_sizes, use_pallas, interpret
    )
    logp, ent, lse = _combine(logp_i, ent_i, lse_i, local_targets, vocab_axis)
    return (logp, ent), (hidden, unembed, local_targets, lse, ent)


def _vocab_parallel_bwd(
    vocab_axis, temperature, softcap, block_sizes, use_pallas, interpret, residuals, cotangents
):
    del use_pallas, interpret  # The chunked jnp backward serves both forwards.
    hidden, unembed, local_targets, lse, ent = residuals
    # The outputs are replicated over vocab_axis, and shard_map (check_vma=False) hands each
    # replica 1/n of their cotangent; summing restores the full cotangent on every device.
    g_logp, g_ent = (jax.lax.psum(g, vocab_axis) for g in cotangents)
    d_hidden, d_unembed = logprob_grads_chunked(
        hidden,
        unembed,
        local_targets,
        lse,
        ent,
        g_logp,
        g_ent,
        temperature=temperature,
        softcap=softcap,
        block_v=block_sizes.block_v,
    )
    # d_hidden is this shard's partial sum over its columns. hidden is unmapped over vocab_axis,
    # so shard_map's transpose psums it over that axis; a psum here would double count.
    return d_hidden, d_unembed, None


_vocab_parallel.defvjp(_vocab_parallel_fwd, _vocab_parallel_bwd)


def sharded_token_logprobs_and_entropy(
    mesh, batch_axes, hidden, unembed, targets, *, vocab_axis=None, **kwargs
):
    """``token_logprobs_and_entropy`` under ``shard_map``.

    Tokens are split over ``batch_axes``. With ``vocab_axis`` None the unembedding is
    replicated and no collectives run; its gradient is summed over the token shards by
    shard_map's transpose. With ``vocab_axis`` set, unembed [D, V] is split by columns over
    that axis: each device scores only its columns and three small [T_local] collectives
    (pmax, 3 psums) combine the statistics, so no device holds the whole unembedding.

    Args:
      mesh: the ``jax.sharding.Mesh``.
      batch_axes: mesh axis name (or tuple of names, or None) sharding T.
      hidden, unembed, targets: as in ``token_logprobs_and_entropy``.
      vocab_axis: mesh axis name sharding V, or None.
      **kwargs: ``temperature``, ``softcap``, ``impl``, ``block_sizes``.

    Returns:
      (logprobs [T], entropy [T]), sharded over ``batch_axes``; differentiable.
    """
    ops.validate(hidden, unembed, targets)
    sharding.check_axes(mesh, batch_axes=batch_axes, vocab_axis=vocab_axis)
    sharding.check_divides("hidden's T", hidden.shape[0], mesh, batch_axes, "pad the token batch")
    sharding.check_divides("unembed's V", unembed.shape[1], mesh, vocab_axis, "pad the vocabulary")
    shards = sharding.axis_size(mesh, batch_axes)
    vocab_shards = sharding.axis_size(mesh, vocab_axis)
    options = ops.resolve_options(
        hidden.shape[0] // shards,
        unembed.shape[1] // vocab_shards,
        kwargs.pop("temperature", 1.0),
        kwargs.pop("impl", "auto"),
        kwargs.pop("block_sizes", None),
        kwargs.pop("softcap", None),
    )
    if kwargs:
        raise ValueError(f"unexpected keyword arguments {sorted(kwargs)}; see the docstring.")
    if vocab_axis is None:
        fn = lambda h, w, t: ops.token_logprobs_and_entropy_core(h, w, t, **options)
    else:
        fn = lambda h, w, t: _vocab_parallel(h, w, t, vocab_axis=vocab_axis, **options)
    row = P(batch_axes)
    in_specs = (P(batch_axes, None), P(None, vocab_axis), row)
    return sharding.run_sharded(fn, mesh, in_specs, (row, row), (hidden, unembed, targets))
