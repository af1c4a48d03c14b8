"""A JetStream engine (``engine_api.Engine`` of JetStream's final release) over rljax's native
paged engine.

:class:`Engine` is the JetStream contract and nothing else: every member of JetStream's API
with its signature and meaning, so JetStream's own orchestrator drives it with no adapter. It
holds a :class:`~rljax.engine.paged.PagedEngine` (``Engine.native``), which owns the slots,
the page tables and the compiled steps, and forwards to it. rljax's own code (the
:class:`~rljax.engine.sampler.Sampler`, the runtime) drives the native engine directly, with
its extensions: ``pause``, ``extend``, ``prefill_batch``, slot lengths and page accounting.

The seam: what JetStream defines (its argument conventions, the tokenizer, a bare
``load_params()`` reading a checkpoint, ``existing_prefix`` refused, the registration with
JetStream's ABCs) is here; what a paged engine is, is in :mod:`rljax.engine.paged`. The shim
keeps the name ``Engine`` and its constructor, so code written against JetStream's API (the
conformance test drives JetStream's orchestrator over it) sees no change.

rljax does not import JetStream (its package pulls TensorFlow): when a caller has imported
``jetstream.engine.engine_api``, the engine registers its classes with JetStream's ABCs, so
the orchestrator's ``isinstance`` checks hold.

- ``prefill`` caches the whole prompt and draws its first token; ``prefill_multisampling``
  draws ``num_samples`` first tokens from one forward pass, each with its own PRNG stream.
- ``insert`` / ``bulk_insert`` arm slots with a prefix; ``generate`` returns every live slot's
  next token as a ResultTokens, with the log-prob of each sampled token in ``log_prob``.
- ``free_resource(slot)`` returns the slot's pages at once and takes no decode state (it may run
  on JetStream's detokenize thread): see :mod:`rljax.engine.paged` for how a racing insert waits.
- A slot that holds ``max_seq_len`` tokens stops: ``generate`` reports it ``valid = False``
  until ``free_resource``; JetStream's orchestrator steps a finished slot until its detokenize
  thread frees it, so this must not raise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rljax.config import LoRAConfig, ModelConfig, SamplingConfig
from rljax.engine.decode import Sampler as LogitsSampler
from rljax.engine.paged import BUSY_SLOT_GRACE_S, PagedEngine
from rljax.engine.state import (
    DecodeState,
    Prefix,
    ResultTokens,
    SlotData,
    SlotSampling,
    register_with_jetstream,
)
from rljax.engine.tokenizer import EngineTokenizer, TokenizerParameters, load_tokenizer
from rljax.models.sharding import SAMPLER_RULES, ShardingRules

__all__ = [
    "BUSY_SLOT_GRACE_S",
    "DecodeState",
    "Engine",
    "Prefix",
    "ResultTokens",
    "SlotData",
    "SlotSampling",
]


class Engine:
    """JetStream's ``Engine`` on the sampler mesh: prefill / insert / generate / free_resource.

    ``tokenizer`` is a Hugging Face tokenizer directory or a ``.gguf`` file, what
    ``get_tokenizer`` / ``build_tokenizer`` serve; ``checkpoint`` (the same kinds of path)
    holds what ``load_params()`` loads when given no params. The other arguments build the
    native engine (:class:`~rljax.engine.paged.PagedEngine`), ``native``.
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
        self.native = PagedEngine(
            model_cfg, sampling_cfg, mesh, graphdef, rules=rules, impl=impl, seed=seed, lora=lora
        )
        self.tokenizer_path = None if tokenizer is None else os.fspath(tokenizer)
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)

    # -- JetStream properties ---------------------------------------------------------------

    @property
    def mesh(self) -> Mesh:
        """The sampler mesh."""
        return self.native.mesh

    @property
    def max_concurrent_decodes(self) -> int:
        """Decode slots."""
        return self.native.max_concurrent_decodes

    @property
    def max_prefill_length(self) -> int:
        """The longest prompt."""
        return self.native.max_prefill_length

    @property
    def samples_per_slot(self) -> int:
        """One sample per slot in a generate's ResultTokens."""
        return 1

    @property
    def colocated_cpus(self) -> None:
        """No CPU devices are set aside next to the accelerators."""
        return None

    @property
    def use_chunked_prefill(self) -> bool:
        """Prompts are prefilled whole."""
        return False

    @property
    def prefill_chunk_size(self) -> int:
        """The largest bucket: a prompt is always prefilled in one call."""
        return self.native.buckets[-1]

    # -- params, tokenizer, state -----------------------------------------------------------

    def get_prefix_destination_sharding(self) -> Prefix:
        """Where a Prefix must live before ``insert``: a Prefix of shardings."""
        return self.native.get_prefix_destination_sharding()

    def load_params(self, params: nnx.State | None = None, *args: Any, **kwargs: Any) -> Any:
        """``params`` (e.g. the learner's) copied onto the sampler mesh in the layout the engine
        serves from (``PagedEngine.load_params``); with none, the engine's ``checkpoint``."""
        del args, kwargs  # JetStream passes loader-specific options; none apply here
        if params is None and self.checkpoint is not None:
            return self.native.load_checkpoint(self.checkpoint)
        if params is None:
            raise ValueError(
                "load_params() needs the params to serve: pass a params state, e.g. "
                "load_params(learner.params), or build the Engine with checkpoint=PATH"
            )
        return self.native.load_params(params)

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
        return EngineTokenizer(load_tokenizer(os.fspath(metadata.path)), self.native.buckets)

    def init_decode_state(self, *args: Any, **kwargs: Any) -> DecodeState:
        """Fresh device state, every slot free, and fresh host page allocators."""
        del args, kwargs
        return self.native.init_decode_state()

    # -- prefill ----------------------------------------------------------------------------

    def prefill(
        self,
        *,
        params: Any,
        existing_prefix: Any = None,
        padded_tokens: Any,
        true_length: int,
        sampler: LogitsSampler | None = None,
        request_id: Any = None,
        rng: Any = None,
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
        params: Any,
        existing_prefix: Any = None,
        padded_tokens: Any,
        true_length: int,
        sampler: LogitsSampler | None = None,
        rng: Any = None,
        num_samples: int = 1,
        sampling: SlotSampling | None = None,
        step: int = 0,
    ) -> tuple[Prefix, ResultTokens]:
        """One prefill and ``num_samples`` first tokens, each from its own PRNG stream
        (``PagedEngine.prefill_multisampling``; ``step`` is an rljax extension)."""
        if existing_prefix is not None:
            raise ValueError(
                "existing_prefix is not supported: this engine has no prefix cache "
                "(use_chunked_prefill is False); prefill the whole prompt"
            )
        out = self.native.prefill_multisampling(
            params=params,
            padded_tokens=padded_tokens,
            true_length=true_length,
            sampler=sampler,
            rng=rng,
            num_samples=num_samples,
            sampling=sampling,
            step=step,
        )
        register_with_jetstream(("ResultTokens", ResultTokens), ("Engine", Engine))
        return out

    # -- slots ------------------------------------------------------------------------------

    def insert(
        self, prefix: Prefix, decode_state: DecodeState, slot: int, request_id: Any = None
    ) -> DecodeState:
        """Arm ``slot`` with a one-sample ``prefix`` (raises OutOfPages, taking nothing)."""
        del request_id
        if prefix.num_samples != 1:
            raise ValueError(
                f"insert takes a one-sample prefix, got {prefix.num_samples} samples; use "
                "bulk_insert, or prefix.select([i])"
            )
        return self.native.bulk_insert(prefix, decode_state, [slot])

    def bulk_insert(
        self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int]
    ) -> DecodeState:
        """Insert one prefix into several slots in one device call
        (``PagedEngine.bulk_insert``)."""
        return self.native.bulk_insert(prefix, decode_state, slots)

    def free_resource(self, slot: int) -> None:
        """Return ``slot``'s pages to the pool now; a free slot stays free."""
        self.native.free_resource(slot)

    # -- generate ---------------------------------------------------------------------------

    def generate(
        self, params: Any, decode_state: DecodeState, sampler: LogitsSampler | None = None
    ) -> tuple[DecodeState, ResultTokens]:
        """One token for every live slot; the ResultTokens stays on the device."""
        out = self.native.generate(params, decode_state, sampler)
        register_with_jetstream(("ResultTokens", ResultTokens), ("Engine", Engine))
        return out
