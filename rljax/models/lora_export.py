"""LoRA adapters out to Hugging Face: a PEFT adapter directory, or merged full weights.

:func:`save_peft_adapter` writes what ``peft.PeftModel.from_pretrained`` loads onto the base
model (``adapter_config.json`` + ``adapter_model.safetensors``); :func:`save_merged_hf` folds
the adapters into the weights and writes a plain checkpoint through
:func:`rljax.models.hf.save_hf`, which transformers and :func:`rljax.models.hf.load_hf` load.

PEFT's LoRA on a ``torch.nn.Linear`` adds ``scale * B(A(x))`` with ``lora_A.weight`` [r, in]
and ``lora_B.weight`` [out, r], where in and out are the flattened axes of the Hugging Face
weight [out, in]. Which of rljax's per-layer axes those flatten, and in what order, is read
from the weight's :class:`~rljax.models.hf.TensorSpec` (the one layout map import and export
share), e.g. for ``wq``: ``A`` "DR" -> [R, D], ``B`` "RNH" -> [N*H, R].

On a mixture-of-experts model an adapter stacked over the dense layers (``w_*``) or the MoE
layers (Qwen2-MoE's shared expert, ``ws_*``) is written under each of those layers' own
index; the routed experts carry no adapters (docs/lora.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from rljax import io
from rljax.config import LoRAConfig, ModelConfig
from rljax.models import lora as lora_lib
from rljax.models.hf import save_hf, save_safetensors
from rljax.models.hf_specs import TENSOR_SPECS

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's key prefix: PeftModel.base_model (LoraModel) .model (the *ForCausalLM).
_PEFT_PREFIX = "base_model.model."


def hf_module(weight: str) -> str:
    """The Hugging Face module a stacked weight belongs to, with ``{i}`` for the layer
    (``wq`` -> ``model.layers.{i}.self_attn.q_proj``)."""
    return TENSOR_SPECS[weight].hf_name.removesuffix(".weight")


def target_modules(lora: LoRAConfig, cfg: ModelConfig) -> list[str]:
    """PEFT's ``target_modules`` for ``lora.targets`` (``q`` -> ``q_proj``; ``gate`` ->
    ``gate_proj``, which names a dense MLP's and a shared expert's alike)."""
    names = [hf_module(w).rsplit(".", 1)[-1] for w in lora_lib.adapted_weights(lora, cfg)]
    return list(dict.fromkeys(names))


def _hf_axes(weight: str, cfg: ModelConfig) -> tuple[str, str]:
    """(out, in): the per-layer axis letters that the Hugging Face weight [out, in] of
    ``weight`` flattens, in its order (``wo`` -> ("D", "NH"))."""
    spec = TENSOR_SPECS[weight]
    a_spec, b_spec = lora_lib.WEIGHT_SPECS[weight]
    letters = a_spec[:-1] + b_spec[1:]  # the rljax weight's axes, e.g. "DNH"
    # rljax axis i is view axis perm[i] (hf.TensorSpec), so view axis v is rljax axis
    # argsort(perm)[v].
    view = "".join(letters[i] for i in np.argsort(spec.perm))
    n_out = len(spec.groups(cfg)[0])
    return view[:n_out], view[n_out:]


def peft_tensors(
    cfg: ModelConfig, params: nnx.State | Mapping[str, Any], lora: LoRAConfig
) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(peft key, float32 array)`` for each layer's ``lora_A`` [r, in] and
    ``lora_B`` [out, r] of every adapted module."""
    pure = _checked_adapters(params, lora, cfg)
    for weight in lora_lib.adapted_weights(lora, cfg):
        a_spec, b_spec = lora_lib.WEIGHT_SPECS[weight]
        out, in_ = _hf_axes(weight, cfg)
        a = np.asarray(jax.device_get(pure[lora_lib.a_key(weight)]), np.float32)
        b = np.asarray(jax.device_get(pure[lora_lib.b_key(weight)]), np.float32)
        module = _PEFT_PREFIX + hf_module(weight)
        for row, i in enumerate(lora_lib.stacked_layers(cfg, weight)):
            a_ri = np.einsum(f"{a_spec}->R{in_}", a[row]).reshape(lora.rank, -1)
            b_or = np.einsum(f"{b_spec}->{out}R", b[row]).reshape(-1, lora.rank)
            yield module.format(i=i) + ".lora_A.weight", a_ri
            yield module.format(i=i) + ".lora_B.weight", b_or


