"""Mixture-of-experts layers: the router, the dropless experts, and the statistics RL needs.

A mixture-of-experts layer replaces a block's dense MLP. Its router scores the E experts for
each token (``softmax(x @ router)``), the token goes to the k best (``top_k``), and its output is
the experts' SwiGLU outputs weighed by their probabilities (renormalised over the k when
``norm_topk_prob``). Qwen2-MoE adds a shared expert every token passes through, scaled by
``sigmoid(x @ ws_router)``.

**Gemma 4's block** (``enable_moe_block``, :func:`moe_block`) keeps every layer's dense MLP and
adds the experts beside it: the router reads the block's input through an unscaled RMSNorm times
a learned scale (``router_scale``) and 1/sqrt(D); the chosen experts' renormalised weights are
multiplied by their own learned scales (``expert_scale``); the experts (GeGLU) read the input
through their own norm (``moe_norm``), and the dense MLP's and the experts' outputs each pass a
norm (``dense_post_norm``, ``moe_post_norm``) before they are added.

**Dropless.** The (token, expert) pairs are sorted by expert and each expert's rows multiply its
own weights (:func:`rljax.kernels.grouped_matmul.grouped_matmul`: a Pallas kernel on TPU,
``jax.lax.ragged_dot`` on GPU, group-aligned row tiles on the CPU, whose ragged_dot is a masked
dense product); no capacity factor, no token dropped. With few pairs (a decode
step) each pair's expert weights are gathered instead (:data:`GATHER_MAX_PAIRS`).

**Forced routes** (rollout routing replay, docs/moe.md): where ``forced`` is set the given expert
ids are used instead of the router's top-k. Their weights still come from this router's
probabilities at those ids, so the router keeps its gradient.

**Expert parallelism.** With a mesh whose rules map the logical 'experts' axis to a mesh axis of
size > 1, each shard of that axis holds E / ep whole experts; the experts run under
``shard_map``: every shard sees its data shard's tokens, computes the pairs routed to its own
experts, and the outputs are summed over the expert (and tensor) axes.

Einsum legend: B batch, T positions, D width, E experts, k experts a token, F expert width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rljax.config import ModelConfig
from rljax.kernels.grouped_matmul import grouped_matmul
from rljax.kernels.grouped_matmul import ops as grouped_matmul_ops
from rljax.kernels.grouped_matmul import xla as grouped_xla
from rljax.kernels.sharding import axis_names, axis_size, run_sharded
from rljax.models.layers import rms_norm
from rljax.models.layouts import gate_activation

# Weights of a mixture-of-experts layer, stacked over the MoE layers (their logical axes are in
# rljax.models.transformer.PARAM_AXES).
EXPERT_PARAMS = ("router", "we_gate", "we_up", "we_down")
SHARED_PARAMS = ("ws_gate", "ws_up", "ws_down", "ws_router")
DENSE_PARAMS = ("w_gate", "w_up", "w_down")
# Gemma 4's block: the router's input scale [D] and the experts' output scales [E], each
# initialised to 1, and the three norms it adds (the dense MLP's output norm, the experts' input
# and output norms); stacked over the mixture-of-experts layers (every layer).
BLOCK_PARAMS = ("router_scale", "expert_scale", "dense_post_norm", "moe_norm", "moe_post_norm")
# A step with at most this many (token, expert) pairs gathers each pair's expert weights
# instead of sorting (scripts/bench_moe.py measures the crossover: on the AMD EPYC CPU gathering
# was 1.5x faster at 16 pairs, 5x slower at 32, docs/benchmarks.md).
GATHER_MAX_PAIRS = 16
# The key under which a layer's forced expert ids ride with its weights through the layer scan.
FORCED_KEY = "_forced_ids"


def moe_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The layers with routed experts (Hugging Face's Qwen-MoE rule; Gemma 4's block: all)."""
    if not cfg.num_experts:
        return ()
    if cfg.enable_moe_block:
        return tuple(range(cfg.num_layers))
    step, dense = cfg.decoder_sparse_step, set(cfg.mlp_only_layers)
    return tuple(i for i in range(cfg.num_layers) if i not in dense and (i + 1) % step == 0)


def dense_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The layers with a dense MLP: those without experts, or all with Gemma 4's block."""
    if cfg.enable_moe_block:
        return tuple(range(cfg.num_layers))
    moe = set(moe_layers(cfg))
    return tuple(i for i in range(cfg.num_layers) if i not in moe)


