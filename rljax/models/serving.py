"""The decoder's weights in the layout a CPU sampler decodes from fastest.

A decode step reads every weight once for a few rows of activations, so its speed is the rate
at which the matmuls stream the weights. On the CPU two things slow the learner's layout
down (measured in docs/benchmarks.md, engine section):

- a ``jax.lax.scan`` over weights stacked by layer slices each layer's weights out of the
  stack, a copy of every weight in every step (XLA's CPU dots cannot read a slice in place);
- XLA's CPU dot kernels stream a weight fastest as the left operand of ``[out, in] @ [in,
  rows]``, and the learner keeps its weights [in, out] (``x @ W``).

:class:`ServingDecoder` holds each layer's weights as their own arrays, every matrix
transposed to [out..., in...] (stored under ``name + '_t'``), and runs the decoder's
computation (:class:`rljax.models.call_paths.CallPaths`) over them in the per-layer layout
(:data:`rljax.models.layouts.PER_LAYER`: those matmuls, the layers as straight-line code).
Its values are the Decoder's, up to float summation order. Built by
:func:`serving_converter` from the learner's params on every weight swap; a TPU sampler keeps
the stacked layout (``sampling.weights_layout``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax.sharding import Mesh

from rljax.config import LoRAConfig, ModelConfig
from rljax.models import lora
from rljax.models.call_paths import CallPaths
from rljax.models.layers import soft_cap
from rljax.models.layouts import PER_LAYER, Layout, PerLayer, contract_last
from rljax.models.sharding import ShardingRules, fitted_sharding
from rljax.models.transformer import LAYER_PARAMS, PARAM_AXES, Decoder

# Each stacked matrix's per-layer axes, reordered to [out..., in...] for the serving layout.
TRANSPOSED = {
    "wq": (1, 2, 0),  # [D, N, H] -> [N, H, D]
    "wk": (1, 2, 0),
    "wv": (1, 2, 0),
    "wo": (2, 0, 1),  # [N, H, D] -> [D, N, H]
    "w_gate": (1, 0),  # [D, F] -> [F, D]
    "w_up": (1, 0),
    "w_down": (1, 0),  # [F, D] -> [D, F]
}


def _serving_axes(name: str) -> tuple[str, tuple[str | None, ...]]:
    """Stacked layer weight ``name``'s key and logical axes in one layer of the serving layout."""
    axes = PARAM_AXES[name][1:]  # drop 'layers'
    if name not in TRANSPOSED:
        return name, axes
    return PerLayer.key(name), tuple(axes[i] for i in TRANSPOSED[name])


# The logical axes of each of one layer's arrays, by its key in the serving layout.
LAYER_AXES: dict[str, tuple[str | None, ...]] = dict(_serving_axes(name) for name in LAYER_PARAMS)
# Unmerged LoRA adapters keep their stacked orientation ([in..., r] and [r, out...]).
LAYER_AXES.update(
    (key(w), lora.adapter_axes(key(w))[1:])
    for w in lora.WEIGHT_SPECS
    for key in (lora.a_key, lora.b_key)
)


@struct.dataclass
class ServingDecoder(CallPaths):
    """The decoder's weights, one set of arrays per layer, matrices [out..., in...].

    ``layers[i]`` holds layer i's norms and biases as the Decoder does and its matrices under
    ``name + '_t'``; ``head_t`` is the untied output projection [V, D] (None when tied: the
    embedding [V, D] is already in that layout).
    """

    layout: ClassVar[Layout] = PER_LAYER
    cfg: ModelConfig = struct.field(pytree_node=False)
    embed: jax.Array
    final_norm: jax.Array
    head_t: jax.Array | None
    layers: tuple[dict[str, jax.Array], ...]
    # Unmerged LoRA adapters sit in layers[i] under their own names, scaled by this.
    lora_scale: float = struct.field(pytree_node=False, default=0.0)

    def _layers(self) -> tuple[dict[str, jax.Array], ...]:
        return self.layers

    def _embed(self, tokens):
        return self.embed[tokens].astype(jnp.dtype(self.cfg.dtype))

    def _final_norm(self) -> jax.Array:
        return self.final_norm

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Vocabulary logits in float32 for hidden states [..., D], soft-capped as the Decoder's."""
        w_vd = self.embed if self.head_t is None else self.head_t
        if w_vd.dtype == jnp.bfloat16:
            logits = float32_times_bfloat16(hidden, w_vd)
        else:
            head = {PerLayer.key("head"): w_vd}
            logits = self.layout.project(hidden.astype(jnp.float32), head, "head", "...D,DV->...V")
        return soft_cap(logits, self.cfg.final_logit_softcapping)


