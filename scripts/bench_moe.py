"""Benchmarks the mixture-of-experts layer and decode against baselines measured in the same run.

    python scripts/bench_moe.py            # the full measurement (run it alone on the machine)
    python scripts/bench_moe.py --quick    # tiny shapes: checks the script works

Four comparisons, each a ratio taken in this run; every timing is the median of ``--repeats``
repeats (each the mean of ``--iters`` calls after a compiling warm-up), reported with its
[min, max], and every ratio is taken within a repeat (the two sides timed back to back):
  (a) the routed experts' forward + backward (``rljax.models.moe.experts_sorted``, the
      grouped matmul's 'xla' implementation in this backend's form) at D 512, 32 experts,
      top 4, expert width 256, 4096 tokens, as a fraction of this machine's sgemm peak,
      measured on its own (a plain f32 matmul of comparable size, FLOP/s), counting the
      active FLOPs only: 6 * tokens * k * 3 * D * F (three projections of every (token,
      expert) pair, forward 2 and backward 4 FLOPs a multiply-add);
  (b) its speedup over computing every expert densely: all E experts on all tokens, weighed by
      the router's weights (zero off the top k), forward + backward; and over the same layer
      through ``jax.lax.ragged_dot`` (the XLA form off the CPU);
  (c) the engine's decode tokens per second (``PagedEngine.generate`` with every slot busy) on
      a tiny Qwen3-MoE against the dense Qwen3 of equal active parameters (its MLP width is k
      experts' widths), the dense model in the engine's default weights layout and stacked
      (the layout a mixture of experts is served in);
  (d) the decode crossover of gathered against sorted experts (``experts_gathered`` /
      ``experts_sorted``, forward) at pair counts 2..64 of a decode step, with the threshold
      the layer uses (``rljax.models.moe.GATHER_MAX_PAIRS``).
The last line printed is one JSON object holding every figure and the CPU's model name.

On the CPU, ``jax.lax.ragged_dot`` lowers to a dense product masked per expert (every expert
over every row), so the grouped matmul's XLA path there is group-aligned row tiles and a
loop of matmuls over them (``rljax.kernels.grouped_matmul.xla.tiled``, and the layer's fused
``rljax.models.moe.experts_tiled``); on a GPU it is ragged_dot. Run it
alone: the timings share the machine's cores with whatever else runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from rljax.kernels.grouped_matmul import xla

from rljax.config import ModelConfig, SamplingConfig
from rljax.engine.paged import PagedEngine
from rljax.models import moe
from rljax.models.sharding import SAMPLER_RULES, make_mesh

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)  # scripts/ is not a package
from continuous_batching import random_params, spread  # noqa: E402
from decode_bound import time_busy_steps  # noqa: E402

log = functools.partial(print, flush=True)

# (tokens, D, E, k, F): the layer of (a) and (b).
FULL_LAYER = (4096, 512, 32, 4, 256)
QUICK_LAYER = (256, 64, 8, 2, 32)
FULL_PAIRS = (2, 4, 8, 16, 32, 64)
QUICK_PAIRS = (2, 8, 16)


def cpu_model() -> str:
    """``lscpu``'s model name ('' where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return ""


def seconds(fn, *args, iters: int) -> float:
    """Mean seconds of one call of ``fn(*args)`` over ``iters`` calls (results blocked on)."""
    jax.block_until_ready(fn(*args))  # compile and warm
    start = time.perf_counter()
    for _ in range(iters):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / iters