def expert_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each mixture-of-experts weight's (shape, the dimensions its initial scale divides by)."""
    lm, d, e = len(moe_layers(cfg)), cfg.hidden_size, cfg.num_experts
    if not lm:
        return {}
    fe, fs = cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
        "router": ((lm, d, e), (1,)),
        "we_gate": ((lm, e, d, fe), (2,)),
        "we_up": ((lm, e, d, fe), (2,)),
        "we_down": ((lm, e, fe, d), (2,)),
    }
    if fs:
        shapes |= {
            "ws_gate": ((lm, d, fs), (1,)),
            "ws_up": ((lm, d, fs), (1,)),
            "ws_down": ((lm, fs, d), (1,)),
            "ws_router": ((lm, d), (1,)),
        }
    return shapes


def block_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of Gemma 4's block's scales and norms (:data:`BLOCK_PARAMS`), each
    initialised to ones; empty without the block."""
    if not cfg.enable_moe_block:
        return {}
    lm, d = len(moe_layers(cfg)), cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {name: (lm, d) for name in BLOCK_PARAMS}
    return shapes | {"expert_scale": (lm, cfg.num_experts)}


def weight_kind(key: str) -> bool | None:
    """True for a mixture-of-experts layer's weight (or its adapter), False for a dense MLP's,
    None for what every layer has (attention, norms, dropout keys)."""
    base = key.split("_lora_")[0]
    if base in (*EXPERT_PARAMS, *SHARED_PARAMS, *BLOCK_PARAMS) or key == FORCED_KEY:
        return True
    if base in DENSE_PARAMS:
        return False
    return None


class MoECall(NamedTuple):
    """How one forward calls its mixture-of-experts layers.

    forced: [B, T] bool, where the forced ids (the layer's ``FORCED_KEY`` weight) are used; None.
    valid: [B, T] bool, the tokens the statistics count (not padding); None: all.
    impl: the grouped matmul's implementation.
    sharding: (mesh, rules), to split the experts over the expert axis; None.
    """

    forced: jax.Array | None
    valid: jax.Array | None
    impl: str
    sharding: Any


def prepare(cfg: ModelConfig, layers: dict, routes, valid_bt, impl: str, sharding) -> tuple:
    """(layers, MoECall or None) for a forward over packed rows: forced ids ride with the
    layer weights ([Lm, B, T, k] under :data:`FORCED_KEY`)."""
    if not cfg.num_experts:
        return layers, None
    forced = None
    if routes is not None:
        layers = {**layers, FORCED_KEY: jnp.moveaxis(routes[0], 2, 0)}
        forced = routes[1]
    return layers, MoECall(forced, valid_bt, impl, sharding)


class MoEStats(NamedTuple):
    """What a forward reports of its routing, for the loss, the metrics and replay.

    routes: [B, T, Lm, k] int32, the experts each token used in each MoE layer.
    aux_loss: the load-balancing loss over all MoE layers (Hugging Face's form).
    z_loss: the mean squared log-sum-exp of the router logits, mean over MoE layers.
    load: [Lm, E] tokens routed to each expert.
    """

    routes: jax.Array
    aux_loss: jax.Array
    z_loss: jax.Array
    load: jax.Array


class LayerStats(NamedTuple):
    """One MoE layer's share of :class:`MoEStats`: routes [B, T, k], the fraction of valid
    tokens whose j-th choice is each expert [k, E], the mean router probability of each expert
    [E], the z-loss, and the load [E]."""

    routes: jax.Array
    tokens_per_expert: jax.Array
    prob_per_expert: jax.Array
    z_loss: jax.Array
    load: jax.Array


def gather_stats(per_layer: Sequence[LayerStats]) -> MoEStats:
    """Stats stacked by layer (one entry per segment, each [layers, ...]) -> MoEStats.

    The load-balancing loss is Hugging Face's ``load_balancing_loss_func`` over the layers'
    router logits together: ``E * sum(tokens_per_expert * prob_per_expert)`` with both means
    taken over every layer's valid tokens.
    """
    cat = lambda name: jnp.concatenate([getattr(s, name) for s in per_layer])  # noqa: E731
    tokens, probs = cat("tokens_per_expert"), cat("prob_per_expert")
    e = probs.shape[-1]
    return MoEStats(
        routes=jnp.moveaxis(cat("routes"), 0, 2),
        aux_loss=e * jnp.sum(tokens.mean(0) * probs.mean(0)[None]),
        z_loss=cat("z_loss").mean(),
        load=cat("load"),
    )


def route(
    x_nd: jax.Array,
    p: dict[str, jax.Array],
    cfg: ModelConfig,
    forced_ids: jax.Array | None = None,
    forced: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(expert ids [N, k] int32, their weights [N, k] f32, router logits [N, E] f32) from the
    layer's router weights in ``p``; Gemma 4's block scales the input and the weights."""
    dt = x_nd.dtype
    if cfg.enable_moe_block:
        x_nd = rms_norm(x_nd, None, cfg.norm_eps) * p["router_scale"].astype(dt)
        x_nd = x_nd * jnp.asarray(cfg.hidden_size**-0.5, dt)
    logits = jnp.einsum("ND,DE->NE", x_nd, p["router"].astype(dt)).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    _, ids = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    ids = ids.astype(jnp.int32)
    if forced_ids is not None and forced is not None:
        ids = jnp.where(forced[:, None], forced_ids.astype(jnp.int32), ids)
    weights = jnp.take_along_axis(probs, ids, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    if cfg.enable_moe_block:
        weights = weights * p["expert_scale"].astype(jnp.float32)[ids]
    return ids, weights, logits


def layer_stats(
    ids_nk: jax.Array, logits_ne: jax.Array, valid_n: jax.Array, shape: tuple[int, ...]
) -> LayerStats:
    """A layer's routing statistics over its valid tokens (see :class:`LayerStats`)."""
    e = logits_ne.shape[-1]
    valid = valid_n.astype(jnp.float32)
    count = jnp.maximum(valid.sum(), 1.0)
    probs = jax.nn.softmax(logits_ne, axis=-1)
    chosen = jax.nn.one_hot(ids_nk, e, dtype=jnp.float32)  # [N, k, E]
    load = jnp.einsum("N,NKE->E", valid, chosen)
    tokens_per_expert = jnp.einsum("N,NKE->KE", valid, chosen) / count
    prob_per_expert = jnp.einsum("N,NE->E", valid, probs) / count
    z = jnp.sum(valid * jax.nn.logsumexp(logits_ne, axis=-1) ** 2) / count
    return LayerStats(ids_nk.reshape(*shape, -1), tokens_per_expert, prob_per_expert, z, load)


def _gated_rows(x, wg, wu, wd, gmm, act: str):
    return gmm(gate_activation(act, gmm(x, wg)) * gmm(x, wu), wd)


def _sort_pairs(ids_nk, e_local: int, first: Any):
    """The (token, expert) pairs sorted by local expert: (mine [N, k], order [N*k], sizes
    [E_local]); pairs of other shards' experts sort last, past every group."""
    local = ids_nk - first
    mine = (local >= 0) & (local < e_local)
    key = jnp.where(mine, local, e_local).reshape(-1)
    order = jnp.argsort(key, stable=True)
    sizes = jnp.bincount(key, length=e_local + 1)[:e_local].astype(jnp.int32)
    return mine, order, sizes


def experts_sorted(
    x_nd,
    ids_nk,
    weights_nk,
    wg,
    wu,
    wd,
    *,
    impl: str = "auto",
    first: Any = 0,
    xla_form=None,
    act: str = "silu",
):
    """The routed experts over sorted (token, expert) pairs; pairs whose expert is not among
    these weights' E_local experts (numbered from ``first``) contribute nothing. ``impl`` and
    ``xla_form``: the grouped matmul's; its tiled XLA form runs as ``experts_tiled``. ``act``:
    the experts' gate activation (SwiGLU's 'silu', GeGLU's 'gelu_pytorch_tanh')."""
    if grouped_matmul_ops.path_for(impl, xla_form) == "tiled":
        return experts_tiled(x_nd, ids_nk, weights_nk, wg, wu, wd, first=first, act=act)
    n, k = ids_nk.shape
    mine, order, sizes = _sort_pairs(ids_nk, wg.shape[0], first)
    rows = x_nd[order // k]
    gmm = lambda a, w: grouped_matmul(  # noqa: E731
        a, w.astype(a.dtype), sizes, impl=impl, xla_form=xla_form
    )
    y = _gated_rows(rows, wg, wu, wd, gmm, act)  # rows past the groups come out 0
    w = jnp.where(mine, weights_nk, 0.0).reshape(-1)[order].astype(y.dtype)
    return jnp.zeros((n, x_nd.shape[-1]), y.dtype).at[order // k].add(y * w[:, None])


def experts_tiled(
    x_nd, ids_nk, weights_nk, wg, wu, wd, *, first: Any = 0, tile=None, act: str = "silu"
):
    """``experts_sorted`` in the grouped matmul's tiled XLA form, the three projections fused:
    the pairs are laid out in group-aligned row tiles once (``grouped_matmul.xla.tile_layout``),
    gate, up, SwiGLU and down run on the tiles, and each slot adds into its token. Against three
    ``grouped_matmul`` calls it saves the sorted copy of the rows and two tilings and untilings
    of [pairs, D or F]; ``tile`` (rows a tile) defaults to ``tile_rows(pairs, E_local)``."""
    n, k = ids_nk.shape
    e_local, d = wg.shape[0], x_nd.shape[-1]
    _, order, sizes = _sort_pairs(ids_nk, e_local, first)  # others' pairs sort past the tiles
    lay = grouped_xla.tile_layout(sizes, n * k, tile or grouped_xla.tile_rows(n * k, e_local))
    pair = order[lay.source]  # the (token, expert) pair each slot holds
    token = pair // k
    dt = x_nd.dtype
    x = jnp.where(lay.valid[:, None], x_nd[token], 0).reshape(lay.tile_group.shape[0], -1, d)
    groups = lay.clipped_groups(e_local)
    mm = lambda a, w: grouped_xla.tile_matmul(a, w.astype(dt), groups).astype(dt)  # noqa: E731
    y = mm(gate_activation(act, mm(x, wg)) * mm(x, wu), wd).reshape(-1, d)
    w = jnp.where(lay.valid, weights_nk.reshape(-1)[pair], 0.0)
    return jnp.zeros((n, d), dt).at[token].add(y * w.astype(dt)[:, None])


def experts_gathered(x_nd, ids_nk, weights_nk, wg, wu, wd, *, first: Any = 0, act: str = "silu"):
    """The routed experts by gathering each pair's weights: for a few pairs (decode)."""
    e_local = wg.shape[0]
    local = ids_nk - first
    mine = (local >= 0) & (local < e_local)
    idx = jnp.clip(local, 0, e_local - 1)
    dt = x_nd.dtype
    g = jnp.einsum("ND,NKDF->NKF", x_nd, wg[idx].astype(dt))
    u = jnp.einsum("ND,NKDF->NKF", x_nd, wu[idx].astype(dt))
    y = jnp.einsum("NKF,NKFD->NKD", gate_activation(act, g) * u, wd[idx].astype(dt))
    w = jnp.where(mine, weights_nk, 0.0).astype(dt)
    return jnp.einsum("NKD,NK->ND", y, w)


def experts(x_nd, ids_nk, weights_nk, p, *, impl: str = "auto", sharding=None, act="silu"):
    """The routed experts' output [N, D], sharded over the expert axis when the mesh has one."""
    wg, wu, wd = p["we_gate"], p["we_up"], p["we_down"]
    gather = ids_nk.size <= GATHER_MAX_PAIRS
    axes = _expert_axes(sharding, wg.shape[0], x_nd.shape[0])
    if axes is None:
        if gather:
            return experts_gathered(x_nd, ids_nk, weights_nk, wg, wu, wd, act=act)
        return experts_sorted(x_nd, ids_nk, weights_nk, wg, wu, wd, impl=impl, act=act)
    mesh, expert, rows, mlp = axes

    def shard(x, ids, w, g, u, d):
        first = jax.lax.axis_index(expert) * g.shape[0]
        if gather:
            y = experts_gathered(x, ids, w, g, u, d, first=first, act=act)
        else:
            y = experts_sorted(x, ids, w, g, u, d, impl=impl, first=first, act=act)
        return jax.lax.psum(y, (expert, *axis_names(mlp)))

    pairs = P(rows, None)
    specs = (pairs, pairs, pairs, P(expert, None, mlp), P(expert, None, mlp), P(expert, mlp, None))
    return run_sharded(shard, mesh, specs, pairs, (x_nd, ids_nk, weights_nk, wg, wu, wd))


def _expert_axes(sharding, num_experts: int, rows: int):
    """(mesh, expert axis, the rows' other batch axes, the expert width's axes), or None when
    the experts are not split (no sharding, or an expert axis of size 1)."""
    if sharding is None:
        return None
    mesh, rules = sharding
    expert = [a for a in axis_names(rules.rules.get("experts")) if a in mesh.shape]
    if len(expert) != 1 or mesh.shape[expert[0]] == 1:
        return None
    if num_experts % mesh.shape[expert[0]]:
        raise ValueError(
            f"{num_experts} experts do not split over the {mesh.shape[expert[0]]}-way mesh axis "
            f"{expert[0]!r}; set mesh.expert_parallel to a divisor of model.num_experts"
        )
    batch = tuple(
        a for a in axis_names(rules.rules.get("batch")) if a in mesh.shape and a != expert[0]
    )
    if batch and rows % axis_size(mesh, batch):
        batch = ()
    mlp = tuple(a for a in axis_names(rules.rules.get("expert_mlp")) if a in mesh.shape)
    row_spec = None if not batch else batch[0] if len(batch) == 1 else batch
    mlp_spec = None if not mlp else mlp[0] if len(mlp) == 1 else mlp
    return mesh, expert[0], row_spec, mlp_spec


def shared_expert(x_nd, p, project) -> jax.Array:
    """Qwen2-MoE's shared expert, scaled by its sigmoid gate; ``project`` applies LoRA."""
    gate = project(x_nd, p, "ws_gate", "ND,DF->NF")
    up = project(x_nd, p, "ws_up", "ND,DF->NF")
    out = project(jax.nn.silu(gate) * up, p, "ws_down", "NF,FD->ND")
    scale = jax.nn.sigmoid(jnp.einsum("ND,D->N", x_nd, p["ws_router"].astype(x_nd.dtype)))
    return out * scale[:, None]


def moe_mlp(
    h_btd: jax.Array,
    p: dict[str, jax.Array],
    cfg: ModelConfig,
    project,
    call: MoECall,
) -> tuple[jax.Array, LayerStats]:
    """A mixture-of-experts MLP over a block's normed input; ``p[FORCED_KEY]`` [B, T, k] holds
    the forced ids where ``forced`` [B, T] is set."""
    b, t, d = h_btd.shape
    x_nd = h_btd.reshape(b * t, d)
    out, stats = _routed(x_nd, x_nd, p, cfg, call, (b, t))
    if cfg.shared_expert_intermediate_size:
        out = out + shared_expert(x_nd, p, project)
    return out.reshape(b, t, d).astype(h_btd.dtype), stats


def moe_block(x_btd, dense_btd, p, cfg: ModelConfig, call: MoECall, norm):
    """Gemma 4's block (``enable_moe_block``) beside a layer's dense MLP: ``x_btd`` is the MLP
    block's input (the residual stream after attention), which the router reads, and
    ``dense_btd`` the dense MLP's output; returns (the dense output and the experts' output,
    each normed, summed; the layer's stats). ``norm(x, w)`` is the model's RMSNorm."""
    b, t, d = x_btd.shape
    x_nd = x_btd.reshape(b * t, d)
    out, stats = _routed(x_nd, norm(x_nd, p["moe_norm"]), p, cfg, call, (b, t))
    out = norm(out.reshape(b, t, d).astype(x_btd.dtype), p["moe_post_norm"])
    return norm(dense_btd, p["dense_post_norm"]) + out, stats


def _routed(route_nd, x_nd, p, cfg: ModelConfig, call: MoECall, bt: tuple[int, int]):
    """The routed experts over ``x_nd`` [N, D], routed by the router's reading of
    ``route_nd`` (the same rows, N = B * T for ``bt`` = (B, T)); returns (output [N, D], the
    layer's stats)."""
    n = route_nd.shape[0]
    forced_ids = p.get(FORCED_KEY)
    ids, weights, logits = route(
        route_nd,
        p,
        cfg,
        None if forced_ids is None else forced_ids.reshape(n, -1),
        None if call.forced is None else call.forced.reshape(-1),
    )
    act = cfg.hidden_act
    out = experts(x_nd, ids, weights, p, impl=call.impl, sharding=call.sharding, act=act)
    valid = jnp.ones((n,), bool) if call.valid is None else call.valid.reshape(-1)
    return out, layer_stats(ids, logits, valid, bt)
