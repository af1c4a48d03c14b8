"""Architecture presets for the supported decoder families, as plain data.

Each preset copies the numbers of the model's published Hugging Face ``config.json`` (base
checkpoints), renamed to rljax's keys. No jax import: the simulator's cost models and the
model builder both read these dicts, and the simulator must stay importable without jax.

Keys (every preset has exactly these):
  family: "llama" | "qwen2" | "qwen3" | "gemma3".
  vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim.
  rope_theta: RoPE base frequency.
  rope_scaling: None, the llama3 scaling dict (rope_type, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings), or Gemma's linear one (rope_type,
    factor).
  norm_eps: RMSNorm epsilon.
  tie_embeddings: whether the LM head reuses the token embedding matrix.
  qk_norm: per-head RMSNorm on q and k (Qwen3, Gemma 3).
  qkv_bias: bias on the q, k, v projections (Qwen2).
  max_position_embeddings: the context length the checkpoint was configured for.
A mixture-of-experts preset (family "qwen3_moe" | "qwen2_moe") has :data:`MOE_PRESET_KEYS` too,
Hugging Face's names as in ``ModelConfig``: num_experts (E), num_experts_per_tok (k),
moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers,
shared_expert_intermediate_size.
A Gemma preset (family "gemma2" | "gemma3") has :data:`GEMMA_PRESET_KEYS` too, the
``ModelConfig`` fields of Gemma's architecture (docs/gemma.md): layer_types, sliding_window,
rope_local_base_freq, query_pre_attn_scalar, attn_logit_softcapping, final_logit_softcapping,
hidden_act, post_norms, norm_unit_offset, scale_embeddings.

:func:`param_count` counts every parameter (every expert): what the weights occupy and what a
weight sync moves. :func:`active_param_count` counts those one token computes with (attention,
the router, k of the E experts, the shared expert, the dense MLPs): what its FLOPs scale with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRESET_KEYS = (
    "family",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "norm_eps",
    "tie_embeddings",
    "qk_norm",
    "qkv_bias",
    "max_position_embeddings",
)
MOE_PRESET_KEYS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "shared_expert_intermediate_size",
)


GEMMA_PRESET_KEYS = (
    "layer_types",
    "sliding_window",
    "rope_local_base_freq",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "hidden_act",
    "post_norms",
    "norm_unit_offset",
    "scale_embeddings",
)


def _llama3_scaling(factor: float) -> dict[str, Any]:
    # Llama 3.1 / 3.2 share the same scaling recipe; only the factor differs.
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def _qwen2(vocab, hidden, inter, layers, heads, kv, tie, max_pos) -> dict[str, Any]:
    return {
        "family": "qwen2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": hidden // heads,
        "rope_theta": 1_000_000.0,
        "rope_scaling": None,
        "norm_eps": 1e-6,
        "tie_embeddings": tie,
        "qk_norm": False,
        "qkv_bias": True,
        "max_position_embeddings": max_pos,
    }


def _qwen3(hidden, inter, layers, heads, kv, tie) -> dict[str, Any]:
    return {
        "family": "qwen3",
        "vocab_size": 151_936,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        # Qwen3 fixes head_dim at 128 independently of hidden_size / num_heads.
        "head_dim": 128,
        "rope_theta": 1_000_000.0,
        "rope_scaling": None,
        "norm_eps": 1e-6,
        "tie_embeddings": tie,
        "qk_norm": True,
        "qkv_bias": False,
        "max_position_embeddings": 40_960,
    }


def _qwen3_moe(hidden, layers, heads, kv, experts, k, expert_inter) -> dict[str, Any]:
    return {
        **_qwen3(hidden, 6_144, layers, heads, kv, False),
        "family": "qwen3_moe",
        "num_experts": experts,
        "num_experts_per_tok": k,
        "moe_intermediate_size": expert_inter,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": (),
        "shared_expert_intermediate_size": 0,
    }


def _llama(vocab, hidden, inter, layers, heads, kv, theta, scaling, eps, tie, max_pos):
    return {
        "family": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": hidden // heads,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": eps,
        "tie_embeddings": tie,
        "qk_norm": False,
        "qkv_bias": False,
        "max_position_embeddings": max_pos,
    }


def _gemma3(hidden, inter, layers, heads, kv, head_dim, scalar) -> dict[str, Any]:
    # Gemma 3 (text) from 4B up, as google/gemma-3-{12b,27b}-it's config.json text_config
    # (sizes, query_pre_attn_scalar, sliding_window 1024, linear RoPE scaling 8) over
    # transformers' Gemma3TextConfig defaults for the keys it leaves out (vocab 262208, the
    # checkpoints' embedding rows; rope_theta 1e6 global, 1e4 local; rms_norm_eps 1e-6; tied
    # embeddings; 131072 positions; five local layers to one global). MaxText's
    # configs/models/gemma3-{12b,27b}.yml give the same sizes, window and RoPE.
    return {
        "family": "gemma3",
        "vocab_size": 262_208,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "norm_eps": 1e-6,
        "tie_embeddings": True,
        "qk_norm": True,
        "qkv_bias": False,
        "max_position_embeddings": 131_072,
        "layer_types": tuple(
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
        ),
        "sliding_window": 1024,
        "rope_local_base_freq": 10_000.0,
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "hidden_act": "gelu_pytorch_tanh",
        "post_norms": True,
        "norm_unit_offset": True,
        "scale_embeddings": True,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(151_936, 896, 4_864, 24, 14, 2, True, 32_768),
    "qwen2.5-1.5b": _qwen2(151_936, 1_536, 8_960, 28, 12, 2, True, 131_072),
    "qwen2.5-7b": _qwen2(152_064, 3_584, 18_944, 28, 28, 4, False, 131_072),
    "qwen3-0.6b": _qwen3(1_024, 3_072, 28, 16, 8, True),
    "qwen3-8b": _qwen3(4_096, 12_288, 36, 32, 8, False),
    # Every layer a mixture of 128 experts of width 768, 8 a token (intermediate_size 6144 is
    # unused: it has no dense layer).
    "qwen3-30b-a3b": _qwen3_moe(2_048, 48, 32, 4, 128, 8, 768),
    "llama-3.2-1b": _llama(
        128_256, 2_048, 8_192, 16, 32, 8, 500_000.0, _llama3_scaling(32.0), 1e-5, True, 131_072
    ),
    "llama-3.1-8b": _llama(
        128_256, 4_096, 14_336, 32, 32, 8, 500_000.0, _llama3_scaling(8.0), 1e-5, False, 131_072
    ),
    # SmolLM2 uses the Llama architecture with no RoPE scaling.
    "smollm2-135m": _llama(49_152, 576, 1_536, 30, 9, 3, 100_000.0, None, 1e-5, True, 8_192),
    # Text only (Gemma3ForCausalLM; the -it checkpoints' vision tower is not built).
    "gemma3-12b": _gemma3(3_840, 15_360, 48, 16, 8, 256, 256),
    "gemma3-27b": _gemma3(5_376, 21_504, 62, 32, 16, 128, 168),
}


def get_preset(name: str) -> dict[str, Any]:
    """Returns a copy of the named preset; raises with the known names on a typo."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dict(PRESETS[name])