def layer_inputs(tokens: int, d: int, e: int, k: int, f: int, seed: int = 0):
    """x [N, D], the router's top-k ids and weights [N, k], and the experts' weights."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((tokens, d)), jnp.float32)
    router = jnp.asarray(rng.standard_normal((d, e)) / np.sqrt(d), jnp.float32)
    cfg = ModelConfig(
        family="qwen3_moe", num_experts=e, num_experts_per_tok=k, moe_intermediate_size=f
    )
    ids, weights, _ = moe.route(x, {"router": router}, cfg)
    scale = 1.0 / np.sqrt(d)
    wg, wu = (jnp.asarray(rng.standard_normal((e, d, f)) * scale, jnp.float32) for _ in range(2))
    wd = jnp.asarray(rng.standard_normal((e, f, d)) / np.sqrt(f), jnp.float32)
    return x, ids, weights, (wg, wu, wd)


def dense_experts(x_nd, ids_nk, weights_nk, wg, wu, wd):
    """Every expert on every token, weighed by the top-k weights (zero elsewhere): [N, D]."""
    w_ne = jnp.zeros((x_nd.shape[0], wg.shape[0]), x_nd.dtype)
    w_ne = w_ne.at[jnp.arange(x_nd.shape[0])[:, None], ids_nk].set(weights_nk)
    g = jnp.einsum("ND,EDF->NEF", x_nd, wg)
    u = jnp.einsum("ND,EDF->NEF", x_nd, wu)
    y = jnp.einsum("NEF,EFD->NED", jax.nn.silu(g) * u, wd)
    return jnp.einsum("NED,NE->ND", y, w_ne)


def train_step(experts_fn):
    """jit of the gradients of sum(y^2) w.r.t. x and the three expert weights (fwd + bwd)."""

    def loss(x, wg, wu, wd, ids, weights):
        return jnp.sum(experts_fn(x, ids, weights, wg, wu, wd) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def sgemm_flops(tokens: int, d: int, width: int, iters: int) -> float:
    """FLOP/s of one plain f32 matmul [tokens, d] @ [d, width], timed on its own."""
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((tokens, d)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((d, width)), jnp.float32)
    return 2.0 * tokens * d * width / seconds(jax.jit(jnp.matmul), a, b, iters=iters)


def bench_layer(args, figures) -> None:
    """(a) and (b): the routed experts' fwd + bwd against the sgemm peak and dense experts."""
    tokens, d, e, k, f = QUICK_LAYER if args.quick else FULL_LAYER
    x, ids, weights, (wg, wu, wd) = layer_inputs(tokens, d, e, k, f)
    sorted_fn = functools.partial(moe.experts_sorted, impl="xla")
    ragged_fn = functools.partial(moe.experts_sorted, impl="xla", xla_form="ragged_dot")
    steps = {
        "sorted_s": train_step(sorted_fn),
        "ragged_dot_s": train_step(ragged_fn),
        "dense_s": train_step(dense_experts),
    }
    operands = (x, wg, wu, wd, ids, weights)
    active = 6.0 * tokens * k * 3 * d * f
    rows: dict[str, list[float]] = {name: [] for name in steps}
    rows |= {"sgemm_flops": [], "fraction": [], "speedup": [], "over_ragged_dot": []}
    for _ in range(args.repeats):
        # The peak's matmul does one projection of every pair at once: [N, D] @ [D, k F].
        peak = sgemm_flops(tokens, d, k * f, args.iters)
        times = {name: seconds(step, *operands, iters=args.iters) for name, step in steps.items()}
        for name, t in times.items():
            rows[name].append(t)
        rows["sgemm_flops"].append(peak)
        rows["fraction"].append(active / times["sorted_s"] / peak)
        rows["speedup"].append(times["dense_s"] / times["sorted_s"])
        rows["over_ragged_dot"].append(times["ragged_dot_s"] / times["sorted_s"])
    out = {
        "shape": dict(tokens=tokens, d=d, experts=e, k=k, f=f),
        "active_flops": active,
        "xla_form": xla.form_for_backend(jax.default_backend()),
    }
    out |= {name: spread(values) for name, values in rows.items()}
    out["sgemm_flops"] = {key: round(v) for key, v in out["sgemm_flops"].items()}
    log(
        f"(a) experts fwd+bwd ({tokens} tokens, D {d}, {e} experts, top {k}, F {f}; "
        f"{out['xla_form']}): {statistics.median(rows['sorted_s']) * 1e3:.2f} ms, "
        f"{_fmt(out['fraction'], 3)} of the sgemm peak "
        f"({statistics.median(rows['sgemm_flops']) / 1e9:.1f} GFLOP/s) at active FLOPs"
    )
    log(f"(b) sorted experts over every expert densely: {_fmt(out['speedup'], 2)}x faster")
    log(f"    and over jax.lax.ragged_dot's lowering here: {_fmt(out['over_ragged_dot'], 2)}x")
    figures["layer"] = out


def _fmt(s: dict, digits: int) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def decode_models(quick: bool) -> tuple[ModelConfig, ModelConfig]:
    """A tiny Qwen3-MoE and the dense Qwen3 whose MLP is its k experts' width."""
    d, e, k, fe = (64, 8, 2, 32) if quick else (256, 16, 2, 192)
    common = dict(
        vocab_size=256 if quick else 2048,
        hidden_size=d,
        num_layers=2 if quick else 4,
        num_heads=4 if quick else 8,
        num_kv_heads=2 if quick else 4,
        head_dim=16 if quick else 32,
        qk_norm=True,
        max_position_embeddings=512,
    )
    mixture = ModelConfig(
        family="qwen3_moe",
        intermediate_size=k * fe,
        num_experts=e,
        num_experts_per_tok=k,
        moe_intermediate_size=fe,
        norm_topk_prob=True,
        **common,
    )
    return mixture, ModelConfig(family="qwen3", intermediate_size=k * fe, **common)


def _tokens_per_s(cfg: ModelConfig, sampling: SamplingConfig, mesh, steps: int, seed: int):
    """Decode tokens per second of ``cfg`` with every slot busy (median step)."""
    graphdef, params = random_params(cfg, mesh, SAMPLER_RULES, seed)
    engine = PagedEngine(cfg, sampling, mesh, graphdef, impl="xla")
    times, _ = time_busy_steps(cfg.family, engine, engine.load_params(params), steps)
    return sampling.max_concurrent_decodes / statistics.median(times), engine.weights_layout


