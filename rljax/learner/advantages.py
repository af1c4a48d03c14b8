"""Outcome advantages: each response's scalar reward against a baseline (``learner.advantage``).

- ``grpo``: the group's mean, divided by the group's std unless the loss says not
  (:func:`group_advantages`).
- ``rloo``: the mean of the group's other responses (:func:`rloo_advantages`).
- ``reinforce_plus_plus_baseline``: the group's mean, then whitened over the batch's trained
  tokens (:func:`reinforce_pp_baseline_advantages`).

Each is one number per response, which the learner applies to every trained token of it. The
definitions follow verl's ``core_algos``; where rljax differs, the function says so.
docs/algorithms.md has the formulas.
"""

from __future__ import annotations

import numpy as np

from rljax.config import LearnerConfig
from rljax.learner.loss_names import ADVANTAGE_NAMES
from rljax.learner.losses import Loss, get_loss


def group_advantages(
    rewards_ng: np.ndarray, *, scale: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``(r - mean_g(r)) / (std_g(r) + eps)`` per group; rows are groups of G responses.

    The std is the population one (ddof=0: divide by G), on purpose: the G responses are the
    whole group being normalised, not a sample of a larger one, and with ddof=0 a group's
    advantages have mean 0 and variance exactly 1 (less the eps), whatever G is. verl and TRL
    divide by the sample std (ddof=1), which makes advantages smaller by sqrt((G-1)/G)
    (0.87 at G=4, 0.97 at G=16); the learning rate absorbs that factor. ``eps`` is added to
    the std (not under a square root), so an almost-constant group cannot blow up.

    ``scale=False`` keeps only the mean baseline (Dr. GRPO), which avoids up-weighting
    groups whose rewards barely differ. A group whose rewards are all equal gets zeros.
    """
    if not isinstance(scale, bool | np.bool_):
        raise TypeError(
            f"group_advantages(scale={scale!r}): pass a bool; for a run's config use "
            "scale=resolve_scale(cfg.learner, loss) (scale_advantages=None means the loss decides)"
        )
    rewards_ng = _groups(rewards_ng)
    centred = rewards_ng - rewards_ng.mean(axis=1, keepdims=True)
    if scale:
        centred = centred / (rewards_ng.std(axis=1, ddof=0, keepdims=True) + eps)
    return centred.astype(np.float32)


def resolve_scale(cfg: LearnerConfig, loss: str | Loss | None = None) -> bool:
    """Whether advantages are divided by the group std for ``loss`` (default: ``cfg.loss``).

    ``cfg.scale_advantages`` when set; otherwise the loss's own default, so ``dr_grpo`` drops
    the std scaling it exists to remove and every other loss keeps it. Pass the loss the
    learner trains with (a custom :class:`Loss` object included).
    """
    if cfg.scale_advantages is not None:
        return cfg.scale_advantages
    return get_loss(loss or cfg.loss).scale_advantages


def rloo_advantages(rewards_ng: np.ndarray) -> np.ndarray:
    """RLOO: ``r_i - mean_{j != i} r_j``, the leave-one-out baseline of each group of G >= 2
    (Ahmadian et al. 2024), which equals ``G / (G - 1) * (r_i - mean_g(r))``. No std scaling."""
    rewards_ng = _groups(rewards_ng)
    g = rewards_ng.shape[1]
    centred = rewards_ng - rewards_ng.mean(axis=1, keepdims=True)
    return (centred * (g / (g - 1))).astype(np.float32)


def reinforce_pp_baseline_advantages(
    rewards_ng: np.ndarray, tokens_ng: np.ndarray, *, eps: float = 1e-8
) -> np.ndarray:
    """REINFORCE++ with a group baseline (Hu et al. 2025, "RF++-baseline"): ``r - mean_g(r)``,
    then whitened over the batch's trained tokens: every response counts once per token it
    trains (``tokens_ng``), as verl's ``masked_whiten`` over the response mask does, with the
    unbiased (n - 1) variance over those n tokens and ``eps`` under the square root."""
    rewards_ng = _groups(rewards_ng)
    tokens = np.asarray(tokens_ng, np.float64)
    if tokens.shape != rewards_ng.shape or (tokens < 0).any():
        raise ValueError(
            f"tokens per response must be [groups, G] counts like the rewards {rewards_ng.shape}, "
            f"got {tokens.shape}"
        )
    n = tokens.sum()
    if n < 2:
        raise ValueError(f"whitening over the batch's tokens needs at least 2, got {n:g}")
    a = rewards_ng - rewards_ng.mean(axis=1, keepdims=True)
    mean = (a * tokens).sum() / n
    var = ((a - mean) ** 2 * tokens).sum() / n * (n / (n - 1))
    return ((a - mean) / np.sqrt(var + eps)).astype(np.float32)


def _groups(rewards_ng: np.ndarray) -> np.ndarray:
    rewards_ng = np.asarray(rewards_ng, np.float64)
    if rewards_ng.ndim != 2 or rewards_ng.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G] with G >= 2, got shape {rewards_ng.shape}")
    return rewards_ng


def outcome_advantages(
    name: str, rewards_ng: np.ndarray, tokens_ng: np.ndarray, *, scale: bool = True
) -> np.ndarray:
    """The advantages [groups, G] of estimator ``name`` (``learner.advantage``); ``scale``:
    grpo's std scaling (:func:`resolve_scale`); ``tokens_ng``: each response's trained tokens."""
    if name == "grpo":
        return group_advantages(rewards_ng, scale=scale)
    if name == "rloo":
        return rloo_advantages(rewards_ng)
    if name == "reinforce_plus_plus_baseline":
        return reinforce_pp_baseline_advantages(rewards_ng, tokens_ng)
    raise ValueError(f"unknown advantage estimator {name!r}; use one of {ADVANTAGE_NAMES}")
