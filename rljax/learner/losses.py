"""Policy losses, chosen by name from an explicit registry.

Every loss maps per-token inputs to a per-token loss and per-token metrics; the learner weighs
the loss by the batch's ``weights`` (which encode the loss's aggregation, see
:mod:`rljax.learner.batch`) and averages the metrics over response tokens.

Symbols: r = pi_theta / pi_base (the PPO ratio), A the advantage, epsilon_low/high the clip
band (DAPO's clip-higher when high > low), c the dual-clip bound on negative advantages
(``clip_ratio_c``, verl), beta the KL weight, C the truncated-IS cap.

Off-policy handling (decoupled PPO, AReaL). The proximal policy pi_prox, the one the clip is
taken against, is the learner's policy before the step: version V = ``learner_version``.
``proximal='recompute'`` uses its log-probs as computed once per batch, before the
``ppo_epochs`` updates (``LossInputs.prox_logprobs``; with one update per batch the
current log-probs are those of pi_prox already). The behaviour policy that sampled the tokens
enters only through the importance weight ``w = pi_prox / pi_behav``, truncated at C when set.
``proximal='loglinear'`` skips the forward pass: it takes log pi linear in the version between
the behaviour (v_b) and the policy this step trains (V + 1), so log pi_prox =
log pi_behav + alpha (log pi_theta - log pi_behav) with alpha = (V - v_b) / (V + 1 - v_b).
Plain GRPO with ``truncated_is = C > 0`` uses the same decomposition.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rljax.config import ConfigError, LearnerConfig


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
    learner_version: jax.Array  # scalar: the version of pi_prox, the params before this step
    ref_logprobs: jax.Array | None = None
    prox_logprobs: jax.Array | None = None  # pi_prox, fixed over the epochs; None: logprobs


LossFn = Callable[[LossInputs, LearnerConfig], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class Loss:
    """A registered loss: the function and how its per-token values are aggregated.

    ``proximal`` says when the loss reads pi_prox: ``'always'`` (decoupled PPO),
    ``'with_is'`` (only when ``truncated_is > 0``) or ``'never'``. ``scale_advantages`` is the
    loss's default for dividing advantages by the group std, used when
    ``LearnerConfig.scale_advantages`` is None (see :func:`rljax.learner.advantages.resolve_scale`).
    ``sampled`` says the batch's tokens were sampled and carry the sampler's log-probs, so the
    learner logs the train-inference mismatch (False for SFT, which trains on given answers).
    """

    fn: LossFn
    aggregation: str = "token_mean"
    uses_advantages: bool = True
    proximal: str = "never"
    scale_advantages: bool = True
    sampled: bool = True

    def __post_init__(self) -> None:
        if self.proximal not in ("always", "with_is", "never"):
            raise ValueError(
                f"Loss.proximal={self.proximal!r}; expected 'always', 'with_is' or 'never'"
            )

    def needs_proximal(self, cfg: LearnerConfig) -> bool:
        """Whether this loss, under ``cfg``, reads the proximal log-probs."""
        return self.proximal == "always" or (self.proximal == "with_is" and cfg.truncated_is > 0)


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """Schulman's k3 estimator of KL(pi || pi_ref): unbiased, always >= 0."""
    d = ref_logprobs - logprobs
    return jnp.exp(d) - d - 1.0


def train_inference_mismatch(
    logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array
) -> dict[str, jax.Array]:
    """Per-token gap between the learner's and the sampler's log-probs of the sampled tokens.

    With r = log pi_learner - log pi_sampler: ``abs_logp`` = |r| and ``k3`` = exp(r) - 1 - r,
    Schulman's k3 estimate of KL(pi_sampler || pi_learner) (the tokens are the sampler's
    draws). Both are 0 off ``mask``, where the sampler's log-probs are padding.
    """
    on = mask > 0
    r = jnp.where(on, jax.lax.stop_gradient(logprobs) - sampler_logprobs, 0.0)
    # expm1: exp(r) - 1 would lose all of k3 ~ r^2 / 2 to rounding at the |r| ~ 1e-3 of bf16.
    return {"abs_logp": jnp.abs(r), "k3": jnp.expm1(r) - r}


def loglinear_alpha(versions: jax.Array, learner_version: jax.Array) -> jax.Array:
    """alpha = (V - v_b) / (V + 1 - v_b): where pi_prox (version V) sits, in log space, between
    the behaviour policy (v_b) and the policy this step trains (V + 1).

    Staleness 0 gives 0 (pi_prox is the behaviour policy), 1 gives 1/2, 2 gives 2/3.
    """
    v_b = versions.astype(jnp.float32)
    v = learner_version.astype(jnp.float32)
    return jnp.clip((v - v_b) / jnp.maximum(v + 1.0 - v_b, 1.0), 0.0, 1.0)


