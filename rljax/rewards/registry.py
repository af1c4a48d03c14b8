"""Explicit name -> verifier table; configs pick a reward by name.

:func:`build_reward` builds a run's reward from its config section: a verifier of
:data:`REWARDS`, a model-based reward ('model': ``rljax.rewards.model``, 'judge':
``rljax.rewards.judge``, each built from its sub-section), or 'weighted': a weighted sum of those
(``rljax.rewards.weighted``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rljax.config import ConfigError, RewardConfig
from rljax.config.checks import MODEL_REWARDS, WEIGHTED_REWARD
from rljax.rewards import verifiers
from rljax.rewards.weighted import WeightedReward

if TYPE_CHECKING:
    from rljax.rewards.model import RewardContext

RewardFn = Callable[[str, dict], float]

REWARDS: dict[str, RewardFn] = {
    "exact_match": verifiers.exact_match,
    "math_answer": verifiers.math_answer,
}


def get_reward(name: str, key: str = "reward.name") -> RewardFn:
    """Returns the verifier registered as ``name``; unknown names list the valid ones (and
    name the config ``key`` that asked for it)."""
    try:
        return REWARDS[name]
    except (KeyError, TypeError):
        others = [*MODEL_REWARDS, WEIGHTED_REWARD] if key == "reward.name" else [*MODEL_REWARDS]
        raise ConfigError(
            f"Unknown reward {name!r}; valid names are {[*sorted(REWARDS), *others]}: set config "
            f"key '{key}' to one of them, or pass your function as rljax.Run(reward_fn=...)"
        ) from None


def build_reward(cfg: RewardConfig, context: RewardContext) -> tuple[Any, bool]:
    """``(fn, batched)``: the reward ``cfg`` names, and whether the pool calls it batched.

    'model' and 'judge' load their checkpoints now (and compile, so that no scoring call waits
    on it), with what ``context`` gives of the run (the policy's tokenizer, its prompts).
    """
    if cfg.name != WEIGHTED_REWARD:
        fn = _build_one(cfg.name, cfg, context, "reward.name")
        return fn, cfg.batched or cfg.name in MODEL_REWARDS
    parts = [
        (name, float(w), _build_one(name, cfg, context, "reward.weights"), name in MODEL_REWARDS)
        for name, w in cfg.weights.items()
    ]
    return WeightedReward(parts), True


def reward_for(
    cfg: RewardConfig, context: RewardContext, reward_fn: Any = None
) -> tuple[RewardFn, bool]:
    """A run's ``(reward, batched)``: ``reward_fn`` (checked: :func:`check_reward_fn`) batched
    as ``cfg.batched`` says, or else the one ``cfg`` names (:func:`build_reward`); an unknown
    ``cfg.heldout`` verifier is refused here too, before the run writes."""
    if cfg.heldout:
        get_reward(cfg.heldout, key="reward.heldout")
    if reward_fn is None:
        return build_reward(cfg, context)
    return check_reward_fn(reward_fn), cfg.batched


def _build_one(name: str, cfg: RewardConfig, context: RewardContext, key: str) -> Any:
    if name == "model":
        from rljax.rewards.model import build_model_reward

        return build_model_reward(cfg.model, context)
    if name == "judge":
        from rljax.rewards.judge import build_judge

        return build_judge(cfg.judge, context)
    return get_reward(name, key)


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
