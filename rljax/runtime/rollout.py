"""Groups of trajectories: assembly, request ids, and the JSON form checkpoints hold.

A :class:`~rljax.engine.sampler.Trajectory` is made by the sampler (so it lives in
``rljax.engine``, which must not import the runtime); a :class:`Group` is the G trajectories of
one prompt, scored: the unit the staleness buffer stores and the learner consumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from rljax.engine.sampler import Trajectory
from rljax.learner.batch import TrainSequence

# Lock-step request ids are (version + 1) * LOCKSTEP_ID_STRIDE + k, for the k-th request
# admitted at that version: a synchronous run's sampling seeds then depend only on the step,
# so a resumed run samples what an uninterrupted one would, with no id counter to restore.
LOCKSTEP_ID_STRIDE = 1_000_000


@dataclasses.dataclass
class Group:
    """A completed, scored GRPO group: the unit the buffer stores and the learner consumes."""

    request_id: int
    example: Any
    trajectories: list
    rewards: np.ndarray
    min_version: int


def lockstep_request_id(version: int, k: int) -> int:
    """The id of the ``k``-th request admitted at learner ``version`` in lock-step mode."""
    if not 0 <= k < LOCKSTEP_ID_STRIDE:
        raise RuntimeError(
            f"{k} requests admitted at version {version}: more than the {LOCKSTEP_ID_STRIDE} "
            "ids a lock-step version has; dynamic sampling is dropping nearly every group (check "
            "the reward), or turn buffer.dynamic_sampling off"
        )
    return (version + 1) * LOCKSTEP_ID_STRIDE + k


def make_group(example: Any, trajectories: Sequence, rewards: Sequence[float]) -> Group:
    """A Group from one request's trajectories (any order) and their rewards (same order)."""
    pairs = sorted(zip(trajectories, rewards, strict=True), key=lambda p: p[0].sample_index)
    trajs = [t for t, _ in pairs]
    return Group(
        request_id=trajs[0].group_id,
        example=example,
        trajectories=trajs,
        rewards=np.asarray([float(r) for _, r in pairs], np.float32),
        min_version=min(t.min_version for t in trajs),
    )


def train_sequence(t: Trajectory, advantage: float) -> TrainSequence:
    """What the learner trains on of a trajectory: prompt + response (a conversation's model
    and env tokens as the engine held them, never encoded again), its behaviour log-probs and
    versions, its loss mask (env tokens untrained) and the experts each response token was
    routed to (a mixture-of-experts model's; none for a dense one)."""
    return TrainSequence(
        list(t.prompt_tokens) + list(t.response_tokens),
        len(t.prompt_tokens),
        t.logprobs,
        float(advantage),
        t.versions,
        t.loss_mask or (),
        t.routes or (),
    )


def routes_digest(routes: Sequence[Sequence[Sequence[int]] | None]) -> str:
    """A short digest of a group's routes (``routes``: each trajectory's, in sample order; None
    where not recorded): what a train record logs per group, so an audit can tell the routes a
    resumed run trained on from those its checkpoint held (``rljax.testing.audit``). Computed
    on plain lists, so the audit reads them from a checkpoint's JSON without decoding it."""
    flat = [None if r is None else [[int(e) for e in ids] for ids in r] for r in routes]
    text = json.dumps(flat, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def encode_group(g: Group) -> dict[str, Any]:
    """A JSON-safe form of a buffered group, for checkpoints."""
    return {
        "request_id": g.request_id,
        "example": g.example,
        "trajectories": [dataclasses.asdict(t) for t in g.trajectories],
        "rewards": [float(r) for r in g.rewards],
        "min_version": g.min_version,
    }


def decode_group(d: dict[str, Any]) -> Group:
    """The inverse of :func:`encode_group`. A checkpoint written before conversations existed
    (no ``loss_mask``, ``env_reward``, ``env_info``) loads as single-turn trajectories, one
    written before routes were recorded (no ``routes``) as trajectories without routes."""
    trajs = [Trajectory(**t) for t in d["trajectories"]]
    return Group(
        d["request_id"], d["example"], trajs, np.asarray(d["rewards"], np.float32), d["min_version"]
    )
