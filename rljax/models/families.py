"""Model configs from and to Hugging Face ``config.json``, and from the named presets.

Five architectures map onto :class:`rljax.config.ModelConfig`:

* ``LlamaForCausalLM`` (family ``llama``; SmolLM2 is a Llama with tied embeddings; Llama 3.1+
  adds ``rope_scaling`` of type ``llama3``);
* ``Qwen2ForCausalLM`` (family ``qwen2``: bias on the q/k/v projections);
* ``Qwen3ForCausalLM`` (family ``qwen3``: per-head q/k RMSNorm, ``head_dim`` set explicitly);
* ``Qwen3MoeForCausalLM`` (family ``qwen3_moe``: Qwen3's attention, mixture-of-experts MLPs);
* ``Qwen2MoeForCausalLM`` (family ``qwen2_moe``: Qwen2's attention, whose q/k/v bias
  transformers 5 makes optional (``qkv_bias``), mixture-of-experts MLPs with a shared expert);
* ``Gemma2ForCausalLM`` (family ``gemma2``: local and global layers alternating, soft-capped
  attention and output logits) and ``Gemma3ForCausalLM`` (family ``gemma3``, ``model_type``
  ``gemma3_text``: local layers with their own RoPE base, q/k RMSNorm). Both have GeGLU MLPs,
  norms after attention and the MLP, RMSNorm's (1 + w) scale, the embedding scaled by sqrt(D)
  and ``query_pre_attn_scalar``; each is a :class:`ModelConfig` field, read under its Hugging
  Face name (``layer_types``, or Gemma 3's older ``sliding_window_pattern``).

The mixture-of-experts keys keep their Hugging Face names (``num_experts``,
``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step``,
``mlp_only_layers``, ``shared_expert_intermediate_size``, ``router_aux_loss_coef``); transformers
5 writes Qwen3-MoE's ``num_experts`` as ``num_local_experts``, and both are read.

Both ``config.json`` dialects are read: the legacy ``rope_theta`` + ``rope_scaling`` keys
(transformers 4.x and the files on the Hub) and transformers 5's ``rope_parameters``.
:func:`config_to_hf` writes both, so either major version of transformers loads the export.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rljax.config import ModelConfig
from rljax.config.checks import GEMMA_FAMILIES, LAYER_TYPES, MOE_FAMILIES
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
}
FAMILY_ARCHITECTURE = {family: arch for arch, (family, _) in ARCHITECTURES.items()}
_MODEL_TYPES = {model_type: arch for arch, (_, model_type) in ARCHITECTURES.items()}
_QK_NORM = ("qwen3", "qwen3_moe", "gemma3")
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


# Gemma 4 (text) needs these beyond Gemma 3, none built yet: (what it is, present in the
# config.json). Its normalisation, value norm, attention scale and layer scalar are in every
# Gemma 4, so every Gemma 4 checkpoint is refused, naming what it uses (docs/gemma.md).
GEMMA4_FEATURES = (
    ("per-layer inputs", lambda c: bool(c.get("hidden_size_per_layer_input"))),
    ("shared KV layers", lambda c: bool(c.get("num_kv_shared_layers"))),
    ("per-layer head_dim", lambda c: bool(c.get("per_layer_config") or c.get("global_head_dim"))),
    (
        "partial (proportional) RoPE",
        lambda c: "proportional" in json.dumps(c.get("rope_parameters")),
    ),
    ("keys as values", lambda c: bool(c.get("attention_k_eq_v"))),
    ("the mixture-of-experts block", lambda c: bool(c.get("enable_moe_block"))),
    ("the double-wide MLP", lambda c: bool(c.get("use_double_wide_mlp"))),
    ("the value norm, unit attention scale and layer scalar", lambda c: True),
)


def _refuse_gemma4(config_json: Mapping[str, Any], source: str) -> None:
    arch = (config_json.get("architectures") or [""])[0]
    if not (arch.startswith("Gemma4") or config_json.get("model_type", "").startswith("gemma4")):
        return
    needs = [name for name, used in GEMMA4_FEATURES if used(config_json)]
    raise _unsupported(
        source,
        f"Gemma 4 is not supported yet: it uses {', '.join(needs)}, which rljax does not implement",
        "use a Gemma 2 or Gemma 3 (text) checkpoint; docs/gemma.md lists what Gemma 4 needs",
    )


def architecture_of(config_json: Mapping[str, Any], *, source: str = "config.json") -> str:
    """The supported architecture name a ``config.json`` declares; raises for any other."""
    _refuse_gemma4(config_json, source)
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
        _check_gemma(config_json, source)
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
    if family in GEMMA_FAMILIES:
        fields.update(gemma_fields(config_json, family, source))
        fields.update(overrides)
        return ModelConfig(**fields)
    theta, scaling = _rope(config_json, source)
    dtype = _dtype(config_json)
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
        dtype=dtype,
        param_dtype=dtype,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def _common_to_hf(cfg: ModelConfig, arch: str) -> dict[str, Any]:
    """The keys every family's ``config.json`` has: the architecture and the sizes."""
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
    }


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dict that transformers 4.x and 5.x both load."""
    if cfg.family in GEMMA_FAMILIES:
        return gemma_config_to_hf(cfg)
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
    arch = FAMILY_ARCHITECTURE[cfg.family]
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling is not None else None
    rope_parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta}
    out: dict[str, Any] = {
        **_common_to_hf(cfg, arch),
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": cfg.param_dtype,
        "torch_dtype": cfg.param_dtype,
        "use_cache": True,
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


# -- Gemma 2 and Gemma 3 (text) ------------------------------------------------------------

_GEMMA_ACT = "gelu_pytorch_tanh"


def _check_gemma(config_json: Mapping[str, Any], source: str) -> None:
    """Rejects Gemma options the shared decoder does not implement."""
    act = config_json.get("hidden_activation") or config_json.get("hidden_act") or _GEMMA_ACT
    if act != _GEMMA_ACT:
        raise _unsupported(
            source, f"hidden_activation={act!r} is not supported", f"Gemma uses {_GEMMA_ACT!r}"
        )
    if config_json.get("attention_bias"):
        raise _unsupported(source, "attention_bias=true is not supported", "set it to false")
    if config_json.get("use_bidirectional_attention"):
        raise _unsupported(
            source,
            "use_bidirectional_attention=true (an encoder) is not supported",
            "rljax trains causal decoders: set it to false",
        )


def _gemma_layer_types(config_json: Mapping[str, Any], family: str, layers: int, source: str):
    """Each layer's attention type: ``layer_types``, else the family's default pattern."""
    types = config_json.get("layer_types")
    if types is None:
        if family == "gemma2":  # local first, then alternating
            return tuple(LAYER_TYPES[i % 2] for i in range(layers))
        pattern = int(config_json.get("sliding_window_pattern", 6))
        return tuple(LAYER_TYPES[(i + 1) % pattern == 0] for i in range(layers))
    types = tuple(types)
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown or len(types) != layers:
        what = (
            f"layer_types names the unknown attention pattern {unknown[0]!r}"
            if unknown
            else f"layer_types has {len(types)} entries for num_hidden_layers={layers}"
        )
        raise _unsupported(
            source, what, f"rljax reads one of {LAYER_TYPES} per layer; fix layer_types"
        )
    return types


def _gemma_rope(config_json: Mapping[str, Any], family: str, source: str):
    """(global RoPE base, global scaling or None, local RoPE base) from either dialect:
    transformers 5's ``rope_parameters`` keyed by layer type (Gemma 3) or flat, or the legacy
    ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq``."""
    params = config_json.get("rope_parameters") or {}
    if "full_attention" in params:
        full, local = dict(params["full_attention"]), dict(params.get("sliding_attention") or {})
    else:
        full, local = dict(params), {}
    theta = float(config_json.get("rope_theta", full.get("rope_theta", 10000.0)))
    local_theta = config_json.get("rope_local_base_freq", local.get("rope_theta"))
    scaling = dict(config_json.get("rope_scaling") or full)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if local.get("rope_type", "default") != "default":
        raise _unsupported(
            source, f"local rope type {local['rope_type']!r} is not supported", "use 'default'"
        )
    if rope_type == "default":
        return theta, None, None if local_theta is None else float(local_theta)
    if rope_type != "linear" or "factor" not in scaling:
        raise _unsupported(
            source,
            f"rope type {rope_type!r} is not supported for {family}",
            "rljax implements 'default' and 'linear' (with a factor) RoPE for Gemma",
        )
    linear = {"rope_type": "linear", "factor": float(scaling["factor"])}
    return theta, linear, None if local_theta is None else float(local_theta)


def _optional_float(config_json: Mapping[str, Any], key: str) -> float | None:
    value = config_json.get(key)
    return None if value is None else float(value)


def gemma_fields(config_json: Mapping[str, Any], family: str, source: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a Gemma 2 / Gemma 3 ``config.json`` beyond the sizes."""
    layers = int(config_json["num_hidden_layers"])
    types = _gemma_layer_types(config_json, family, layers, source)
    theta, scaling, local_theta = _gemma_rope(config_json, family, source)
    window = config_json.get("sliding_window")
    dtype = _dtype(config_json)
    return dict(
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_base_freq=local_theta,
        layer_types=types,
        sliding_window=None if window is None else int(window),
        norm_eps=float(config_json.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config_json.get("tie_word_embeddings", True)),
        qk_norm=family in _QK_NORM,
        max_position_embeddings=int(config_json.get("max_position_embeddings", 8192)),
        attn_logit_softcapping=_optional_float(config_json, "attn_logit_softcapping"),
        final_logit_softcapping=_optional_float(config_json, "final_logit_softcapping"),
        query_pre_attn_scalar=_optional_float(config_json, "query_pre_attn_scalar"),
        hidden_act=_GEMMA_ACT,
        post_norms=True,
        norm_unit_offset=True,
        scale_embeddings=True,
        dtype=dtype,
        param_dtype=dtype,
    )


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


