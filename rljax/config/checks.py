"""The one-line config error, the checks every section runs, and the choices they accept."""

from __future__ import annotations

import math
from typing import Any

DTYPES = ("float32", "bfloat16")
FAMILIES = ("llama", "qwen2", "qwen3")
LOSSES = ("grpo", "dapo", "dr_grpo", "gspo", "decoupled_ppo")
SWAP_MODES = ("inflight", "recompute", "drain")
WEIGHTS_LAYOUTS = ("auto", "stacked", "per_layer")
TASKS = ("arithmetic", "arithmetic_lookup", "gsm8k", "math")
MESH_MODES = ("colocated", "split")
SLICE_LAYOUTS = ("by_role", "spread")  # multislice: whole slices per role, or both on every one
# Activation rematerialisation of the training decoder block: 'none' keeps every activation,
# 'full' recomputes the block in the backward pass, the rest name jax.checkpoint_policies.
REMAT = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
RUN_MODES = ("sync", "async")
SFT_TEACHERS = ("reference", "drops_carries", "looks_up_sometimes", "calls_calculator_sometimes")
# lora.targets -> the decoder weight each adapts (rljax.models.lora).
# The tools the 'tools' env builds in (rljax.envs.tool_env.BUILTIN_TOOLS).
BUILTIN_TOOL_NAMES = ("calculator", "python")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LORA_SERVING = ("auto", "merged", "unmerged")


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the key and the fix."""


def _fail(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"config key '{key}' = {value!r} is invalid: expected {expected}")


def _positive(key: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        _fail(key, value, "an integer >= 0" if allow_zero else "an integer > 0")


def _positive_float(key: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        _fail(key, value, "a finite number >= 0" if allow_zero else "a finite number > 0")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, value, f"one of {', '.join(choices)}")
