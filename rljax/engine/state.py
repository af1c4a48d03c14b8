"""The data the engine's API passes around: prefixes, decode state, results, slot settings,
and where the prefix and decode state live on the sampler mesh.

:class:`ResultTokens` and :class:`SlotData` have the fields, layout and methods of JetStream's
``engine_api`` types (one ``[rows, 3]`` int32 array holding tokens, validity and lengths, read
through index ranges), plus ``log_prob``: the log-prob of each sampled token, which rljax's
learner needs. :class:`~rljax.engine.engine.Engine` makes and consumes them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import SamplingConfig
from rljax.models.sharding import ShardingRules, axis_size

# Column ranges of ResultTokens.data: [token, valid, length] per row.
TOKENS_IDX, VALID_IDX, LENGTH_IDX = (0, 1), (1, 2), (2, 3)


@struct.dataclass
class Prefix:
    """A prefilled prompt and the first token of each of its ``S`` samples.

    The whole prompt is cached; each sample's first token (drawn by prefill) is what its slot
    feeds to the first ``generate`` after ``insert``.
    """

    k: jax.Array  # [L, T, K, H]
    v: jax.Array
    # The request's scalars may still be on the host (numpy) until insert moves them.
    length: jax.Array | np.integer  # int32 scalar: prompt tokens cached
    tokens: jax.Array  # [S] int32: each sample's first token
    keys: jax.Array  # [S, 2] uint32: each sample's PRNG key data (token i folds in i)
    floats: jax.Array | np.ndarray  # [3] float32: temperature, top_p, min_p of the request
    top_k: jax.Array | np.integer  # int32 scalar
    # int32 scalar: the index of the token prefill drew in each sample's response (0 for a
    # fresh prompt, the tokens a resumed sample had); generate continues from steps + 1.
    steps: jax.Array | np.integer = dataclasses.field(default_factory=lambda: np.int32(0))

    @property
    def num_samples(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, samples: Sequence[int]) -> Prefix:
        """The same prompt with only the given samples, in that order (to insert in parts)."""
        idx = np.asarray(samples, np.int32).reshape(-1)
        if idx.size == 0 or idx.min() < 0 or idx.max() >= self.num_samples:
            raise ValueError(
                f"samples {idx.tolist()} are not a non-empty selection of this prefix's "
                f"{self.num_samples} samples"
            )
        return dataclasses.replace(self, tokens=self.tokens[idx], keys=self.keys[idx])


@struct.dataclass
class DecodeState:
    """Everything ``generate`` reads and writes, one row per slot.

    The KV cache is one page pool per kind of layer (:mod:`rljax.engine.pools`): ``k_pages``,
    ``v_pages`` and ``page_table`` hold the global layers (every layer of a model without
    local ones); a model with local (sliding-window) layers also has the ``local_*`` pool and
    table, None otherwise. :meth:`pools` gives them in the pools' order.
    """

    k_pages: jax.Array  # [Lg, K, P, Z, H]
    v_pages: jax.Array
    tokens: jax.Array  # [B] the token each slot feeds next
    positions: jax.Array  # [B] where that token goes = tokens cached so far
    page_table: jax.Array  # [B, M]
    active: jax.Array  # [B] bool
    keys: jax.Array  # [B, 2] uint32 per-request PRNG key data
    steps: jax.Array  # [B] tokens generated so far, prefill's first token included
    temperature: jax.Array  # [B]
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    local_k_pages: jax.Array | None = None  # [Ll, K, Pl, Z, H]
    local_v_pages: jax.Array | None = None
    local_page_table: jax.Array | None = None  # [B, M]

    def pools(self) -> tuple[tuple[jax.Array, jax.Array, jax.Array], ...]:
        """``(k_pages, v_pages, page_table)`` of each pool: the global one, then the local."""
        out = [(self.k_pages, self.v_pages, self.page_table)]
        if self.local_k_pages is not None:
            assert self.local_v_pages is not None and self.local_page_table is not None
            out.append((self.local_k_pages, self.local_v_pages, self.local_page_table))
        return tuple(out)

    def with_pages(self, ks: Sequence[jax.Array], vs: Sequence[jax.Array]) -> DecodeState:
        """This state with each pool's keys and values replaced (in :meth:`pools` order)."""
        local = {} if len(ks) == 1 else dict(local_k_pages=ks[1], local_v_pages=vs[1])
        return dataclasses.replace(self, k_pages=ks[0], v_pages=vs[0], **local)

    def with_tables(self, tables: Sequence[jax.Array]) -> DecodeState:
        """This state with each pool's page table replaced (in :meth:`pools` order)."""
        local = {} if len(tables) == 1 else dict(local_page_table=tables[1])
        return dataclasses.replace(self, page_table=tables[0], **local)


