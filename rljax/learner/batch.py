"""Turn trajectories into packed, micro-batched training arrays.

Sequences (prompt + response) are packed into rows of ``row_len`` tokens, told apart by segment
ids, rather than padded to the longest one (:mod:`rljax.policy.packing` decides the placement).
At row position t the arrays hold the input token and everything about the *next* token, the
one that position predicts: its id (``targets``), whether it is a trained response token
(``mask``), its behaviour log-prob, advantage and policy version, and its weight in the loss.
``rewards`` holds each sequence's reward at its last trained token (0 elsewhere), where the
per-token estimators (:mod:`rljax.learner.token_advantages`) take it.

The weight encodes the loss aggregation, so micro-batches simply add up:
- ``token_mean``: every response token of the batch weighs 1 / (response tokens in the batch);
- ``seq_mean_token_mean``: a sequence's tokens weigh 1 / (sequences * its length);
- ``constant``: 1 / (sequences * max_new_tokens), Dr. GRPO's length-unbiased sum.

A conversation (multi-turn) is one sequence: its response holds model and env tokens, and its
``loss_mask`` marks the model's. Env tokens are inputs only: mask 0, weight 0, behaviour
log-prob 0 (whatever the trajectory says), and every count above ("response tokens", "its
length") counts model tokens only.

Routes (mixture-of-experts models, docs/moe.md): a sequence's ``routes`` give each response
token the flat Lm*k expert ids it was routed to when the sampler fed it. They pack into the
field ``routes`` [rows, row_len, Lm*k] int32, present when some sequence has routes. Unlike the
fields above, position t holds what belongs to the INPUT token t (the routes that computed the
logits predicting t+1): response token j of a sequence with ``prompt_len`` P sits at P+j.
-1 marks a position not forced (prompt and env tokens, padding, a token never fed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rljax.policy.packing import balance_microbatches, pack_sequences

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")
FIELDS = (
    "tokens",
    "positions",
    "segment_ids",
    "targets",
    "mask",
    "weights",
    "old_logprobs",
    "advantages",
    "versions",
    "rewards",
)


@dataclasses.dataclass(frozen=True)
class TrainSequence:
    """One sequence to train on: the response tokens follow ``prompt_len`` prompt tokens."""

    tokens: Sequence[int]
    prompt_len: int
    logprobs: Sequence[float] = ()  # behaviour log-prob per response token
    advantage: float = 0.0
    versions: Sequence[int] = ()  # policy version per response token
    loss_mask: Sequence[int] = ()  # per response token: 1 trained (model), 0 not (env); (): all
    # per response token: its flat Lm*k expert ids ([]: none recorded); (): no routes at all
    routes: Sequence[Sequence[int]] = ()
    reward: float = 0.0  # the outcome reward, packed at its last trained token

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def trained_len(self) -> int:
        """The response tokens trained on (the model's, not the env's)."""
        return int(sum(self.loss_mask)) if self.loss_mask else self.response_len


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """Arrays shaped [micro_batches, rows, row_len], plus host-side counts."""

    arrays: dict[str, np.ndarray]
    num_sequences: int
    num_tokens: int  # real (non-padding) tokens
    num_response_tokens: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.arrays["tokens"].shape


def _round_rows(n: int, multiple: int) -> int:
    """Rows padded up to ``multiple * 2^k`` so batch shapes (and compiles) stay few."""
    units = -(-n // multiple)
    power = 1
    while power < units:
        power *= 2
    return power * multiple


def pack_batch(
    seqs: Sequence[TrainSequence],
    *,
    row_len: int,
    micro_batches: int = 1,
    row_multiple: int = 1,
    aggregation: str = "token_mean",
    max_new_tokens: int = 0,
) -> TrainBatch:
    """Pack ``seqs`` into ``micro_batches`` equal micro-batches of rows.

    ``row_multiple`` is the learner's data-parallel size: every micro-batch gets a multiple of
    it rows, so each device holds whole rows.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r}; expected one of {AGGREGATIONS}")
    if not seqs:
        raise ValueError("pack_batch got no sequences")
    if aggregation == "constant" and max_new_tokens <= 0:
        raise ValueError("aggregation='constant' needs max_new_tokens > 0")
    for i, s in enumerate(seqs):
        if not 1 <= s.prompt_len < len(s.tokens) + 1:
            raise ValueError(
                f"sequence {i}: prompt_len={s.prompt_len} outside [1, {len(s.tokens)}]"
            )
        if s.logprobs and len(s.logprobs) != s.response_len:
            raise ValueError(
                f"sequence {i}: {len(s.logprobs)} log-probs for {s.response_len} response tokens"
            )
        if s.loss_mask and (len(s.loss_mask) != s.response_len or not set(s.loss_mask) <= {0, 1}):
            raise ValueError(
                f"sequence {i}: loss_mask must hold one 0 or 1 per response token "
                f"({s.response_len}), got {len(s.loss_mask)} values"
            )
    width = _route_width(seqs)
    rows = pack_sequences([len(s.tokens) for s in seqs], row_len=row_len)
    n_rows = _round_rows(len(rows), micro_batches * row_multiple)
    rows += [[] for _ in range(n_rows - len(rows))]
    counts = [sum(len(seqs[i].tokens) for i in row) for row in rows]
    order = [r for mb in balance_microbatches(counts, micro_batches) for r in mb]

    n_resp = sum(s.trained_len for s in seqs)
    arrays = {
        name: np.zeros((n_rows, row_len), np.float32 if name in _FLOATS else np.int32)
        for name in FIELDS
    }
    if width:
        arrays["routes"] = np.full((n_rows, row_len, width), -1, np.int32)
    for out_row, row in enumerate(order):
        start = 0
        for seg, i in enumerate(rows[row], start=1):
            s = seqs[i]
            _write(
                arrays,
                out_row,
                start,
                seg,
                s,
                _weight(s, aggregation, n_resp, len(seqs), max_new_tokens),
            )
            start += len(s.tokens)
    per_mb = n_rows // micro_batches
    stacked = {k: v.reshape(micro_batches, per_mb, *v.shape[1:]) for k, v in arrays.items()}
    return TrainBatch(stacked, len(seqs), sum(len(s.tokens) for s in seqs), n_resp)


