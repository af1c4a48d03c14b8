"""Scoring on a pod: the sampler hosts share the verifier's work, the leader gathers.

Every sampler host ran the same generate steps, so any of them can score a trajectory; each
scores the ones that ran in its own slots, from prompts it read (the example's stream
position ``p``, host ``p % n``: :mod:`rljax.runtime.pod_prompts`), and a trajectory with no
position (an evaluation prompt) goes to host ``group_id % n``. The leader cuts each scoring
call so, posts each follower its share, scores its own share meanwhile, then gathers the
followers' rewards through the coordination service. A share
travels as response tokens and the example, a few hundred bytes a group; the follower decodes
and scores it in its own :class:`~rljax.rewards.pool.RewardPool`, on a thread beside the steps
it replays, so a verifier that raises, hangs or returns NaN is isolated and counted on the host
that ran it. Each result carries that host's failure counts, which the leader sums. A
conversation's reward is its env's, which the same host gave (:mod:`rljax.runtime.pod_envs`):
it is not shared.

Keys: ``score/<epoch>/<host>/<n>`` (a share; null tells the follower to stop) and
``scored/<epoch>/<host>/<n>``; the epoch is the pod's resize count, so a rebuilt pod never
meets an earlier build's keys. Each key is deleted by its reader.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.engine.sampler import Trajectory
from rljax.mesh.control import Channel, ChannelThread, host_key
from rljax.rewards.pool import FAILURE_KINDS, RewardPool
from rljax.runtime.pod_prompts import owner, task_example
from rljax.runtime.scoring import completion_text, response_text


def owners(trajs: list[Trajectory], hosts: int) -> list[int]:
    """The sampler host (an index into the sampler's processes) that scores each trajectory."""
    return [owner(t.payload, t.group_id, hosts) for t in trajs]


def _share(trajs: list[Trajectory]) -> dict[str, list]:
    return {
        "tokens": [t.response_tokens for t in trajs],
        "finish": [t.finish_reason for t in trajs],
        "examples": [task_example(t.payload) for t in trajs],
    }


class PodScorer:
    """The leader's side: :meth:`score` returns what ``scoring.score`` does (rewards, failures
    by kind), with the work shared among the sampler hosts ``hosts`` (the leader first).

    ``scored`` (``{host: trajectories}``) is added to as hosts score; a run passes one dict to
    every build's scorer, so it counts across resizes.
    """

    def __init__(
        self,
        channel: Channel,
        hosts: tuple[int, ...],
        epoch: int,
        pool,
        tokenizer,
        scored: dict[int, int] | None = None,
    ):
        self.channel, self.hosts, self.epoch = channel, hosts, epoch
        self.pool, self.tokenizer = pool, tokenizer
        self._sent = dict.fromkeys(hosts[1:], 0)
        self._failures = {h: dict.fromkeys(FAILURE_KINDS, 0) for h in hosts[1:]}
        self.scored = {} if scored is None else scored

    def score(self, trajs: list[Trajectory]) -> tuple[np.ndarray, dict[str, int]]:
        """(rewards of ``trajs`` in order, failures by kind summed over the sampler hosts).

        A conversation's reward is its env steps' sum, which its home host's env already gave
        (:mod:`rljax.runtime.pod_envs`); the verifier scores the rest."""
        scored, env = owners(trajs, len(self.hosts)), [t.env_reward for t in trajs]
        shares = [
            [j for j, o in enumerate(scored) if o == i and env[j] is None]
            for i in range(len(self.hosts))
        ]
        posted = []
        for host, share in zip(self.hosts[1:], shares[1:], strict=True):
            if share:
                n = self._sent[host]
                key = host_key("score", self.epoch, host, n)
                self.channel.post(key, _share([trajs[j] for j in share]))
                posted.append((host, share, n))
                self._sent[host] += 1
        rewards = np.array([0.0 if r is None else r for r in env], np.float32)
        if shares[0]:
            texts = [completion_text(self.tokenizer, trajs[j]) for j in shares[0]]
            examples = [task_example(trajs[j].payload) for j in shares[0]]
            rewards[shares[0]] = self.pool.score(texts, examples)
        for host, share, n in posted:
            key = host_key("scored", self.epoch, host, n)
            result = self.channel.get(key, waiting_for=f"sampler host {host}'s rewards")
            self.channel.delete(key)
            rewards[share] = result["rewards"]
            self._failures[host] = result["failures"]
        for host, share in zip(self.hosts, shares, strict=True):
            self.scored[host] = self.scored.get(host, 0) + len(share)
        for t, r in zip(trajs, rewards, strict=True):
            t.reward = float(r)
        return rewards, self.failures()

    def failures(self) -> dict[str, int]:
        mine = self.pool.stats.by_kind()
        return {k: mine[k] + sum(f[k] for f in self._failures.values()) for k in FAILURE_KINDS}

    def stop(self) -> None:
        """Tell every follower's server to stop (before the pod ends or resizes)."""
        for host, n in self._sent.items():
            self.channel.post(host_key("score", self.epoch, host, n), None)


class ScoreServer(ChannelThread):
    """A sampler follower's side: a thread scoring the shares the leader posts, until told to
    stop. An error here fails the pod (:meth:`Channel.fail`), naming this process."""

    def __init__(
        self, channel: Channel, me: int, epoch: int, pool: RewardPool, tokenizer: Any
    ) -> None:
        super().__init__(channel, "pod-scoring")
        self.me, self.epoch = me, epoch
        self.pool, self.tokenizer = pool, tokenizer
        self.start()

    def _serve(self) -> None:
        n = 0
        while True:
            key = host_key("score", self.epoch, self.me, n)
            share = self.channel.get(key, waiting_for="the leader's next scoring share")
            self.channel.delete(key)
            if share is None:
                return
            pairs = zip(share["tokens"], share["finish"], strict=True)
            texts = [response_text(self.tokenizer, *p) for p in pairs]
            rewards = self.pool.score(texts, share["examples"])
            result = {"rewards": rewards.tolist(), "failures": self.pool.stats.by_kind()}
            self.channel.post(host_key("scored", self.epoch, self.me, n), result)
            n += 1
