"""Explicit name -> env table; a config picks an env by ``env.name``, as it picks a reward.

An entry builds the run's env factory from the run config and the run's reward function (an
env may score its final turn with it): ``builder(cfg, reward) -> factory``, where ``factory()``
returns a fresh :class:`~rljax.envs.base.Env`. Research code registers its own with
:func:`register_env`, or passes ``rljax.run(cfg, workdir, env=factory)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rljax.config import ConfigError
from rljax.envs.base import Env
from rljax.envs.lookup import LookupEnv

EnvFactory = Callable[[], Env]
EnvBuilder = Callable[[Any, Callable[[str, dict], float]], EnvFactory]


def _tools(cfg, reward) -> EnvFactory:
    """The tool-calling env with the built-in tools ``env.tools``, listed as
    ``env.tool_prompt`` says; the user's message is the task's prompt through
    ``data.prompt_template``, as a single-turn run would phrase it."""
    from rljax.envs.tool_env import BUILTIN_TOOLS, ToolEnv  # needed by this env alone

    template = cfg.data.prompt_template

    class TaskToolEnv(ToolEnv):
        def reset(self, example: dict) -> list[dict]:
            text = template.format(
                prompt=example["prompt"], question=example["prompt"].rstrip("= ")
            )
            return super().reset({**example, "prompt": text})

    return functools.partial(
        TaskToolEnv,
        {name: BUILTIN_TOOLS[name] for name in cfg.env.tools},
        fmt=cfg.env.tool_format,
        prompt_style=cfg.env.tool_prompt,
        answer_reward=reward,
    )


ENVS: dict[str, EnvBuilder] = {
    "lookup": lambda cfg, reward: functools.partial(LookupEnv, reward),
    "lookup_blind": lambda cfg, reward: functools.partial(LookupEnv, reward, blind=True),
    "tools": _tools,
}


def register_env(name: str, builder: EnvBuilder) -> None:
    """Make ``env.name=name`` build its factory with ``builder(cfg, reward) -> factory``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"an env's name must be a non-empty str, got {name!r}")
    if not callable(builder):
        raise TypeError(f"register_env({name!r}, ...) needs builder(cfg, reward) -> factory")
    ENVS[name] = builder


def env_factory(cfg, reward: Callable[[str, dict], float]) -> EnvFactory:
    """The factory ``env.name`` names; unknown names list the registered ones."""
    try:
        builder = ENVS[cfg.env.name]
    except KeyError:
        raise ConfigError(
            f"Unknown env {cfg.env.name!r}; registered envs are {sorted(ENVS)}: set config key "
            "'env.name' to one of them, register yours with rljax.envs.register_env, or pass "
            "rljax.run(cfg, workdir, env=factory)"
        ) from None
    return builder(cfg, reward)
