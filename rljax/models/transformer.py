"""A decoder-only transformer in Flax NNX: Llama, Qwen2, Qwen3, SmolLM2 and Gemma 2/3/4 share it.

Pieces: RMSNorm, rotary embeddings (with Llama-3 or linear frequency scaling), grouped-query
attention with optional q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3, Gemma 3/4), a SwiGLU
or GeGLU (Gemma) MLP, and optional tied input/output embeddings (SmolLM2, Gemma). Gemma adds
config fields, none keyed on the family: local layers attending to a sliding window with their
own RoPE base (``layer_types``, ``sliding_window``, ``rope_local_base_freq``), soft-capped
attention and output logits, norms after attention and the MLP (``post_norms``), RMSNorm's
``(1 + w)`` scale (``norm_unit_offset``) and the embedding scaled by sqrt(D); Gemma 4 adds a
value norm without a scale (``v_norm``), an output scalar per layer (``layer_scalar``) and
partial RoPE on the global layers (``partial_rotary_factor``), takes an attention scale of
1 (``query_pre_attn_scalar=1``), and its mixture-of-experts variant adds routed experts beside
every layer's MLP (``enable_moe_block``, :func:`rljax.models.moe.moe_block`).

Per-layer weights are stacked along a leading ``layers`` axis and the blocks run under
``jax.lax.scan``: one block is compiled per run of layers of one kind however deep the model
is, and a checkpoint's layer tensors map onto one array per kind. The computation lives in
:class:`rljax.models.call_paths.CallPaths`, over a :class:`~rljax.models.layouts.Layout` that
says how the weights multiply and the layers run, so a CPU sampler can run it over the same
weights in another layout (:mod:`rljax.models.serving`). :class:`Decoder` holds the weights in
the stacked layout the learner trains.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from rljax.config import LoRAConfig, ModelConfig
from rljax.models import lora as lora_lib
from rljax.models import moe as moe_lib
from rljax.models.call_paths import CallPaths
from rljax.models.layers import soft_cap
from rljax.models.layouts import STACKED
from rljax.models.sharding import ShardingRules, state_shardings

# Each parameter's logical axes; models/sharding.py maps them to mesh axes per role.
PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("embed",),
    "attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "attn_post_norm": ("layers", "embed"),  # Gemma's norms after attention and the MLP
    "mlp_post_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
    "bq": ("layers", "heads", "head_dim"),
    "bk": ("layers", "kv_heads", "head_dim"),
    "bv": ("layers", "kv_heads", "head_dim"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
    "layer_scalar": ("layers",),  # Gemma 4's per-layer output scalar
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
    # Mixture-of-experts layers (rljax.models.moe), stacked over the MoE layers only; the dense
    # MLP's three above are then stacked over the dense layers only.
    "router": ("layers", "embed", None),
    "we_gate": ("layers", "experts", "expert_embed", "expert_mlp"),
    "we_up": ("layers", "experts", "expert_embed", "expert_mlp"),
    "we_down": ("layers", "experts", "expert_mlp", "expert_embed"),
    "ws_gate": ("layers", "embed", "mlp"),
    "ws_up": ("layers", "embed", "mlp"),
    "ws_down": ("layers", "mlp", "embed"),
    "ws_router": ("layers", "embed"),
    # Gemma 4's block (enable_moe_block): the router's scales and the norms around the experts.
    "router_scale": ("layers", "embed"),
    "expert_scale": ("layers", None),
    "dense_post_norm": ("layers", "embed"),
    "moe_norm": ("layers", "embed"),
    "moe_post_norm": ("layers", "embed"),
}

LAYER_PARAMS = tuple(k for k, axes in PARAM_AXES.items() if axes[0] == "layers")
# Every LoRA adapter a Decoder may hold (rljax.models.lora), all stacked by layer.
ADAPTER_PARAMS = tuple(
    key(w) for w in lora_lib.WEIGHT_SPECS for key in (lora_lib.a_key, lora_lib.b_key)
)


class Decoder(CallPaths, nnx.Module):
    """The decoder, its weights in the stacked layout (the one it trains in). Parameters carry
    logical axis names in their ``out_sharding`` metadata."""

    layout = STACKED

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, lora: LoRAConfig | None = None):
        self.cfg = cfg
        dtype = jnp.dtype(cfg.param_dtype)
        d, f, n, k, h, l_ = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.num_layers,
        )

        def param(name, shape, init):
            value = init(rngs.params(), shape, jnp.float32).astype(dtype)
            return nnx.Param(value, out_sharding=PARAM_AXES[name], eager_sharding=False)

        def fan_in(scale_dims):
            def init(key, shape, dt):
                fan = math.prod(shape[i] for i in scale_dims)
                return jax.random.normal(key, shape, dt) / math.sqrt(fan)

            return init

        zeros = lambda key, shape, dt: jnp.zeros(shape, dt)
        # A norm's identity scale: 1, or 0 where it scales by (1 + w).
        ones = zeros if cfg.norm_unit_offset else lambda key, shape, dt: jnp.ones(shape, dt)
        embed_std = 1.0 / math.sqrt(d) if cfg.tie_embeddings else 1.0
        self.embed = param(
            "embed", (cfg.vocab_size, d), lambda k_, s, dt: embed_std * jax.random.normal(k_, s, dt)
        )
        if not cfg.tie_embeddings:
            self.lm_head = param("lm_head", (d, cfg.vocab_size), fan_in([0]))
        self.final_norm = param("final_norm", (d,), ones)
        self.attn_norm = param("attn_norm", (l_, d), ones)
        self.mlp_norm = param("mlp_norm", (l_, d), ones)
        if cfg.post_norms:
            self.attn_post_norm = param("attn_post_norm", (l_, d), ones)
            self.mlp_post_norm = param("mlp_post_norm", (l_, d), ones)
        self.wq = param("wq", (l_, d, n, h), fan_in([1]))
        self.wk = param("wk", (l_, d, k, h), fan_in([1]))
        self.wv = param("wv", (l_, d, k, h), fan_in([1]))
        self.wo = param("wo", (l_, n, h, d), fan_in([1, 2]))
        if cfg.qkv_bias:
            self.bq = param("bq", (l_, n, h), zeros)
            self.bk = param("bk", (l_, k, h), zeros)
            self.bv = param("bv", (l_, k, h), zeros)
        if cfg.qk_norm:
            self.q_norm = param("q_norm", (l_, h), ones)
            self.k_norm = param("k_norm", (l_, h), ones)
        if cfg.layer_scalar:
            self.layer_scalar = param("layer_scalar", (l_,), lambda key, s, dt: jnp.ones(s, dt))
        dense = len(moe_lib.dense_layers(cfg))
        if dense:
            self.w_gate = param("w_gate", (dense, d, f), fan_in([1]))
            self.w_up = param("w_up", (dense, d, f), fan_in([1]))
            self.w_down = param("w_down", (dense, f, d), fan_in([1]))
        for name, (shape, fan_dims) in moe_lib.expert_shapes(cfg).items():
            setattr(self, name, param(name, shape, fan_in(fan_dims)))
        for name, shape in moe_lib.block_shapes(cfg).items():
            setattr(self, name, param(name, shape, lambda key, s, dt: jnp.ones(s, dt)))
        if lora is not None and lora.enabled:
            self.lora_scale = lora.scale
            self.lora_dropout = lora.dropout
            adapter_dtype = jnp.dtype(lora.dtype or cfg.param_dtype)
            for name, shape in lora_lib.adapter_shapes(cfg, lora).items():
                value = lora_lib.init_adapter(name, rngs.params(), shape, adapter_dtype)
                axes = lora_lib.adapter_axes(name)
                param_ = lora_lib.LoRAParam(value, out_sharding=axes, eager_sharding=False)
                setattr(self, name, param_)

    # -- the weights the call paths read --------------------------------------------------------

    def _layers(self) -> dict[str, jax.Array]:
        names = (*LAYER_PARAMS, *ADAPTER_PARAMS)
        return {name: getattr(self, name)[...] for name in names if hasattr(self, name)}

    @property
    def unembed_dv(self) -> jax.Array:
        """The output projection [D, V] (the transposed embedding when tied)."""
        if self.cfg.tie_embeddings:
            return self.embed[...].T
        return self.lm_head[...]

    def _embed(self, tokens):
        return self.embed[...][tokens].astype(jnp.dtype(self.cfg.dtype))

    def _final_norm(self) -> jax.Array:
        return self.final_norm[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Vocabulary logits in float32 for hidden states [..., D], soft-capped when the model
        caps them (``final_logit_softcapping``)."""
        logits = jnp.einsum(
            "...D,DV->...V", hidden.astype(jnp.float32), self.unembed_dv.astype(jnp.float32)
        )
        return soft_cap(logits, self.cfg.final_logit_softcapping)


