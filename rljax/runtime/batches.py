"""What the sampler and the learner are handed, from examples and groups.

:class:`Encoding` owns what that takes (the tokenizer, the task's prompt format, the loss, the
conversations of a run with an env, and the data-parallel size batches are packed for) and is
called by the run: a request per example (its sampling seed a function of the run seed and the
request id alone), a packed train batch per list of groups (group-normalised advantages), and
a warm start's sequence per teacher answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np

from rljax.config import RunConfig
from rljax.data.tasks import encode_prompt
from rljax.data.teachers import Answer
from rljax.engine.sampler import Request
from rljax.engine.state import SlotSampling
from rljax.envs.conversation import Conversations
from rljax.learner.advantages import outcome_advantages, resolve_scale
from rljax.learner.batch import TrainBatch, TrainSequence, pack_batch
from rljax.learner.loss_names import TOKEN_ADVANTAGES
from rljax.learner.losses import Loss
from rljax.runtime import agents
from rljax.runtime.prompts import task_example
from rljax.runtime.rollout import Group, train_sequence

log = logging.getLogger("rljax.runtime.run")  # the data events' logger, for pod debugging


class Encoding:
    """Requests from examples, train batches from groups, warm-start sequences from answers."""

    def __init__(
        self, cfg: RunConfig, tokenizer: Any, loss: Loss, conversations: Conversations | None
    ):
        self.cfg, self.tokenizer, self.loss = cfg, tokenizer, loss
        self.conversations = conversations
        self.dp = 1  # the learner's data-parallel size: rows are packed in multiples of it

    def use_dp(self, dp: int) -> None:
        """Pack for a learner of ``dp`` data-parallel devices (set when the learner is built)."""
        self.dp = dp

    def prompt(self, example: dict) -> list[int]:
        """``example``'s prompt tokens (a conversation's first turn with an env)."""
        if self.conversations is not None:
            return self.conversations.prompt(task_example(example))
        return encode_prompt(self.tokenizer, self.cfg.data, example)

    def request(
        self,
        example: dict,
        request_id: int,
        *,
        home: int | None,
        greedy: bool = False,
        samples: int | None = None,
        sampling: SlotSampling | None = None,
    ) -> Request:
        """A request for ``example``: G samples, or one greedy sample for evaluation, or
        ``samples`` with ``sampling`` (an evaluation's k). A conversation's Turns are bound
        where it runs (:mod:`rljax.runtime.env_answers`)."""
        cfg = self.cfg
        # a conversation's token budget over all its turns (0: max_new_tokens alone)
        budget = (cfg.env.max_tokens or None) if self.conversations is not None else None
        if greedy:
            samples, sampling = 1, SlotSampling(temperature=0.0)
        return Request(
            self.prompt(example),
            samples or cfg.learner.group_size,
            seed=(cfg.seed * 1_000_003 + request_id) % (2**31 - 1),
            sampling=sampling,
            payload=example,
            request_id=request_id,
            home=home,
            max_new_tokens=budget,
        )

    def pack(self, seqs: list[TrainSequence], aggregation: str) -> TrainBatch:
        """``seqs`` packed into rows of the learner's length, a multiple of ``dp`` rows."""
        cfg = self.cfg
        return pack_batch(
            seqs,
            row_len=cfg.learner.pack_length or cfg.sampling.max_seq_len,
            micro_batches=cfg.learner.micro_batches,
            row_multiple=self.dp,
            aggregation=aggregation,
            max_new_tokens=cfg.sampling.max_new_tokens,
        )

    def batch(self, groups: list[Group]) -> TrainBatch:
        """Each response's advantage (``learner.advantage``), then a packed batch for the
        configured loss; a per-token estimator's batch carries each response's reward instead,
        and the learner computes the advantages."""
        if log.isEnabledFor(logging.DEBUG):  # one JSON line per batch, for pod debugging
            fields = {"prompts": [g.example["prompt"] for g in groups]}
            log.debug("data %s %s", "learner", json.dumps(fields))
        learner = self.cfg.learner
        seqs = [[train_sequence(t, 0.0) for t in g.trajectories] for g in groups]
        if learner.advantage in TOKEN_ADVANTAGES:  # the learner computes them from the rewards
            flat = [
                dataclasses.replace(s, reward=float(r))
                for row, g in zip(seqs, groups, strict=True)
                for s, r in zip(row, g.rewards, strict=True)
            ]
            return self.pack(flat, self.loss.aggregation)
        adv = outcome_advantages(
            learner.advantage,
            np.stack([g.rewards for g in groups]),
            np.asarray([[s.trained_len for s in row] for row in seqs]),
            scale=resolve_scale(learner, self.loss),
        )
        flat = [
            dataclasses.replace(s, advantage=float(a))
            for row, arow in zip(seqs, adv, strict=True)
            for s, a in zip(row, arow, strict=True)
        ]
        return self.pack(flat, self.loss.aggregation)

    def teacher_sequence(self, example: dict, answer: Answer) -> TrainSequence:
        """What the warm start trains for a teacher's ``answer`` to ``example``: the prompt, then
        the answer and its stop token, or a transcript's turns as a conversation holds them."""
        if isinstance(answer, str):
            prompt = self.prompt(example)
            tokens = prompt + self.tokenizer.encode(answer, add_bos=False)
            return TrainSequence(tokens + [self.tokenizer.eos_id], len(prompt))
        return agents.transcript_sequence(
            self.conversations, example, answer, self.tokenizer, self.cfg.env.tool_format
        )
