"""Policy losses, chosen by name from an explicit registry.

Every loss maps per-token inputs to a per-token loss and per-token metrics; the learner weighs
the loss by the batch's ``weights`` (which encode the loss's aggregation, see
:mod:`rljax.learner.batch`) and averages the metrics over response tokens.

Symbols: r = pi_theta / pi_base (the PPO ratio), A the advantage, epsilon_low/high the clip
band (DAPO's clip-higher when high > low), beta the KL weight, C the truncated-IS cap.

Off-policy handling. The learner takes one optimiser step per batch, so the proximal policy of
decoupled PPO (AReaL), the policy the clip is taken against, is the learner's current policy
before the step: ``prox = stop_gradient(logp)`` (``proximal='recompute'``). The behaviour
policy that sampled the tokens enters only through the importance weight
``w = exp(prox - behaviour)``, truncated at C when set. ``proximal='loglinear'`` instead
interpolates prox between the behaviour and current log-probs by policy version (AReaL's
cheap estimate). Plain GRPO with ``truncated_is = C > 0`` uses the same decomposition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from rljax.config import LearnerConfig


@struct.dataclass
class LossInputs:
    """Per-token arrays [R, T]; log-probs are of the target (next) token."""

    logprobs: jax.Array  # current policy, differentiable
    old_logprobs: jax.Array  # behaviour policy (the sampler)
    advantages: jax.Array
    mask: jax.Array  # 1 on trained response tokens
    entropy: jax.Array
    segment_ids: jax.Array  # for sequence-level losses
    versions: jax.Array  # behaviour version of each token
    learner_version: jax.Array  # scalar
    ref_logprobs: jax.Array | None = None


LossFn = Callable[[LossInputs, LearnerConfig], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class Loss:
    """A registered loss: the function and how its per-token values are aggregated."""

    fn: LossFn
    aggregation: str = "token_mean"
    uses_advantages: bool = True


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Schulman's k3 estimator of KL(pi || pi_ref): unbiased, always >= 0."""
    d = ref_logprobs - logprobs
    return jnp.exp(d) - d - 1.0


def _proximal(x: LossInputs, cfg: LearnerConfig) -> jax.Array:
    current = jax.lax.stop_gradient(x.logprobs)
    if cfg.proximal == "recompute":
        return current
    # Log-linear in version between behaviour (v_b) and current (V): prox is version V - 1.
    v_b = x.versions.astype(jnp.float32)
    v = x.learner_version.astype(jnp.float32)
    alpha = jnp.where(v > v_b, (v - 1.0 - v_b) / jnp.maximum(v - v_b, 1.0), 1.0)
    return x.old_logprobs + jnp.clip(alpha, 0.0, 1.0) * (current - x.old_logprobs)


def _clipped_surrogate(ratio, advantages, cfg: LearnerConfig):
    clipped = jnp.clip(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    loss = -jnp.minimum(unclipped_obj, clipped_obj)
    clip_frac = (clipped_obj < unclipped_obj).astype(jnp.float32)
    return loss, clip_frac


def _policy_gradient(x: LossInputs, cfg: LearnerConfig, *, decoupled: bool):
    metrics = {}
    if decoupled or cfg.truncated_is > 0:
        prox = _proximal(x, cfg)
        ratio = jnp.exp(x.logprobs - prox)
        weight = jnp.exp(prox - x.old_logprobs)
        if cfg.truncated_is > 0:
            weight = jnp.minimum(weight, cfg.truncated_is)
        weight = jax.lax.stop_gradient(weight)
        metrics["is_weight"] = weight
    else:
        ratio = jnp.exp(x.logprobs - x.old_logprobs)
        weight = 1.0
    loss, clip_frac = _clipped_surrogate(ratio, x.advantages, cfg)
    loss = weight * loss
    metrics.update(ratio=ratio, clip_frac=clip_frac)
    return _with_kl(loss, metrics, x, cfg)


def _with_kl(loss, metrics, x: LossInputs, cfg: LearnerConfig):
    if x.ref_logprobs is not None:
        kl = kl_k3(x.logprobs, x.ref_logprobs)
        metrics["kl"] = kl
        loss = loss + cfg.beta * kl
    metrics["entropy"] = x.entropy
    return loss, metrics


def grpo(x: LossInputs, cfg: LearnerConfig):
    """GRPO: PPO-clipped surrogate on group advantages, optional k3 KL to a reference."""
    return _policy_gradient(x, cfg, decoupled=False)


def decoupled_ppo(x: LossInputs, cfg: LearnerConfig):
    """AReaL's decoupled PPO: clip against the proximal policy, IS-weight by the behaviour."""
    return _policy_gradient(x, cfg, decoupled=True)


def gspo(x: LossInputs, cfg: LearnerConfig):
    """GSPO: one length-normalised ratio per sequence, clipped at the sequence level."""
    r, t = x.mask.shape
    ids = (jnp.arange(r)[:, None] * (t + 1) + x.segment_ids).reshape(-1)
    log_ratio = ((x.logprobs - x.old_logprobs) * x.mask).reshape(-1)
    sums = jax.ops.segment_sum(log_ratio, ids, num_segments=r * (t + 1))
    counts = jax.ops.segment_sum(x.mask.reshape(-1), ids, num_segments=r * (t + 1))
    seq_log_ratio = (sums / jnp.maximum(counts, 1.0))[ids].reshape(r, t)
    ratio = jnp.exp(seq_log_ratio)
    loss, clip_frac = _clipped_surrogate(ratio, x.advantages, cfg)
    return _with_kl(loss, {"ratio": ratio, "clip_frac": clip_frac}, x, cfg)


def sft(x: LossInputs, cfg: LearnerConfig):
    """Cross-entropy on the masked tokens (supervised fine-tuning / warm start)."""
    del cfg
    return -x.logprobs, {"entropy": x.entropy}


LOSSES: dict[str, Loss] = {
    "grpo": Loss(grpo),
    "dapo": Loss(grpo),  # DAPO = GRPO + clip-higher + token-mean + dynamic sampling (buffer)
    "dr_grpo": Loss(grpo, aggregation="constant"),
    "gspo": Loss(gspo, aggregation="seq_mean_token_mean"),
    "decoupled_ppo": Loss(decoupled_ppo),
    "sft": Loss(sft, uses_advantages=False),
}


def get_loss(name: str | Loss) -> Loss:
    """A Loss by registry name (or pass a Loss through)."""
    if isinstance(name, Loss):
        return name
    if name not in LOSSES:
        raise ValueError(
            f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))} "
            "(add yours to rljax.learner.LOSSES or pass a Loss)"
        )
    return LOSSES[name]
