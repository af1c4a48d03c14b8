"""Scoring trajectories, shared among the processes that read the prompts.

Each participant of the run's :class:`~rljax.runtime.exchange.Exchange` runs the reward
function (maybe an expensive verifier) only on the groups it owns, those of the prompts it read
(:func:`rljax.runtime.prompts.owner_key`), in its own :class:`~rljax.rewards.pool.RewardPool`,
so a verifier that raises, hangs or returns NaN is isolated and counted where it ran. The
rewards and each participant's failure counts come back to whoever asked (every process of an
SPMD program, a pod's leader), which sums the counts. A trajectory travels as its response
tokens, finish reason and example, a few hundred bytes; the owner decodes it.

A conversation's reward is the sum its env's steps gave (:mod:`rljax.envs`), on the host that
ran it; only the others are scored here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.rewards.pool import FAILURE_KINDS, RewardPool
from rljax.runtime.exchange import Exchange, spread
from rljax.runtime.prompts import owner_key, task_example

log = logging.getLogger(__name__)

TOPIC = "score"


def completion_text(tokenizer: Any, t: Trajectory) -> str:
    """The response the reward sees: decoded, without its stop token."""
    return response_text(tokenizer, t.response_tokens, t.finish_reason)


def response_text(tokenizer: Any, tokens: list[int], finish_reason: str) -> str:
    """:func:`completion_text` from a trajectory's response tokens and finish reason."""
    if finish_reason == FINISH_STOP and tokens:
        tokens = tokens[:-1]
    # A checkpoint's embedding may be padded past the tokenizer; such ids decode to nothing.
    return tokenizer.decode([i for i in tokens if i < tokenizer.vocab_size])


class Scorer:
    """Rewards for trajectories, each scored by the participant that owns its group.

    ``scored`` (``{participant: trajectories}``) is added to as participants score; a run
    passes one dict to every build's scorer, so it counts across resizes.
    """

    def __init__(
        self,
        exchange: Exchange,
        pool: RewardPool,
        tokenizer: Any,
        scored: dict[int, int] | None = None,
    ):
        self.exchange, self.pool, self.tokenizer = exchange, pool, tokenizer
        self.scored = {} if scored is None else scored

    def score(self, trajs: list[Trajectory]) -> tuple[np.ndarray, dict[str, int]]:
        """(rewards of ``trajs`` in order, failures by kind summed over the participants);
        each trajectory's ``reward`` is set too. Every participant that holds the trajectories
        calls it alike (a pod's followers serve it instead: :meth:`score_share`)."""
        rewards = np.array([t.env_reward or 0.0 for t in trajs], np.float32)
        todo = [i for i, t in enumerate(trajs) if t.env_reward is None]
        keys = [owner_key(trajs[i].payload, trajs[i].group_id) for i in todo]
        items = [
            [trajs[i].response_tokens, trajs[i].finish_reason, task_example(trajs[i].payload)]
            for i in todo
        ]
        indices, shares = spread(self.exchange, TOPIC, keys, items, self.score_share)
        for p, (share, result) in enumerate(zip(indices, shares, strict=True)):
            rewards[[todo[i] for i in share]] = result["rewards"]
            self.scored[p] = self.scored.get(p, 0) + len(share)
        if log.isEnabledFor(logging.DEBUG):  # one JSON line per scoring, for pod debugging
            mine = [trajs[todo[i]] for i in indices[self.exchange.index]]
            prompts = sorted({t.payload["prompt"] for t in mine})
            fields = {"process": self.exchange.index, "prompts": prompts}
            fields |= {"trajectories": len(mine), "of": len(trajs)}
            log.debug("data scored %s", json.dumps(fields))
        for t, r in zip(trajs, rewards, strict=True):
            t.reward = float(r)
        failures = {k: sum(int(s["failures"][k]) for s in shares) for k in FAILURE_KINDS}
        return rewards, failures

    def score_share(self, items: list[Any]) -> dict[str, Any]:
        """This participant's share: rewards of ``items`` ``[tokens, finish, example]`` and its
        pool's failure counts so far (the ``work`` of every transport)."""
        texts = [response_text(self.tokenizer, tokens, finish) for tokens, finish, _ in items]
        rewards = self.pool.score(texts, [example for _, _, example in items])
        return {"rewards": rewards.tolist(), "failures": self.pool.stats.by_kind()}

    def stop(self) -> None:
        """The end of a build: a pod follower's scoring server returns."""
        self.exchange.close(TOPIC)
