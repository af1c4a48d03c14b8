"""The one-line config error, the checks every section runs, and the choices they accept.

The choices that name a registry's entries (tasks, teachers, losses, built-in tools, LoRA
targets) are that registry's keys, and :func:`check_needs` is the one rule for what an entry
needs of the rest of the config (``rljax.needs``). The registries' declarations are
import-light, so the config stays importable without JAX.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rljax.data.registry import TASKS as TASK_REGISTRY
from rljax.data.teachers import TEACHERS
from rljax.envs.tool_env import BUILTIN_TOOLS
from rljax.learner.loss_names import LOSS_NEEDS
from rljax.models.lora_targets import TARGET_WEIGHTS
from rljax.needs import Needs

DTYPES = ("float32", "bfloat16")
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe")
GEMMA_FAMILIES = ("gemma2", "gemma3", "gemma4")
FAMILIES = ("llama", "qwen2", "qwen3", *MOE_FAMILIES, *GEMMA_FAMILIES)
# model.layer_types entries (Hugging Face's names): a local (sliding-window) or a global layer.
LAYER_TYPES = ("sliding_attention", "full_attention")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")
ROUTER_REPLAY = ("off", "rollout")
LOSSES = tuple(LOSS_NEEDS)  # the built-in ones; rljax.LOSSES takes more at run time
SWAP_MODES = ("inflight", "recompute", "drain")
WEIGHTS_LAYOUTS = ("auto", "stacked", "per_layer")
TASKS = tuple(TASK_REGISTRY)
MESH_MODES = ("colocated", "split")
SLICE_LAYOUTS = ("by_role", "spread")  # multislice: whole slices per role, or both on every one
# Activation rematerialisation of the training decoder block: 'none' keeps every activation,
# 'full' recomputes the block in the backward pass, the rest name jax.checkpoint_policies.
REMAT = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
RUN_MODES = ("sync", "async")
SFT_TEACHERS = tuple(TEACHERS)
# The tools the 'tools' env builds in.
BUILTIN_TOOL_NAMES = tuple(BUILTIN_TOOLS)
# The projections LoRA can adapt (rljax.models.lora).
LORA_TARGETS = tuple(TARGET_WEIGHTS)
LORA_SERVING = ("auto", "merged", "unmerged")
# The rewards built from a model (rljax.rewards.model, rljax.rewards.judge), and the name of a
# weighted sum of rewards (reward.weights).
MODEL_REWARDS = ("model", "judge")
WEIGHTED_REWARD = "weighted"


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the key and the fix."""


def _fail(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"config key '{key}' = {value!r} is invalid: expected {expected}")


def _positive(key: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        _fail(key, value, "an integer >= 0" if allow_zero else "an integer > 0")


def _positive_float(
    key: str, value: Any, *, allow_zero: bool = False, unset: str | None = None
) -> None:
    """A finite number > 0 (>= 0 with ``allow_zero``); ``unset`` names what None means for a
    key that may also be None, for the message."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        expected = "a finite number >= 0" if allow_zero else "a finite number > 0"
        _fail(key, value, expected if unset is None else f"{expected}, or {unset}")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, value, f"one of {', '.join(choices)}")


def value_in(config: Any, prefix: str = "") -> Callable[[str], Any]:
    """``value_of(dotted_key)`` over ``config``: the whole run config, or the section whose
    keys start with ``prefix`` (``'data.'``), where a key outside it is a KeyError."""

    def value_of(key: str) -> Any:
        if not key.startswith(prefix):
            raise KeyError(key)
        value = config
        for part in key.removeprefix(prefix).split("."):
            value = getattr(value, part)
        return value

    return value_of


def check_needs(
    key: str, value: Any, needs: Needs, value_of: Callable[[str], Any], fallback: Any
) -> None:
    """Refuses ``key = value`` when the entry it names needs other keys' values (``needs``)
    that the config (``value_of(dotted_key)``) does not hold; ``fallback`` is the choice that
    needs nothing (the key's default)."""
    if needs.unmet(value_of):
        why = f" ({needs.why})" if needs.why else ""
        raise ConfigError(
            f"config key '{key}' = {value!r} needs {needs}{why}; set {needs}, or {key}={fallback!r}"
        )
