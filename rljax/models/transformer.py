"""A decoder-only transformer in Flax NNX: Llama, Qwen2, Qwen3 and SmolLM2 share it.

Pieces: RMSNorm, rotary embeddings (with Llama-3 frequency scaling), grouped-query attention
with optional q/k/v bias (Qwen2) and per-head q/k RMSNorm (Qwen3), a SwiGLU MLP, and optional
tied input/output embeddings (SmolLM2).

Per-layer weights are stacked along a leading ``layers`` axis and the blocks run under
``jax.lax.scan``: one block is compiled however deep the model is, and a checkpoint's layer
tensors map onto one array per kind. The computation lives in :class:`CallPaths`, over a
:class:`~rljax.models.layouts.Layout` that says how the weights multiply and the layers run, so
a CPU sampler can run it over the same weights in another layout (:mod:`rljax.models.serving`).

Two call paths share the weights:
- :meth:`Decoder.__call__` runs packed training sequences (segment ids + positions) and can
  return each layer's keys and values, which is how the engine prefills;
- :meth:`Decoder.decode` runs one new token per slot against a paged KV cache.

Both take ``sharding=(mesh, rules)``. A ``pallas_call`` has no GSPMD partitioning rule, so on a
multi-device mesh the Pallas attention kernels run per shard under ``shard_map``, split over the
mesh axes the role's rules give 'batch' and 'heads' (see ``models.sharding.kernel_mesh_axes``).
The XLA path needs no such help: GSPMD partitions it.

Einsum legend: B batch, T query positions, S key positions, D model width, N query heads,
K key/value heads, G query heads per kv head (N = K * G), H head width, F MLP width, V vocab,
L layers, P pages in the pool, Z page size.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from rljax.config import LoRAConfig, ModelConfig
from rljax.kernels.flash_attention import flash_attention, sharded_flash_attention
from rljax.kernels.sharding import axis_size
from rljax.models import lora as lora_lib
from rljax.models import moe as moe_lib
from rljax.models.layers import apply_rope, rms_norm, rope_frequencies
from rljax.models.layouts import STACKED, Layout
from rljax.models.paged_kv import PagedKV
from rljax.models.sharding import ShardingRules, kernel_mesh_axes, state_shardings

# A role's mesh and its logical-axis rules; what the call paths need to shard_map the kernels.
Sharding = tuple[Mesh, ShardingRules]

# Each parameter's logical axes; models/sharding.py maps them to mesh axes per role.
PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("embed",),
    "attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
    "bq": ("layers", "heads", "head_dim"),
    "bk": ("layers", "kv_heads", "head_dim"),
    "bv": ("layers", "kv_heads", "head_dim"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
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
}

LAYER_PARAMS = tuple(k for k, axes in PARAM_AXES.items() if axes[0] == "layers")
# Every LoRA adapter a Decoder may hold (rljax.models.lora), all stacked by layer.
ADAPTER_PARAMS = tuple(
    key(w) for w in lora_lib.WEIGHT_SPECS for key in (lora_lib.a_key, lora_lib.b_key)
)

# learner.remat -> the jax.checkpoint policy of the scanned training block ('none': no remat).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class CallPaths:
    """The decoder's computation, over weights its subclass holds in its ``layout``.

    A subclass gives ``cfg``, ``layout`` (a :class:`rljax.models.layouts.Layout`: how its
    weights multiply and its layers run, fixed by the class), ``_layers()`` (the per-layer
    weights, in the form its layout runs), ``_embed(tokens)``, ``_final_norm()`` and
    ``logits(hidden)``. :class:`Decoder` holds the stacked layout the learner trains;
    :class:`rljax.models.serving.ServingDecoder` holds the per-layer layout a CPU sampler
    decodes from fastest.
    """

    cfg: ModelConfig
    layout: ClassVar[Layout]
    # alpha / rank of the LoRA adapters the weights carry (rljax.models.lora); unused without.
    lora_scale: float = 0.0
    # Dropout on the adapters' input, applied when a call passes a dropout key (training).
    lora_dropout: float = 0.0

    def _layers(self) -> Any:
        raise NotImplementedError  # a subclass's weights

    def _embed(self, tokens: jax.Array) -> jax.Array:
        raise NotImplementedError

    def _final_norm(self) -> jax.Array:
        raise NotImplementedError

    def logits(self, hidden: jax.Array) -> jax.Array:
        raise NotImplementedError  # a subclass's head over its weights

    def _project(self, x, p, name: str, spec: str) -> jax.Array:
        """``x`` times weight ``name``, plus its LoRA adapters' product when ``p`` holds them."""
        y = self.layout.project(x, p, name, spec)
        if lora_lib.a_key(name) not in p:
            return y
        a, b = p[lora_lib.a_key(name)], p[lora_lib.b_key(name)]
        key = p.get(lora_lib.DROPOUT_KEY)
        if key is not None and self.lora_dropout > 0:
            x = lora_lib.dropout(
                x, jax.random.fold_in(key, lora_lib.weight_index(name)), self.lora_dropout
            )
        return y + lora_lib.delta(x, a, b, name, self.lora_scale)

    def _mlp(self, h_btd, p) -> jax.Array:
        mlp = ("w_gate", "w_up", "w_down")
        adapted = [lora_lib.a_key(w) in p for w in mlp]
        if not any(adapted):
            return self.layout.mlp(h_btd, p)
        dropout = lora_lib.DROPOUT_KEY in p and self.lora_dropout > 0
        if all(adapted) and self.layout is STACKED and not dropout:
            # The training layout: a hand-written backward without the frozen weights' GEMMs.
            dt = h_btd.dtype
            w = [p[name].astype(dt) for name in mlp]
            ab = [
                p[key(name)].astype(dt) for name in mlp for key in (lora_lib.a_key, lora_lib.b_key)
            ]
            return lora_lib.swiglu_adapted(self.lora_scale, h_btd, *w, tuple(ab))
        # Otherwise plain autodiff, which also computes no gradient for the frozen weights.
        gate = self._project(h_btd, p, "w_gate", "BTD,DF->BTF")
        up = self._project(h_btd, p, "w_up", "BTD,DF->BTF")
        return self._project(jax.nn.silu(gate) * up, p, "w_down", "BTF,FD->BTD")

    def _qkv(self, p, x_btd, positions_bt):
        cfg = self.cfg
        h_btd = rms_norm(x_btd, p["attn_norm"], cfg.norm_eps)
        project = self._project
        q = project(h_btd, p, "wq", "BTD,DNH->BTNH")
        k = project(h_btd, p, "wk", "BTD,DKH->BTKH")
        v = project(h_btd, p, "wv", "BTD,DKH->BTKH")
        if cfg.qkv_bias:
            dt = h_btd.dtype  # f32 biases must not promote bf16 activations
            q, k, v = q + p["bq"].astype(dt), k + p["bk"].astype(dt), v + p["bv"].astype(dt)
        if cfg.qk_norm:
            q = rms_norm(q, p["q_norm"], cfg.norm_eps)
            k = rms_norm(k, p["k_norm"], cfg.norm_eps)
        inv_freq = rope_frequencies(cfg)
        return apply_rope(q, positions_bt, inv_freq), apply_rope(k, positions_bt, inv_freq), v

    def _finish_block(self, p, x_btd, attn_btnh, moe: moe_lib.MoECall | None = None):
        """The attention output's projection and the MLP: dense, or with ``moe`` (a mixture-of-
        experts layer's call) the experts; returns (x, that layer's stats or None)."""
        cfg = self.cfg
        x_btd = x_btd + self._project(attn_btnh, p, "wo", "BTNH,NHD->BTD")
        h_btd = rms_norm(x_btd, p["mlp_norm"], cfg.norm_eps)
        if moe is None:
            return x_btd + self._mlp(h_btd, p), None
        out, stats = moe_lib.moe_mlp(h_btd, p, cfg, self._project, moe)
        return x_btd + out, stats

    def _run(self, block, carry, layers, *, unroll: int = 1, call: moe_lib.MoECall | None = None):
        """``block(carry, (p, i), moe)`` over the layers: :func:`rljax.models.moe.run_layers`."""
        return moe_lib.run_layers(self.layout, self.cfg, block, carry, layers, unroll, call)

    # -- call paths -------------------------------------------------------------------------

    def __call__(
        self,
        tokens_bt: jax.Array,
        positions_bt: jax.Array,
        segment_ids_bt: jax.Array,
        *,
        return_kv: bool = False,
        impl: str = "auto",
        sharding: Sharding | None = None,
        remat: str = "none",
        unroll: int = 1,
        adapters: bool = True,
        dropout_key: jax.Array | None = None,
        routes: tuple[jax.Array, jax.Array] | None = None,
        moe_stats: bool = False,
    ):
        """Final hidden states [B, T, D] of packed rows; optionally each layer's K and V.

        ``segment_ids_bt`` separates packed sequences (0 marks padding). With ``return_kv``
        the result is ``(hidden, (k_lbtkh, v_lbtkh))``, keys already rotated. Attention is
        causal within each segment, through :func:`rljax.kernels.flash_attention` (``impl``
        picks Pallas or XLA); with ``sharding=(mesh, rules)`` the Pallas kernel runs under
        ``shard_map``, rows over the 'batch' axes and heads over the 'heads' axes.

        ``remat`` (a key of :data:`REMAT_POLICIES`, or 'none') wraps each scanned block in
        ``jax.checkpoint``: the backward pass then keeps only what the policy saves (with
        'full', each layer's input) and recomputes the rest, trading FLOPs for activation
        memory. The values and gradients are unchanged.

        ``unroll`` layers run per iteration of the layer scan (0: all, straight-line code); on
        the CPU it speeds up the backward at a compile time growing with the unrolled depth.

        ``adapters=False`` runs the base model of a LoRA-adapted one (its adapters left out):
        the reference policy of a KL penalty, with no second copy of the weights.
        ``dropout_key`` (training) draws the LoRA dropout masks (``lora.dropout``), one stream
        per layer and adapted weight; without it there is no dropout.

        Mixture of experts (``rljax.models.moe``): ``routes=(ids [B, T, Lm, k], forced [B, T])``
        forces those experts where ``forced`` is set (routing replay); ``moe_stats`` appends
        the forward's :class:`~rljax.models.moe.MoEStats` (None for a dense model).
        """
        if not isinstance(unroll, int) or isinstance(unroll, bool) or unroll < 0:
            raise ValueError(f"unroll={unroll!r}; expected an integer >= 0 (0: all layers)")
        if remat != "none" and remat not in REMAT_POLICIES:
            raise ValueError(f"remat={remat!r}; expected 'none' or one of {list(REMAT_POLICIES)}")
        split = kernel_mesh_axes(
            sharding, impl, (("batch", tokens_bt.shape[0]), ("heads", self.cfg.num_kv_heads))
        )

        def attend(q, k, v):
            if split is None:
                return flash_attention(q, k, v, segment_ids_bt, causal=True, impl=impl)
            mesh, (batch_axes, head_axis) = split
            return sharded_flash_attention(
                mesh, batch_axes, head_axis, q, k, v, segment_ids_bt, causal=True, impl=impl
            )

        def block(x_btd, layer, moe):
            p, _ = layer
            q, k, v = self._qkv(p, x_btd, positions_bt)
            x_btd, stats = self._finish_block(p, x_btd, attend(q, k, v), moe)
            return x_btd, ((k, v) if return_kv else None, stats)

        depth = self.cfg.num_layers
        unroll = depth if unroll == 0 else min(unroll, depth)
        if remat != "none":
            # Inside a rolled scan XLA cannot CSE the recomputation away, so prevent_cse costs
            # nothing there; unrolled blocks are straight-line code, where it keeps the remat.
            block = _rematerialised(block, REMAT_POLICIES[remat], prevent_cse=unroll > 1)
        layers = self._layers() if adapters else _without_adapters(self._layers())
        if adapters and dropout_key is not None and self.lora_dropout > 0:
            layers = {**layers, lora_lib.DROPOUT_KEY: jax.random.split(dropout_key, depth)}
        layers, call = moe_lib.prepare(self.cfg, layers, routes, segment_ids_bt > 0, impl, sharding)
        x_btd, kv, stats = self._run(
            block, self._embed(tokens_bt), layers, unroll=unroll, call=call
        )
        hidden = rms_norm(x_btd, self._final_norm(), self.cfg.norm_eps)
        out = (hidden, kv) if return_kv else (hidden,)
        out = (*out, stats) if moe_stats else out
        return out[0] if len(out) == 1 else out

    def decode(
        self,
        tokens_b: jax.Array,
        positions_b: jax.Array,
        k_pages: jax.Array,
        v_pages: jax.Array,
        page_table_bm: jax.Array,
        *,
        impl: str = "auto",
        sharding: Sharding | None = None,
        kv_shards: int = 1,
        record_routes: bool = False,
    ):
        """One token per slot against the paged cache; returns (hidden [B, D], k_pages, v_pages),
        and with ``record_routes`` (a mixture-of-experts model) the experts each slot's token
        went to, [B, Lm, k] int32.

        The cache is [L, K, P, Z, H]. Each slot's new key/value is written at ``positions_b``
        through its page table before attending, so the slot sees ``positions_b + 1`` tokens.
        Free slots point their page table at page 0, which absorbs their writes.

        ``kv_shards`` splits the slots and the pool's pages into that many equal, contiguous
        shards: slot b belongs to shard ``b // (B / kv_shards)``, owns pages of that shard only,
        and its page table holds page indices local to the shard (each shard's page 0 is its
        null page). The engine picks the size of the sampler's 'batch' mesh axes, so each data
        shard keeps its own slots and pages and the pool is sharded over P instead of
        replicated. The write and the XLA attention run per shard under ``vmap`` (GSPMD keeps
        each shard on its devices); the Pallas kernel runs under ``shard_map``, slots and pages
        over the 'batch' axes, heads and the pool's K over the 'heads' axes.
        """
        b = tokens_b.shape[0]
        if kv_shards < 1 or b % kv_shards or k_pages.shape[2] % kv_shards:
            raise ValueError(
                f"kv_shards={kv_shards} must divide the {b} slots and the {k_pages.shape[2]} pages"
            )
        split = kernel_mesh_axes(sharding, impl, (("batch", b), ("heads", self.cfg.num_kv_heads)))
        if split is not None and kv_shards > 1:
            mesh, (batch_axes, _) = split
            if axis_size(mesh, batch_axes) != kv_shards:
                raise ValueError(
                    f"kv_shards={kv_shards} differs from the {axis_size(mesh, batch_axes)} "
                    f"shards of the 'batch' mesh axes {batch_axes!r}; they must match"
                )

        cache = PagedKV(page_table_bm, positions_b, k_pages.shape[3], kv_shards, split, impl)

        def block(carry, layer, moe):
            x_btd, kp, vp = carry
            p, i = layer
            q, k, v = self._qkv(p, x_btd, positions_b[:, None])
            kp, vp = cache.write(kp, i, k[:, 0]), cache.write(vp, i, v[:, 0])
            attn = cache.attend(q[:, 0], kp[i], vp[i])
            x_btd, stats = self._finish_block(p, x_btd, attn[:, None], moe)
            return (x_btd, kp, vp), (None, stats)

        carry = (self._embed(tokens_b[:, None]), k_pages, v_pages)
        call = moe_lib.MoECall(None, None, impl, sharding) if self.cfg.num_experts else None
        (x_b1d, k_pages, v_pages), _, stats = self._run(block, carry, self._layers(), call=call)
        hidden = rms_norm(x_b1d[:, 0], self._final_norm(), self.cfg.norm_eps)
        if record_routes:
            if stats is None:
                raise ValueError("record_routes=True needs a mixture-of-experts model")
            return hidden, k_pages, v_pages, stats.routes[:, 0]
        return hidden, k_pages, v_pages


