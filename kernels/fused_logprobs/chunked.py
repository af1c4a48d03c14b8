"""Vocabulary-chunked log-probs and entropy in jnp: the ``'xla'`` forward and the backward of
both paths.

Forward: an online logsumexp over [T, block_v] logit chunks carries four [T] statistics:
running max m, sum l = sum exp(z - m), s = sum exp(z - m) * z, and the target logit. Then

    lse = m + log l,   log p(target) = z_target - lse,   entropy = lse - s / l.

Backward: chunk by chunk, logits are recomputed and, with p = exp(z - lse) and H the entropy,

    dz = g_logp * (onehot(target) - p) - g_ent * p * (z - lse + H),
    d_hidden += dz @ W_c^T / temperature,   d_unembed[:, c] = hidden^T @ dz / temperature.

With a soft cap c (Gemma 2's final-logit soft-capping) the logits are
z = c * tanh(hidden @ W / c) / temperature, and dz also carries the cap's slope
1 - tanh(hidden @ W / c)^2 (the derivative of c * tanh(x / c)).

Chunks are sliced with ``dynamic_slice`` inside a ``fori_loop``, so neither the logits nor a
reshaped copy of the unembedding is ever materialised; a ragged last chunk is a static slice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_F32 = jnp.float32


def _logits(hidden, unembed_chunk, temperature, softcap):
    """(logits z, tanh(hidden @ W / c) or None without a cap) of one vocabulary chunk."""
    raw = jnp.dot(hidden, unembed_chunk, preferred_element_type=_F32)
    if softcap is None:
        return raw / temperature, None
    tanh = jnp.tanh(raw / softcap)
    return softcap * tanh / temperature, tanh


def _chunks(vocab: int, block_v: int):
    """(chunk width, number of full chunks, width of the ragged tail chunk or 0)."""
    # A chunk wider than the vocabulary would not even trace inside the loop body.
    block_v = min(block_v, vocab)
    return block_v, vocab // block_v, vocab % block_v


def logprob_stats_chunked(
    hidden, unembed, targets, *, temperature: float, softcap: float | None, block_v: int
):
    """Forward statistics without materialising logits.

    Args:
      hidden: [T, D]; unembed: [D, V]; targets: [T] int32.
      temperature: logits divisor, applied after the cap.
      softcap: None, or c > 0 capping the logits at c * tanh(hidden @ W / c).
      block_v: vocabulary chunk width.

    Returns:
      (logprobs [T], entropy [T], lse [T]), all f32.
    """
    tokens = hidden.shape[0]
    vocab = unembed.shape[1]
    block_v, num_full, tail = _chunks(vocab, block_v)
    targets = targets.astype(jnp.int32)

    def update(state, z, col0):
        m, row_sum, s, tgt = state
        m_new = jnp.maximum(m, z.max(axis=-1))
        alpha = jnp.exp(m - m_new)
        e = jnp.exp(z - m_new[:, None])
        cols = col0 + jnp.arange(z.shape[1])[None, :]
        hit = jnp.sum(jnp.where(cols == targets[:, None], z, 0.0), axis=-1)
        return (
            m_new,
            alpha * row_sum + e.sum(axis=-1),
            alpha * s + (e * z).sum(axis=-1),
            tgt + hit,
        )

    def body(j, state):
        chunk = jax.lax.dynamic_slice_in_dim(unembed, j * block_v, block_v, axis=1)
        return update(state, _logits(hidden, chunk, temperature, softcap)[0], j * block_v)

    zeros = jnp.zeros((tokens,), _F32)
    state = (jnp.full((tokens,), -jnp.inf, _F32), zeros, zeros, zeros)
    if num_full:  # a vocabulary narrower than one chunk is all tail
        state = jax.lax.fori_loop(0, num_full, body, state)
    if tail:
        col0 = num_full * block_v
        state = update(state, _logits(hidden, unembed[:, col0:], temperature, softcap)[0], col0)
    m, row_sum, s, tgt = state
    lse = m + jnp.log(row_sum)
    return tgt - lse, lse - s / row_sum, lse


def logprob_grads_chunked(
    hidden,
    unembed,
    targets,
    lse,
    entropy,
    g_logp,
    g_ent,
    *,
    temperature: float,
    softcap: float | None,
    block_v: int,
):
    """Gradients of (logprobs, entropy) wrt hidden and unembed, chunked over the vocabulary.

    Args:
      hidden: [T, D]; unembed: [D, V]; targets: [T] int32.
      lse, entropy: [T] f32 from the forward.
      g_logp, g_ent: [T] cotangents of logprobs and entropy.
      temperature: logits divisor, applied after the cap.
      softcap: None, or the forward's cap c; its slope 1 - tanh^2 enters dz.
      block_v: vocabulary chunk width.

    Returns:
      (d_hidden [T, D] in hidden's dtype, d_unembed [D, V] in unembed's dtype).
    """
    vocab = unembed.shape[1]
    block_v, num_full, tail = _chunks(vocab, block_v)
    targets = targets.astype(jnp.int32)
    g_logp = g_logp.astype(_F32)[:, None]
    g_ent = g_ent.astype(_F32)[:, None]
    lse_c = lse[:, None]
    shift = entropy[:, None] - lse_c  # z - lse + H = z + shift

    def dlogits(chunk, col0):
        z, tanh = _logits(hidden, chunk, temperature, softcap)
        p = jnp.exp(z - lse_c)
        cols = col0 + jnp.arange(z.shape[1])[None, :]
        onehot = (cols == targets[:, None]).astype(_F32)
        dz = g_logp * (onehot - p) - g_ent * p * (z + shift)
        dz = dz / temperature
        return dz if tanh is None else dz * (1.0 - tanh * tanh)

    def grads(chunk, col0):
        dz = dlogits(chunk, col0)
        d_hidden = jnp.dot(dz, chunk.T, preferred_element_type=_F32)
        d_chunk = jnp.dot(hidden.T, dz, preferred_element_type=_F32)
        return d_hidden, d_chunk

    def body(j, carry):
        d_hidden, d_unembed = carry
        col0 = j * block_v
        chunk = jax.lax.dynamic_slice_in_dim(unembed, col0, block_v, axis=1)
        dh, dw = grads(chunk, col0)
        d_unembed = jax.lax.dynamic_update_slice_in_dim(
            d_unembed, dw.astype(d_unembed.dtype), col0, axis=1
        )
        return d_hidden + dh, d_unembed

    carry = (jnp.zeros(hidden.shape, _F32), jnp.zeros(unembed.shape, unembed.dtype))
    d_hidden, d_unembed = jax.lax.fori_loop(0, num_full, body, carry) if num_full else carry
    if tail:
        col0 = num_full * block_v
        dh, dw = grads(unembed[:, col0:], col0)
        d_hidden = d_hidden + dh
        d_unembed = d_unembed.at[:, col0:].set(dw.astype(d_unembed.dtype))
    return d_hidden.astype(hidden.dtype), d_unembed
