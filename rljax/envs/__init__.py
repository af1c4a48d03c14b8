"""Environments for multi-turn, tool-using conversations (docs/agents.md).

``Env`` and ``Step`` are what research code writes; ``rljax.run(cfg, workdir, env=factory)``
or config key ``env.name`` (:data:`ENVS`) puts them in a run. Import-light: no JAX.
"""

from rljax.envs.base import Env, Step
from rljax.envs.calculator import calculator
from rljax.envs.conversation import Conversation, Conversations
from rljax.envs.lookup import LookupEnv
from rljax.envs.pool import EnvPool
from rljax.envs.registry import ENVS, register_env
from rljax.envs.render import ChatRenderer
from rljax.envs.sandbox import SandboxResult, run_python
from rljax.envs.tool_calls import ToolCall, ToolCallError, ToolError, parse_tool_calls
from rljax.envs.tool_env import BUILTIN_TOOLS, CALCULATOR, PYTHON, Tool, ToolEnv

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
