"""A JetStream engine (``engine_api.Engine`` of JetStream's final release) over a paged KV cache.

Every member of JetStream's API is here with its signature and meaning, so JetStream's own
orchestrator can drive it with no adapter; rljax's Sampler uses the same calls. rljax does not
import JetStream (its package pulls TensorFlow): when a caller has imported
``jetstream.engine.engine_api``, the engine registers its classes with JetStream's ABCs, so
the orchestrator's ``isinstance`` checks hold.

- ``prefill`` caches the whole prompt and draws its first token, returned as a
  :class:`ResultTokens`; ``prefill_multisampling`` draws ``num_samples`` first tokens from one
  forward pass, each with its own PRNG stream. ``prefill_batch`` (an rljax extension) runs
  many prompts in one call: see :mod:`rljax.engine.prefill`.
- ``insert`` / ``bulk_insert`` arm slots with a prefix; ``generate`` feeds every live slot's
  last token and returns the next as a ResultTokens (still on the device), with the log-prob
  of each sampled token in ``log_prob``.
- ``free_resource(slot)`` returns the slot's pages at once. It takes no decode state (it may
  run on another thread, as in JetStream's orchestrator); the device side of the slot is parked
  before the next insert or generate. JetStream's detokenize thread puts a slot back on the
  free queue just *before* it calls ``free_resource``, so an insert can reach a slot whose free
  is a moment away: insert waits up to ``BUSY_SLOT_GRACE_S`` for it, then refuses the busy
  slot.
- A slot that holds ``max_seq_len`` tokens stops: ``generate`` reports it ``valid = False``
  and takes no page for it, until ``free_resource``. JetStream's orchestrator steps a finished
  slot until its detokenize thread frees it, so this must not raise.

Decode state lives on the sampler mesh. Keys and values sit in a page pool [L, K, P, Z, H];
each slot owns a row of the page table. A host-side :class:`SlotPages` hands out pages as
sequences grow, so memory follows the tokens held rather than slots x maximum length. The
slots and the pool are split into ``kv_shards`` equal shards, one per device group of the
sampler's 'batch' mesh axes: each shard's slots use its own pages only (one shard when the
slots do not divide).

This module is the API and the host bookkeeping of slots and pages (under one lock). The rest
of the engine lives beside it: the compiled device steps (:mod:`rljax.engine.steps`), prefill's
host side (:mod:`rljax.engine.prefill`), the data types and where they live
(:mod:`rljax.engine.state`), the layout of the served weights (:mod:`rljax.engine.weights`)
and the host page allocator (:mod:`rljax.engine.pages`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import threading
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.config import LoRAConfig, ModelConfig, SamplingConfig
from rljax.engine.pages import PageAllocator, SlotPages
from rljax.engine.prefill import (
    PrefillRequest,
    extend_slot,
    prefill_batch,
    prefill_one,
    sample_keys,
)
from rljax.engine.state import (
    DecodeState,
    Prefix,
    ResultTokens,
    SlotData,
    SlotSampling,
    decode_state_shardings,
    prefix_shardings,
    register_with_jetstream,
)
from rljax.engine.steps import build_steps
from rljax.engine.tokenizer import EngineTokenizer, TokenizerParameters, load_tokenizer
from rljax.engine.weights import ServingLayout, load_checkpoint, serving_layout
from rljax.models.sharding import (
    SAMPLER_RULES,
    ShardingRules,
    axis_size,
    state_shardings,
    with_shardings,
)

__all__ = ["Engine", "DecodeState", "Prefix", "ResultTokens", "SlotData", "SlotSampling"]

# How long insert waits for another thread's free_resource of a slot it finds busy.
BUSY_SLOT_GRACE_S = 1.0


class Engine:
    """JetStream's ``Engine`` on the sampler mesh: prefill / insert / generate / free_resource.

    ``tokenizer`` is a Hugging Face tokenizer directory or a ``.gguf`` file, what
    ``get_tokenizer`` / ``build_tokenizer`` serve; ``checkpoint`` (the same kinds of path)
    holds what ``load_params()`` loads when given no params; ``seed`` seeds the PRNG streams
    of prefills given no ``rng``; ``lora``: the LoRA adapters ``graphdef`` holds (served merged
    or unmerged, rljax.engine.weights.lora_merged).
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
        tokenizer: str | os.PathLike | None = None,
        checkpoint: str | os.PathLike | None = None,
        seed: int = 0,
        lora: LoRAConfig | None = None,
    ):
        self.model_cfg = model_cfg
        self.sampling_cfg = sampling_cfg
        self._mesh = mesh
        self._graphdef = graphdef
        self._rules = rules
        self.impl = impl  # kernels: 'auto' (Pallas on TPU), 'pallas' or 'xla'
        self.tokenizer_path = None if tokenizer is None else os.fspath(tokenizer)
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.page_size = z = sampling_cfg.page_size
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
        # free_resource may run on another thread than insert/generate (JetStream's
        # detokenize thread): the host page state changes under this lock only.
        self._lock = threading.RLock()
        self._freed = threading.Condition(self._lock)  # notified by free_resource
        self._parked = False  # host slots freed since the device state last saw the table
        self._base_key = jax.random.key(seed)
        self._prefills = itertools.count()
        # How the served weights are held, fixed for the engine's life (rljax.engine.weights).
        self.layout: ServingLayout = serving_layout(
            sampling_cfg.weights_layout, model_cfg, graphdef, mesh, rules, lora_cfg=lora
        )
        self.weights_layout = self.layout.name
        self._steps = build_steps(self)

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

    @property
    def colocated_cpus(self) -> None:
        """No CPU devices are set aside next to the accelerators."""
        return None

    @property
    def use_chunked_prefill(self) -> bool:
        return False

    @property
    def prefill_chunk_size(self) -> int:
        """The largest bucket: a prompt is always prefilled in one call."""
        return self.buckets[-1]

    # -- shardings --------------------------------------------------------------------------

    def _replicated(self) -> NamedSharding:
        return NamedSharding(self._mesh, PartitionSpec())

    def param_shardings(self, params: nnx.State):
        """The sampler's shardings for a params state of this model."""
        return state_shardings(params, self._mesh, self._rules)

    def get_prefix_destination_sharding(self) -> Prefix:
        """Where a Prefix must live before ``insert``: a Prefix of shardings."""
        return prefix_shardings(self._mesh, self._rules, self.model_cfg.num_kv_heads)

    def decode_state_shardings(self) -> DecodeState:
        """Where each DecodeState array lives: the pool over kv heads (and pages, with several
        kv shards), the per-slot arrays with their slots."""
        return decode_state_shardings(
            self._mesh, self._rules, self.model_cfg.num_kv_heads, self.kv_shards
        )

    # -- params, tokenizer, state -----------------------------------------------------------

    def load_params(self, params: nnx.State | None = None, *args, **kwargs):
        """``params`` (e.g. the learner's) copied onto the sampler mesh by ``device_put``
        (never a jit, which could not write to another mesh), then put in the layout this
        engine serves from (:meth:`serving_params`, a jit on the sampler mesh). With none, the
        engine's ``checkpoint`` read into the sampler's shardings.

        Always a copy: the learner donates its buffers to the next step, so the sampler must
        never alias them, even when both roles share devices.
        """
        del args, kwargs  # JetStream passes loader-specific options; none apply here
        if params is None and self.checkpoint is not None:
            params = load_checkpoint(self.checkpoint, self.model_cfg, self._mesh, self._rules)
            return self.serving_params(params)
        if params is None:
            raise ValueError(
                "load_params() needs the params to serve: pass a params state, e.g. "
                "load_params(learner.params), or build the Engine with checkpoint=PATH"
            )
        if not isinstance(params, nnx.State):
            raise ValueError(
                "load_params() takes a params state (the learner's layout), not params this "
                "engine already serves; pass those to prefill/generate as they are"
            )
        moved = jax.device_put(params, self.param_shardings(params), may_alias=False)
        return self.serving_params(moved)

    def serving_params(self, params):
        """``params`` (on the sampler mesh) in the layout this engine serves from.

        A params state goes through the engine's :class:`~rljax.engine.weights.ServingLayout`
        (under 'per_layer' it becomes a new :class:`~rljax.models.serving.ServingDecoder`);
        anything else (weights already served, or None) is returned as it is. prefill and
        generate take what this returns.
        """
        if not isinstance(params, nnx.State):
            return params
        return self.layout.serve(params)

    def get_tokenizer(self) -> TokenizerParameters:
        """Where the tokenizer lives (JetStream's ``TokenizerParameters``)."""
        if self.tokenizer_path is None:
            raise ValueError(
                "this Engine has no tokenizer; build it with Engine(..., tokenizer=PATH), a "
                "Hugging Face tokenizer directory or a .gguf file"
            )
        return TokenizerParameters(path=self.tokenizer_path)

    def build_tokenizer(self, metadata: TokenizerParameters) -> EngineTokenizer:
        """A JetStream ``tokenizer_api.Tokenizer`` loaded from ``metadata.path``."""
        return EngineTokenizer(load_tokenizer(os.fspath(metadata.path)), self.buckets)

    def init_decode_state(self, *args, **kwargs) -> DecodeState:
        """Fresh device state, every slot free, and fresh host page allocators."""
        del args, kwargs
        with self._lock:
            self.pages.reset()
            self._parked = False
            return self._steps.make_state()

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

    def prefill(
        self,
        *,
        params: nnx.State,
        existing_prefix=None,
        padded_tokens,
        true_length: int,
        sampler=None,
        request_id=None,
        rng=None,
        sampling: SlotSampling | None = None,
    ) -> tuple[Prefix, ResultTokens]:
        """Cache ``padded_tokens[:true_length]`` and draw the first token.

        ``rng`` (a PRNG key) and ``sampling`` (per-request settings) are rljax extensions;
        without them the engine draws its own key and uses ``sampling_cfg``.
        """
        del request_id
        return self.prefill_multisampling(
            params=params,
            existing_prefix=existing_prefix,
            padded_tokens=padded_tokens,
            true_length=true_length,
            sampler=sampler,
            rng=rng,
            num_samples=1,
            sampling=sampling,
        )

    def prefill_multisampling(
        self,
        *,
        params: nnx.State,
        existing_prefix=None,
        padded_tokens,
        true_length: int,
        sampler=None,
        rng=None,
        num_samples: int = 1,
        sampling: SlotSampling | None = None,
        step: int = 0,
    ) -> tuple[Prefix, ResultTokens]:
        """One prefill and ``num_samples`` first tokens, each from its own PRNG stream.

        ``rng``: None (the engine's next key), one key (split per sample), or one key per
        sample (shape ``[num_samples]``). The ResultTokens holds one row per sample
        (``samples_per_slot = num_samples``), so ``get_result_at_slot(0)`` reads them all.
        ``step`` (an rljax extension): the index in its stream of the token drawn, the
        response tokens a resumed sample already has (0 for a fresh prompt).
        """
        if existing_prefix is not None:
            raise ValueError(
                "existing_prefix is not supported: this engine has no prefix cache "
                "(use_chunked_prefill is False); prefill the whole prompt"
            )
        out = prefill_one(
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
        register_with_jetstream(("ResultTokens", ResultTokens), ("Engine", Engine))
        return out

    def prefill_batch(
        self, *, params: nnx.State, requests: Sequence[PrefillRequest], sampler=None
    ) -> list[tuple[Prefix, ResultTokens]]:
        """Many prompts in one call (an rljax extension): see :mod:`rljax.engine.prefill`."""
        return prefill_batch(self, params, requests, sampler=sampler)

    def _sample_keys(self, rng, n: int) -> jax.Array:
        """Key data [n, 2]: one PRNG stream per sample (the engine's next key when None)."""
        if rng is None:
            with self._lock:
                i = next(self._prefills)
            rng = jax.random.fold_in(self._base_key, i)
        return sample_keys(rng, n)

    # -- slots ------------------------------------------------------------------------------

    def insert(
        self, prefix: Prefix, decode_state: DecodeState, slot: int, request_id=None
    ) -> DecodeState:
        """Arm ``slot`` with a one-sample ``prefix`` (raises OutOfPages, taking nothing)."""
        del request_id
        if prefix.num_samples != 1:
            raise ValueError(
                f"insert takes a one-sample prefix, got {prefix.num_samples} samples; use "
                "bulk_insert, or prefix.select([i])"
            )
        return self.bulk_insert(prefix, decode_state, [slot])

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
            rows = np.zeros((width, self.pages_per_slot), np.int32)
            rows[: len(slots)] = self.pages.admit(slots, int(prefix.length))
            decode_state = self._park_freed(decode_state)
            # One set of input shardings whichever prefill made the prefix: nothing recompiles.
            prefix = jax.device_put(prefix, self.get_prefix_destination_sharding())
            return self._steps.insert(decode_state, prefix, rows, slot_ids, cols, fold)

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
                self._parked = True
                self._freed.notify_all()

    def pause(self, slot: int) -> None:
        """Stop decoding ``slot`` but keep its pages and cached tokens (an rljax extension: a
        conversation waiting for its env); :meth:`extend` continues it, ``free_resource``
        ends it."""
        with self._lock:
            if not self.pages.active[slot]:
                raise ValueError(f"slot {slot} is free: only a slot in use can be paused")
            self.pages.paused[slot] = True
            self._parked = True

    def extend(
        self,
        params,
        decode_state: DecodeState,
        slot: int,
        tokens: Sequence[int],
        *,
        step: int,
        sampler=None,
    ) -> tuple[DecodeState, ResultTokens]:
        """Prefill ``tokens`` onto ``slot``'s cached ones and draw its next token (an rljax
        extension: a conversation's next turn, earlier turns never encoded again).

        ``tokens`` start with the token the slot would feed next (the one ``generate`` drew
        last, not yet cached); the next token is drawn as token ``step`` of the slot's stream
        and fed by the next ``generate``. Unpauses the slot. Raises OutOfPages (taking
        nothing) when the pool is short, ValueError when the slot would have no room left.
        """
        return extend_slot(self, params, decode_state, slot, tokens, step, sampler)

    def _busy(self, slots: list[int]) -> bool:
        b = self.max_concurrent_decodes
        return any(0 <= s < b and self.pages.active[s] for s in slots)

    def _park_freed(self, decode_state: DecodeState) -> DecodeState:
        """Ship the host page table and slot mask to the device if a slot was freed or grew
        (one small host->device copy, no recompile). Call with the lock held."""
        if not self._parked:
            return decode_state
        self._parked = False
        table = jax.device_put(self.pages.table.copy(), decode_state.page_table.sharding)
        active = jax.device_put(self.pages.decoding(), decode_state.active.sharding)
        return dataclasses.replace(decode_state, page_table=table, active=active)

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

    # -- generate ---------------------------------------------------------------------------

    def generate(
        self, params: nnx.State, decode_state: DecodeState, sampler=None
    ) -> tuple[DecodeState, ResultTokens]:
        """One token for every live slot; the ResultTokens stays on the device.

        Grows page tables first, taking no page when it raises OutOfPages (the pool is short;
        the exception names the slots). A slot holding ``max_seq_len`` tokens is not live: it
        reports ``valid = False`` and takes nothing until ``free_resource``.
        """
        with self._lock:
            self._parked |= self.pages.grow()
            decode_state = self._park_freed(decode_state)
            decode_state, data, log_prob = self._steps.generate(sampler)(params, decode_state)
            self.pages.advance()
        register_with_jetstream(("ResultTokens", ResultTokens), ("Engine", Engine))
        return decode_state, ResultTokens(data, log_prob=log_prob)

    def lower_generate(self, params: nnx.State) -> jax.stages.Lowered:
        """The device step of :meth:`generate` lowered for a params state and an empty decode
        state, in the layout this engine serves.

        ``params`` may be arrays or abstract (``nnx.eval_shape``) ShapeDtypeStructs: only their
        shapes and dtypes count, placed as the engine's layout places what it serves. The
        decode state is abstract too, so nothing is allocated. ``.compile().memory_analysis()``
        gives per-device bytes.
        """
        params = self.layout.abstract(params)
        abstract = jax.eval_shape(self._steps.make_state)
        state = with_shardings(abstract, self.decode_state_shardings())
        return self._steps.lower_generate(params, state)
