"""What a :class:`~rljax.engine.sampler.Sampler` is asked for and gives back.

A :class:`Request` asks for ``num_samples`` responses to one prompt (a GRPO group); each
response comes back as a :class:`Trajectory` with a finish reason (:data:`FINISH_STOP` or
:data:`FINISH_LENGTH`), a behaviour log-prob and a params version per token. While the Sampler
holds it, a response is a :class:`Sample`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rljax.engine.state import SlotSampling

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclasses.dataclass
class Request:
    """One prompt and how to sample it."""

    prompt_tokens: Sequence[int]
    num_samples: int = 1
    max_new_tokens: int | None = None  # None: the engine's sampling.max_new_tokens
    seed: int = 0
    sampling: SlotSampling | None = None
    payload: Any = None  # carried to the Trajectory (e.g. the task example)
    request_id: int = -1  # assigned by submit() unless the caller sets a unique id >= 0
    home: int | None = None  # the slots it may take (rljax.engine.homes); None: any


@dataclasses.dataclass
class Trajectory:
    """A finished response with everything the learner needs."""

    prompt_tokens: list[int]
    response_tokens: list[int]
    logprobs: list[float]  # behaviour log-prob of each response token
    versions: list[int]  # params version that produced each response token
    finish_reason: str
    group_id: int  # the request id: samples of one prompt share it
    sample_index: int
    payload: Any = None
    reward: float | None = None

    @property
    def min_version(self) -> int:
        return min(self.versions) if self.versions else -1


@dataclasses.dataclass
class Sample:
    """One sample of a request in the Sampler's hands: its tokens so far, waiting for a slot,
    running, or held by an interrupt."""

    request: Request
    index: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    order: int = 0  # admission order: the highest is the youngest

    @property
    def budget(self) -> int:
        budget = self.request.max_new_tokens
        assert budget is not None, "Sampler.submit gives every request its max_new_tokens"
        return budget

    def to_trajectory(self, reason: str) -> Trajectory:
        r = self.request
        return Trajectory(
            list(r.prompt_tokens),
            self.tokens,
            self.logprobs,
            self.versions,
            reason,
            r.request_id,
            self.index,
            r.payload,
        )
