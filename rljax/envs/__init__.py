"""Environments for multi-turn, tool-using conversations (docs/agents.md).

``Env`` and ``Step`` are what research code writes; ``rljax.run(cfg, workdir, env=factory)``
or config key ``env.name`` (:data:`ENVS`) puts them in a run. Import-light: no JAX. The names
whose modules import the config resolve on first use (PEP 562), so that the config can import
the tools' registry (``rljax.envs.tool_env``) without a circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rljax.envs.base import Env, Step
from rljax.envs.calculator import calculator
from rljax.envs.lookup import LookupEnv
from rljax.envs.render import ChatRenderer
from rljax.envs.sandbox import SandboxResult, run_python
from rljax.envs.tool_calls import ToolCall, ToolCallError, ToolError, parse_tool_calls
from rljax.envs.tool_env import BUILTIN_TOOLS, CALCULATOR, PYTHON, Tool, ToolEnv

if TYPE_CHECKING:
    from rljax.envs.conversation import Conversation, Conversations
    from rljax.envs.pool import EnvPool
    from rljax.envs.registry import ENVS, register_env

# The public names whose modules import the config (the env registry; the env pool through
# rljax.rewards): resolved on first use, so that importing the tools' registry does not.
_EXPORTS = {
    "Conversation": "rljax.envs.conversation",
    "Conversations": "rljax.envs.conversation",
    "EnvPool": "rljax.envs.pool",
    "ENVS": "rljax.envs.registry",
    "register_env": "rljax.envs.registry",
}

__all__ = [
    "BUILTIN_TOOLS",
    "CALCULATOR",
    "ChatRenderer",
    "Conversation",
    "Conversations",
    "ENVS",
    "Env",
    "EnvPool",
    "LookupEnv",
    "PYTHON",
    "SandboxResult",
    "Step",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolEnv",
    "ToolError",
    "calculator",
    "parse_tool_calls",
    "register_env",
    "run_python",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rljax.envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # resolve once
    return value
