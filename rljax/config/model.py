"""The model's section of a run config: the decoder's architecture, dense or mixture-of-experts,
and the ``moe`` section (routing replay and expert parallelism).

Field names follow Hugging Face ``config.json`` where one exists, so a checkpoint's config reads
into :class:`ModelConfig` key for key (``rljax.models.families``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rljax.config.checks import (
    DTYPES,
    FAMILIES,
    HIDDEN_ACTS,
    LAYER_TYPES,
    MOE_FAMILIES,
    ROUTER_REPLAY,
    _fail,
    _one_of,
    _positive,
    _positive_float,
)
from rljax.models.lora_targets import ATTENTION_TARGETS, target_weights


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Llama / Qwen2 / Qwen3 / SmolLM2, the Qwen3-MoE / Qwen2-MoE
    mixtures of experts, and Gemma 2 / Gemma 3 / Gemma 4 text), read by rljax.models.

    Field names follow Hugging Face ``config.json`` where one exists.

    Attributes:
      family: the architecture, one of llama, qwen2, qwen3, qwen3_moe, qwen2_moe, gemma2, gemma3,
        gemma4.
      vocab_size: rows of the token embedding (and of the output projection).
      hidden_size: D, the width of the residual stream.
      intermediate_size: the hidden width of the SwiGLU MLP.
      num_layers: decoder blocks.
      num_heads: N, query heads.
      num_kv_heads: key/value heads, a divisor of num_heads (grouped-query attention).
      head_dim: H, the width of one head (even: RoPE rotates pairs).
      rope_theta: the RoPE base frequency.
      rope_scaling: None, or a mapping with rope_type='llama3', factor, low_freq_factor,
        high_freq_factor, original_max_position_embeddings (Llama 3.1+ long-context scaling),
        or rope_type='linear' and factor (positions divided by it; Gemma 3's global layers).
      norm_eps: the RMSNorms' epsilon.
      tie_embeddings: the output projection reuses the token embedding.
      qk_norm: RMSNorm on each head's q and k before RoPE (Qwen3).
      qkv_bias: bias on the q/k/v projections (Qwen2).
      max_position_embeddings: the longest sequence the model takes.
      dtype: the activation / compute dtype, float32 or bfloat16.
      param_dtype: the dtype of the learner's master parameters.
      num_experts: E, the routed experts of a mixture-of-experts layer; 0: a dense model.
      num_experts_per_tok: k, the experts each token is routed to (top-k of the router).
      moe_intermediate_size: the hidden width of one routed expert's SwiGLU MLP.
      norm_topk_prob: renormalise the k chosen experts' router probabilities to sum to 1
        (Qwen3-30B-A3B); otherwise they keep their softmax mass (Qwen2-MoE).
      decoder_sparse_step: layer i is a mixture-of-experts layer when (i + 1) is a multiple of
        it (and i is not in mlp_only_layers); the others keep a dense MLP.
      mlp_only_layers: layers that keep a dense MLP of intermediate_size.
      shared_expert_intermediate_size: the width of Qwen2-MoE's shared expert, an MLP every token
        passes through, scaled by a sigmoid gate; 0: none.
      router_aux_loss_coef: the weight of the router's load-balancing loss in the learner's loss.
      router_z_loss_coef: the weight of the router z-loss (mean squared logsumexp of the router
        logits); 0: off.
      layer_types: each layer's attention, 'sliding_attention' (local: the last sliding_window
        keys) or 'full_attention' (global); empty: every layer global.
      sliding_window: the keys a local layer's query sees, itself included; None without local
        layers.
      rope_local_base_freq: the RoPE base of the local layers (Gemma 3); None: rope_theta.
      attn_logit_softcapping: c, attention scores become c * tanh(score / c) (Gemma 2); None.
      final_logit_softcapping: the same on the output logits (Gemma 2); None.
      query_pre_attn_scalar: the attention scale is this ** -0.5 (Gemma; 1.0 for Gemma 4's
        unit scale); None: head_dim.
      hidden_act: the MLP's gate activation: 'silu' (SwiGLU) or 'gelu_pytorch_tanh' (GeGLU
        with tanh-GELU, Gemma).
      post_norms: RMSNorm also after attention and after the MLP, before each residual add
        (Gemma's sandwich norms).
      norm_unit_offset: RMSNorms scale by (1 + w), their weights starting at 0 (Gemma 2 and 3;
        Gemma 4's scale by w).
      scale_embeddings: the token embedding is multiplied by sqrt(hidden_size), rounded to the
        compute dtype (Gemma).
      partial_rotary_factor: the share of a global layer's head_dim that RoPE rotates, in
        Gemma 4's 'proportional' form: the first int(f * head_dim // 2) frequency pairs, at
        head_dim's frequencies, rotate and the rest pass unrotated; 1.0: all (local layers
        always rotate all).
      v_norm: RMSNorm without a scale on each head's values, before they are attended and
        cached (Gemma 4).
      layer_scalar: each layer's output is multiplied by its own scalar weight (Gemma 4's
        ``layer_scalar``, a buffer in transformers; a parameter here, trained as the others).
      enable_moe_block: Gemma 4's mixture-of-experts block on every layer: the routed experts
        (GeGLU, hidden_act) run beside the dense MLP, not instead of it, each output with its
        own norm before the two are added; the router reads the block's input through an
        unscaled RMSNorm, a learned scale and 1/sqrt(hidden_size), and each chosen expert's
        weight is renormalised, then multiplied by that expert's learned scale.
    """

    family: str = "llama"
    vocab_size: int = 32
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qk_norm: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 2048
    dtype: str = "float32"
    param_dtype: str = "float32"
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    router_aux_loss_coef: float = 0.001
    router_z_loss_coef: float = 0.0
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    rope_local_base_freq: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    hidden_act: str = "silu"
    post_norms: bool = False
    norm_unit_offset: bool = False
    scale_embeddings: bool = False
    partial_rotary_factor: float = 1.0
    v_norm: bool = False
    layer_scalar: bool = False
    enable_moe_block: bool = False

    def __post_init__(self):
        _one_of("model.family", self.family, FAMILIES)
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _positive(f"model.{name}", getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            _fail(
                "model.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of model.num_heads={self.num_heads} (grouped-query attention)",
            )
        if self.head_dim % 2:
            _fail("model.head_dim", self.head_dim, "an even number (RoPE rotates pairs)")
        _positive_float("model.rope_theta", self.rope_theta)
        _positive_float("model.norm_eps", self.norm_eps)
        _one_of("model.dtype", self.dtype, DTYPES)
        _one_of("model.param_dtype", self.param_dtype, DTYPES)
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            rope_type = scaling.get("rope_type")
            if rope_type not in ("llama3", "linear"):
                _fail("model.rope_scaling.rope_type", rope_type, "'llama3', 'linear' or None")
            _positive_float("model.rope_scaling.factor", scaling.get("factor"))
        if self.rope_scaling is not None and dict(self.rope_scaling)["rope_type"] == "llama3":
            scaling = dict(self.rope_scaling)
            for k in ("low_freq_factor", "high_freq_factor"):
                _positive_float(f"model.rope_scaling.{k}", scaling.get(k))
            _positive(
                "model.rope_scaling.original_max_position_embeddings",
                scaling.get("original_max_position_embeddings"),
            )
        _check_experts(self)
        _check_attention(self)


def _check_attention(cfg: ModelConfig) -> None:
    """Local/global layers, soft-caps and Gemma's other fields: one line per bad value."""
    _one_of("model.hidden_act", cfg.hidden_act, HIDDEN_ACTS)
    unset = {
        "attn_logit_softcapping": "None (no cap)",
        "final_logit_softcapping": "None (no cap)",
        "query_pre_attn_scalar": "None (the scale is head_dim ** -0.5)",
        "rope_local_base_freq": "None (local layers use rope_theta)",
    }
    for name, none in unset.items():
        if getattr(cfg, name) is not None:
            _positive_float(f"model.{name}", getattr(cfg, name), unset=none)
    factor = cfg.partial_rotary_factor
    if not (isinstance(factor, int | float) and not isinstance(factor, bool) and 0 <= factor <= 1):
        _fail(
            "model.partial_rotary_factor",
            factor,
            "a share of head_dim in [0, 1] (1.0: RoPE rotates every pair)",
        )
    if cfg.layer_types and len(cfg.layer_types) != cfg.num_layers:
        _fail(
            "model.layer_types",
            tuple(cfg.layer_types),
            f"one entry per layer (model.num_layers={cfg.num_layers}), or () for all global",
        )
    bad = [t for t in cfg.layer_types if t not in LAYER_TYPES]
    if bad:
        _fail("model.layer_types", bad[0], f"one of {LAYER_TYPES} for every layer")
    local = "sliding_attention" in cfg.layer_types
    if local and cfg.sliding_window is None:
        _fail("model.sliding_window", None, "an integer >= 1 for the 'sliding_attention' layers")
    if cfg.sliding_window is not None:
        window = cfg.sliding_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            _fail("model.sliding_window", window, "an integer >= 1 (keys a local query sees)")
        if window > cfg.max_position_embeddings:
            _fail(
                "model.sliding_window",
                window,
                f"at most model.max_position_embeddings={cfg.max_position_embeddings} (a "
                "larger window is global attention: set the layers to 'full_attention')",
            )


def _check_experts(cfg: ModelConfig) -> None:
    """The mixture-of-experts fields: one line per bad value, naming the fix."""
    moe = cfg.family in MOE_FAMILIES or cfg.enable_moe_block
    _positive("model.num_experts", cfg.num_experts, allow_zero=True)
    if cfg.enable_moe_block and cfg.family != "gemma4":
        _fail(
            "model.enable_moe_block",
            True,
            f"False for family {cfg.family!r} (the block beside a dense MLP is Gemma 4's)",
        )
    if not moe:
        if cfg.num_experts:
            fix = (
                "set model.enable_moe_block=True for Gemma 4's experts"
                if cfg.family == "gemma4"
                else "use family 'qwen3_moe' or 'qwen2_moe' for experts"
            )
            _fail("model.num_experts", cfg.num_experts, f"0 for family {cfg.family!r}; or {fix}")
        return
    if cfg.enable_moe_block and cfg.decoder_sparse_step != 1:
        _fail(
            "model.decoder_sparse_step",
            cfg.decoder_sparse_step,
            "1: Gemma 4's block is on every layer",
        )
    if cfg.enable_moe_block and cfg.mlp_only_layers:
        _fail("model.mlp_only_layers", cfg.mlp_only_layers, "(): Gemma 4's block is on every layer")
    if cfg.num_experts < 1:
        _fail("model.num_experts", cfg.num_experts, f"at least 1 for family {cfg.family!r}")
    if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
        _fail(
            "model.num_experts_per_tok",
            cfg.num_experts_per_tok,
            f"between 1 and model.num_experts={cfg.num_experts} (top-k of the experts)",
        )
    _positive("model.moe_intermediate_size", cfg.moe_intermediate_size)
    _positive("model.decoder_sparse_step", cfg.decoder_sparse_step)
    bad = [i for i in cfg.mlp_only_layers if not 0 <= i < cfg.num_layers]
    if bad:
        _fail(
            "model.mlp_only_layers",
            tuple(cfg.mlp_only_layers),
            f"layer indices in [0, {cfg.num_layers})",
        )
    _positive(
        "model.shared_expert_intermediate_size",
        cfg.shared_expert_intermediate_size,
        allow_zero=True,
    )
    if cfg.shared_expert_intermediate_size and cfg.family != "qwen2_moe":
        _fail(
            "model.shared_expert_intermediate_size",
            cfg.shared_expert_intermediate_size,
            f"0 for family {cfg.family!r} (a shared expert is Qwen2-MoE's)",
        )
    _positive_float("model.router_aux_loss_coef", cfg.router_aux_loss_coef, allow_zero=True)
    _positive_float("model.router_z_loss_coef", cfg.router_z_loss_coef, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts training: rollout routing replay (docs/moe.md; the expert-parallel size
    is mesh.expert_parallel).

    Attributes:
      router_replay: 'off', or 'rollout': the engine records the experts each model token was
        routed to, and the learner's forwards (current, old and reference log-probs) use them.
      disagreement_every: with replay on, every this many learner steps an extra unforced
        forward measures the router disagreement, and a forced one beside it the log-prob
        mismatch replay removes (it costs two forwards); 0: never. With replay off every step
        measures the disagreement from the forward the loss already runs.
    """

    router_replay: str = "off"
    disagreement_every: int = 10

    def __post_init__(self):
        _one_of("moe.router_replay", self.router_replay, ROUTER_REPLAY)
        _positive("moe.disagreement_every", self.disagreement_every, allow_zero=True)


def check_moe(model: ModelConfig, moe: MoEConfig, expert_parallel: int) -> None:
    """The rules between the two sections."""
    if moe.router_replay != "off" and model.num_experts == 0:
        _fail(
            "moe.router_replay",
            moe.router_replay,
            f"'off' for the dense model family {model.family!r} (no experts to replay)",
        )
    if model.num_experts and model.num_experts % expert_parallel:
        _fail(
            "mesh.expert_parallel",
            expert_parallel,
            f"a divisor of model.num_experts={model.num_experts}: each expert-parallel shard "
            "holds whole experts",
        )
    if not model.num_experts and expert_parallel != 1:
        _fail("mesh.expert_parallel", expert_parallel, "1 for a dense model")


def has_dense_mlp(cfg: ModelConfig) -> bool:
    """Whether some layer has a dense MLP: every layer of a dense model; on a mixture of
    experts, the layers in ``mlp_only_layers``, and layer 0 when ``decoder_sparse_step`` > 1;
    every layer under Gemma 4's ``enable_moe_block``. (``rljax.models.moe.dense_layers`` lists
    them but needs JAX; a test checks they agree.)"""
    return (
        not cfg.num_experts
        or cfg.enable_moe_block
        or bool(cfg.mlp_only_layers)
        or cfg.decoder_sparse_step > 1
    )


def check_lora_targets(model: ModelConfig, targets: Sequence[str]) -> None:
    """An enabled LoRA's targets must each adapt a weight of ``model``: an MLP target adapts
    dense MLPs and shared experts, never the routed experts (rljax.models.lora_targets)."""
    dense, shared = has_dense_mlp(model), bool(model.shared_expert_intermediate_size)
    for t in targets:
        if not target_weights(t, dense_mlp=dense, shared_expert=shared):
            quoted = ",".join(f'"{a}"' for a in ATTENTION_TARGETS)
            _fail(
                "lora.targets",
                t,
                f"one of {', '.join(ATTENTION_TARGETS)} on this {model.family} model: its MLPs "
                "are all routed experts (no dense layer, no shared expert), which LoRA leaves "
                f"frozen; set lora.targets='({quoted})'",
            )
