"""The decoder's computation, over weights held in either layout: :class:`CallPaths`.

:class:`rljax.models.transformer.Decoder` holds the weights in the stacked layout the learner
trains; :class:`rljax.models.serving.ServingDecoder` holds them per layer for a CPU sampler.
Both run this computation (see the model's description in :mod:`rljax.models.transformer`).

Two call paths share the weights:
- :meth:`CallPaths.__call__` runs packed training sequences (segment ids + positions) and can
  return each layer's keys and values, which is how the engine prefills;
- :meth:`CallPaths.decode` runs one new token per slot against a paged KV cache.

Both take ``sharding=(mesh, rules)``. A ``pallas_call`` has no GSPMD partitioning rule, so on a
multi-device mesh the Pallas attention kernels run per shard under ``shard_map``, split over the
mesh axes the role's rules give 'batch' and 'heads' (see ``models.sharding.kernel_mesh_axes``).
The XLA path needs no such help: GSPMD partitions it.

The layers run as runs of one kind (:mod:`rljax.models.layer_runs`): a local layer's attention
is compiled with its window, so it skips the keys outside it.

Einsum legend: B batch, T query positions, S key positions, D model width, N query heads,
K key/value heads, G query heads per kv head (N = K * G), H head width, F MLP width, V vocab,
L layers, P pages in the pool, Z page size.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rljax.config import ModelConfig
from rljax.kernels.flash_attention import flash_attention, sharded_flash_attention
from rljax.kernels.sharding import axis_size
from rljax.models import layer_runs
from rljax.models import lora as lora_lib
from rljax.models import moe as moe_lib
from rljax.models.layers import apply_rope, rms_norm, rope_frequencies
from rljax.models.layouts import STACKED, Layout, gate_activation
from rljax.models.paged_kv import PagedKV, pool_rows
from rljax.models.sharding import ShardingRules, kernel_mesh_axes

# A role's mesh and its logical-axis rules; what the call paths need to shard_map the kernels.
Sharding = tuple[Mesh, ShardingRules]

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

    def _norm(self, x, w) -> jax.Array:
        return rms_norm(x, w, self.cfg.norm_eps, unit_offset=self.cfg.norm_unit_offset)

    def _mlp(self, h_btd, p) -> jax.Array:
        mlp = ("w_gate", "w_up", "w_down")
        adapted = [lora_lib.a_key(w) in p for w in mlp]
        act = self.cfg.hidden_act
        if not any(adapted):
            return self.layout.mlp(h_btd, p, act)
        dropout = lora_lib.DROPOUT_KEY in p and self.lora_dropout > 0
        # LoRA's hand-written backward is SwiGLU's; GeGLU's adapters take autodiff below.
        if all(adapted) and self.layout is STACKED and not dropout and act == "silu":
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
        return self._project(gate_activation(act, gate) * up, p, "w_down", "BTF,FD->BTD")

    def _qkv(self, p, x_btd, positions_bt, window: int | None):
        """Rotated q, k and v of one layer; a local layer (``window``) rotates at its base."""
        cfg = self.cfg
        h_btd = self._norm(x_btd, p["attn_norm"])
        project = self._project
        q = project(h_btd, p, "wq", "BTD,DNH->BTNH")
        k = project(h_btd, p, "wk", "BTD,DKH->BTKH")
        v = project(h_btd, p, "wv", "BTD,DKH->BTKH")
        if cfg.qkv_bias:
            dt = h_btd.dtype  # f32 biases must not promote bf16 activations
            q, k, v = q + p["bq"].astype(dt), k + p["bk"].astype(dt), v + p["bv"].astype(dt)
        if cfg.qk_norm:
            q, k = self._norm(q, p["q_norm"]), self._norm(k, p["k_norm"])
        if cfg.v_norm:  # before the values are attended, and cached by the engine
            v = rms_norm(v, None, cfg.norm_eps)
        inv_freq = rope_frequencies(cfg, local=window is not None)
        return apply_rope(q, positions_bt, inv_freq), apply_rope(k, positions_bt, inv_freq), v

    def _finish_block(self, p, x_btd, attn_btnh, moe: moe_lib.MoECall | None = None):
        """The attention output's projection and the MLP: dense, or with ``moe`` (a mixture-of-
        experts layer's call) the experts; returns (x, that layer's stats or None)."""
        cfg = self.cfg
        attn_btd = self._project(attn_btnh, p, "wo", "BTNH,NHD->BTD")
        if cfg.post_norms:
            attn_btd = self._norm(attn_btd, p["attn_post_norm"])
        x_btd = x_btd + attn_btd
        h_btd = self._norm(x_btd, p["mlp_norm"])
        stats = None
        if moe is None:
            out = self._mlp(h_btd, p)
        elif cfg.enable_moe_block:  # Gemma 4: the experts beside the dense MLP
            out, stats = moe_lib.moe_block(x_btd, self._mlp(h_btd, p), p, cfg, moe, self._norm)
        else:
            out, stats = moe_lib.moe_mlp(h_btd, p, cfg, self._project, moe)
        if cfg.post_norms:
            out = self._norm(out, p["mlp_post_norm"])
        x_btd = x_btd + out
        if cfg.layer_scalar:  # the layer's whole output, residual included (Gemma 4)
            x_btd = x_btd * p["layer_scalar"].astype(x_btd.dtype)
        return x_btd, stats

    def _run(self, block, carry, layers, *, unroll: int = 1, call: moe_lib.MoECall | None = None):
        """``block(carry, (p, i), moe, window)`` over the layers: the model's runs of one kind
        (:func:`rljax.models.layer_runs.run_layers`)."""
        return layer_runs.run_layers(self.layout, self.cfg, block, carry, layers, unroll, call)

    def _embedded(self, tokens) -> jax.Array:
        """The tokens' embeddings, times sqrt(D) rounded to the compute dtype under
        ``scale_embeddings`` (Gemma)."""
        x = self._embed(tokens)
        if not self.cfg.scale_embeddings:
            return x
        return x * jnp.asarray(math.sqrt(self.cfg.hidden_size), x.dtype)

    def _attention_options(self, window: int | None) -> dict[str, Any]:
        """The attention kernels' window, soft-cap and scale for a layer with ``window``."""
        scalar = self.cfg.query_pre_attn_scalar
        options = dict(
            window=window,
            softcap=self.cfg.attn_logit_softcapping,
            sm_scale=None if scalar is None else float(scalar) ** -0.5,
        )
        return {k: v for k, v in options.items() if v is not None}  # None: the kernel's default

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
        _check_unroll_and_remat(unroll, remat)
        split = kernel_mesh_axes(
            sharding, impl, (("batch", tokens_bt.shape[0]), ("heads", self.cfg.num_kv_heads))
        )

        def attend(q, k, v, window):
            kw = dict(causal=True, impl=impl, **self._attention_options(window))
            if split is None:
                return flash_attention(q, k, v, segment_ids_bt, **kw)
            mesh, (batch_axes, head_axis) = split
            return sharded_flash_attention(
                mesh, batch_axes, head_axis, q, k, v, segment_ids_bt, **kw
            )

        def block(x_btd, layer, moe, window):
            p, _ = layer
            q, k, v = self._qkv(p, x_btd, positions_bt, window)
            x_btd, stats = self._finish_block(p, x_btd, attend(q, k, v, window), moe)
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
            block, self._embedded(tokens_bt), layers, unroll=unroll, call=call
        )
        hidden = self._norm(x_btd, self._final_norm())
        out = (hidden, kv) if return_kv else (hidden,)
        out = (*out, stats) if moe_stats else out
        return out[0] if len(out) == 1 else out

    def decode(
        self,
        tokens_b: jax.Array,
        positions_b: jax.Array,
        k_pages: jax.Array | tuple[jax.Array, ...],
        v_pages: jax.Array | tuple[jax.Array, ...],
        page_table_bm: jax.Array | tuple[jax.Array, ...],
        *,
        impl: str = "auto",
        sharding: Sharding | None = None,
        kv_shards: int = 1,
        record_routes: bool = False,
    ):
        """One token per slot against the paged cache; returns (hidden [B, D], k_pages, v_pages),
        and with ``record_routes`` (a mixture-of-experts model) the experts each slot's token
        went to, [B, Lm, k] int32.

        The cache is one pool [L, K, P, Z, H] with its page table [B, M], or a tuple of pools
        and a tuple of tables (global, local): the global layers' pool [Lg, K, P, Z, H] and the
        local (sliding-window) layers' [Ll, K, Pl, Z, H], each with its own table (the engine's
        pools, rljax.engine.pools); the pages come back in the form given. With two pools a
        layer's keys and values are row j of its kind's pool, j its index among the layers of
        its kind (:func:`rljax.models.paged_kv.pool_rows`). A local layer reads only the pages
        of its window, so its table's entries before them may point at the null page.

        Each slot's new key/value is written at ``positions_b`` through its page table before
        attending, so the slot sees ``positions_b + 1`` tokens. Free slots point their page
        table at page 0, which absorbs their writes.

        ``kv_shards`` splits the slots and the pool's pages into that many equal, contiguous
        shards: slot b belongs to shard ``b // (B / kv_shards)``, owns pages of that shard only,
        and its page table holds page indices local to the shard (each shard's page 0 is its
        null page). The engine picks the size of the sampler's 'batch' mesh axes, so each data
        shard keeps its own slots and pages and the pool is sharded over P instead of
        replicated. The write and the XLA attention run per shard under ``vmap`` (GSPMD keeps
        each shard on its devices); the Pallas kernel runs under ``shard_map``, slots and pages
        over the 'batch' axes, heads and the pool's K over the 'heads' axes.
        """
        pooled = isinstance(k_pages, tuple)
        k_pools, v_pools, tables = (
            tuple(x) if isinstance(x, tuple) else (x,) for x in (k_pages, v_pages, page_table_bm)
        )
        b = tokens_b.shape[0]
        split = kernel_mesh_axes(sharding, impl, (("batch", b), ("heads", self.cfg.num_kv_heads)))
        _check_kv_shards(kv_shards, b, k_pools, split)
        z = k_pools[0].shape[3]
        caches = tuple(PagedKV(t, positions_b, z, kv_shards, split, impl) for t in tables)
        rows = pool_rows(self.cfg, len(k_pools))

        def block(carry, layer, moe, window):
            x_btd, kps, vps = carry
            p, i = layer
            pool = int(window is not None and len(kps) > 1)  # the layer's kind, static
            cache, j = caches[pool], rows(i)
            q, k, v = self._qkv(p, x_btd, positions_b[:, None], window)
            kp, vp = cache.write(kps[pool], j, k[:, 0]), cache.write(vps[pool], j, v[:, 0])
            attn = cache.attend(q[:, 0], kp, vp, j, **self._attention_options(window))
            x_btd, stats = self._finish_block(p, x_btd, attn[:, None], moe)
            kps, vps = _replaced(kps, pool, kp), _replaced(vps, pool, vp)
            return (x_btd, kps, vps), (None, stats)

        carry = (self._embedded(tokens_b[:, None]), k_pools, v_pools)
        call = moe_lib.MoECall(None, None, impl, sharding) if self.cfg.num_experts else None
        (x_b1d, k_pools, v_pools), _, stats = self._run(block, carry, self._layers(), call=call)
        hidden = self._norm(x_b1d[:, 0], self._final_norm())
        k_out, v_out = (k_pools, v_pools) if pooled else (k_pools[0], v_pools[0])
        if record_routes:
            if stats is None:
                raise ValueError("record_routes=True needs a mixture-of-experts model")
            return hidden, k_out, v_out, stats.routes[:, 0]
        return hidden, k_out, v_out