def adapter_config(
    lora: LoRAConfig, cfg: ModelConfig, base_model_name_or_path: str
) -> dict[str, Any]:
    """The ``adapter_config.json`` of ``lora`` on model ``cfg`` (plain LoRA: ``alpha / r``
    scaling, no bias)."""
    alpha = lora.alpha
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        # PEFT types lora_alpha as an int; a fractional alpha still scales correctly.
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_modules(lora, cfg),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def save_peft_adapter(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: nnx.State | Mapping[str, Any],
    lora: LoRAConfig,
    *,
    base_model_name_or_path: str,
) -> None:
    """Writes the adapters of ``params`` as a Hugging Face PEFT adapter directory.

    ``params`` is a LoRA-adapted Decoder's state (base plus adapters, or the adapters alone)
    and ``lora`` the config they were trained with. The directory holds
    ``adapter_config.json`` and ``adapter_model.safetensors`` (float32);
    ``peft.PeftModel.from_pretrained(base, path)`` applies it to the base model, which
    ``base_model_name_or_path`` names (a hub id or directory, e.g. one :func:`save_hf` wrote).
    """
    tensors = {name: np.ascontiguousarray(a) for name, a in peft_tensors(cfg, params, lora)}
    io.makedirs(path)
    save_safetensors(tensors, io.join(path, ADAPTER_WEIGHTS_FILE), {"format": "pt"})
    config = adapter_config(lora, cfg, base_model_name_or_path)
    io.write_text(io.join(path, ADAPTER_CONFIG_FILE), json.dumps(config, indent=2))


class _Merged(Mapping):
    """A Decoder's pure state with each adapted weight merged (``W + scale * A B``) when it
    is read, so an export holds one merged weight at a time, not a second model."""

    def __init__(self, pure: Mapping[str, Any], scale: float):
        self._pure = pure
        self._scale = scale
        self._names = [k for k in pure if not lora_lib.is_adapter(k)]

    def __getitem__(self, name: str):
        if lora_lib.is_adapter(name) or name not in self._pure:
            raise KeyError(name)
        w = self._pure[name]
        a_key, b_key = lora_lib.a_key(name), lora_lib.b_key(name)
        if a_key not in self._pure:
            return w
        return lora_lib.merged_weight(w, self._pure[a_key], self._pure[b_key], name, self._scale)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def save_merged_hf(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: nnx.State | Mapping[str, Any],
    lora: LoRAConfig,
    tokenizer=None,
    *,
    max_shard_bytes: int = 4 << 30,
) -> None:
    """Writes base plus adapters as one plain Hugging Face checkpoint (:func:`save_hf`).

    Each adapted weight becomes ``W + (alpha / r) A B`` (:func:`rljax.models.lora.merged_weight`,
    summed in float32, stored in the weight's dtype); ``transformers`` and ``load_hf`` load the
    result with no adapters. ``tokenizer`` and ``max_shard_bytes`` are :func:`save_hf`'s.
    """
    pure = _checked_adapters(params, lora, cfg)
    if not any(k in pure for k in TENSOR_SPECS):
        raise ValueError(
            "params hold only LoRA adapters; a merged export needs the base too: pass "
            "lora.join(base, adapters)"
        )
    merged = _Merged(pure, lora.scale)
    save_hf(path, cfg, merged, tokenizer, max_shard_bytes=max_shard_bytes)


def _checked_adapters(
    params: nnx.State | Mapping[str, Any], lora: LoRAConfig, cfg: ModelConfig
) -> dict[str, Any]:
    """``params`` as a pure dict, once its adapters are known to be those ``lora`` describes
    on model ``cfg``."""
    # nnx.State is itself a Mapping (of Variables), so test for it first.
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else dict(params)
    held = sorted({k.rsplit("_lora_", 1)[0] for k in pure if lora_lib.is_adapter(k)})
    if not held:
        raise ValueError(
            "params hold no LoRA adapters; pass a LoRA-adapted Decoder's state (e.g. "
            "Learner.params of a run with lora.enabled, or transformer.with_adapters)"
        )
    if not lora.enabled:
        raise ValueError(
            "lora.enabled is False; pass the LoRAConfig the adapters were trained with"
        )
    wanted = sorted(lora_lib.adapted_weights(lora, cfg))
    if held != wanted:
        raise ValueError(
            f"params hold adapters of {held} but lora.targets={lora.targets!r} adapts "
            f"{wanted}; pass the LoRAConfig the adapters were trained with"
        )
    for weight in held:
        for key in (lora_lib.a_key(weight), lora_lib.b_key(weight)):
            if key not in pure:
                raise ValueError(
                    f"params hold {weight}'s LoRA adapters without {key}; pass the whole "
                    "adapted state (lora.join(base, adapters))"
                )
        rank = np.shape(pure[lora_lib.a_key(weight)])[-1]
        if rank != lora.rank:
            raise ValueError(
                f"params' {lora_lib.a_key(weight)} has rank {rank} but lora.rank={lora.rank}; "
                "pass the LoRAConfig the adapters were trained with"
            )
    return pure