def _rematerialised(block, policy, *, prevent_cse: bool):
    """``block(x, layer, moe)`` under ``jax.checkpoint``; ``moe`` (a MoECall: an impl name and
    a mesh beside arrays) is bound outside it, as a checkpoint's arguments must be arrays."""

    def run(x_btd, layer, moe):
        inner = lambda x, lay: block(x, lay, moe)  # noqa: E731
        return jax.checkpoint(inner, policy=policy, prevent_cse=prevent_cse)(x_btd, layer)

    return run


def _without_adapters(layers):
    """Layer weights (a dict, or a tuple of per-layer dicts) with the LoRA adapters left out."""
    strip = lambda p: {k: v for k, v in p.items() if not lora_lib.is_adapter(k)}  # noqa: E731
    return strip(layers) if isinstance(layers, dict) else tuple(strip(p) for p in layers)


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

        ones = lambda key, shape, dt: jnp.ones(shape, dt)
        zeros = lambda key, shape, dt: jnp.zeros(shape, dt)
        embed_std = 1.0 / math.sqrt(d) if cfg.tie_embeddings else 1.0
        self.embed = param(
            "embed", (cfg.vocab_size, d), lambda k_, s, dt: embed_std * jax.random.normal(k_, s, dt)
        )
        if not cfg.tie_embeddings:
            self.lm_head = param("lm_head", (d, cfg.vocab_size), fan_in([0]))
        self.final_norm = param("final_norm", (d,), ones)
        self.attn_norm = param("attn_norm", (l_, d), ones)
        self.mlp_norm = param("mlp_norm", (l_, d), ones)
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
        dense = len(moe_lib.dense_layers(cfg))
        if dense:
            self.w_gate = param("w_gate", (dense, d, f), fan_in([1]))
            self.w_up = param("w_up", (dense, d, f), fan_in([1]))
            self.w_down = param("w_down", (dense, f, d), fan_in([1]))
        for name, (shape, fan_dims) in moe_lib.expert_shapes(cfg).items():
            setattr(self, name, param(name, shape, fan_in(fan_dims)))
        if lora is not None and lora.enabled:
            self.lora_scale = lora.scale
            self.lora_dropout = lora.dropout
            for name, shape in lora_lib.adapter_shapes(cfg, lora).items():
                value = lora_lib.init_adapter(name, rngs.params(), shape, dtype)
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
        """Vocabulary logits in float32 for hidden states [..., D]."""
        return jnp.einsum(
            "...D,DV->...V", hidden.astype(jnp.float32), self.unembed_dv.astype(jnp.float32)
        )


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
