"""Explicit name -> verifier table; configs pick a reward by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from rljax.config import ConfigError
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
    except (KeyError, TypeError):
        raise ConfigError(
            f"Unknown reward {name!r}; valid names are {sorted(REWARDS)}: set config key "
            "'reward.name' to one of them, or pass your function as rljax.Run(reward_fn=...)"
        ) from None


def check_reward_fn(fn) -> RewardFn:
    """Returns ``fn`` if it can be called as ``fn(completion, example)``; a one-line
    TypeError otherwise, before any trajectory is scored (a verifier that fails on every call
    would otherwise score every trajectory 0.0 and train on nothing)."""
    usage = "def reward(completion: str, example: dict) -> float"
    if not callable(fn):
        raise TypeError(f"reward_fn={fn!r} is not callable; pass a function: {usage}")
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (a callable object's method)
    ):
        raise TypeError(f"reward_fn {name} is async; the pool calls it synchronously: {usage}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature; let them be
        return fn
    try:
        signature.bind("", {})
    except TypeError:
        raise TypeError(
            f"reward_fn {name}{signature} cannot be called as fn(completion, example); give it "
            f"two positional parameters: {usage}"
        ) from None
    return fn
