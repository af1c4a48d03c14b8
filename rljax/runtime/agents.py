"""The run's side of multi-turn conversations (rljax.envs, docs/agents.md): building them from
the config or ``env=``, a teacher's transcript as a conversation holds it, and their metrics."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rljax.config import ConfigError, RunConfig
from rljax.engine.sampler import Trajectory
from rljax.envs.base import Env
from rljax.envs.conversation import ENV_ERROR_KINDS, Conversations
from rljax.envs.registry import env_factory
from rljax.envs.render import ChatRenderer
from rljax.envs.tool_calls import tool_call_text, tool_results
from rljax.learner.batch import TrainSequence
from rljax.models.tokenizer import Tokenizer


def build(
    cfg: RunConfig,
    tokenizer: Tokenizer,
    reward: Callable[[str, dict], float],
    env: Callable[[], Env] | None,
) -> Conversations | None:
    """The run's conversations: ``env`` (a factory) or ``env.name``'s; None without either."""
    if env is None and not cfg.env.name:
        return None
    if jax.process_count() > 1 and cfg.mesh.mode != "split":
        raise ConfigError(
            "an env (config key 'env.name' or rljax.run(..., env=)) on several processes runs "
            f"on a pod (this run has {jax.process_count()} processes sharing both meshes, and "
            "each would step its own envs); set mesh.mode='split' with the sampler and the "
            "learner on whole hosts, or run agents on one host"
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
    conversations: Conversations | None,
    example: dict,
    transcript: list[dict],
    tokenizer: Tokenizer,
    tool_format: str = "hermes",
) -> TrainSequence:
    """A teacher's conversation as the engine would hold it: the env's prompt, each assistant
    message's ids and the template's end-of-turn stop token (trained), each run of other
    messages rendered as one observation (not trained), its tool results in ``tool_format``'s
    form."""
    if conversations is None:
        raise ConfigError(
            f"the warm start's teacher answered {example.get('id')!r} with a conversation, "
            "which needs an env to render it (env.name or rljax.run(..., env=)); set env.name "
            "or use a single-turn teacher"
        )
    renderer = conversations.renderer
    stop_id = renderer.turn_end_id
    prompt = conversations.prompt(example)
    tokens, mask = list(prompt), []
    pending: list[dict] = []
    for message in transcript:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            ids = renderer.observation_ids(tool_results(pending, tool_format))
            tokens += ids
            mask += [0] * len(ids)
            pending = []
        text = message["content"]
        if message.get("tool_calls"):  # a call, written as the run's tool format writes it
            text += tool_call_text(message["tool_calls"], tool_format)
        ids = renderer.tokenizer.encode(text, add_bos=False) + [stop_id]
        tokens += ids
        mask += [1] * len(ids)
    if pending or not mask:
        raise ValueError(
            "a teacher's transcript must end with an assistant message (the answer); got "
            f"{[m['role'] for m in transcript]}"
        )
    return TrainSequence(tokens, len(prompt), loss_mask=mask)


class EnvMetrics:
    """What the conversations trained on since the last train step logged: turns per
    conversation, tool calls, tool and env errors by kind, env seconds, and the prefill tokens
    the sampler saved by keeping the KV (and its re-prefills) since then. Per step, not since
    the process started, so a resumed run logs what an uninterrupted one does (in sync mode,
    where no conversation spans a step boundary). Evaluation's conversations are not counted
    (:meth:`skip`). Scoring and logging may run on different threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._env_s = 0.0
        self._sampler: dict[str, int] = {}

    def add(self, trajs: Sequence[Trajectory]) -> None:
        infos = [t.env_info for t in trajs if t.env_info is not None]
        with self._lock:
            for info in infos:
                self._counts["conversations"] += 1
                self._env_s += float(info.get("env_s", 0.0))
                for key, value in info.items():
                    if key != "env_s":
                        self._counts[key] += int(value)

    def skip(self, sampler_stats: dict[str, int] | None) -> None:
        """Forget what was added since the last step (an evaluation's conversations)."""
        with self._lock:
            self._counts.clear()
            self._env_s = 0.0
            self._sampler = dict(sampler_stats or {})

    def metrics(self, sampler_stats: dict[str, int] | None) -> dict[str, Any]:
        """This step's figures; the counts start again from zero."""
        stats = dict(sampler_stats or {})
        with self._lock:
            counts, env_s, before = self._counts, self._env_s, self._sampler
            self._counts, self._env_s, self._sampler = collections.Counter(), 0.0, stats
        n = counts.pop("conversations", 0)
        out: dict[str, Any] = {
            "turns_per_conversation": counts["turns"] / n if n else float("nan"),
            "tool_calls": counts["tool_calls"],
            "env_s": env_s,
        }
        out |= {k: v for k, v in counts.items() if k.startswith("tool_errors/")}
        out |= {f"env_errors/{k}": counts[f"env_errors/{k}"] for k in ENV_ERROR_KINDS}
        for key in ("prefill_tokens_saved", "turn_re_prefills"):
            out[key] = int(stats.get(key, 0)) - int(before.get(key, 0))
        return out
