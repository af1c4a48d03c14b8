"""What a :class:`~rljax.engine.sampler.Sampler` is asked for and gives back.

A :class:`Request` asks for ``num_samples`` responses to one prompt (a GRPO group); each
response comes back as a :class:`Trajectory` with a finish reason (:data:`FINISH_STOP` or
:data:`FINISH_LENGTH`), a behaviour log-prob and a params version per token. While the Sampler
holds it, a response is a :class:`Sample`.

A request with ``turns`` is a conversation (multi-turn, docs/agents.md): each sample gets its
own :class:`Turns` (the environment as the Sampler sees it). When a model turn ends (a stop
token), the Sampler asks it for the next turn's tokens and, while it waits, decodes other
slots. The trajectory's response then holds model and env tokens interleaved; ``loss_mask``
tells them apart (env tokens: log-prob 0.0, version :data:`ENV_VERSION`).

A :class:`Recorder` holds the stop rules: it appends each sampled token to its sample and
tells which samples go on, which finished and which conversations ended a model turn.

**Routes** (mixture-of-experts models, an engine built with ``record_routes``): each model token
of a response carries the experts it was routed to (flat: Lm MoE layers x k ids) when it was
FED to the model, the step that drew the token after it (a decode step, or a later turn's or a
resumed sample's prefill). A token keeps the routes of its first feed, whatever params fed it
later (an in-flight swap, a re-prefill); the last token (never fed) and env tokens have none
(``[]``). :meth:`Sample.feed_routes` records them; the learner replays them (docs/moe.md).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rljax.engine.state import ResultTokens, SlotSampling

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
ENV_VERSION = -1  # the version an env token carries: no policy produced it


class Turns(Protocol):
    """One conversation's environment, as the Sampler sees it (made per sample)."""

    def next_turn(self, turn_tokens: list[int]) -> concurrent.futures.Future[list[int] | None]:
        """Called (on the sampler thread, must not block) when a model turn ends: the tokens the
        model decoded in this turn, its stop token included. The future resolves to the token
        ids to append (the chat template's rendering of the observation plus the header that
        opens the next assistant turn), or None when the conversation is over (done, limits,
        or a failure). It never resolves to an exception."""
        ...

    @property
    def reward(self) -> float:
        """The sum of the steps' rewards so far."""
        ...

    @property
    def info(self) -> dict:
        """Counters for metrics: turns, tool_calls, errors by kind, env_s."""
        ...


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
    # A conversation: called once per sample (argument: the sample index) when the sample is
    # made; None: single-turn.
    turns: Callable[[int], Turns] | None = None

    def check(self, max_prefill_length: int, budget: int) -> None:
        """Raise ValueError unless an engine whose prompts hold up to ``max_prefill_length``
        tokens and responses up to ``budget`` (``sampling.max_new_tokens``) can serve this."""
        n = len(self.prompt_tokens)
        if n == 0:
            raise ValueError("a request's prompt_tokens is empty; give at least one token")
        if n > max_prefill_length:
            raise ValueError(
                f"prompt of {n} tokens is longer than sampling.max_prefill_length="
                f"{max_prefill_length}; raise it or truncate the prompt"
            )
        if self.max_new_tokens is not None and not 0 < self.max_new_tokens <= budget:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} must be in [1, {budget}] "
                "(sampling.max_new_tokens bounds the KV cache)"
            )
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} must be >= 1")


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
    # A conversation's: 1 = model token, 0 = env token (None: every token is the model's).
    loss_mask: list[int] | None = None
    env_reward: float | None = None  # the Turns' reward (None: single-turn)
    env_info: dict | None = None  # the Turns' counters (None: single-turn)
    # Per response token, the flat Lm*k expert ids it was routed to when fed ([]: never fed, or
    # an env token); None: not recorded (a dense model, or an engine not recording).
    routes: list[list[int]] | None = None

    @property
    def min_version(self) -> int:
        """The oldest version of a model token (env tokens' :data:`ENV_VERSION` is not one);
        -1 when there is none."""
        model = [v for v in self.versions if v != ENV_VERSION]
        return min(model) if model else -1


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
    turns: Turns | None = None  # made from request.turns when the sample is made
    loss_mask: list[int] = dataclasses.field(default_factory=list)  # conversations only
    turn_start: int = 0  # where the current model turn begins in ``tokens``
    # The env's next turn while the conversation waits for it; None while the model decodes.
    future: concurrent.futures.Future | None = None
    routes: list[list[int]] | None = None  # per response token, as Trajectory.routes

    def feed_routes(self, first: int, rows: Any) -> None:
        """Record the routes of response tokens ``first, first + 1, ...`` as fed to the model
        (``rows``: [n, Lm*k] ints, one row per token fed). Only model tokens that have none
        take them: a token keeps the routes of its first feed; env tokens and indices outside
        the response (prompt tokens) take none."""
        if self.routes is None:
            self.routes = []
        self.routes.extend([] for _ in range(len(self.tokens) - len(self.routes)))
        for i, row in enumerate(rows):
            j = first + i
            if not 0 <= j < len(self.tokens) or self.routes[j]:
                continue
            if self.loss_mask and not self.loss_mask[j]:  # an env token
                continue
            self.routes[j] = [int(e) for e in row]

    def __post_init__(self) -> None:
        if self.request.turns is not None and self.turns is None:
            self.turns = self.request.turns(self.index)

    def append_env(self, ids: Sequence[int]) -> None:
        """Append the env's tokens (no log-prob, no version, no loss) and open a model turn."""
        self.tokens.extend(int(t) for t in ids)
        self.logprobs.extend(0.0 for _ in ids)
        self.versions.extend(ENV_VERSION for _ in ids)
        self.loss_mask.extend(0 for _ in ids)
        self.turn_start = len(self.tokens)

    @property
    def budget(self) -> int:
        budget = self.request.max_new_tokens
        assert budget is not None, "Sampler.submit gives every request its max_new_tokens"
        return budget

    def to_trajectory(self, reason: str) -> Trajectory:
        r = self.request
        t = Trajectory(
            list(r.prompt_tokens),
            self.tokens,
            self.logprobs,
            self.versions,
            reason,
            r.request_id,
            self.index,
            r.payload,
        )
        if self.turns is not None:
            t.loss_mask = list(self.loss_mask)
            t.env_reward = float(self.turns.reward)
            t.env_info = dict(self.turns.info)
        if self.routes is not None:
            t.routes = [list(r) for r in self.routes]
            t.routes.extend([] for _ in range(len(self.tokens) - len(t.routes)))
        return t


