"""Explicit name -> verifier table; configs pick a reward by name."""

from __future__ import annotations

from collections.abc import Callable

from rljax.rewards import verifiers

RewardFn = Callable[[str, dict], float]

REWARDS: dict[str, RewardFn] = {
    "exact_match": verifiers.exact_match,
    "math_answer": verifiers.math_answer,
}


def get_reward(name: str) -> RewardFn:
    """Returns the verifier registered as ``name``; unknown names list the valid ones."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"Unknown reward {name!r}; valid names are {sorted(REWARDS)}.") from None
