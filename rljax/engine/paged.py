"""rljax's native engine: decode slots over a paged KV cache on the sampler mesh.

:class:`PagedEngine` owns the page tables and the layout of the device state: it admits
prefixes into slots (``bulk_insert``), grows, pauses (``pause``), continues (``extend``) and
frees slots, prefills one prompt or many in one call (``prefill_multisampling``,
``prefill_batch``), and runs one decode step for every live slot (``generate``). rljax's
:class:`~rljax.engine.sampler.Sampler` drives it. JetStream's ``engine_api.Engine`` is a thin
shim over it (:class:`rljax.engine.engine.Engine`); the methods both have keep JetStream's
names and meanings.

- ``prefill_multisampling`` caches the whole prompt and draws ``num_samples`` first tokens
  from one forward pass, each with its own PRNG stream, returned as a :class:`ResultTokens`.
  ``prefill_batch`` runs many prompts in one call (:mod:`rljax.engine.prefill`).
- ``bulk_insert`` arms slots with a prefix; ``generate`` feeds every live slot's last token
  and returns the next as a ResultTokens (still on the device), with the log-prob of each
  sampled token in ``log_prob``.
- ``free_resource(slot)`` returns the slot's pages at once. It takes no decode state (it may
  run on another thread, as in JetStream's orchestrator); the device side of the slot is parked
  before the next insert or generate. JetStream's detokenize thread puts a slot back on the
  free queue just *before* it calls ``free_resource``, so an insert can reach a slot whose free
  is a moment away: insert waits up to ``BUSY_SLOT_GRACE_S`` for it, then refuses the busy
  slot.
- A slot that holds ``max_seq_len`` tokens stops: ``generate`` reports it ``valid = False``
  and takes no page for it, until ``free_resource``.

The decode state is a value the caller holds and passes back (so jit can donate it); this
engine makes it (``init_decode_state``), places it and consumes it. Keys and values sit in a
page pool [L, K, P, Z, H]; each slot owns a row of the page table. A host-side
:class:`SlotPages` hands out pages as sequences grow, so memory follows the tokens held rather
than slots x maximum length. A model with local (sliding-window) layers keeps those in a second
pool whose slots hold only their window's pages (:mod:`rljax.engine.pools`, docs/engine.md).
The slots and the pools are split into ``kv_shards`` equal shards, one per device group of the
sampler's 'batch' mesh axes: each shard's slots use its own pages only (one shard when the
slots do not divide).

This module is the host bookkeeping of slots and pages (under one lock). The compiled device
steps are in :mod:`rljax.engine.steps`, prefill's host side in :mod:`rljax.engine.prefill`, the
data types in :mod:`rljax.engine.state`, the layout of the served weights in
:mod:`rljax.engine.weights`, the host page allocator in :mod:`rljax.engine.pages` and the
pools in :mod:`rljax.engine.pools`.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Collection, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import LoRAConfig, ModelConfig, SamplingConfig
from rljax.engine import decode
from rljax.engine.decode import Sampler as LogitsSampler
from rljax.engine.decode import steps_per_call
from rljax.engine.pages import PageAllocator
from rljax.engine.pools import PagePools, pool_layout
from rljax.engine.prefill import (
    PrefillRequest,
    extend_chunk,
    prefill_batch,
    prefill_one,
    sample_keys,
)
from rljax.engine.state import (
    DecodeState,
    Prefix,
    ResultTokens,
    SlotSampling,
    decode_state_shardings,
    prefix_shardings,
)
from rljax.engine.steps import build_steps
from rljax.engine.weights import (
    ServingLayout,
    check_learner_params,
    load_checkpoint,
    serving_layout,
)
from rljax.models.sharding import (
    SAMPLER_RULES,
    ShardingRules,
    axis_size,
    state_shardings,
    with_shardings,
)

# How long insert waits for another thread's free_resource of a slot it finds busy.
BUSY_SLOT_GRACE_S = 1.0


class PagedEngine:
    """Decode slots over a paged KV cache on the sampler mesh (see the module docstring).

    ``seed`` seeds the PRNG streams of prefills given no ``rng``; ``lora``: the LoRA adapters
    ``graphdef`` holds (served merged or unmerged, rljax.engine.weights.lora_merged); ``impl``
    picks the kernels: 'auto' (Pallas on TPU), 'pallas' or 'xla'. ``record_routes`` (a
    mixture-of-experts model only; None: whenever the model is one): every result also carries
    the experts each token it fed was routed to (``ResultTokens.routes``), for rollout routing
    replay and the learner's router disagreement (docs/moe.md).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        sampling_cfg: SamplingConfig,
        mesh: Mesh,
        graphdef: nnx.GraphDef,
        *,
        rules: ShardingRules = SAMPLER_RULES,
        impl: str = "auto",
        seed: int = 0,
        lora: LoRAConfig | None = None,
        record_routes: bool | None = None,
    ):
        if record_routes is None:
            record_routes = model_cfg.num_experts > 0
        if record_routes and not model_cfg.num_experts:
            raise ValueError(
                f"record_routes=True for the dense model family {model_cfg.family!r}: only a "
                "mixture-of-experts model routes tokens; leave it False"
            )
        self.record_routes = record_routes
        self.model_cfg = model_cfg
        self.sampling_cfg = sampling_cfg
        self.graphdef = graphdef
        self.rules = rules
        self.impl = impl
        self._mesh = mesh
        self.page_size = z = sampling_cfg.page_size
        self.max_seq_len = sampling_cfg.max_prefill_length + sampling_cfg.max_new_tokens
        self.pages_per_slot = math.ceil(self.max_seq_len / z)
        b = sampling_cfg.max_concurrent_decodes
        shards = axis_size(mesh, rules.rules.get("batch"))
        self.kv_shards = shards if b % shards == 0 else 1
        self.slots_per_shard = b // self.kv_shards
        # The pools' sizes: sampling.num_pages (and num_local_pages) count all shards.
        steps = steps_per_call(sampling_cfg.decode_steps, mesh)
        self.pool_layout = pool_layout(model_cfg, sampling_cfg, self.kv_shards, steps)
        self.pages_per_shard = self.pool_layout.pages_per_shard[0]  # the global pool's
        self.num_pages = self.pages_per_shard * self.kv_shards
        self.pages = PagePools(
            self.pool_layout,
            num_slots=b,
            kv_shards=self.kv_shards,
            page_size=z,
            max_seq_len=self.max_seq_len,
        )
        # Buckets beyond max_prefill_length exist only to re-prefill resumed sequences.
        buckets = list(sampling_cfg.buckets)
        while buckets[-1] < self.max_seq_len:
            buckets.append(min(buckets[-1] * 2, self.pages_per_slot * z))
        self.buckets = tuple(buckets)
        # free_resource may run on another thread than insert/generate (JetStream's
        # detokenize thread): the host page state changes under this lock only.
        self._lock = threading.RLock()
        self._freed = threading.Condition(self._lock)  # notified by free_resource
        self._base_key = jax.random.key(seed)
        self._prefills = itertools.count()
        # How the served weights are held, fixed for the engine's life (rljax.engine.weights).
        self.layout: ServingLayout = serving_layout(
            sampling_cfg.weights_layout, model_cfg, graphdef, mesh, rules, lora_cfg=lora
        )
        self.weights_layout = self.layout.name
        self.steps = build_steps(self)

    @property
    def mesh(self) -> Mesh:
        """The sampler mesh."""
        return self._mesh

    @property
    def max_concurrent_decodes(self) -> int:
        """Decode slots: sequences decoded at once."""
        return self.sampling_cfg.max_concurrent_decodes

    @property
    def max_prefill_length(self) -> int:
        """The longest prompt a request may have."""
        return self.sampling_cfg.max_prefill_length

    # -- shardings --------------------------------------------------------------------------

    def replicated(self) -> NamedSharding:
        """A sharding that puts a copy on every device of the mesh."""
        return NamedSharding(self._mesh, PartitionSpec())

    def param_shardings(self, params: nnx.State) -> Any:
        """The sampler's shardings for a params state of this model."""
        return state_shardings(params, self._mesh, self.rules)

    def get_prefix_destination_sharding(self) -> Prefix:
        """Where a Prefix must live before ``bulk_insert``: a Prefix of shardings."""
        return prefix_shardings(self._mesh, self.rules, self.model_cfg.num_kv_heads)

    def decode_state_shardings(self) -> DecodeState:
        """Where each DecodeState array lives: the pool over kv heads (and pages, with several
        kv shards), the per-slot arrays with their slots."""
        return decode_state_shardings(
            self._mesh,
            self.rules,
            self.model_cfg.num_kv_heads,
            self.kv_shards,
            len(self.pool_layout.layers),
        )

    # -- params and state -------------------------------------------------------------------

    def load_params(self, params: nnx.State | None) -> Any:
        """``params`` (e.g. the learner's) copied onto the sampler mesh by ``device_put``
        (never a jit, which could not write to another mesh), then put in the layout this
        engine serves from (:meth:`serving_params`, a jit on the sampler mesh).

        Always a copy: the learner donates its buffers to the next step, so the sampler must
        never alias them, even when both roles share devices.
        """
        params = check_learner_params(params)
        moved = jax.device_put(params, self.param_shardings(params), may_alias=False)
        return self.serving_params(moved)

    def load_checkpoint(self, path: str) -> Any:
        """The checkpoint at ``path`` read into the sampler's shardings, in the served layout."""
        params = load_checkpoint(path, self.model_cfg, self._mesh, self.rules)
        return self.serving_params(params)

    def serving_params(self, params: Any) -> Any:
        """``params`` (on the sampler mesh) in the layout this engine serves from.

        A params state goes through the engine's :class:`~rljax.engine.weights.ServingLayout`
        (under 'per_layer' it becomes a new :class:`~rljax.models.serving.ServingDecoder`);
        anything else (weights already served, or None) is returned as it is. prefill and
        generate take what this returns.
        """
        if not isinstance(params, nnx.State):
            return params
        return self.layout.serve(params)

    def init_decode_state(self) -> DecodeState:
        """Fresh device state, every slot free, and fresh host page allocators."""
        with self._lock:
            self.pages.reset()
            return self.steps.make_state()

    # -- prefill ----------------------------------------------------------------------------

    def bucket_for(self, length: int) -> int:
        """The padded length a prompt of ``length`` tokens is prefilled at."""
        for b in self.buckets:
            if length <= b:
                return b
        raise ValueError(
            f"sequence of {length} tokens exceeds the largest prefill bucket {self.buckets[-1]}; "
            "raise sampling.max_prefill_length or shorten the prompt"
        )

    def prefill_multisampling(
        self,
        *,
        params: Any,
        padded_tokens: Any,
        true_length: int,
        sampler: LogitsSampler | None = None,
        rng: jax.Array | None = None,
        num_samples: int = 1,
        sampling: SlotSampling | None = None,
        step: int = 0,
    ) -> tuple[Prefix, ResultTokens]:
        """Cache ``padded_tokens[:true_length]`` and draw ``num_samples`` first tokens, each
        from its own PRNG stream.

        ``rng``: None (the engine's next key), one key (split per sample), or one key per
        sample (shape ``[num_samples]``). The ResultTokens holds one row per sample
        (``samples_per_slot = num_samples``), so ``get_result_at_slot(0)`` reads them all.
        ``sampling``: per-request settings (None: ``sampling_cfg``). ``step``: the index in its
        stream of the token drawn, the response tokens a resumed sample already has (0 for a
        fresh prompt). ``sampler``: a caller's logits -> tokens function (JetStream's).
        """
        return prefill_one(
            self,
            params,
            padded_tokens,
            true_length,
            rng=rng,
            num_samples=num_samples,
            sampling=sampling,
            sampler=sampler,
            step=step,
        )

    def prefill_batch(
        self,
        *,
        params: Any,
        requests: Sequence[PrefillRequest],
        sampler: LogitsSampler | None = None,
    ) -> list[tuple[Prefix, ResultTokens]]:
        """Many prompts in one call: see :mod:`rljax.engine.prefill`."""
        return prefill_batch(self, params, requests, sampler=sampler)

    def sample_keys(self, rng: jax.Array | None, n: int) -> jax.Array:
        """Key data [n, 2]: one PRNG stream per sample (the engine's next key when None)."""
        if rng is None:
            with self._lock:
                i = next(self._prefills)
            rng = jax.random.fold_in(self._base_key, i)
        return sample_keys(rng, n)

    # -- slots ------------------------------------------------------------------------------

    def bulk_insert(
        self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int]
    ) -> DecodeState:
        """Insert one prefix into several slots in one device call.

        Slot ``i`` feeds sample ``i`` when the prefix has one sample per slot; a one-sample
        prefix goes to every slot, each slot past the first with its own PRNG stream. Raises
        ValueError for a repeated or out-of-range slot, or one still busy after
        ``BUSY_SLOT_GRACE_S``, and OutOfPages when the pool cannot hold them all, taking no
        page either way.
        """
        slots = [int(s) for s in slots]
        n = prefix.num_samples
        if not slots or n not in (1, len(slots)):
            raise ValueError(
                f"bulk_insert got a prefix of {n} samples for slots {slots}; give one slot per "
                "sample (prefix.select picks samples)"
            )
        # Pad to a power of two so only log2(slots) shapes ever compile; padding writes to the
        # null page and to slot index B, which the scatters drop.
        width = 1 << (len(slots) - 1).bit_length()
        slot_ids = np.full(width, self.max_concurrent_decodes, np.int32)
        slot_ids[: len(slots)] = slots
        cols = np.zeros(width, np.int32)
        fold = np.zeros(width, np.uint32)
        if n == len(slots):
            cols[:n] = np.arange(n)
        else:
            fold[: len(slots)] = np.arange(len(slots))
        with self._freed:
            if self._busy(slots):  # another thread's free_resource may be on its way
                self._freed.wait_for(lambda: not self._busy(slots), timeout=BUSY_SLOT_GRACE_S)
            rows = []
            for admitted in self.pages.admit(slots, int(prefix.length)):  # one per pool
                rows.append(np.zeros((width, self.pages_per_slot), np.int32))
                rows[-1][: len(slots)] = admitted
            decode_state = self.pages.ship(decode_state)
            # One set of input shardings whichever prefill made the prefix: nothing recompiles.
            prefix = jax.device_put(prefix, self.get_prefix_destination_sharding())
            return self.steps.insert(decode_state, prefix, tuple(rows), slot_ids, cols, fold)

    def free_resource(self, slot: int) -> None:
        """Return ``slot``'s pages to the pool now; a free slot stays free.

        Needs no decode state: the device stops using the slot before the next insert or
        generate reads the page table.
        """
        slot = int(slot)
        if not 0 <= slot < self.max_concurrent_decodes:
            raise ValueError(
                f"slot {slot} is out of range [0, {self.max_concurrent_decodes}); "
                "free a slot that insert was given"
            )
        with self._freed:
            if self.pages.active[slot]:
                self.pages.release(slot)
                self._freed.notify_all()

    def pause(self, slot: int) -> None:
        """Stop decoding ``slot`` but keep its pages and cached tokens (a conversation waiting
        for its env); :meth:`extend` continues it, ``free_resource`` ends it."""
        with self._lock:
            self.pages.pause(slot)

    def extend(
        self,
        params: Any,
        decode_state: DecodeState,
        slot: int,
        tokens: Sequence[int],
        *,
        step: int,
        sampler: LogitsSampler | None = None,
    ) -> tuple[DecodeState, ResultTokens]:
        """Prefill ``tokens`` onto ``slot``'s cached ones and draw its next token (a
        conversation's next turn, earlier turns never encoded again).

        ``tokens`` start with the token the slot would feed next (the one ``generate`` drew
        last, not yet cached); the next token is drawn as token ``step`` of the slot's stream
        and fed by the next ``generate``. Unpauses the slot. Raises OutOfPages (taking
        nothing) when the pool is short, ValueError when the slot would have no room left.
        Recording routes, the result's ``routes`` are those of ``tokens`` [n, Lm*k].
        """
        slot, n = int(slot), len(tokens)
        chunk = extend_chunk(self, tokens)
        with self._lock:
            start = int(self.pages.positions[slot])
            rows = self.pages.extend(slot, n)  # raises OutOfPages / ValueError taking nothing
            decode_state = self.pages.ship(decode_state)  # the slot decodes again
            decode_state, data, log_prob, routes = self.steps.extend(sampler)(
                params,
                decode_state,
                jnp.asarray(chunk),
                jnp.int32(n),
                jnp.int32(start),
                tuple(jnp.asarray(row) for row in rows),
                jnp.int32(slot),
                jnp.int32(step),
            )
        routes = None if routes is None else routes[:n]
        return decode_state, ResultTokens(data, log_prob=log_prob, routes=routes)

    def _busy(self, slots: list[int]) -> bool:
        b = self.max_concurrent_decodes
        return any(0 <= s < b and self.pages.active[s] for s in slots)

    def shard_of(self, slot: int) -> int:
        """The kv shard whose pages ``slot`` uses."""
        return self.pages.shard_of(slot)

    @property
    def allocators(self) -> list[PageAllocator]:
        """Each kv shard's page allocator."""
        return self.pages.allocators

    def slot_length(self, slot: int) -> int:
        """Tokens cached for ``slot`` (prompt and generated)."""
        return int(self.pages.positions[slot])

    def page_usage(self) -> dict[str, int]:
        """Pages held and free in each pool (:meth:`rljax.engine.pools.PagePools.usage`)."""
        with self._lock:
            return self.pages.usage()

    # -- generate ---------------------------------------------------------------------------

    def generate(
        self, params: Any, decode_state: DecodeState, sampler: LogitsSampler | None = None
    ) -> tuple[DecodeState, ResultTokens]:
        """One token for every live slot; the ResultTokens stays on the device.

        Grows page tables first, taking no page when it raises OutOfPages (the pool is short;
        the exception names the slots). A slot holding ``max_seq_len`` tokens is not live: it
        reports ``valid = False`` and takes nothing until ``free_resource``. Recording routes,
        the result's ``routes`` [B, Lm*k] are those of the token each slot fed.
        """
        with self._lock:
            self.pages.grow()
            decode_state = self.pages.ship(decode_state)
            step = self.steps.generate(sampler)
            decode_state, data, log_prob, routes = step(params, decode_state)
            self.pages.advance()
        return decode_state, ResultTokens(data, log_prob=log_prob, routes=routes)

    def generate_steps(
        self,
        params: Any,
        decode_state: DecodeState,
        steps: int,
        limits: Sequence[int] | np.ndarray,
        stop_ids: Collection[int],
        sampler: LogitsSampler | None = None,
    ) -> tuple[DecodeState, list[ResultTokens]]:
        """Up to ``steps`` tokens for every live slot in one device call (rljax's multi-step
        decode; :mod:`rljax.engine.decode`): slot b draws at most ``limits[b]`` and stops at
        any of ``stop_ids``. Every page the call may write is taken first (OutOfPages as
        :meth:`generate`). Returns one host ResultTokens per step, as ``generate`` would."""
        ahead, inputs = decode.call_inputs(steps, limits, stop_ids, self.replicated())
        with self._lock:
            self.pages.grow(ahead)
            decode_state = self.pages.ship(decode_state)
            call = self.steps.generate_steps(sampler, steps)
            decode_state, *out = call(params, decode_state, *inputs)
            results = decode.split_steps(*out)
            self.pages.advance(decode.decoded(results))
        return decode_state, results

    def lower_generate(self, params: Any) -> jax.stages.Lowered:
        """The device step of :meth:`generate` lowered for a params state and an empty decode
        state, in the layout this engine serves.

        ``params`` may be arrays or abstract (``nnx.eval_shape``) ShapeDtypeStructs: only their
        shapes and dtypes count, placed as the engine's layout places what it serves. The
        decode state is abstract too, so nothing is allocated. ``.compile().memory_analysis()``
        gives per-device bytes.
        """
        params = self.layout.abstract(params)
        abstract = jax.eval_shape(self.steps.make_state)
        state = with_shardings(abstract, self.decode_state_shardings())
        return self.steps.lower_generate(params, state)