class Recorder:
    """Appends sampled tokens to their samples and tells which go on: the stop rules.

    ``stop_ids`` and ``stop_strings`` (read by ``detokenize`` from the current turn's tokens)
    end a sample with :data:`FINISH_STOP`; its budget (``max_new_tokens``) with
    :data:`FINISH_LENGTH`. ``stats``: the Sampler's counters (``tokens``), shared on purpose.
    """

    def __init__(
        self,
        stop_ids: Sequence[int],
        stop_strings: Sequence[str],
        detokenize: Callable[[list[int]], str] | None,
        stats: collections.Counter[str],
    ):
        if stop_strings and detokenize is None:
            raise ValueError("stop_strings need a detokenize function to read the text")
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.stop_strings = tuple(stop_strings)
        self.detokenize = detokenize
        self._stats = stats

    def record(
        self,
        samples: Sequence[Sample],
        result: ResultTokens,
        rows: Sequence[int],
        version: int,
        finished: list[Trajectory],
        fed_routes: np.ndarray | None = None,
    ) -> tuple[list[int], list[Sample]]:
        """Append each valid row's token (drawn by params ``version``) to its sample.

        ``fed_routes`` (a decode step's, [rows, Lm*k]): the routes of the token each row fed,
        its sample's last token, recorded before the new one is appended. Returns the indices
        of the samples still running, and the conversations whose model turn ended (neither
        running nor finished: their env is asked next). The samples that finished go to
        ``finished``."""
        tokens, valid, logprobs = result.tokens, result.valid, result.logprobs
        running, turn_ended = [], []
        for i, (s, row) in enumerate(zip(samples, rows, strict=True)):
            if not valid[row]:
                running.append(i)
                continue
            if fed_routes is not None:
                s.feed_routes(len(s.tokens) - 1, fed_routes[row : row + 1])
            token = int(tokens[row])
            s.tokens.append(token)
            s.logprobs.append(float(logprobs[row]))
            s.versions.append(version)
            if s.turns is not None:
                s.loss_mask.append(1)
            self._stats["tokens"] += 1
            reason = self._finish_reason(s, token)
            if reason == FINISH_STOP and s.turns is not None:
                turn_ended.append(s)
            elif reason:
                finished.append(s.to_trajectory(reason))
            else:
                running.append(i)
        return running, turn_ended

    def _finish_reason(self, s: Sample, token: int) -> str | None:
        if token in self.stop_ids:
            return FINISH_STOP
        if self.stop_strings and self.detokenize is not None:  # __init__ checked it is given
            text = self.detokenize(s.tokens[s.turn_start :])  # this turn's (one turn's all)
            if any(stop in text for stop in self.stop_strings):
                return FINISH_STOP
        if len(s.tokens) >= s.budget:
            return FINISH_LENGTH
        return None
