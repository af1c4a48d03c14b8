"""Token sampling with per-slot settings, returning the log-prob of what was sampled.

The recorded log-prob is that of the distribution actually sampled from:
``log_softmax(filter(logits / temperature))[token]``, where the filter is top-k, then top-p,
then min-p, each masking tokens to -inf. The learner recomputes ``log_softmax(logits / tau)``
with the same temperature tau, so with no filter active its log-probs equal the sampler's up to
float error; with a filter, the sampler's log-prob is the renormalised one (off-policy by the
filtered mass, which the decoupled/truncated-IS losses account for).

Greedy decoding (temperature 0) records ``log_softmax(logits)[argmax]``, the log-prob under the
unscaled policy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def filter_logits(
    scaled_bv: jax.Array, top_k_b: jax.Array, top_p_b: jax.Array, min_p_b: jax.Array
) -> jax.Array:
    """Mask logits outside top-k / top-p / min-p to -inf, per row; 0 / 1.0 / 0.0 disable."""
    v = scaled_bv.shape[-1]
    sorted_desc = -jnp.sort(-scaled_bv, axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    rank = jnp.arange(v)[None, :]
    keep = jnp.where(top_k_b[:, None] > 0, rank < top_k_b[:, None], True)
    # Nucleus: keep a token while the mass strictly before it is below p (the first always).
    # p = 1 keeps every token, even where the float cumsum reaches 1 before the tail.
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep &= (mass_before < top_p_b[:, None]) | (top_p_b[:, None] >= 1.0)
    keep &= probs >= min_p_b[:, None] * probs[:, :1]
    # The smallest kept logit is the row's threshold; ties at the threshold are kept too.
    threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled_bv >= threshold, scaled_bv, NEG_INF)


def sample(
    logits_bv: jax.Array,
    keys_b: jax.Array,
    temperature_b: jax.Array,
    top_k_b: jax.Array,
    top_p_b: jax.Array,
    min_p_b: jax.Array,
    *,
    use_filters: bool | jax.Array = True,
) -> tuple[jax.Array, jax.Array]:
    """One token per row and its log-prob.

    ``use_filters`` gates the filters, whose sort is costly: a Python bool decides at trace
    time; a traced scalar bool decides on the device (``lax.cond``), so one compiled step
    serves batches with and without filtered rows. A row whose settings are all disabled is
    unchanged by the filters either way.
    """
    logits_bv = logits_bv.astype(jnp.float32)
    greedy_b = temperature_b <= 0.0
    safe_t = jnp.where(greedy_b, 1.0, temperature_b)[:, None]
    scaled = logits_bv / safe_t
    if isinstance(use_filters, bool):
        if use_filters:
            scaled = filter_logits(scaled, top_k_b, top_p_b, min_p_b)
    else:
        scaled = jax.lax.cond(
            use_filters,
            lambda x: filter_logits(x, top_k_b, top_p_b, min_p_b),
            lambda x: x,
            scaled,
        )
    logp = jax.nn.log_softmax(scaled, axis=-1)
    argmax = jnp.argmax(logits_bv, axis=-1)
    # A batch of greedy rows (evaluation) skips the Gumbel noise: [rows, V] random bits a step.
    drawn = jax.lax.cond(
        jnp.all(greedy_b),
        lambda: argmax,
        lambda: jax.vmap(jax.random.categorical)(keys_b, scaled),
    )
    tokens = jnp.where(greedy_b, argmax, drawn).astype(jnp.int32)
    greedy_logp = jnp.take_along_axis(jax.nn.log_softmax(logits_bv, -1), argmax[:, None], -1)
    token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=-1)
    return tokens, jnp.where(greedy_b, greedy_logp[:, 0], token_logp[:, 0])