_FLOATS = ("mask", "weights", "old_logprobs", "advantages", "rewards")


def _weight(s: TrainSequence, aggregation: str, n_resp: int, n_seqs: int, max_new: int) -> float:
    if aggregation == "token_mean":
        return 1.0 / max(n_resp, 1)
    if aggregation == "seq_mean_token_mean":
        return 1.0 / (n_seqs * max(s.trained_len, 1))
    return 1.0 / (n_seqs * max_new)


def _write(
    arrays: dict[str, np.ndarray], row: int, start: int, seg: int, s: TrainSequence, weight: float
) -> None:
    n, p = len(s.tokens), s.prompt_len
    sl = slice(start, start + n)
    arrays["tokens"][row, sl] = s.tokens
    arrays["positions"][row, sl] = np.arange(n)
    arrays["segment_ids"][row, sl] = seg
    # Position t predicts token t+1: the response tokens are predicted from p-1 .. n-2.
    tgt = slice(start + p - 1, start + n - 1)
    arrays["targets"][row, start : start + n - 1] = s.tokens[1:]
    trained = np.asarray(s.loss_mask, np.float32) if s.loss_mask else 1.0
    arrays["mask"][row, tgt] = trained
    arrays["weights"][row, tgt] = weight * trained
    arrays["advantages"][row, tgt] = s.advantage
    trained_at = np.flatnonzero(s.loss_mask) if s.loss_mask else [s.response_len - 1]
    if len(trained_at):
        arrays["rewards"][row, start + p - 1 + trained_at[-1]] = s.reward
    if s.logprobs:
        # An env token's behaviour log-prob never reaches a loss: no policy sampled it.
        arrays["old_logprobs"][row, tgt] = np.where(trained, np.asarray(s.logprobs, np.float32), 0)
    if s.versions:
        arrays["versions"][row, tgt] = s.versions
    if "routes" in arrays:
        # Routes belong to the input token: response token j is the input at p + j.
        for j, ids in enumerate(s.routes):
            if ids:
                arrays["routes"][row, start + p + j] = ids


def _route_width(seqs: Sequence[TrainSequence]) -> int:
    """Lm*k, the one width of every recorded route; 0 when no sequence has routes."""
    widths = set()
    for i, s in enumerate(seqs):
        if s.routes and len(s.routes) != s.response_len:
            raise ValueError(
                f"sequence {i}: {len(s.routes)} routes for {s.response_len} response tokens"
            )
        widths |= {len(r) for r in s.routes if r}
    if len(widths) > 1:
        raise ValueError(
            f"routes of widths {sorted(widths)} in one batch; every route holds Lm*k expert ids "
            "of one model"
        )
    return widths.pop() if widths else 0
