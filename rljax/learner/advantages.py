"""Group-relative advantages (GRPO): each response is scored against its own group."""

from __future__ import annotations

import numpy as np


def group_advantages(
    rewards_ng: np.ndarray, *, scale: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``(r - mean_g(r)) / (std_g(r) + eps)`` per group; rows are groups of G responses.

    ``scale=False`` keeps only the mean baseline (Dr. GRPO), which avoids up-weighting
    groups whose rewards barely differ. A group whose rewards are all equal gets zeros.
    """
    rewards_ng = np.asarray(rewards_ng, np.float64)
    if rewards_ng.ndim != 2 or rewards_ng.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G] with G >= 2, got shape {rewards_ng.shape}")
    centred = rewards_ng - rewards_ng.mean(axis=1, keepdims=True)
    if scale:
        centred = centred / (rewards_ng.std(axis=1, keepdims=True) + eps)
    return centred.astype(np.float32)
