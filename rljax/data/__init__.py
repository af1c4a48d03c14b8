"""Data: prompt tasks (synthetic arithmetic, GSM8K/MATH files) and grain pipelines.

Each name is resolved on first use (PEP 562), so the config can import the task and teacher
registries (``rljax.data.registry``, ``rljax.data.teachers``) without loading grain and JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rljax.data.arithmetic import ArithmeticTask
    from rljax.data.math_tasks import chat_prompt_builder, load_math_examples, plain_prompt
    from rljax.data.pipeline import process_shard, prompt_dataset, prompt_iterator

# Public name -> the module that defines it.
_EXPORTS = {
    "ArithmeticTask": "rljax.data.arithmetic",
    "chat_prompt_builder": "rljax.data.math_tasks",
    "load_math_examples": "rljax.data.math_tasks",
    "plain_prompt": "rljax.data.math_tasks",
    "process_shard": "rljax.data.pipeline",
    "prompt_dataset": "rljax.data.pipeline",
    "prompt_iterator": "rljax.data.pipeline",
}

__all__ = [
    "ArithmeticTask",
    "chat_prompt_builder",
    "load_math_examples",
    "plain_prompt",
    "process_shard",
    "prompt_dataset",
    "prompt_iterator",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rljax.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # resolve once
    return value
