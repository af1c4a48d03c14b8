"""The other processes of a pod: they replay the leader's ticks (:mod:`rljax.runtime.pod`).

A sampler follower replays the sampler operations, so its engine state stays the leader's; a
learner process trains, sends weights and saves as the ticks say. Both replay through
:func:`replay`, which fails the pod at once on an operation it does not know. At the end each
learner process hashes its shards of the params (:func:`shard_digests`), and the leader
compares every copy of every shard (:func:`compare_replicas`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from rljax.engine.sampler import Sampler
from rljax.learner.learner import Learner
from rljax.mesh.control import Channel
from rljax.mesh.pod_weights import PodWeights
from rljax.mesh.roles import Roles
from rljax.runtime.clocks import compile_seconds
from rljax.runtime.env_answers import EnvAnswers
from rljax.runtime.hosted import HostedRun
from rljax.runtime.pod import (
    Op,
    PodProtocolError,
    decode_request,
    parse_op,
    report_progress,
)
from rljax.runtime.rollout import decode_group


class ReplayHost(Protocol):
    """What a replaying process reads of its hosting (rljax.runtime.pod_hosting.PodHosting)."""

    channel: Channel
    roles: Roles | None
    weights: PodWeights
    answers: EnvAnswers | None

    def save_state(
        self, run: HostedRun, version: int, meta: dict[str, Any], *, wait: bool
    ) -> None: ...


def replay(
    channel: Channel, k: int, handlers: dict[Op, Callable[[Any], Any]]
) -> tuple[int, Op, Any]:
    """Replay the leader's ticks from ``k`` with ``handlers`` (an operation this role has no
    handler for is none of its business) until END or RESIZE; returns (the next tick, that
    operation, its argument). An unknown operation fails the pod (:func:`parse_op`)."""
    while True:
        report_progress(channel, k)
        for name, arg in channel.get(f"tick/{k}", waiting_for=f"the leader's tick {k}"):
            op = parse_op(name, k)
            if op in (Op.END, Op.RESIZE):
                return k + 1, op, arg
            handler = handlers.get(op)
            if handler is not None:
                handler(arg)
        k += 1


def follow_sampler(
    run: HostedRun, hosting: ReplayHost, sampler: Sampler, k: int = 0
) -> tuple[int, Op, Any]:
    """A sampler follower: replays the leader's sampler operations from tick ``k``. A step
    applies the env answers the leader took (never this host's own futures), and a
    conversation's turns are made here (:mod:`rljax.runtime.env_answers`)."""
    weights = hosting.weights
    answers = hosting.answers
    turns = None if answers is None or answers.conversations is None else answers.turns
    return replay(
        hosting.channel,
        k,
        {
            Op.SUBMIT: lambda arg: sampler.submit([decode_request(r, turns) for r in arg]),
            Op.SWAP: lambda version: sampler.set_params(weights.move(), version),
            Op.STEP: lambda answers: sampler.step(answers or []),
            Op.INTERRUPT: sampler.interrupt,
            Op.RESUME: sampler.resume,
            Op.ABORT: sampler.abort,
            Op.CLEAR: lambda _: sampler.clear(),
            Op.SAVE: lambda arg: hosting.save_state(
                run, arg["version"], arg["meta"], wait=arg["wait"]
            ),
        },
    )


def follow_learner(
    run: HostedRun, hosting: ReplayHost, learner: Learner, k: int = 0
) -> tuple[int, Op, Any]:
    """A learner process: ``learner`` trains, sends weights and saves as the leader's ticks
    say, from tick ``k``."""
    channel, roles = hosting.channel, hosting.roles
    assert roles is not None

    def check_version(version: int, what: str) -> None:
        if version != learner.version:
            raise PodProtocolError(
                f"pod out of order: {what} {version} on a learner at version "
                f"{learner.version} (a bug in the tick stream)"
            )

    def swap(version: int) -> None:
        check_version(version, "the leader swaps to version")
        hosting.weights.move(learner.params)

    def learn(arg: dict[str, Any]) -> None:
        check_version(arg["version"], "a step for version")
        groups = [decode_group(g) for g in arg["groups"]]
        compiled = compile_seconds()
        metrics = learner.step(run.make_batch(groups))
        if roles.is_learner_leader:
            metrics["compile_s"] = compile_seconds() - compiled
            channel.post(f"done/{arg['version']}", _plain(metrics))

    def sft(_: Any) -> None:
        run.warm_start_learner(learner)
        if roles.is_learner_leader:
            channel.post("done/sft", {})

    return replay(
        channel,
        k,
        {
            Op.SWAP: swap,
            Op.LEARN: learn,
            Op.SFT: sft,
            Op.SAVE: lambda arg: hosting.save_state(
                run, arg["version"], arg["meta"], wait=arg["wait"]
            ),
        },
    )


def shard_digests(params: Any) -> dict[str, list[str]]:
    """This process's shards of ``params``: {leaf path and shard index: [sha256 per device]}."""
    out: dict[str, list[str]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        for shard in sorted(leaf.addressable_shards, key=lambda s: s.device.id):
            key = f"{jax.tree_util.keystr(path)}{shard.index}"
            data = np.ascontiguousarray(np.asarray(shard.data))
            out.setdefault(key, []).append(hashlib.sha256(data.tobytes()).hexdigest()[:16])
    return out


def compare_replicas(digests: list[dict[str, list[str]]]) -> dict[str, Any]:
    """Whether every copy of every shard, across the learner processes, holds the same bytes."""
    held: dict[str, list[str]] = {}
    for one in digests:
        for key, values in one.items():
            held.setdefault(key, []).extend(values)
    replicated = [k for k, v in held.items() if len(v) > 1]
    differ = sorted(k for k in replicated if len(set(held[k])) > 1)
    return {
        "processes": len(digests),
        "shards": len(held),
        "replicated_shards": len(replicated),
        "equal": not differ,
        "differ": differ[:5],
    }


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` as JSON: arrays of one element become numbers."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out[key] = _plain(value)
        elif hasattr(value, "item") and getattr(value, "size", 1) == 1:
            out[key] = value.item()
        elif isinstance(value, (int, float, str, bool, list)) or value is None:
            out[key] = value
        else:
            out[key] = float(value)
    return out