@struct.dataclass
class SlotData:
    """One slot's rows of a :class:`ResultTokens` (JetStream's ``SlotData``)."""

    tokens: jax.Array | np.ndarray  # [samples, 1]
    valid: jax.Array | np.ndarray  # [samples, 1]
    lengths: jax.Array | np.ndarray  # [samples]
    log_prob: jax.Array | np.ndarray | None = None  # [samples, 1]


@struct.dataclass
class ResultTokens:
    """What one prefill or generate produced, in JetStream's layout.

    ``data[r] = [token, valid, length]`` for row r (slot ``r // samples_per_slot``); ``length``
    counts the tokens the sequence has generated so far, prefill's first token included.
    ``log_prob[r, 0]`` is the log-prob of the sampled token under the distribution it was
    drawn from. Arrays stay on the device until :meth:`convert_to_numpy`.
    """

    data: jax.Array | np.ndarray  # [rows, 3] int32
    tokens_idx: tuple[int, int] = struct.field(pytree_node=False, default=TOKENS_IDX)
    valid_idx: tuple[int, int] = struct.field(pytree_node=False, default=VALID_IDX)
    length_idx: tuple[int, int] = struct.field(pytree_node=False, default=LENGTH_IDX)
    samples_per_slot: int = struct.field(pytree_node=False, default=1)
    log_prob: jax.Array | np.ndarray | None = None  # [rows, 1] float32
    # An engine recording routes (rljax's extension): the flat Lm*k expert ids of each token the
    # call FED to the model, [fed, Lm*k] int32: generate's one per row (the slot's fed token),
    # extend's one per token of its chunk, a prefill's one per response token it re-fed (a
    # resumed sample's ``step`` tokens; none for a fresh prompt). None: not recorded.
    routes: jax.Array | np.ndarray | None = None

    def copy_to_host_async(self) -> None:
        """Start copying to the host; a no-op for numpy arrays."""
        for x in (self.data, self.log_prob, self.routes):
            if isinstance(x, jax.Array):
                x.copy_to_host_async()

    def convert_to_numpy(self) -> ResultTokens:
        """The same result with host numpy arrays."""
        log_prob = None if self.log_prob is None else np.asarray(self.log_prob)
        routes = None if self.routes is None else np.asarray(self.routes)
        return dataclasses.replace(
            self, data=np.asarray(self.data), log_prob=log_prob, routes=routes
        )

    def get_result_at_slot(self, slot: int) -> SlotData:
        """The rows of ``slot``: tokens and valid [samples, 1], lengths [samples]."""
        rows = slice(slot * self.samples_per_slot, (slot + 1) * self.samples_per_slot)
        return self._rows(rows)

    def get_result_at_slots(self, slots: Sequence[int]) -> SlotData:
        """The rows of several slots, in order (one sample per slot)."""
        return self._rows(np.asarray(slots))

    def _rows(self, rows: slice | np.ndarray) -> SlotData:
        data = self.data
        return SlotData(
            tokens=data[rows, self.tokens_idx[0] : self.tokens_idx[1]],
            valid=data[rows, self.valid_idx[0] : self.valid_idx[1]],
            lengths=data[rows, self.length_idx[0] : self.length_idx[1]][:, 0],
            log_prob=None if self.log_prob is None else self.log_prob[rows],
        )

    # 1-D views over every row, for callers that read a whole step at once.
    @property
    def tokens(self) -> np.ndarray:
        return np.asarray(self.data[:, self.tokens_idx[0]])

    @property
    def valid(self) -> np.ndarray:
        return np.asarray(self.data[:, self.valid_idx[0]]).astype(bool)

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.data[:, self.length_idx[0]])

    @property
    def logprobs(self) -> np.ndarray:
        if self.log_prob is None:
            raise ValueError("this result carries no log-probs (log_prob=None)")
        return np.asarray(self.log_prob[:, 0])