def _proximal(x: LossInputs, cfg: LearnerConfig) -> jax.Array:
    current = jax.lax.stop_gradient(x.logprobs)
    if cfg.proximal == "loglinear":
        alpha = loglinear_alpha(x.versions, x.learner_version)
        return x.old_logprobs + alpha * (current - x.old_logprobs)
    if x.prox_logprobs is not None:
        return jax.lax.stop_gradient(x.prox_logprobs)
    return current  # one update per batch: the current params are pi_prox's


def _clipped_surrogate(
    ratio: jax.Array, advantages: jax.Array, cfg: LearnerConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped surrogate, and verl's dual clip: for A < 0 the loss is at most -c A."""
    clipped = jnp.clip(ratio, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    loss = -jnp.minimum(unclipped_obj, clipped_obj)
    metrics = {"clip_frac": (clipped_obj < unclipped_obj).astype(jnp.float32)}
    if cfg.clip_ratio_c > 0:
        bound = -cfg.clip_ratio_c * advantages
        dual = (advantages < 0) & (loss > bound)
        loss = jnp.where(dual, bound, loss)
        metrics["dual_clip_frac"] = dual.astype(jnp.float32)
    return loss, metrics


def _policy_gradient(
    x: LossInputs, cfg: LearnerConfig, *, decoupled: bool
) -> tuple[jax.Array, dict[str, jax.Array]]:
    metrics: dict[str, jax.Array] = {}
    weight: jax.Array | float = 1.0
    if decoupled or cfg.truncated_is > 0:
        prox = _proximal(x, cfg)
        ratio = jnp.exp(x.logprobs - prox)
        is_weight = jnp.exp(prox - x.old_logprobs)
        if cfg.truncated_is > 0:
            is_weight = jnp.minimum(is_weight, cfg.truncated_is)
        weight = metrics["is_weight"] = jax.lax.stop_gradient(is_weight)
    else:
        ratio = jnp.exp(x.logprobs - x.old_logprobs)
    loss, clip_metrics = _clipped_surrogate(ratio, x.advantages, cfg)
    loss = weight * loss
    metrics.update(ratio=ratio, **clip_metrics)
    return _with_kl(loss, metrics, x, cfg)


def _with_kl(
    loss: jax.Array, metrics: dict[str, jax.Array], x: LossInputs, cfg: LearnerConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    if x.ref_logprobs is not None:
        kl = kl_k3(x.logprobs, x.ref_logprobs)
        metrics["kl"] = kl
        loss = loss + cfg.beta * kl
    metrics["entropy"] = x.entropy
    return loss, metrics


def grpo(x: LossInputs, cfg: LearnerConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO: PPO-clipped surrogate on group advantages, optional k3 KL to a reference."""
    return _policy_gradient(x, cfg, decoupled=False)


def decoupled_ppo(x: LossInputs, cfg: LearnerConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """AReaL's decoupled PPO: clip against the proximal policy, IS-weight by the behaviour."""
    return _policy_gradient(x, cfg, decoupled=True)


def gspo(x: LossInputs, cfg: LearnerConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO: one length-normalised ratio per sequence, clipped at the sequence level.

    In GSPO-token's form (Zheng et al. 2025, eq. 13): token t's ratio is sg[s_i] pi_t /
    sg[pi_t], whose value is the sequence's s_i (so the clip is decided per sequence) and whose
    gradient is s_i grad log pi_t times the token's own advantage. With one advantage per
    sequence this is GSPO exactly; with per-token advantages (gae, opd, reinforce_plus_plus)
    each token keeps its own, where differentiating s_i itself would give every token the
    sequence's mean advantage.
    """
    r, t = x.mask.shape
    ids = (jnp.arange(r)[:, None] * (t + 1) + x.segment_ids).reshape(-1)
    log_ratio = ((x.logprobs - x.old_logprobs) * x.mask).reshape(-1)
    sums = jax.ops.segment_sum(log_ratio, ids, num_segments=r * (t + 1))
    counts = jax.ops.segment_sum(x.mask.reshape(-1), ids, num_segments=r * (t + 1))
    seq_log_ratio = (sums / jnp.maximum(counts, 1.0))[ids].reshape(r, t)
    token = x.logprobs - jax.lax.stop_gradient(x.logprobs)  # 0, with grad log pi_t
    ratio = jnp.exp(jax.lax.stop_gradient(seq_log_ratio) + token)
    loss, clip_metrics = _clipped_surrogate(ratio, x.advantages, cfg)
    return _with_kl(loss, {"ratio": ratio, **clip_metrics}, x, cfg)


def sft(x: LossInputs, cfg: LearnerConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy on the masked tokens (supervised fine-tuning / warm start)."""
    del cfg
    return -x.logprobs, {"entropy": x.entropy}


LOSSES: dict[str, Loss] = {
    "grpo": Loss(grpo, proximal="with_is"),
    # DAPO = GRPO + clip-higher + token-mean + dynamic sampling (buffer)
    "dapo": Loss(grpo, proximal="with_is"),
    # Dr. GRPO: no length normalisation (constant) and no std scaling of the advantages.
    "dr_grpo": Loss(grpo, aggregation="constant", proximal="with_is", scale_advantages=False),
    "gspo": Loss(gspo, aggregation="seq_mean_token_mean"),
    "decoupled_ppo": Loss(decoupled_ppo, proximal="always"),
    "sft": Loss(sft, uses_advantages=False, sampled=False),
}


def get_loss(name: str | Loss, cfg: LearnerConfig | None = None) -> Loss:
    """A Loss by registry name (or pass a Loss through).

    With ``cfg``, a Loss that is not a built-in is first traced once on tiny inputs
    (:func:`check_loss`), so a wrong signature or output refuses with one line before any
    train step compiles.
    """
    if isinstance(name, Loss):
        if cfg is not None and name not in LOSSES.values():
            check_loss(name, cfg)
        return name
    if callable(name):
        raise TypeError(
            f"loss {getattr(name, '__qualname__', name)!r} is a bare function; wrap it as "
            "rljax.Loss(fn) (and set its aggregation), or register it in rljax.LOSSES"
        )
    if not isinstance(name, str) or name not in LOSSES:
        raise ConfigError(
            f"unknown loss {name!r}; registered: {', '.join(sorted(LOSSES))} "
            "(set config key 'learner.loss' to one of them, add yours to rljax.LOSSES "
            "or pass a Loss)"
        )
    return LOSSES[name]


_LOSS_USAGE = (
    "a loss maps (inputs: LossInputs, cfg: LearnerConfig) to (per-token loss [R, T], "
    "{metric name: [R, T] array})"
)


def check_loss(loss: Loss, cfg: LearnerConfig, rows: int = 2, length: int = 3) -> None:
    """Traces ``loss.fn`` on abstract [rows, length] inputs; raises one line if it cannot be
    called as ``fn(inputs, cfg)`` or does not return a per-token loss and per-token metrics."""
    fn = loss.fn
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if not callable(fn):
        raise TypeError(f"Loss.fn={fn!r} is not callable; {_LOSS_USAGE}")
    try:
        inspect.signature(fn).bind(None, cfg)
    except TypeError:
        raise TypeError(
            f"loss function {name}{inspect.signature(fn)} cannot be called as fn(inputs, cfg); "
            f"{_LOSS_USAGE}"
        ) from None
    except ValueError:  # no signature to inspect (a builtin); the trace below still checks
        pass
    f32 = jax.ShapeDtypeStruct((rows, length), jnp.float32)
    i32 = jax.ShapeDtypeStruct((rows, length), jnp.int32)
    # Abstract leaves: eval_shape traces the loss on shapes alone.
    abstract: dict[str, Any] = dict(
        logprobs=f32,
        old_logprobs=f32,
        advantages=f32,
        mask=f32,
        entropy=f32,
        segment_ids=i32,
        versions=i32,
        learner_version=jax.ShapeDtypeStruct((), jnp.int32),
        ref_logprobs=f32 if cfg.beta > 0 else None,
        prox_logprobs=f32 if loss.needs_proximal(cfg) else None,
    )
    try:
        out = jax.eval_shape(lambda x: fn(x, cfg), LossInputs(**abstract))
    except Exception as e:  # anything the user's function raises while tracing
        text = " ".join(str(e).split())[:300]
        raise TypeError(
            f"loss function {name} failed on [{rows}, {length}] inputs "
            f"({type(e).__name__}: {text}); {_LOSS_USAGE}"
        ) from e
    want = (rows, length)
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(
            f"loss function {name} returned {_describe(out)}, not a (loss, metrics) pair; "
            f"{_LOSS_USAGE}"
        )
    per_token, metrics = out
    if not isinstance(per_token, jax.ShapeDtypeStruct) or per_token.shape != want:
        raise ValueError(
            f"loss function {name} returned a loss of {_describe(per_token)} for [{rows}, "
            f"{length}] inputs; return one value per token (no reduction: the learner weighs "
            "and sums it)"
        )
    for key, value in metrics.items():
        if not isinstance(value, jax.ShapeDtypeStruct) or value.shape != want:
            raise ValueError(
                f"loss function {name} returned metric {key!r} of {_describe(value)} for "
                f"[{rows}, {length}] inputs; return one value per token (the learner averages "
                "it over response tokens)"
            )


def _describe(value: Any) -> str:
    if isinstance(value, jax.ShapeDtypeStruct):
        return f"shape {list(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