def abstract_decoder(cfg: ModelConfig, lora: LoRAConfig | None = None) -> Decoder:
    """The model with ShapeDtypeStructs for weights: a restore target, never materialised."""
    return nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora))


def init_sharded(cfg: ModelConfig, mesh: Mesh, rules: ShardingRules, seed: int):
    """Initialise a Decoder directly into its shardings; returns (graphdef, params state)."""
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)))
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh, rules)

    def create():
        return nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)))[1]

    return graphdef, jax.jit(create, out_shardings=shardings)()


def with_adapters(
    cfg: ModelConfig,
    params: nnx.State,
    lora: LoRAConfig,
    mesh: Mesh,
    rules: ShardingRules,
    seed: int,
):
    """A base params state plus freshly initialised LoRA adapters (B = 0: the model is still
    the base); returns (graphdef, params). The base arrays are kept, not copied; the adapters
    are placed by their logical axes, and are those ``Decoder(cfg, lora=lora,
    rngs=nnx.Rngs(seed))`` draws."""
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed), lora=lora))
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(lora_lib.split_adapters(abstract_state)[0], mesh, rules)

    def create():  # XLA prunes the base weights' initialisers: only the adapters are outputs
        state = nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed), lora=lora))[1]
        return lora_lib.split_adapters(state)[0]

    adapters = jax.jit(create, out_shardings=shardings)()
    return graphdef, lora_lib.join(params, adapters)