def moe_layer_count(preset: Mapping[str, Any]) -> int:
    """The mixture-of-experts layers of a preset (0 for a dense one): Hugging Face's Qwen-MoE
    rule, which ``rljax.models.moe.moe_layers`` applies to a ModelConfig (a test checks they
    agree)."""
    if not preset.get("num_experts"):
        return 0
    step, dense = preset["decoder_sparse_step"], set(preset["mlp_only_layers"])
    return sum(1 for i in range(preset["num_layers"]) if i not in dense and (i + 1) % step == 0)


def _count(preset: Mapping[str, Any], experts: int) -> int:
    """Parameters of a preset with ``experts`` routed experts in each MoE layer counted."""
    h, hd = preset["hidden_size"], preset["head_dim"]
    q_dim = preset["num_heads"] * hd
    kv_dim = preset["num_kv_heads"] * hd
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h
    if preset["qkv_bias"]:
        attn += q_dim + 2 * kv_dim
    if preset["qk_norm"]:
        attn += 2 * hd
    mlp = 3 * h * preset["intermediate_size"]  # gate, up, down (SwiGLU or GeGLU)
    n_moe = moe_layer_count(preset)
    moe = 0
    if n_moe:
        fs = preset["shared_expert_intermediate_size"]
        moe = h * preset["num_experts"] + experts * 3 * h * preset["moe_intermediate_size"]
        moe += (3 * h * fs + h) if fs else 0  # the shared expert and its sigmoid gate
    layers = preset["num_layers"]
    norms = 4 if preset.get("post_norms") else 2  # Gemma's norms after attention and the MLP
    blocks = layers * (attn + norms * h) + (layers - n_moe) * mlp + n_moe * moe
    embed = preset["vocab_size"] * h
    head = 0 if preset["tie_embeddings"] else embed
    return embed + head + blocks + h  # + final norm


def param_count(preset: Mapping[str, Any]) -> int:
    """Number of parameters of a preset (embeddings, LM head unless tied, all layers, norms;
    every expert of a mixture of experts)."""
    return _count(preset, preset.get("num_experts", 0))


def active_param_count(preset: Mapping[str, Any]) -> int:
    """Parameters one token computes with: :func:`param_count` with k of the E experts of each
    mixture-of-experts layer (the router and a shared expert count whole); equal to
    :func:`param_count` for a dense preset."""
    return _count(preset, preset.get("num_experts_per_tok", 0) if preset.get("num_experts") else 0)


def kv_bytes_per_token(preset: Mapping[str, Any], dtype_bytes: int) -> int:
    """Bytes of K and V cache one token occupies across all layers (a Gemma token while it is
    inside the local layers' window; :func:`kv_bytes_of_sequence` counts the window)."""
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes must be positive, got {dtype_bytes}; use 2 for bf16")
    return 2 * preset["num_layers"] * preset["num_kv_heads"] * preset["head_dim"] * dtype_bytes


def local_layer_count(preset: Mapping[str, Any]) -> int:
    """The sliding-window (local) layers of a preset: 0 without ``layer_types``."""
    if preset.get("sliding_window") is None:
        return 0
    return sum(t == "sliding_attention" for t in preset.get("layer_types", ()))


def kv_bytes_of_sequence(preset: Mapping[str, Any], dtype_bytes: int, tokens: int) -> int:
    """Bytes of K and V cache a sequence of ``tokens`` tokens needs: every token in each global
    layer, the last ``sliding_window`` in each local one (the engine's pages round both up)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    per_layer = kv_bytes_per_token(preset, dtype_bytes) // preset["num_layers"]
    local = local_layer_count(preset)
    window = min(tokens, preset["sliding_window"]) if local else 0
    return per_layer * ((preset["num_layers"] - local) * tokens + local * window)
