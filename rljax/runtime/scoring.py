"""Scoring trajectories, sharded by process.

Each process runs the reward function (maybe an expensive verifier) only on its share of the
groups (:func:`rljax.mesh.distributed.group_owners`; in training that is exactly the prompts it
read), then the rewards and the failure counts are all-gathered, so every process builds the
same advantages and logs the same counts.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from rljax.engine.sampler import FINISH_STOP, Trajectory
from rljax.mesh import distributed
from rljax.rewards.pool import FAILURE_KINDS, RewardPool

log = logging.getLogger(__name__)


def completion_text(tokenizer, t: Trajectory) -> str:
    """The response the reward sees: decoded, without its stop token."""
    return response_text(tokenizer, t.response_tokens, t.finish_reason)


def response_text(tokenizer, tokens: list[int], finish_reason: str) -> str:
    """:func:`completion_text` from a trajectory's response tokens and finish reason."""
    if finish_reason == FINISH_STOP and tokens:
        tokens = tokens[:-1]
    # A checkpoint's embedding may be padded past the tokenizer; such ids decode to nothing.
    return tokenizer.decode([i for i in tokens if i < tokenizer.vocab_size])


def score(
    trajs: list[Trajectory], pool: RewardPool, tokenizer, shard_index: int, shard_count: int
) -> tuple[np.ndarray, dict[str, int]]:
    """(rewards of ``trajs`` in order, failures by kind summed over processes); a collective.

    Each trajectory's ``reward`` is set too.
    """
    owners = distributed.group_owners([t.group_id for t in trajs], shard_count)
    mine = [trajs[i] for i, p in enumerate(owners) if p == shard_index]
    # A conversation's reward is its env steps' sum (rljax.envs); the verifier scores the rest.
    single = [t for t in mine if t.env_reward is None]
    scored = iter(
        pool.score([completion_text(tokenizer, t) for t in single], [t.payload for t in single])
    )
    local = np.array(
        [t.env_reward if t.env_reward is not None else next(scored) for t in mine], np.float32
    )
    if log.isEnabledFor(logging.DEBUG):  # one JSON line per scoring, for pod debugging
        prompts = sorted({t.payload["prompt"] for t in mine})
        fields = {"process": shard_index, "prompts": prompts, "trajectories": len(mine)}
        fields["of"] = len(trajs)
        log.debug("data scored %s", json.dumps(fields))
    share = {"rewards": local.tolist(), "failures": pool.stats.by_kind()}
    # One shard (one process, or a pod's leader scoring for all): nothing to gather.
    shares = [share] if shard_count == 1 else distributed.allgather_objects(share)
    failures = {k: sum(share["failures"][k] for share in shares) for k in FAILURE_KINDS}
    rewards = np.zeros(len(trajs), np.float32)
    for p, share in enumerate(shares):
        rewards[[i for i, owner in enumerate(owners) if owner == p]] = share["rewards"]
    for t, r in zip(trajs, rewards, strict=True):
        t.reward = float(r)
    return rewards, failures
