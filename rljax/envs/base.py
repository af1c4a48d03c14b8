"""The environment interface: ``Env`` (what research code writes) and ``Step`` (what it returns).

An env plays one conversation. ``reset(example)`` gives the first chat messages (the prompt),
``step(action)`` takes the model's turn as text and answers with a :class:`Step`: new messages
(tool results, a user's reply; possibly none), a reward, whether the conversation is over, and
counters for metrics. The trajectory's reward is the sum of its steps' rewards.

An env runs off the sampler thread (:class:`rljax.envs.pool.EnvPool`), under a per-step
timeout; one that raises, hangs or returns something that is not a ``Step`` is counted by kind
and ends its conversation, never the run (docs/agents.md, docs/errors.md).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable


@dataclasses.dataclass
class Step:
    """What an env answers to one model turn.

    Attributes:
      observation: new chat messages (``{"role": ..., "content": ...}``), appended after the
        model's turn; empty for none.
      reward: this step's reward; the trajectory's is the sum over its steps.
      done: the conversation is over (the model gets no further turn).
      info: counters for metrics (ints or floats), e.g. ``{"tool_calls": 1}``; the keys
        ``tool_calls`` and ``tool_errors/<kind>`` are summed into the run's metrics.
    """

    observation: list[dict] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """One conversation's environment; ``rljax.run(cfg, workdir, env=factory)`` calls
    ``factory()`` for a fresh one per conversation."""

    def reset(self, example: dict) -> list[dict]:
        """The first chat messages for ``example`` (the task's example dict)."""
        ...

    def step(self, action: str) -> Step:
        """Answer the model's turn (its text, the turn's stop token not included)."""
        ...


def check_messages(messages: object, where: str) -> list[dict]:
    """``messages`` if it is a list of ``{"role": str, "content": str, ...}`` dicts; a
    TypeError naming ``where`` and the fix otherwise."""
    if not isinstance(messages, list):
        raise TypeError(
            f"{where} must return a list of chat messages ({{'role': ..., 'content': ...}}), "
            f"got {type(messages).__name__}"
        )
    for m in messages:
        if not (
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content", ""), str)
        ):
            raise TypeError(
                f"{where} returned {m!r}, not a chat message: each must be a dict with a str "
                "'role' and a str 'content'"
            )
    return messages


def check_step(step: object) -> Step:
    """``step`` if it is a well-formed :class:`Step`; a TypeError naming the problem otherwise
    (the env pool counts it as a ``bad_step``)."""
    if not isinstance(step, Step):
        raise TypeError(
            f"Env.step must return rljax.envs.Step(observation, reward, done, info), got "
            f"{type(step).__name__}"
        )
    check_messages(step.observation, "Env.step's Step.observation")
    if isinstance(step.reward, bool) or not isinstance(step.reward, int | float):
        raise TypeError(f"Step.reward must be a number, got {type(step.reward).__name__}")
    if step.reward != step.reward or abs(step.reward) == float("inf"):
        raise TypeError(f"Step.reward must be finite, got {step.reward}")
    if not isinstance(step.done, bool):
        raise TypeError(f"Step.done must be True or False, got {type(step.done).__name__}")
    if not isinstance(step.info, dict):
        raise TypeError(f"Step.info must be a dict, got {type(step.info).__name__}")
    return step
