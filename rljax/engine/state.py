"""The data the engine's API passes around: prefixes, decode state, results, slot settings.

Shaped after JetStream's ``engine_api`` types; :class:`~rljax.engine.engine.Engine` makes
and consumes them.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import struct

from rljax.config import SamplingConfig


@struct.dataclass
class Prefix:
    """A prefilled prompt: keys/values of all but its last token, and that last token."""

    k: jax.Array  # [L, T, K, H]
    v: jax.Array
    length: np.ndarray  # int32 scalar: tokens cached (prompt length - 1)
    next_token: np.ndarray  # int32 scalar


@struct.dataclass
class DecodeState:
    """Everything ``generate`` reads and writes, one row per slot."""

    k_pages: jax.Array  # [L, K, P, Z, H]
    v_pages: jax.Array
    tokens: jax.Array  # [B] the token each slot feeds next
    positions: jax.Array  # [B] where that token goes = tokens cached so far
    page_table: jax.Array  # [B, M]
    active: jax.Array  # [B] bool
    keys: jax.Array  # [B, 2] uint32 per-request PRNG key data
    steps: jax.Array  # [B] tokens generated so far (folded into the key)
    temperature: jax.Array  # [B]
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array


@dataclasses.dataclass(frozen=True)
class ResultTokens:
    """What one prefill/generate produced for every slot (host numpy arrays).

    ``tokens[b]`` was sampled for slot b with log-prob ``logprobs[b]`` when ``valid[b]``.
    """

    tokens: np.ndarray
    valid: np.ndarray
    lengths: np.ndarray  # generated tokens per slot so far
    logprobs: np.ndarray

    def get_result_at_slot(self, slot: int) -> tuple[int, bool, int, float]:
        return (
            int(self.tokens[slot]),
            bool(self.valid[slot]),
            int(self.lengths[slot]),
            float(self.logprobs[slot]),
        )


@dataclasses.dataclass(frozen=True)
class SlotSampling:
    """Per-request sampling settings written into a slot at insert time."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def from_config(cls, cfg: SamplingConfig) -> SlotSampling:
        return cls(cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
