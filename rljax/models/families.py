"""Model configs from and to Hugging Face ``config.json``, and from the named presets.

These architectures map onto :class:`rljax.config.ModelConfig`:

* ``LlamaForCausalLM`` (family ``llama``; SmolLM2 is a Llama with tied embeddings; Llama 3.1+
  adds ``rope_scaling`` of type ``llama3``);
* ``Qwen2ForCausalLM`` (family ``qwen2``: bias on the q/k/v projections);
* ``Qwen3ForCausalLM`` (family ``qwen3``: per-head q/k RMSNorm, ``head_dim`` set explicitly);
* ``Qwen3MoeForCausalLM`` (family ``qwen3_moe``: Qwen3's attention, mixture-of-experts MLPs);
* ``Qwen2MoeForCausalLM`` (family ``qwen2_moe``: Qwen2's attention, whose q/k/v bias
  transformers 5 makes optional (``qkv_bias``), mixture-of-experts MLPs with a shared expert);
* ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` and ``Gemma4ForCausalLM`` (families ``gemma2``,
  ``gemma3``, ``gemma4``), read and written by :mod:`rljax.models.gemma`.

The mixture-of-experts keys keep their Hugging Face names (``num_experts``,
``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step``,
``mlp_only_layers``, ``shared_expert_intermediate_size``, ``router_aux_loss_coef``); transformers
5 writes Qwen3-MoE's ``num_experts`` as ``num_local_experts``, and both are read.

Both ``config.json`` dialects are read: the legacy ``rope_theta`` + ``rope_scaling`` keys
(transformers 4.x and the files on the Hub) and transformers 5's ``rope_parameters``.
:func:`config_to_hf` writes both, so either major version of transformers loads the export
(Gemma 4 exists in transformers 5 only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rljax.config import ModelConfig
from rljax.config.checks import GEMMA_FAMILIES, MOE_FAMILIES
from rljax.models import gemma
from rljax.models.presets import get_preset

# architecture (config.json "architectures"[0]) -> (family, model_type)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "llama"),
    "Qwen2ForCausalLM": ("qwen2", "qwen2"),
    "Qwen3ForCausalLM": ("qwen3", "qwen3"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3_moe"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "qwen2_moe"),
    "Gemma2ForCausalLM": ("gemma2", "gemma2"),
    "Gemma3ForCausalLM": ("gemma3", "gemma3_text"),
    "Gemma4ForCausalLM": ("gemma4", "gemma4_text"),
}
FAMILY_ARCHITECTURE = {family: arch for arch, (family, _) in ARCHITECTURES.items()}
_MODEL_TYPES = {model_type: arch for arch, (_, model_type) in ARCHITECTURES.items()}
_QK_NORM = ("qwen3", "qwen3_moe")
_QKV_BIAS = ("qwen2", "qwen2_moe")
# Mixture-of-experts keys read when present (ModelConfig's defaults are transformers').
_MOE_OPTIONAL = {
    "norm_topk_prob": bool,
    "decoder_sparse_step": int,
    "router_aux_loss_coef": float,
}
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _unsupported(source: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{source}: {what}; {fix}")


def architecture_of(config_json: Mapping[str, Any], *, source: str = "config.json") -> str:
    """The supported architecture name a ``config.json`` declares; raises for any other."""
    archs = config_json.get("architectures") or []
    arch = archs[0] if archs else _MODEL_TYPES.get(config_json.get("model_type", ""))
    if arch not in ARCHITECTURES:
        shown = arch if arch else f"model_type={config_json.get('model_type')!r}"
        raise _unsupported(
            source,
            f"unsupported architecture {shown}",
            f"supported architectures are {', '.join(ARCHITECTURES)}",
        )
    return arch


def _rope(config_json: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, llama3 scaling dict or None) from either config.json dialect."""
    params = dict(config_json.get("rope_parameters") or {})
    legacy = config_json.get("rope_scaling")
    scaling = dict(legacy) if legacy else dict(params)
    theta = config_json.get("rope_theta", params.get("rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise _unsupported(
            source,
            f"rope type {rope_type!r} is not supported",
            "rljax implements 'default' and 'llama3' RoPE",
        )
    missing = [k for k in _LLAMA3_KEYS if k not in scaling]
    if missing:
        raise _unsupported(
            source, f"llama3 rope scaling lacks {', '.join(missing)}", "add them to config.json"
        )
    out = {"rope_type": "llama3", **{k: scaling[k] for k in _LLAMA3_KEYS}}
    out["original_max_position_embeddings"] = int(out["original_max_position_embeddings"])
    return float(theta), out


def _check_features(config_json: Mapping[str, Any], family: str, source: str) -> None:
    """Rejects config.json options the shared decoder does not implement."""
    if family in GEMMA_FAMILIES:
        gemma.check_config(config_json, family, source)
        return
    act = config_json.get("hidden_act", "silu")
    if act != "silu":
        raise _unsupported(source, f"hidden_act={act!r} is not supported", "rljax uses SwiGLU")
    if config_json.get("mlp_bias"):
        raise _unsupported(source, "mlp_bias=true is not supported", "rljax MLPs have no bias")
    if family not in _QKV_BIAS and config_json.get("attention_bias"):
        raise _unsupported(
            source,
            "attention_bias=true (which also biases o_proj) is not supported",
            "only Qwen2's q/k/v bias is implemented",
        )
    if config_json.get("use_sliding_window"):
        raise _unsupported(
            source, "use_sliding_window=true is not supported", "set it to false (full attention)"
        )


def _dtype(config_json: Mapping[str, Any]) -> str:
    name = str(config_json.get("dtype") or config_json.get("torch_dtype") or "float32")
    # float16 checkpoints compute in float32: ModelConfig has no float16 and fp16 fits in fp32.
    return "bfloat16" if name == "bfloat16" else "float32"


def _moe_fields(config_json: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The mixture-of-experts fields of a Qwen3-MoE / Qwen2-MoE ``config.json``; a required key
    that is absent raises KeyError (its name)."""
    experts = config_json.get("num_experts", config_json.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_experts")
    out: dict[str, Any] = {
        "num_experts": int(experts),
        "num_experts_per_tok": int(config_json["num_experts_per_tok"]),
        "moe_intermediate_size": int(config_json["moe_intermediate_size"]),
        "mlp_only_layers": tuple(int(i) for i in config_json.get("mlp_only_layers") or ()),
    }
    out.update({k: cast(config_json[k]) for k, cast in _MOE_OPTIONAL.items() if k in config_json})
    if family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = int(config_json["shared_expert_intermediate_size"])
    return out


def config_from_hf(
    config_json: Mapping[str, Any], *, source: str = "config.json", **overrides: Any
) -> ModelConfig:
    """A validated :class:`ModelConfig` from a parsed Hugging Face ``config.json``.

    ``source`` names the file in error messages. ``overrides`` replace fields afterwards
    (e.g. ``dtype="float32"``). The checkpoint's ``dtype``/``torch_dtype`` sets both
    ``dtype`` and ``param_dtype`` (bfloat16 stays bfloat16; anything else becomes float32).
    """
    arch = architecture_of(config_json, source=source)
    family = ARCHITECTURES[arch][0]
    _check_features(config_json, family, source)
    try:
        hidden = int(config_json["hidden_size"])
        heads = int(config_json["num_attention_heads"])
        fields: dict[str, Any] = {
            "family": family,
            "vocab_size": int(config_json["vocab_size"]),
            "hidden_size": hidden,
            "intermediate_size": int(config_json["intermediate_size"]),
            "num_layers": int(config_json["num_hidden_layers"]),
            "num_heads": heads,
            "num_kv_heads": int(config_json.get("num_key_value_heads") or heads),
            "head_dim": int(config_json.get("head_dim") or hidden // heads),
        }
        if family in MOE_FAMILIES:
            fields.update(_moe_fields(config_json, family))
    except KeyError as exc:
        raise _unsupported(
            source,
            f"{arch} config lacks key {exc.args[0]!r}",
            "the file is incomplete: re-download it or add the key",
        ) from None
    except (TypeError, ValueError) as exc:
        raise _unsupported(
            source, f"{arch} config has a non-integer size ({exc})", "fix the value in the file"
        ) from None
    dtype = _dtype(config_json)
    fields.update(dtype=dtype, param_dtype=dtype)
    if family in GEMMA_FAMILIES:
        fields.update(gemma.fields(config_json, family, source))
        fields.update(overrides)
        return ModelConfig(**fields)
    theta, scaling = _rope(config_json, source)
    fields.update(
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(config_json.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config_json.get("tie_word_embeddings", False)),
        qk_norm=family in _QK_NORM,
        # Qwen2's q/k/v always have a bias; transformers 5 makes Qwen2-MoE's optional.
        qkv_bias=family == "qwen2"
        or (family == "qwen2_moe" and bool(config_json.get("qkv_bias", True))),
        max_position_embeddings=int(config_json.get("max_position_embeddings", 2048)),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def _common_to_hf(cfg: ModelConfig, arch: str) -> dict[str, Any]:
    """The keys every family's ``config.json`` has: the architecture, the sizes and dtype."""
    return {
        "architectures": [arch],
        "model_type": ARCHITECTURES[arch][1],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": cfg.param_dtype,
        "torch_dtype": cfg.param_dtype,
        "use_cache": True,
    }


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dict that transformers 4.x and 5.x both load."""
    arch = FAMILY_ARCHITECTURE[cfg.family]
    if cfg.family in GEMMA_FAMILIES:
        return {**_common_to_hf(cfg, arch), **gemma.config_to_hf(cfg)}
    gemma4 = [k for k in ("v_norm", "layer_scalar") if getattr(cfg, k)]
    gemma4 += ["partial_rotary_factor"] if cfg.partial_rotary_factor != 1.0 else []
    if gemma4:
        raise ValueError(
            f"config_to_hf: family {cfg.family!r} with Gemma 4's {', '.join(gemma4)} has no "
            "Hugging Face architecture; use family='gemma4'"
        )
    if cfg.family not in _QK_NORM and cfg.qk_norm:
        raise ValueError(
            f"config_to_hf: family {cfg.family!r} with qk_norm=True has no Hugging Face "
            "architecture; use family='qwen3' (or 'qwen3_moe')"
        )
    if cfg.family != "qwen2_moe" and cfg.qkv_bias != (cfg.family == "qwen2"):
        raise ValueError(
            f"config_to_hf: qkv_bias={cfg.qkv_bias} with family {cfg.family!r} has no Hugging "
            "Face architecture; only qwen2 has (and needs) q/k/v bias, qwen2_moe may have it"
        )
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling is not None else None
    rope_parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta}
    out: dict[str, Any] = {
        **_common_to_hf(cfg, arch),
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": rope_parameters,
    }
    if cfg.family == "llama":
        out["mlp_bias"] = False
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.num_layers)
    if cfg.family in MOE_FAMILIES:
        out.update(_moe_to_hf(cfg))
    return out


def _moe_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The mixture-of-experts keys of a Qwen3-MoE / Qwen2-MoE ``config.json``."""
    out: dict[str, Any] = {
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "norm_topk_prob": cfg.norm_topk_prob,
        "decoder_sparse_step": cfg.decoder_sparse_step,
        "mlp_only_layers": list(cfg.mlp_only_layers),
        "router_aux_loss_coef": cfg.router_aux_loss_coef,
        "output_router_logits": False,
    }
    if cfg.family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size
        out["qkv_bias"] = cfg.qkv_bias
    return out


def model_config(preset_name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a named preset (``rljax.models.presets.PRESETS``).

    ``overrides`` replace fields, e.g. ``param_dtype="bfloat16"``.
    """
    preset = get_preset(preset_name)
    cfg = ModelConfig(**preset)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