def float32_times_bfloat16(hidden: jax.Array, w_vd: jax.Array) -> jax.Array:
    """float32 ``hidden`` [..., D] times bfloat16 ``w_vd`` [V, D] -> [..., V], as the float32
    product the Decoder's head computes, reading the weight once as it is stored.

    Casting the weight to float32 instead would write and read a float32 copy of the whole
    head in every decode step. ``hidden`` is split into three bfloat16 terms whose sum is it to
    2^-27 of its value (8 bits of mantissa each, float32 has 24); every product of two bfloat16
    numbers is exact in float32, so one dot of the three terms' rows, accumulating in float32,
    gives the three partial products, whose sum is the float32 product up to summation order.
    """
    *lead, d = hidden.shape
    rest = hidden.astype(jnp.float32).reshape(-1, d)
    terms = []
    for _ in range(3):
        term = rest.astype(jnp.bfloat16)
        terms.append(term)
        rest = rest - term.astype(jnp.float32)
    rows = len(rest)
    parts = jax.lax.optimization_barrier(contract_last(w_vd, jnp.concatenate(terms)))
    logits = parts[:, :rows] + parts[:, rows : 2 * rows] + parts[:, 2 * rows :]
    return logits.T.reshape(*lead, w_vd.shape[0])


def to_serving(model, *, merge_adapters: bool = False) -> ServingDecoder:
    """A Decoder's weights in the serving layout (traceable; new arrays, never views); its
    LoRA adapters folded into the weights (``merge_adapters``) or kept beside them."""
    cfg = model.cfg
    stacked = model._layers()
    if merge_adapters:
        stacked = lora.merged_layers(stacked, model.lora_scale)

    def layer(i):
        out = {}
        for name, w in stacked.items():
            if name in TRANSPOSED:
                out[PerLayer.key(name)] = jnp.transpose(w[i], TRANSPOSED[name])
            else:
                out[name] = w[i]
        return out

    head = None if cfg.tie_embeddings else model.lm_head[...].T
    layers = tuple(layer(i) for i in range(cfg.num_layers))
    scale = 0.0 if merge_adapters else model.lora_scale
    return ServingDecoder(cfg, model.embed[...], model.final_norm[...], head, layers, scale)


def serving_shardings(abstract: ServingDecoder, mesh: Mesh, rules: ShardingRules):
    """NamedShardings for a ServingDecoder's arrays, from the logical axes of their layout."""

    def place(logical, x, name):
        return fitted_sharding(mesh, rules, logical, x.shape, name)

    head = None
    if abstract.head_t is not None:
        head = place(("vocab", "embed"), abstract.head_t, "head_t")
    layers = tuple(
        {k: place(LAYER_AXES[k], x, f"layers/{i}/{k}") for k, x in layer.items()}
        for i, layer in enumerate(abstract.layers)
    )
    return dataclasses.replace(
        abstract,
        embed=place(PARAM_AXES["embed"], abstract.embed, "embed"),
        final_norm=place(PARAM_AXES["final_norm"], abstract.final_norm, "final_norm"),
        head_t=head,
        layers=layers,
    )


def serving_converter(
    cfg: ModelConfig,
    graphdef: nnx.GraphDef,
    mesh: Mesh,
    rules: ShardingRules,
    *,
    lora_cfg: LoRAConfig | None = None,
    merge_adapters: bool = False,
) -> Callable[[nnx.State], ServingDecoder]:
    """One compiled conversion from a params state (placed on ``mesh``) to a ServingDecoder
    on the same mesh; build it once per engine, call it on every weight swap. ``graphdef``
    holds ``lora_cfg``'s adapters when it is given; ``merge_adapters`` folds them in."""

    def convert(params):
        return to_serving(nnx.merge(graphdef, params), merge_adapters=merge_adapters)

    decoder = lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora_cfg)  # noqa: E731
    abstract = jax.eval_shape(lambda: convert(nnx.state(decoder())))
    return jax.jit(convert, out_shardings=serving_shardings(abstract, mesh, rules))
