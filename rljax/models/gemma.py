"""Gemma 2, 3 and 4 (text): their ``config.json`` read into :class:`ModelConfig` fields and
written back (:mod:`rljax.models.families` dispatches here by family).

* ``Gemma2ForCausalLM`` (family ``gemma2``): local and global layers alternating, soft-capped
  attention scores and output logits;
* ``Gemma3ForCausalLM`` (family ``gemma3``, ``model_type`` ``gemma3_text``): local layers with
  their own RoPE base, q/k RMSNorm;
* ``Gemma4ForCausalLM`` (family ``gemma4``, ``model_type`` ``gemma4_text``): Gemma 3's layers with
  RMSNorm scaled by w (not 1 + w), a value norm without a scale, an attention scale of 1, an
  output scalar per layer and 'proportional' partial RoPE on the global layers; its
  mixture-of-experts variant (``enable_moe_block``) adds routed experts beside every layer's
  MLP (:func:`rljax.models.moe.moe_block`).

All have GeGLU MLPs, norms after attention and the MLP and the embedding scaled by sqrt(D). Each
difference is a :class:`ModelConfig` field (:data:`SHAPES`), read under its Hugging Face name
(``layer_types``, or Gemma 3's older ``sliding_window_pattern``); the decoder never asks the
family. The Gemma 4 features the stacked decoder does not build (:func:`unbuilt_gemma4`) are
refused in one line that names each one the file uses (docs/gemma.md says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rljax.config import ModelConfig
from rljax.config.checks import LAYER_TYPES

_ACT = "gelu_pytorch_tanh"
_FULL = "full_attention"
# What each family fixes of the architecture: read into every config of the family, and what a
# config must hold for config_to_hf to write the family.
_COMMON = dict(hidden_act=_ACT, post_norms=True, scale_embeddings=True, qkv_bias=False)
_GEMMA23 = dict(_COMMON, norm_unit_offset=True, v_norm=False, layer_scalar=False)
SHAPES: dict[str, dict[str, Any]] = {
    "gemma2": dict(_GEMMA23, qk_norm=False, partial_rotary_factor=1.0),
    "gemma3": dict(_GEMMA23, qk_norm=True, partial_rotary_factor=1.0),
    "gemma4": dict(
        _COMMON,
        norm_unit_offset=False,
        qk_norm=True,
        v_norm=True,
        layer_scalar=True,
        query_pre_attn_scalar=1.0,  # transformers' scaling = 1.0
        attn_logit_softcapping=None,
    ),
}
# The RoPE types each family's global layers may use (its local layers: 'default').
_ROPE_TYPES = {
    "gemma2": ("default", "linear"),
    "gemma3": ("default", "linear"),
    "gemma4": ("default", "linear", "proportional"),
}
# transformers' Gemma4TextConfig defaults, for keys a config.json may leave out.
_GEMMA4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    _FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
}
_GLOBAL_HEAD_DIM, _PER_LAYER_INPUT = 512, 256


def _refused(source: str, what: str, fix: str) -> ValueError:
    return ValueError(f"{source}: {what}; {fix}")


def _per_layer_overrides(c: Mapping[str, Any]) -> list[str]:
    """Gemma 4's per-layer overrides that differ from the base config (``per_layer_config``, or
    the global layers' ``global_head_dim`` and, with keys as values, their KV heads), one
    entry per key."""
    if "per_layer_config" in c:
        overrides = c["per_layer_config"] or {}
        if not isinstance(overrides, Mapping) or not all(
            isinstance(o, Mapping) for o in overrides.values()
        ):
            return [f"per-layer overrides it does not map by layer (per_layer_config={overrides})"]
        places = [(f"on layer {i}", dict(o)) for i, o in overrides.items()]
    else:
        global_layers: dict[str, Any] = {"head_dim": c.get("global_head_dim", _GLOBAL_HEAD_DIM)}
        if c.get("attention_k_eq_v") and c.get("num_global_key_value_heads") is not None:
            global_layers["num_key_value_heads"] = c["num_global_key_value_heads"]
        places = [("on every global layer", global_layers)]
    out: dict[str, str] = {}
    for where, override in places:
        for key, value in override.items():
            if value != c.get(key) and key not in out:
                out[key] = f"per-layer {key} ({value} {where}, not {key}={c.get(key)})"
    return list(out.values())


def unbuilt_gemma4(c: Mapping[str, Any]) -> list[str]:
    """The Gemma 4 features a ``config.json`` uses that rljax does not build, each named with
    the key that turns it on (transformers' default where the key is absent)."""
    out = []
    per_layer_input = c.get("hidden_size_per_layer_input", _PER_LAYER_INPUT)
    if per_layer_input:
        out.append(f"per-layer inputs (hidden_size_per_layer_input={per_layer_input})")
    if c.get("num_kv_shared_layers"):
        out.append(f"shared KV layers (num_kv_shared_layers={c['num_kv_shared_layers']})")
    out += _per_layer_overrides(c)
    if c.get("attention_k_eq_v"):
        out.append("keys as values (attention_k_eq_v=true)")
    if c.get("use_double_wide_mlp") and c.get("num_kv_shared_layers"):  # only the shared layers'
        out.append("the double-wide MLP (use_double_wide_mlp=true)")
    if c.get("use_bidirectional_attention") == "all":
        out.append("bidirectional attention (use_bidirectional_attention='all')")
    return out


def check_config(config_json: Mapping[str, Any], family: str, source: str) -> None:
    """Rejects Gemma options the shared decoder does not implement, in one line."""
    if family == "gemma4":
        unbuilt = unbuilt_gemma4(config_json)
        if unbuilt:
            raise _refused(
                source,
                f"this Gemma 4 uses {', '.join(unbuilt)}, which rljax does not build",
                "use a Gemma 4 text checkpoint without them, or a Gemma 2 or Gemma 3 one; "
                "docs/gemma.md lists what is built",
            )
        act = config_json.get("hidden_activation") or _ACT  # Gemma 4 reads no hidden_act
    else:
        act = config_json.get("hidden_activation") or config_json.get("hidden_act") or _ACT
    if act != _ACT:
        what = f"hidden_activation={act!r} is not supported"
        raise _refused(source, what, f"Gemma uses {_ACT!r}")
    if config_json.get("attention_bias"):
        raise _refused(source, "attention_bias=true is not supported", "set it to false")
    # Gemma 4's 'vision' makes only image tokens bidirectional: a text model stays causal.
    if config_json.get("use_bidirectional_attention") not in (None, False, "vision"):
        raise _refused(
            source,
            "use_bidirectional_attention=true (an encoder) is not supported",
            "rljax trains causal decoders: set it to false",
        )


def _layer_types(config_json: Mapping[str, Any], family: str, layers: int, source: str):
    """Each layer's attention type: ``layer_types``, else the family's default pattern; Gemma
    4's last layer is global whatever the file says, as transformers makes it."""
    types = config_json.get("layer_types")
    if types is None:
        if family == "gemma2":  # local first, then alternating
            return tuple(LAYER_TYPES[i % 2] for i in range(layers))
        pattern = int(config_json.get("sliding_window_pattern", 6))
        types = [LAYER_TYPES[(i + 1) % pattern == 0] for i in range(layers)]
    types = tuple(types)
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown or len(types) != layers:
        what = (
            f"layer_types names the unknown attention pattern {unknown[0]!r}"
            if unknown
            else f"layer_types has {len(types)} entries for num_hidden_layers={layers}"
        )
        raise _refused(source, what, f"rljax reads one of {LAYER_TYPES} per layer; fix layer_types")
    if family == "gemma4" and types:
        types = (*types[:-1], _FULL)
    return types


def _rope_fields(config_json: Mapping[str, Any], family: str, source: str) -> dict[str, Any]:
    """The global RoPE base, its scaling and partial rotation, and the local base, from either
    dialect: transformers 5's ``rope_parameters`` keyed by layer type (Gemma 3, 4) or flat, or
    the legacy ``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq``."""
    params = config_json.get("rope_parameters") or (_GEMMA4_ROPE if family == "gemma4" else {})
    if _FULL in params:
        full, local = dict(params[_FULL]), dict(params.get("sliding_attention") or {})
    else:
        full, local = dict(params), {}
    local_theta = config_json.get("rope_local_base_freq", local.get("rope_theta"))
    out: dict[str, Any] = dict(
        rope_theta=float(config_json.get("rope_theta", full.get("rope_theta", 10000.0))),
        rope_scaling=None,
        rope_local_base_freq=None if local_theta is None else float(local_theta),
    )
    scaling = dict(config_json.get("rope_scaling") or full)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if local.get("rope_type", "default") != "default":
        raise _refused(
            source, f"local rope type {local['rope_type']!r} is not supported", "use 'default'"
        )
    allowed = _ROPE_TYPES[family]
    if rope_type not in allowed or (rope_type == "linear" and "factor" not in scaling):
        raise _refused(
            source,
            f"rope type {rope_type!r} is not supported for {family}",
            f"rljax implements {', '.join(map(repr, allowed))} RoPE for {family} (linear with "
            "a factor)",
        )
    if rope_type == "default":
        return out
    if rope_type == "proportional":
        out["partial_rotary_factor"] = float(scaling.get("partial_rotary_factor", 1.0))
    factor = float(scaling.get("factor", 1.0))
    if rope_type == "linear" or factor != 1.0:  # proportional's factor divides as linear's
        out["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return out


def _moe_block(config_json: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Gemma 4's mixture-of-experts fields: E, k and the expert width under transformers'
    names, the chosen experts' weights always renormalised (its router's rule); none without
    ``enable_moe_block``."""
    if not config_json.get("enable_moe_block"):
        return {}
    keys = ("num_experts", "top_k_experts", "moe_intermediate_size")
    missing = [k for k in keys if not isinstance(config_json.get(k), int)]
    if missing:
        raise _refused(
            source,
            f"enable_moe_block=true without an integer {missing[0]}",
            "the file is incomplete: re-download it or add the key",
        )
    return dict(
        enable_moe_block=True,
        num_experts=config_json["num_experts"],
        num_experts_per_tok=config_json["top_k_experts"],
        moe_intermediate_size=config_json["moe_intermediate_size"],
        norm_topk_prob=True,
        # transformers' Gemma 4 trains with no load-balancing loss and its file has no weight.
        router_aux_loss_coef=0.0,
    )


def _optional_float(config_json: Mapping[str, Any], key: str) -> float | None:
    value = config_json.get(key)
    return None if value is None else float(value)


def fields(config_json: Mapping[str, Any], family: str, source: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a Gemma ``config.json`` beyond the sizes and dtype."""
    four = family == "gemma4"
    layers = int(config_json["num_hidden_layers"])
    window = config_json.get("sliding_window", 512 if four else None)
    out = dict(
        _rope_fields(config_json, family, source),
        layer_types=_layer_types(config_json, family, layers, source),
        sliding_window=None if window is None else int(window),
        norm_eps=float(config_json.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config_json.get("tie_word_embeddings", True)),
        max_position_embeddings=int(
            config_json.get("max_position_embeddings", 131_072 if four else 8192)
        ),
        attn_logit_softcapping=_optional_float(config_json, "attn_logit_softcapping"),
        final_logit_softcapping=_optional_float(config_json, "final_logit_softcapping"),
        query_pre_attn_scalar=_optional_float(config_json, "query_pre_attn_scalar"),
    )
    out.update(SHAPES[family])  # Gemma 4's fixed scale and absent cap override what was read
    return out | (_moe_block(config_json, source) if four else {})


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _global_rope(cfg: ModelConfig) -> dict[str, Any]:
    """The global layers' ``rope_parameters``: Gemma 4's proportional form (its linear factor
    as 'factor'), else the default or linear one."""
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling is not None else {}
    if cfg.family != "gemma4":
        return {"rope_type": "default", **scaling, "rope_theta": cfg.rope_theta}
    out = {"rope_type": "proportional", "partial_rotary_factor": cfg.partial_rotary_factor}
    if scaling:
        out["factor"] = scaling["factor"]
    return {**out, "rope_theta": cfg.rope_theta}


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """A Gemma ``config.json``'s own keys (families adds the sizes and dtype): transformers 4.x
    and 5.x both load Gemma 2 and 3; Gemma 4 is transformers 5's."""
    shape = SHAPES[cfg.family]
    off = [k for k, v in shape.items() if getattr(cfg, k) != v]
    if off:
        raise ValueError(
            f"config_to_hf: family {cfg.family!r} with {off} differing from its shape has no "
            f"Hugging Face architecture; keep {shape}"
        )
    types = list(cfg.layer_types) or [_FULL] * cfg.num_layers
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_base_freq or cfg.rope_theta}
    out: dict[str, Any] = {
        "hidden_activation": _ACT,
        "layer_types": types,
        "sliding_window": cfg.sliding_window,
        "final_logit_softcapping": cfg.final_logit_softcapping,
    }
    if cfg.family == "gemma4":
        return out | {
            "rope_parameters": {_FULL: _global_rope(cfg), "sliding_attention": local},
            # Every head as wide as head_dim, and none of the unbuilt features (unbuilt_gemma4).
            "global_head_dim": cfg.head_dim,
            "per_layer_config": {},
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "attention_k_eq_v": False,
            "enable_moe_block": cfg.enable_moe_block,
            "num_experts": cfg.num_experts or None,
            "top_k_experts": cfg.num_experts_per_tok if cfg.enable_moe_block else None,
            "moe_intermediate_size": cfg.moe_intermediate_size or None,
            "use_double_wide_mlp": False,
            "use_bidirectional_attention": None,
        }
    out |= {
        "hidden_act": _ACT,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling is not None else None,
        # transformers types it int (Gemma's are 256, 144, 168...); a fractional one stays float
        "query_pre_attn_scalar": _whole(cfg.query_pre_attn_scalar or cfg.head_dim),
        "attn_logit_softcapping": cfg.attn_logit_softcapping,
    }
    if cfg.family == "gemma2":
        return out | {"rope_parameters": _global_rope(cfg)}
    return out | {
        "rope_local_base_freq": local["rope_theta"],
        "rope_parameters": {_FULL: _global_rope(cfg), "sliding_attention": local},
        "use_bidirectional_attention": False,
    }