def bench_decode(args, figures) -> None:
    """(c): decode tokens/s of a tiny mixture against the dense model of its active size."""
    mixture, dense = decode_models(args.quick)
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    sampling = SamplingConfig(
        max_concurrent_decodes=8 if args.quick else 32,
        max_prefill_length=16,
        max_new_tokens=32 if args.quick else 96,
        page_size=8,
    )
    stacked = SamplingConfig(**{**vars(sampling), "weights_layout": "stacked"})
    steps = 8 if args.quick else 32
    rows = {"moe": [], "dense": [], "dense_stacked": []}
    layouts = {}
    for r in range(args.repeats):
        for name, cfg, s in (
            ("moe", mixture, sampling),
            ("dense", dense, sampling),
            ("dense_stacked", dense, stacked),
        ):
            rate, layouts[name] = _tokens_per_s(cfg, s, mesh, steps, seed=r)
            rows[name].append(rate)
    ratio = [m / dn for m, dn in zip(rows["moe"], rows["dense"], strict=True)]
    ratio_stacked = [m / dn for m, dn in zip(rows["moe"], rows["dense_stacked"], strict=True)]
    out = {name: spread(values) for name, values in rows.items()}
    out |= {
        "moe_over_dense": spread(ratio),
        "moe_over_dense_stacked": spread(ratio_stacked),
        "layouts": layouts,
        "slots": sampling.max_concurrent_decodes,
        "experts": mixture.num_experts,
        "k": mixture.num_experts_per_tok,
    }
    log(
        f"(c) decode tokens/s, {sampling.max_concurrent_decodes} slots: MoE "
        f"{statistics.median(rows['moe']):.0f} ({layouts['moe']}), dense of equal active "
        f"params {statistics.median(rows['dense']):.0f} ({layouts['dense']}), stacked "
        f"{statistics.median(rows['dense_stacked']):.0f}; MoE / dense "
        f"{_fmt(out['moe_over_dense'], 2)}, / dense stacked "
        f"{_fmt(out['moe_over_dense_stacked'], 2)}"
    )
    figures["decode"] = out


def bench_crossover(args, figures) -> None:
    """(d): gathered vs sorted experts' forward at a decode step's pair counts."""
    _, d, e, _, f = QUICK_LAYER if args.quick else FULL_LAYER
    k = 2  # pairs = slots * k, from one slot up
    gathered = jax.jit(moe.experts_gathered)
    sorted_ = jax.jit(functools.partial(moe.experts_sorted, impl="xla"))
    table = []
    for pairs in QUICK_PAIRS if args.quick else FULL_PAIRS:
        x, ids, weights, w = layer_inputs(pairs // k, d, e, k, f, seed=pairs)
        ratios, t_g, t_s = [], [], []
        for _ in range(args.repeats):
            g = seconds(gathered, x, ids, weights, *w, iters=args.iters * 4)
            s = seconds(sorted_, x, ids, weights, *w, iters=args.iters * 4)
            t_g.append(g * 1e6)
            t_s.append(s * 1e6)
            ratios.append(s / g)
        row = {"pairs": pairs, "gathered_us": spread(t_g), "sorted_us": spread(t_s)}
        row["sorted_over_gathered"] = spread(ratios)
        table.append(row)
        log(
            f"(d) {pairs:3d} pairs: gathered {statistics.median(t_g):8.1f} us, sorted "
            f"{statistics.median(t_s):8.1f} us, sorted / gathered "
            f"{_fmt(row['sorted_over_gathered'], 2)}"
        )
    faster = [r["pairs"] for r in table if r["sorted_over_gathered"]["median"] < 1.0]
    crossover = min(faster) if faster else None
    where = f"from {crossover} pairs" if crossover else f"at none up to {table[-1]['pairs']} pairs"
    log(
        f"(d) sorted is faster {where} (median); the layer gathers up to "
        f"moe.GATHER_MAX_PAIRS = {moe.GATHER_MAX_PAIRS}"
    )
    figures["crossover"] = {
        "shape": dict(d=d, experts=e, k=k, f=f),
        "table": table,
        "sorted_faster_from_pairs": crossover,
        "gather_max_pairs": moe.GATHER_MAX_PAIRS,
    }


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes: check the script works")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=None, help="calls a timing averages")
    p.add_argument("--parts", default="layer,decode,crossover")
    args = p.parse_args(argv)
    if args.iters is None:
        args.iters = 2 if args.quick else 5
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    figures = {
        "cpu_model": cpu_model(),
        "devices": [str(d) for d in jax.devices()],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "quick": args.quick,
        "repeats": args.repeats,
        "iters": args.iters,
    }
    parts = set(args.parts.split(","))
    for name, run in (
        ("layer", bench_layer),
        ("decode", bench_decode),
        ("crossover", bench_crossover),
    ):
        if name in parts:
            run(args, figures)
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    log(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
