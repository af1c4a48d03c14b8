"""Architecture presets for the supported decoder families, as plain data.

Each preset copies the numbers of the model's published Hugging Face ``config.json`` (base
checkpoints), renamed to rljax's keys. No jax import: the simulator's cost models and the
model builder both read these dicts, and the simulator must stay importable without jax.

Keys (every preset has exactly these):
  family: "llama" | "qwen2" | "qwen3".
  vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim.
  rope_theta: RoPE base frequency.
  rope_scaling: None, or the llama3 scaling dict (rope_type, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings).
  norm_eps: RMSNorm epsilon.
  tie_embeddings: whether the LM head reuses the token embedding matrix.
  qk_norm: per-head RMSNorm on q and k (Qwen3).
  qkv_bias: bias on the q, k, v projections (Qwen2).
  max_position_embeddings: the context length the checkpoint was configured for.
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


PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(151_936, 896, 4_864, 24, 14, 2, True, 32_768),
    "qwen2.5-1.5b": _qwen2(151_936, 1_536, 8_960, 28, 12, 2, True, 131_072),
    "qwen2.5-7b": _qwen2(152_064, 3_584, 18_944, 28, 28, 4, False, 131_072),
    "qwen3-0.6b": _qwen3(1_024, 3_072, 28, 16, 8, True),
    "qwen3-8b": _qwen3(4_096, 12_288, 36, 32, 8, False),
    "llama-3.2-1b": _llama(
        128_256, 2_048, 8_192, 16, 32, 8, 500_000.0, _llama3_scaling(32.0), 1e-5, True, 131_072
    ),
    "llama-3.1-8b": _llama(
        128_256, 4_096, 14_336, 32, 32, 8, 500_000.0, _llama3_scaling(8.0), 1e-5, False, 131_072
    ),
    # SmolLM2 uses the Llama architecture with no RoPE scaling.
    "smollm2-135m": _llama(49_152, 576, 1_536, 30, 9, 3, 100_000.0, None, 1e-5, True, 8_192),
}


def get_preset(name: str) -> dict[str, Any]:
    """Returns a copy of the named preset; raises with the known names on a typo."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dict(PRESETS[name])


def param_count(preset: Mapping[str, Any]) -> int:
    """Number of parameters of a preset (embeddings, LM head unless tied, all layers, norms)."""
    h, hd = preset["hidden_size"], preset["head_dim"]
    q_dim = preset["num_heads"] * hd
    kv_dim = preset["num_kv_heads"] * hd
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h
    if preset["qkv_bias"]:
        attn += q_dim + 2 * kv_dim
    if preset["qk_norm"]:
        attn += 2 * hd
    mlp = 3 * h * preset["intermediate_size"]  # gate, up, down (SwiGLU)
    layer = attn + mlp + 2 * h  # two RMSNorm scales per layer
    embed = preset["vocab_size"] * h
    head = 0 if preset["tie_embeddings"] else embed
    return embed + head + preset["num_layers"] * layer + h  # + final norm


def kv_bytes_per_token(preset: Mapping[str, Any], dtype_bytes: int) -> int:
    """Bytes of K and V cache one token occupies across all layers."""
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes must be positive, got {dtype_bytes}; use 2 for bf16")
    return 2 * preset["num_layers"] * preset["num_kv_heads"] * preset["head_dim"] * dtype_bytes
