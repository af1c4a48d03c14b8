"""Naive full-logits log-probs and entropy: the test oracle and the benchmark baseline.

Materialises the [T, V] logits, so it is never used by the op itself; the op's ``'xla'`` path
is the chunked implementation in ``chunked.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs_and_entropy_reference(
    hidden, unembed, targets, *, temperature=1.0, softcap: float | None = None
):
    """log p(target) and softmax entropy per token, through full [T, V] f32 logits.

    Args:
      hidden: [T, D] final hidden states.
      unembed: [D, V] output projection.
      targets: [T] int32 token ids in [0, V).
      temperature: logits are divided by it, after the cap.
      softcap: None, or c > 0: the logits become c * tanh(logits / c) before the temperature.

    Returns:
      (logprobs [T] f32, entropy [T] f32).
    """
    logits = jnp.dot(hidden, unembed, preferred_element_type=jnp.float32)
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = logits / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    target_logp = jnp.take_along_axis(logp, targets[:, None].astype(jnp.int32), axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return target_logp, entropy
