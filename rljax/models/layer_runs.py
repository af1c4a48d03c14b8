"""The decoder's layers as runs of one kind, each run one scan (or straight-line code).

A layer's kind is its MLP (dense, or a mixture of experts: :mod:`rljax.models.moe`) and its
attention (global, or local: the last ``sliding_window`` keys, Gemma's ``sliding_attention``
layers). A model whose layers all share one kind runs one scan over its stacked weights; a model
mixing kinds runs one scan per run of consecutive layers of one kind (:func:`segments`), so each
run's block is compiled with its kind fixed: a local layer's attention skips the key blocks
outside its window at trace time instead of masking them. Gemma 3's five local layers to one
global make two runs per six layers; Gemma 2's alternation makes every layer its own run (the
layers become straight-line code, a longer compile for the same program).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from rljax.config import ModelConfig
from rljax.models import moe as moe_lib


class Segment(NamedTuple):
    """A run of consecutive layers of one kind: layers [start, stop), whose expert weights
    (``moe``) are rows [expert_start, expert_start + stop - start) of the experts' stacks and
    whose dense MLP weights (``dense``) rows from ``dense_start`` of the dense MLP's (Gemma 4's
    block has both); ``window``: the local layers' sliding window, None for global attention."""

    start: int
    stop: int
    moe: bool
    expert_start: int
    window: int | None = None
    dense: bool = True
    dense_start: int = 0


def layer_window(cfg: ModelConfig, layer: int) -> int | None:
    """Layer ``layer``'s sliding window: ``cfg.sliding_window`` for a local layer, else None."""
    if cfg.layer_types and cfg.layer_types[layer] == "sliding_attention":
        return cfg.sliding_window
    return None


def local_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The layers with a sliding window (none unless ``cfg.layer_types`` names some)."""
    return tuple(i for i in range(cfg.num_layers) if layer_window(cfg, i) is not None)


def segments(cfg: ModelConfig) -> tuple[Segment, ...]:
    """The model's layers as runs of one kind; one segment when every layer shares its kind."""
    moe, dense = set(moe_lib.moe_layers(cfg)), set(moe_lib.dense_layers(cfg))
    out: list[Segment] = []
    experts_seen = dense_seen = 0
    for i in range(cfg.num_layers):
        is_moe, window = i in moe, layer_window(cfg, i)
        if out and (out[-1].moe, out[-1].window) == (is_moe, window):
            out[-1] = out[-1]._replace(stop=i + 1)
        else:
            out.append(Segment(i, i + 1, is_moe, experts_seen, window, i in dense, dense_seen))
        experts_seen += is_moe
        dense_seen += i in dense
    return tuple(out)


def segment_weights(layers: Any, seg: Segment) -> Any:
    """The weights one segment runs over: every layer's rows [start, stop) and its MLP stacks'
    rows (experts, dense MLP) of a stacked dict; a per-layer tuple's layers [start, stop)."""
    if not isinstance(layers, dict):
        return layers[seg.start : seg.stop]
    n = seg.stop - seg.start
    out = {}
    for key, value in layers.items():
        kind = moe_lib.weight_kind(key)
        if kind is None:
            out[key] = value[seg.start : seg.stop]
        elif kind and seg.moe:
            out[key] = value[seg.expert_start : seg.expert_start + n]
        elif not kind and seg.dense:
            out[key] = value[seg.dense_start : seg.dense_start + n]
    return out


def run_layers(layout, cfg: ModelConfig, block, carry, layers, unroll: int, call) -> tuple:
    """``block(carry, (p, i), moe, window)`` over the layers in ``layout`` (``moe``: ``call``
    for a mixture-of-experts layer, else None; ``window``: the layer's sliding window or None);
    returns (carry, per-layer outputs stacked by layer, MoE stats or None)."""
    segs = segments(cfg)
    if len(segs) == 1:
        seg = segs[0]
        moe = call if seg.moe else None
        carry, out = layout.run_layers(
            lambda c, x: block(c, x, moe, seg.window), carry, layers, unroll=unroll
        )
        return carry, out[0], (moe_lib.gather_stats([out[1]]) if seg.moe else None)
    outs, stats = [], []
    for seg in segs:
        part = segment_weights(layers, seg)
        seg_call = call if seg.moe else None

        def seg_block(c, x, start=seg.start, seg_call=seg_call, window=seg.window):
            return block(c, (x[0], x[1] + start), seg_call, window)

        n = seg.stop - seg.start
        carry, out = layout.run_layers(seg_block, carry, part, unroll=min(unroll, n))
        outs.append(out[0])
        if seg.moe:
            stats.append(out[1])
    kv = None if outs[0] is None else jax.tree.map(lambda *x: jnp.concatenate(x), *outs)
    return carry, kv, (moe_lib.gather_stats(stats) if stats else None)
