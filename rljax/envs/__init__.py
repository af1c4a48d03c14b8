"""Environments for multi-turn, tool-using conversations (docs/agents.md).

``Env`` and ``Step`` are what research code writes; ``rljax.run(cfg, workdir, env=factory)``
or config key ``env.name`` (:data:`ENVS`) puts them in a run. Import-light: no JAX.
"""

from rljax.envs.base import Env, Step
from rljax.envs.conversation import Conversation, Conversations
from rljax.envs.lookup import LookupEnv
from rljax.envs.pool import EnvPool
from rljax.envs.registry import ENVS, register_env
from rljax.envs.render import ChatRenderer

__all__ = [
    "ENVS",
    "ChatRenderer",
    "Conversation",
    "Conversations",
    "Env",
    "EnvPool",
    "LookupEnv",
    "Step",
    "register_env",
]