_GEMMA_SHAPE = dict(
    hidden_act=_GEMMA_ACT, post_norms=True, norm_unit_offset=True, scale_embeddings=True
)


def gemma_config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A Gemma 2 / Gemma 3 ``config.json`` dict that transformers 4.x and 5.x both load."""
    off = [k for k, v in _GEMMA_SHAPE.items() if getattr(cfg, k) != v]
    if off or cfg.qkv_bias or cfg.qk_norm != (cfg.family in _QK_NORM):
        raise ValueError(
            f"config_to_hf: family {cfg.family!r} with {off or ['qkv_bias/qk_norm']} differing "
            f"from Gemma's has no Hugging Face architecture; keep {_GEMMA_SHAPE}"
        )
    arch = FAMILY_ARCHITECTURE[cfg.family]
    types = list(cfg.layer_types) or ["full_attention"] * cfg.num_layers
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling is not None else None
    full = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta}
    out: dict[str, Any] = {
        **_common_to_hf(cfg, arch),
        "hidden_activation": _GEMMA_ACT,
        "hidden_act": _GEMMA_ACT,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "layer_types": types,
        "sliding_window": cfg.sliding_window,
        # transformers types it int (Gemma's are 256, 144, 168...); a fractional one stays float
        "query_pre_attn_scalar": _whole(cfg.query_pre_attn_scalar or cfg.head_dim),
        "attn_logit_softcapping": cfg.attn_logit_softcapping,
        "final_logit_softcapping": cfg.final_logit_softcapping,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": cfg.param_dtype,
        "torch_dtype": cfg.param_dtype,
        "use_cache": True,
    }
    if cfg.family == "gemma3":
        local_theta = cfg.rope_local_base_freq or cfg.rope_theta
        out["rope_local_base_freq"] = local_theta
        out["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
        }
        out["use_bidirectional_attention"] = False
    else:
        out["rope_parameters"] = full
    return out


def model_config(preset_name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a named preset (``rljax.models.presets.PRESETS``).

    ``overrides`` replace fields, e.g. ``param_dtype="bfloat16"``.
    """
    preset = get_preset(preset_name)
    cfg = ModelConfig(**preset)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