def _check_kv_shards(kv_shards: int, b: int, pools: tuple[jax.Array, ...], split) -> None:
    """Refuse ``kv_shards`` that do not divide the ``b`` slots and every pool's pages, or that
    differ from the kernel's 'batch' mesh axes (``split``)."""
    for kp in pools:
        if kv_shards < 1 or b % kv_shards or kp.shape[2] % kv_shards:
            raise ValueError(
                f"kv_shards={kv_shards} must divide the {b} slots and the {kp.shape[2]} pages"
            )
    if split is not None and kv_shards > 1:
        mesh, (batch_axes, _) = split
        if axis_size(mesh, batch_axes) != kv_shards:
            raise ValueError(
                f"kv_shards={kv_shards} differs from the {axis_size(mesh, batch_axes)} "
                f"shards of the 'batch' mesh axes {batch_axes!r}; they must match"
            )


def _replaced(items: tuple, i: int, value: Any) -> tuple:
    """``items`` with entry ``i`` replaced by ``value``."""
    return (*items[:i], value, *items[i + 1 :])


def _check_unroll_and_remat(unroll: int, remat: str) -> None:
    if not isinstance(unroll, int) or isinstance(unroll, bool) or unroll < 0:
        raise ValueError(f"unroll={unroll!r}; expected an integer >= 0 (0: all layers)")
    if remat != "none" and remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r}; expected 'none' or one of {list(REMAT_POLICIES)}")


def _rematerialised(block, policy, *, prevent_cse: bool):
    """``block(x, layer, moe, window)`` under ``jax.checkpoint``; ``moe`` (a MoECall: an impl
    name and a mesh beside arrays) and ``window`` (a static int or None) are bound outside it,
    as a checkpoint's arguments must be arrays."""

    def run(x_btd, layer, moe, window):
        inner = lambda x, lay: block(x, lay, moe, window)  # noqa: E731
        return jax.checkpoint(inner, policy=policy, prevent_cse=prevent_cse)(x_btd, layer)

    return run


def _without_adapters(layers):
    """Layer weights (a dict, or a tuple of per-layer dicts) with the LoRA adapters left out."""
    strip = lambda p: {k: v for k, v in p.items() if not lora_lib.is_adapter(k)}  # noqa: E731
    return strip(layers) if isinstance(layers, dict) else tuple(strip(p) for p in layers)