def pack_result(
    tokens: jax.Array, valid: jax.Array, lengths: jax.Array, logprobs: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(data [R, 3] int32, log_prob [R, 1] float32)`` for a ResultTokens (traceable)."""
    data = jnp.stack(
        [tokens.astype(jnp.int32), valid.astype(jnp.int32), lengths.astype(jnp.int32)], axis=1
    )
    return data, logprobs.astype(jnp.float32)[:, None]


def prefix_shardings(mesh: Mesh, rules: ShardingRules, num_kv_heads: int) -> Prefix:
    """Where a Prefix lives before ``insert``: keys and values over kv heads, the rest
    replicated."""
    kv = NamedSharding(mesh, rules.on(mesh, (None, None, "kv_heads", None)))
    kv = _divisible_or_replicated(kv, num_kv_heads, 2)
    rep = NamedSharding(mesh, PartitionSpec())
    # A pytree of shardings in the Prefix's structure, as jit's shardings arguments take.
    return Prefix(k=kv, v=kv, length=rep, tokens=rep, keys=rep, floats=rep, top_k=rep, steps=rep)  # type: ignore[arg-type]


def decode_state_shardings(
    mesh: Mesh, rules: ShardingRules, num_kv_heads: int, kv_shards: int, num_pools: int = 1
) -> DecodeState:
    """Where each DecodeState array lives: each of the ``num_pools`` pools over kv heads and
    (with several ``kv_shards``) pages, the per-slot arrays over the 'batch' axes with their
    slots."""

    def sharding(*logical: str | None) -> NamedSharding:
        return NamedSharding(mesh, rules.on(mesh, logical))

    if kv_shards > 1:
        pages = sharding(None, "kv_heads", "batch", None, None)
        slot = sharding("batch")
        table = sharding("batch", None)
    else:
        pages = sharding(None, "kv_heads", None, None, None)
        slot = table = NamedSharding(mesh, PartitionSpec())
    pages = _divisible_or_replicated(pages, num_kv_heads, 1)
    s = slot
    local = {}
    if num_pools > 1:
        local = dict(local_k_pages=pages, local_v_pages=pages, local_page_table=table)
    # A pytree of shardings in the DecodeState's structure, as jit's shardings arguments take.
    return DecodeState(pages, pages, s, s, table, s, table, s, s, s, s, s, **local)  # type: ignore[arg-type]


def _divisible_or_replicated(sharding: NamedSharding, size: int, dim: int) -> NamedSharding:
    """Replicate ``dim`` when its mesh axes do not divide it (few kv heads, wide tensor axis)."""
    if size % axis_size(sharding.mesh, sharding.spec[dim]) == 0:
        return sharding
    spec = list(sharding.spec)
    spec[dim] = None
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


@dataclasses.dataclass(frozen=True)
class SlotSampling:
    """Per-request sampling settings, given to prefill and carried by the prefix into a slot."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def from_config(cls, cfg: SamplingConfig) -> SlotSampling:
        return cls(cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)


def register_with_jetstream(*classes_by_name: tuple[str, type]) -> bool:
    """Make rljax's types virtual subclasses of JetStream's ABCs, if JetStream is loaded.

    JetStream's orchestrator tells a prefill's first token from a generate step by
    ``isinstance(x, engine_api.ResultTokens)``. rljax never imports JetStream (its package
    pulls TensorFlow), so it registers its classes with the ABCs only once the caller has
    imported ``jetstream.engine.engine_api`` itself. Returns whether it did.
    """
    api = sys.modules.get("jetstream.engine.engine_api")
    if api is None:
        return False
    for name, cls in classes_by_name:
        base = getattr(api, name, None)
        if base is not None and hasattr(base, "register") and not issubclass(cls, base):
            base.register(cls)
    return True
