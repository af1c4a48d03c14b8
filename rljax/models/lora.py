"""Low-rank adapters (LoRA) on the decoder's projections: one model definition, a frozen base.

An adapted projection computes ``x W + scale * (x A) B`` with ``A`` [in..., r] and ``B``
[r, out...] (``scale = alpha / r``), in the same call paths the learner and the engine run
(:class:`rljax.models.call_paths.CallPaths`). ``B`` starts at zero, so an adapted model starts
equal to its base. The adapters are :class:`LoRAParam` variables of the
:class:`~rljax.models.transformer.Decoder`, stacked by layer like the weights they adapt and
named ``<weight>_lora_a`` / ``<weight>_lora_b``; :func:`split_adapters` separates them from the
base, which the learner never differentiates, updates or checkpoints again.

On a mixture-of-experts model the MLP targets adapt the dense MLPs of its dense layers
(``w_*``, stacked over :func:`~rljax.models.moe.dense_layers`) and Qwen2-MoE's shared expert
(``ws_*``, stacked over :func:`~rljax.models.moe.moe_layers`); the routed experts stay frozen
(:mod:`rljax.models.lora_targets`).

The base model is the reference policy of a KL penalty: the call paths take ``adapters=False``
(no second copy of the weights). A sampler serves base plus adapters either unmerged (the
low-rank product at every step) or merged (:func:`merged_layers`: folded into the weights
when it swaps them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.config import LoRAConfig, ModelConfig
from rljax.models.lora_targets import TARGET_WEIGHTS as TARGET_WEIGHTS
from rljax.models.lora_targets import target_weights
from rljax.models.moe import DENSE_PARAMS, SHARED_PARAMS, dense_layers, moe_layers

# Each adapted weight's einsum in the stacked layout's axis order (per layer): A takes the
# input axes to the rank R, B the rank to the output axes.
WEIGHT_SPECS = {
    "wq": ("DR", "RNH"),
    "wk": ("DR", "RKH"),
    "wv": ("DR", "RKH"),
    "wo": ("NHR", "RD"),
    "w_gate": ("DR", "RF"),
    "w_up": ("DR", "RF"),
    "w_down": ("FR", "RD"),
    # Qwen2-MoE's shared expert (S: its width, shared_expert_intermediate_size).
    "ws_gate": ("DR", "RS"),
    "ws_up": ("DR", "RS"),
    "ws_down": ("SR", "RD"),
}

_AXES = {
    "D": "embed",
    "N": "heads",
    "K": "kv_heads",
    "H": "head_dim",
    "F": "mlp",
    "S": "mlp",
    "R": None,  # the rank is small: replicated
}


# Where a training call puts each layer's dropout key among the layer weights it scans.
DROPOUT_KEY = "_lora_dropout_key"


def weight_index(weight: str) -> int:
    """A stable small int per adaptable weight (to fold into a dropout key)."""
    return list(WEIGHT_SPECS).index(weight)


def dropout(x: jax.Array, key: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: each element kept with probability 1 - rate, scaled by 1 / (1 - rate)."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class LoRAParam(nnx.Param):
    """An adapter weight: the only parameters a LoRA run differentiates and updates."""


def is_adapter(name: str) -> bool:
    """Whether a params key names a LoRA adapter (or a training call's dropout keys)."""
    return "_lora_" in name


def a_key(weight: str) -> str:
    return weight + "_lora_a"


def b_key(weight: str) -> str:
    return weight + "_lora_b"


def adapted_weights(lora: LoRAConfig, cfg: ModelConfig) -> tuple[str, ...]:
    """The decoder weights ``lora`` adapts on model ``cfg``, in ``lora.targets`` order (an MLP
    target: the dense MLP where ``cfg`` has dense layers, then the shared expert where its MoE
    layers have one)."""
    dense = bool(dense_layers(cfg))
    shared = bool(moe_layers(cfg)) and cfg.shared_expert_intermediate_size > 0
    return tuple(
        w for t in lora.targets for w in target_weights(t, dense_mlp=dense, shared_expert=shared)
    )


def stacked_layers(cfg: ModelConfig, weight: str) -> tuple[int, ...]:
    """The layers whose weights ``weight``'s stack holds, in order: a dense MLP's the dense
    layers, a shared expert's the mixture-of-experts layers, the rest every layer."""
    if weight in DENSE_PARAMS:
        return dense_layers(cfg)
    if weight in SHARED_PARAMS:
        return moe_layers(cfg)
    return tuple(range(cfg.num_layers))


def _dims(cfg: ModelConfig, rank: int) -> dict[str, int]:
    return {
        "D": cfg.hidden_size,
        "N": cfg.num_heads,
        "K": cfg.num_kv_heads,
        "H": cfg.head_dim,
        "F": cfg.intermediate_size,
        "S": cfg.shared_expert_intermediate_size,
        "R": rank,
    }


def adapter_shapes(cfg: ModelConfig, lora: LoRAConfig) -> dict[str, tuple[int, ...]]:
    """Every adapter variable's name -> its stacked shape [layers, ...], stacked over the
    layers of the weight it adapts (:func:`stacked_layers`)."""
    dims = _dims(cfg, lora.rank)
    out = {}
    for w in adapted_weights(lora, cfg):
        a, b = WEIGHT_SPECS[w]
        depth = len(stacked_layers(cfg, w))
        out[a_key(w)] = (depth, *(dims[c] for c in a))
        out[b_key(w)] = (depth, *(dims[c] for c in b))
    return out


def adapter_axes(name: str) -> tuple[str | None, ...]:
    """The logical axes of adapter variable ``name`` (sharded by the weights' rules)."""
    weight, part = name.rsplit("_lora_", 1)
    a, b = WEIGHT_SPECS[weight]
    return ("layers", *(_AXES[c] for c in (a if part == "a" else b)))


def init_adapter(name: str, key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """A: PEFT's default, uniform in +-1/sqrt(fan in) (Kaiming-uniform, a=sqrt(5)); B: zeros."""
    if name.endswith("_lora_b"):
        return jnp.zeros(shape, dtype)
    fan_in = math.prod(shape[1:-1])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)


def delta(x: jax.Array, a: jax.Array, b: jax.Array, weight: str, scale: float) -> jax.Array:
    """``scale * (x A) B`` for one layer's adapters of ``weight``; x's trailing axes are the
    weight's input axes."""
    a_spec, b_spec = WEIGHT_SPECS[weight]
    ins = a_spec[:-1]
    lead = "abcdefg"[: x.ndim - len(ins)]
    xa = jnp.einsum(f"{lead}{ins},{a_spec}->{lead}R", x, a.astype(x.dtype))
    out = jnp.einsum(f"{lead}R,{b_spec}->{lead}{b_spec[1:]}", xa, b.astype(x.dtype))
    return out * jnp.asarray(scale, x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def swiglu_adapted(scale, x_btd, w_gate, w_up, w_down, adapters):
    """The SwiGLU MLP with every one of its weights adapted, with a hand-written backward
    that computes no gradient for the frozen weights.

    ``adapters`` is (A_gate, B_gate, A_up, B_up, A_down, B_down), one layer's. Like
    :func:`rljax.models.layouts.swiglu`, every product is a 2-D matmul over the flattened
    tokens and only the pre-activations (and the adapters' rank-r inputs) are saved; the
    weight gradients are the adapters' alone (``x^T dy`` of rank r), so the full weights'
    [in, out] gradient GEMMs are never run. Values and gradients equal autodiff's.
    """
    return _swiglu_adapted_fwd(scale, x_btd, w_gate, w_up, w_down, adapters)[0]


def _swiglu_adapted_fwd(scale, x_btd, w_gate, w_up, w_down, adapters):
    a_g, b_g, a_u, b_u, a_d, b_d = adapters
    x = x_btd.reshape(-1, x_btd.shape[-1])
    xa_g, xa_u = x @ a_g, x @ a_u
    gate = x @ w_gate + scale * (xa_g @ b_g)
    up = x @ w_up + scale * (xa_u @ b_u)
    h = jax.nn.silu(gate) * up
    ha_d = h @ a_d
    out = h @ w_down + scale * (ha_d @ b_d)
    saved = (x, w_gate, w_up, w_down, adapters, gate, up, xa_g, xa_u, ha_d)
    return out.reshape(x_btd.shape), saved


def _swiglu_adapted_bwd(scale, saved, dy_btd):
    x, w_gate, w_up, w_down, adapters, gate, up, xa_g, xa_u, ha_d = saved
    a_g, b_g, a_u, b_u, a_d, b_d = adapters
    dy = dy_btd.reshape(-1, dy_btd.shape[-1])
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    h = silu * up
    dy_b = scale * (dy @ b_d.T)  # [tokens, r]
    dh = dy @ w_down.T + dy_b @ a_d.T
    d_up = dh * silu
    d_gate = dh * up * (sig * (1 + gate * (1 - sig)))
    dg_b, du_b = scale * (d_gate @ b_g.T), scale * (d_up @ b_u.T)
    dx = d_gate @ w_gate.T + d_up @ w_up.T + dg_b @ a_g.T + du_b @ a_u.T
    x_t = x.T
    d_adapters = (
        x_t @ dg_b,
        scale * (xa_g.T @ d_gate),
        x_t @ du_b,
        scale * (xa_u.T @ d_up),
        h.T @ dy_b,
        scale * (ha_d.T @ dy),
    )
    zeros = tuple(jnp.zeros_like(w) for w in (w_gate, w_up, w_down))  # frozen: pruned by XLA
    return (dx.reshape(dy_btd.shape), *zeros, d_adapters)


swiglu_adapted.defvjp(_swiglu_adapted_fwd, _swiglu_adapted_bwd)


def merged_weight(w: jax.Array, a: jax.Array, b: jax.Array, weight: str, scale: float):
    """``W + scale * A B`` (stacked [L, ...] or one layer's), computed in float32."""
    a_spec, b_spec = WEIGHT_SPECS[weight]
    lead = "L" if a.ndim > len(a_spec) else ""
    ab = jnp.einsum(
        f"{lead}{a_spec},{lead}{b_spec}->{lead}{a_spec[:-1]}{b_spec[1:]}",
        a.astype(jnp.float32),
        b.astype(jnp.float32),
    )
    return (w.astype(jnp.float32) + scale * ab).astype(w.dtype)


def merged_layers(layers: Mapping[str, jax.Array], scale: float) -> dict[str, jax.Array]:
    """Stacked layer weights with every adapter folded into the weight it adapts (and the
    adapters dropped): what a merged sampler serves."""
    out = {k: v for k, v in layers.items() if not is_adapter(k)}
    for name in list(out):
        if a_key(name) in layers:
            out[name] = merged_weight(
                out[name], layers[a_key(name)], layers[b_key(name)], name, scale
            )
    return out


def _is_adapter(path, _) -> bool:
    return is_adapter(str(path[-1]))


def split_adapters(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(adapters, base) of a params state, or of any state shaped like one (its shardings,
    gradients): adapters are found by name, so bare leaves split as their Variables do."""
    adapters, base = nnx.split_state(state, _is_adapter, ...)
    return adapters, base


def has_adapters(state: nnx.State) -> bool:
    """Whether a params state holds LoRA adapters."""
    return bool(jax.tree.leaves(split_adapters(state)[0]))


def join(base: nnx.State, adapters: nnx.State) -> nnx.State:
    """The params state of base plus adapters (no array is copied)."""
    return nnx.merge_state(base, adapters)
