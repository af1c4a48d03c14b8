"""A JetStream-shaped generation engine over a paged KV cache.

The method names and shapes mirror JetStream's ``Engine`` (prefill / insert / generate /
init_decode_state / load_params / get_prefix_destination_sharding), so a JetStream-style
orchestrator can drive it, but rljax does not depend on JetStream.

Decode state lives on the sampler mesh. Keys and values sit in a page pool [L, K, P, Z, H];
each slot owns a row of the page table. A host-side :class:`PageAllocator` hands out pages as
sequences grow and takes them back when a slot is freed, so memory follows the tokens actually
held rather than slots x maximum length (the bookkeeping lives in :mod:`rljax.engine.pages`).

The slots and the pool are split into ``kv_shards`` equal shards, one per device group of the
sampler's 'batch' mesh axes (the 'data' axis): each shard's slots use its own pages only, with
its own allocator, null page and shard-local page tables. So the pool is sharded over P, not
replicated, and a data-parallel sampler holds 1/data of the cache per device. When the slots do
not divide over the 'batch' axes there is one shard.

One deliberate difference from JetStream: ``prefill`` caches the prompt up to, but not
including, its last token, and samples nothing. The first ``generate`` after ``insert`` feeds
that last token. So G samples that share one prefill draw their first tokens independently,
and every sampled token's log-prob and version come from the ``generate`` call that made it.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine import sampling
from rljax.engine.pages import PageAllocator, SlotPages
from rljax.engine.state import DecodeState, Prefix, ResultTokens, SlotSampling
from rljax.models.sharding import (
    SAMPLER_RULES,
    ShardingRules,
    axis_size,
    state_shardings,
    with_shardings,
)
from rljax.models.transformer import Decoder


class Engine:
    """Prefill / insert / generate over a paged KV cache on the sampler mesh."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        sampling_cfg: SamplingConfig,
        mesh: Mesh,
        graphdef: nnx.GraphDef,
        *,
        rules: ShardingRules = SAMPLER_RULES,
        impl: str = "auto",
    ):
        self.model_cfg = model_cfg
        self.sampling_cfg = sampling_cfg
        self._mesh = mesh
        self._graphdef = graphdef
        self._rules = rules
        self.impl = impl  # kernels: 'auto' (Pallas on TPU), 'pallas' or 'xla'
        z = sampling_cfg.page_size
        self.max_seq_len = sampling_cfg.max_prefill_length + sampling_cfg.max_new_tokens
        self.pages_per_slot = math.ceil(self.max_seq_len / z)
        b = sampling_cfg.max_concurrent_decodes
        shards = axis_size(mesh, rules.rules.get("batch"))
        self.kv_shards = shards if b % shards == 0 else 1
        self.slots_per_shard = b // self.kv_shards
        # sampling.num_pages counts all shards; each gets an equal share (rounded up).
        wanted = sampling_cfg.num_pages or b * self.pages_per_slot + self.kv_shards
        self.pages_per_shard = -(-wanted // self.kv_shards)
        self.num_pages = self.pages_per_shard * self.kv_shards
        self.pages = SlotPages(
            num_slots=b,
            kv_shards=self.kv_shards,
            pages_per_shard=self.pages_per_shard,
            page_size=z,
            max_seq_len=self.max_seq_len,
        )
        # Buckets beyond max_prefill_length exist only to re-prefill resumed sequences.
        buckets = list(sampling_cfg.buckets)
        while buckets[-1] < self.max_seq_len:
            buckets.append(min(buckets[-1] * 2, self.pages_per_slot * z))
        self.buckets = tuple(buckets)
        self._build_jits()

    # -- JetStream properties ---------------------------------------------------------------

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def max_concurrent_decodes(self) -> int:
        return self.sampling_cfg.max_concurrent_decodes

    @property
    def max_prefill_length(self) -> int:
        return self.sampling_cfg.max_prefill_length

    @property
    def samples_per_slot(self) -> int:
        return 1

    # -- shardings --------------------------------------------------------------------------

    def _sharding(self, *logical) -> NamedSharding:
        return NamedSharding(self._mesh, self._rules.spec(logical))

    def _replicated(self) -> NamedSharding:
        return NamedSharding(self._mesh, PartitionSpec())

    def param_shardings(self, params: nnx.State):
        """The sampler's shardings for a params state of this model."""
        return state_shardings(params, self._mesh, self._rules)

    def get_prefix_destination_sharding(self):
        """Where a Prefix must live before ``insert`` (JetStream API)."""
        kv = self._sharding(None, None, "kv_heads", None)
        kv = _divisible_or_replicated(kv, self.model_cfg.num_kv_heads, 2)
        rep = self._replicated()
        return Prefix(k=kv, v=kv, length=rep, next_token=rep)

    def decode_state_shardings(self) -> DecodeState:
        """Where each DecodeState array lives: the pool over kv heads and (with several
        kv_shards) pages, the per-slot arrays over the 'batch' axes with their slots."""
        if self.kv_shards > 1:
            pages = self._sharding(None, "kv_heads", "batch", None, None)
            slot = self._sharding("batch")
            table = self._sharding("batch", None)
        else:
            pages = self._sharding(None, "kv_heads", None, None, None)
            slot = table = self._replicated()
        pages = _divisible_or_replicated(pages, self.model_cfg.num_kv_heads, 1)
        return DecodeState(
            k_pages=pages,
            v_pages=pages,
            tokens=slot,
            positions=slot,
            page_table=table,
            active=slot,
            keys=table,
            steps=slot,
            temperature=slot,
            top_k=slot,
            top_p=slot,
            min_p=slot,
        )

    # -- API --------------------------------------------------------------------------------

    def load_params(self, params: nnx.State) -> nnx.State:
        """A copy of ``params`` on the sampler mesh (a cross-mesh ``device_put``, never a jit).

        Always a copy: the learner donates its buffers to the next step, so the sampler must
        never alias them, even when both roles share devices.
        """
        return jax.device_put(params, self.param_shardings(params), may_alias=False)

    def init_decode_state(self) -> DecodeState:
        """Fresh device state, every slot free, and fresh host page allocators."""
        self.pages.reset()
        return self._make_state()

    def _empty_state(self) -> DecodeState:
        cfg, b = self.model_cfg, self.max_concurrent_decodes
        shape = (
            cfg.num_layers,
            cfg.num_kv_heads,
            self.num_pages,
            self.sampling_cfg.page_size,
            cfg.head_dim,
        )
        dtype = jnp.dtype(cfg.dtype)
        s = SlotSampling.from_config(self.sampling_cfg)
        zeros_i = jnp.zeros(b, jnp.int32)
        return DecodeState(
            k_pages=jnp.zeros(shape, dtype),
            v_pages=jnp.zeros(shape, dtype),
            tokens=zeros_i,
            positions=zeros_i,
            page_table=jnp.zeros((b, self.pages_per_slot), jnp.int32),
            active=jnp.zeros(b, bool),
            keys=jnp.zeros((b, 2), jnp.uint32),
            steps=zeros_i,
            temperature=jnp.full(b, s.temperature, jnp.float32),
            top_k=jnp.full(b, s.top_k, jnp.int32),
            top_p=jnp.full(b, s.top_p, jnp.float32),
            min_p=jnp.full(b, s.min_p, jnp.float32),
        )

    def bucket_for(self, length: int) -> int:
        """The padded length a prompt of ``length`` tokens is prefilled at."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ValueError(
            f"sequence of {length} tokens exceeds the largest prefill bucket {self.buckets[-1]}; "
            "raise sampling.max_prefill_length or shorten the prompt"
        )

    def prefill(
        self, *, params: nnx.State, padded_tokens: np.ndarray, true_length: int
    ) -> tuple[Prefix, ResultTokens]:
        """Cache the first ``true_length - 1`` tokens; the last is fed by ``generate``."""
        padded_tokens = np.asarray(padded_tokens, np.int32).reshape(-1)
        if not 1 <= true_length <= padded_tokens.shape[0]:
            raise ValueError(
                f"true_length={true_length} must be in [1, {padded_tokens.shape[0]}] "
                "(the padded prompt's length)"
            )
        bucket = self.bucket_for(padded_tokens.shape[0])
        tokens = np.zeros(bucket, np.int32)
        tokens[: padded_tokens.shape[0]] = padded_tokens
        k, v = self._prefill(params, jnp.asarray(tokens[None]), jnp.int32(true_length - 1))
        prefix = Prefix(k, v, np.int32(true_length - 1), np.int32(tokens[true_length - 1]))
        b = self.max_concurrent_decodes
        empty = ResultTokens(
            np.zeros(b, np.int32), np.zeros(b, bool), np.zeros(b, np.int32), np.zeros(b)
        )
        return prefix, empty

    def insert(
        self,
        prefix: Prefix,
        decode_state: DecodeState,
        slot: int,
        *,
        seed: int = 0,
        sampling: SlotSampling | None = None,
    ) -> DecodeState:
        """Copy ``prefix`` into ``slot``'s pages and arm the slot (raises OutOfPages)."""
        return self.bulk_insert(prefix, decode_state, [slot], seeds=[seed], sampling=sampling)

    def bulk_insert(
        self,
        prefix: Prefix,
        decode_state: DecodeState,
        slots,
        *,
        seeds,
        sampling: SlotSampling | None = None,
    ) -> DecodeState:
        """Insert one prefix into several slots (the samples of a group) in one device call.

        Each slot gets its own pages and PRNG stream. Raises OutOfPages, allocating nothing,
        when the pool cannot hold all of them.
        """
        slots, seeds = list(slots), list(seeds)
        if len(slots) != len(seeds) or not slots:
            raise ValueError(f"bulk_insert needs one seed per slot, got {slots} and {seeds}")
        # Pad to a power of two so only log2(slots) shapes ever compile; padding writes to the
        # null page and to slot index B, which the scatters drop.
        width = 1 << (len(slots) - 1).bit_length()
        rows = np.zeros((width, self.pages_per_slot), np.int32)
        rows[: len(slots)] = self.pages.admit(slots, int(prefix.length))
        slot_ids = np.full(width, self.max_concurrent_decodes, np.int32)
        slot_ids[: len(slots)] = slots
        seed_arr = np.zeros(width, np.uint32)
        seed_arr[: len(slots)] = [seed % (2**32) for seed in seeds]
        s = sampling or SlotSampling.from_config(self.sampling_cfg)
        return self._insert(
            decode_state,
            prefix,
            rows,
            slot_ids,
            seed_arr,
            np.asarray([s.temperature, s.top_p, s.min_p], np.float32),
            np.int32(s.top_k),
        )

    def free_slot(self, decode_state: DecodeState, slot: int) -> DecodeState:
        """Return ``slot``'s pages to the pool and park the slot on the null page."""
        self.pages.release(slot)
        return self._free(decode_state, jnp.int32(slot))

    def shard_of(self, slot: int) -> int:
        """The kv shard whose pages ``slot`` uses."""
        return self.pages.shard_of(slot)

    @property
    def allocators(self) -> list[PageAllocator]:
        """Each kv shard's page allocator."""
        return self.pages.allocators

    @property
    def free_pages(self) -> int:
        """Pages not held by any slot, over all shards (each shard's null page excluded)."""
        return self.pages.free_pages

    def slot_length(self, slot: int) -> int:
        """Tokens cached for ``slot`` (prompt and generated)."""
        return int(self.pages.positions[slot])

    def generate(self, params: nnx.State, decode_state: DecodeState):
        """One token for every active slot.

        Grows page tables first, taking no page when it raises: OutOfPages when the pool is
        short, ValueError when a slot already holds ``max_seq_len`` tokens.
        """
        if self.pages.grow():  # one small host->device copy of the whole table: no recompiles
            table = jax.device_put(self.pages.table, decode_state.page_table.sharding)
            decode_state = decode_state.replace(page_table=table)
        decode_state, tokens, logprobs, steps = self._generate(params, decode_state)
        self.pages.advance()
        tokens, logprobs, steps = jax.device_get((tokens, logprobs, steps))
        result = ResultTokens(tokens, self.pages.active.copy(), steps, logprobs)
        return decode_state, result

    def lower_generate(self, params: nnx.State) -> jax.stages.Lowered:
        """The device step of :meth:`generate` lowered for ``params`` and an empty decode state.

        ``params`` may be arrays or abstract (``nnx.eval_shape``) ShapeDtypeStructs: only their
        shapes and dtypes count, placed by :meth:`param_shardings`. The decode state is
        abstract too, so nothing is allocated. ``.compile().memory_analysis()`` gives
        per-device bytes.
        """
        params = with_shardings(params, self.param_shardings(params))
        state = with_shardings(jax.eval_shape(self._empty_state), self.decode_state_shardings())
        return self._generate.lower(params, state)

    # -- compiled pieces --------------------------------------------------------------------

    def _model(self, params) -> Decoder:
        return nnx.merge(self._graphdef, params)

    def _build_jits(self):
        state_sh = self.decode_state_shardings()
        prefix_sh = self.get_prefix_destination_sharding()
        # Compiled once per engine: building a Sampler must not re-jit the empty state.
        self._make_state = jax.jit(self._empty_state, out_shardings=state_sh)

        @functools.partial(jax.jit, out_shardings=(prefix_sh.k, prefix_sh.v))
        def prefill(params, tokens_1t, length):
            t = tokens_1t.shape[1]
            positions = jnp.arange(t)[None]
            segments = (positions < length).astype(jnp.int32)
            _, (k, v) = self._model(params)(
                tokens_1t,
                positions,
                segments,
                return_kv=True,
                impl=self.impl,
                sharding=(self._mesh, self._rules),
            )
            return k[:, 0], v[:, 0]

        @functools.partial(jax.jit, donate_argnums=0, out_shardings=state_sh)
        def insert(state, prefix, rows_wm, slots_w, seeds_w, floats, top_k):
            z = state.k_pages.shape[3]
            pos_t = jnp.arange(prefix.k.shape[1])
            col_t = jnp.minimum(pos_t // z, rows_wm.shape[1] - 1)
            # Page tables hold shard-local ids; the pool is indexed globally. Padding rows
            # (slot index B) land on the last shard's null page.
            shard_w = jnp.minimum(slots_w // self.slots_per_shard, self.kv_shards - 1)
            null_w1 = (shard_w * self.pages_per_shard)[:, None]  # each shard's page 0
            page_wt = jnp.where(pos_t < prefix.length, rows_wm[:, col_t] + null_w1, null_w1)
            off_wt = jnp.broadcast_to(pos_t % z, page_wt.shape)
            # [L, T, K, H] -> [L, K, W, T, H], one copy of the prompt per slot.
            k = jnp.broadcast_to(
                prefix.k.transpose(0, 2, 1, 3)[:, :, None],
                (*state.k_pages.shape[:2], *page_wt.shape, prefix.k.shape[-1]),
            )
            v = jnp.broadcast_to(prefix.v.transpose(0, 2, 1, 3)[:, :, None], k.shape)
            kp = state.k_pages.at[:, :, page_wt, off_wt].set(k.astype(state.k_pages.dtype))
            vp = state.v_pages.at[:, :, page_wt, off_wt].set(v.astype(state.v_pages.dtype))
            keys = jax.vmap(lambda s: jax.random.key_data(jax.random.key(s)))(seeds_w)
            w = slots_w.shape[0]
            put = (
                lambda arr, val: arr.at[slots_w].set(  # noqa: E731
                    jnp.broadcast_to(val, (w, *arr.shape[1:])).astype(arr.dtype), mode="drop"
                )
            )
            return state.replace(
                k_pages=kp,
                v_pages=vp,
                tokens=put(state.tokens, prefix.next_token),
                positions=put(state.positions, prefix.length),
                page_table=put(state.page_table, rows_wm),
                active=put(state.active, True),
                keys=put(state.keys, keys),
                steps=put(state.steps, 0),
                temperature=put(state.temperature, floats[0]),
                top_p=put(state.top_p, floats[1]),
                min_p=put(state.min_p, floats[2]),
                top_k=put(state.top_k, top_k),
            )

        @functools.partial(jax.jit, donate_argnums=0, out_shardings=state_sh)
        def free(state, slot):
            return state.replace(
                page_table=state.page_table.at[slot].set(0),
                active=state.active.at[slot].set(False),
            )

        # What the host reads back is replicated: with the slots sharded over 'data', a
        # multi-process sampler could not fetch rows that live on another host's devices.
        rep = self._replicated()

        @functools.partial(jax.jit, donate_argnums=1, out_shardings=(state_sh, rep, rep, rep))
        def generate(params, state):
            model, live = self._model(params), state.active
            hidden, kp, vp = model.decode(
                state.tokens,
                state.positions,
                state.k_pages,
                state.v_pages,
                state.page_table,
                impl=self.impl,
                sharding=(self._mesh, self._rules),
                kv_shards=self.kv_shards,
            )
            logits = model.logits(hidden)
            keys = jax.vmap(lambda kd, s: jax.random.fold_in(jax.random.wrap_key_data(kd), s))(
                state.keys, state.steps
            )
            # Filters honour each slot's own settings; the sort they need runs only on steps
            # where some live, sampled (not greedy) slot asks for one.
            asks = (state.top_k > 0) | (state.top_p < 1.0) | (state.min_p > 0.0)
            tokens, logprobs = sampling.sample(
                logits,
                keys,
                state.temperature,
                state.top_k,
                state.top_p,
                state.min_p,
                use_filters=jnp.any(asks & live & (state.temperature > 0.0)),
            )
            new = state.replace(
                k_pages=kp,
                v_pages=vp,
                tokens=jnp.where(live, tokens, state.tokens),
                positions=state.positions + live,
                steps=state.steps + live,
            )
            return new, tokens, logprobs, new.steps

        self._prefill, self._insert, self._free = prefill, insert, free
        self._generate = generate


def _divisible_or_replicated(sharding: NamedSharding, size: int, dim: int) -> NamedSharding:
    """Replicate ``dim`` when its mesh axes do not divide it (few kv heads, wide tensor axis)."""
    if size % axis_size(sharding.mesh, sharding.spec[dim]) == 0:
        return sharding
    spec = list(sharding.spec)
    spec[dim] = None
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))
