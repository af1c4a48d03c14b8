"""Group-relative advantages (GRPO): each response is scored against its own group."""

from __future__ import annotations

import numpy as np

from rljax.config import LearnerConfig
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
    rewards_ng = np.asarray(rewards_ng, np.float64)
    if rewards_ng.ndim != 2 or rewards_ng.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G] with G >= 2, got shape {rewards_ng.shape}")
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
