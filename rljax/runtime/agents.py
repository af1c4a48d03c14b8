"""The run's side of multi-turn conversations (rljax.envs, docs/agents.md): building them from
the config or ``env=``, a teacher's transcript as a conversation holds it, and their metrics."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rljax.config import ConfigError, RunConfig
from rljax.engine.sampler import Trajectory
from rljax.envs.base import Env
from rljax.envs.conversation import ENV_ERROR_KINDS, Conversations
from rljax.envs.registry import env_factory
from rljax.envs.render import ChatRenderer
from rljax.learner.batch import TrainSequence


def build(
    cfg: RunConfig, tokenizer, reward: Callable[[str, dict], float], env: Callable[[], Env] | None
) -> Conversations | None:
    """The run's conversations: ``env`` (a factory) or ``env.name``'s; None without either."""
    if env is None and not cfg.env.name:
        return None
    if jax.process_count() > 1:
        raise ConfigError(
            "an env (config key 'env.name' or rljax.run(..., env=)) runs on one process for now "
            f"(this run has {jax.process_count()}: a conversation's env would have to run "
            "where its sampler slot is); run agents on one host"
        )
    factory = env if env is not None else env_factory(cfg, reward)
    return Conversations(
        factory,
        ChatRenderer(tokenizer),
        max_turns=cfg.env.max_turns,
        step_timeout_s=cfg.env.step_timeout_s,
        num_workers=cfg.env.num_workers,
        on_failure=cfg.env.on_failure,
    )


def transcript_sequence(
    conversations: Conversations | None, example: dict, transcript: list[dict], tokenizer
) -> TrainSequence:
    """A teacher's conversation as the engine would hold it: the env's prompt, each assistant
    message's ids and a stop token (trained), each run of other messages rendered as one
    observation (not trained)."""
    if conversations is None:
        raise ConfigError(
            f"the warm start's teacher answered {example.get('id')!r} with a conversation, "
            "which needs an env to render it (env.name or rljax.run(..., env=)); set env.name "
            "or use a single-turn teacher"
        )
    renderer, stop_id = conversations.renderer, tokenizer.eos_id
    prompt = conversations.prompt(example)
    tokens, mask = list(prompt), []
    pending: list[dict] = []
    for message in transcript:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            ids = renderer.observation_ids(pending)
            tokens += ids
            mask += [0] * len(ids)
            pending = []
        ids = renderer.tokenizer.encode(message["content"], add_bos=False) + [stop_id]
        tokens += ids
        mask += [1] * len(ids)
    if pending or not mask:
        raise ValueError(
            "a teacher's transcript must end with an assistant message (the answer); got "
            f"{[m['role'] for m in transcript]}"
        )
    return TrainSequence(tokens, len(prompt), loss_mask=mask)


class EnvMetrics:
    """Counters over the conversations scored so far, for the run's metrics: turns per
    conversation (of the latest scoring), tool calls, tool and env errors by kind, env
    seconds, and the prefill tokens the sampler saved by keeping the KV."""

    def __init__(self) -> None:
        self.totals: collections.Counter[str] = collections.Counter()
        self.env_s = 0.0
        self.turns_per_conversation = float("nan")

    def add(self, trajs: Sequence[Trajectory]) -> None:
        infos = [t.env_info for t in trajs if t.env_info is not None]
        if not infos:
            return
        self.turns_per_conversation = sum(i.get("turns", 0) for i in infos) / len(infos)
        for info in infos:
            self.env_s += float(info.get("env_s", 0.0))
            for key, value in info.items():
                if key != "env_s":
                    self.totals[key] += int(value)

    def metrics(self, sampler_stats: dict[str, int] | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turns_per_conversation": self.turns_per_conversation,
            "tool_calls": self.totals["tool_calls"],
            "env_s": self.env_s,
        }
        out |= {k: v for k, v in self.totals.items() if k.startswith("tool_errors/")}
        out |= {f"env_errors/{k}": self.totals[f"env_errors/{k}"] for k in ENV_ERROR_KINDS}
        stats = sampler_stats or {}
        out["prefill_tokens_saved"] = int(stats.get("prefill_tokens_saved", 0))
        out["turn_re_prefills"] = int(stats.get("turn_re_prefills", 0))
        return out
