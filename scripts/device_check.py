"""The accelerator check: absolute figures on whatever one device this process sees.

    python scripts/device_check.py --out=device_check.json      # real shapes, < 8 min on an H200
    python scripts/device_check.py --tiny --out=/tmp/check.json # tiny shapes (the CI's test)

Random weights at real model shapes (no download), bf16. Four parts, each a ratio against a
limit measured in this same run, each timing a median over repeats after an untimed compile:

  (a) engine decode at Qwen3-8B's and Llama-3.1-8B's shapes with 64 and 256 slots: tokens/s
      and the fraction of the bandwidth bound, the bound being a token step's bytes (weights +
      the KV the slots hold) over the device's copy bandwidth (a jitted copy of a large array,
      read + write counted), at ``decode_steps`` 1 and the device kind's default;
  (b) the learner's train step at Qwen3-1.7B's shapes (and Qwen3-8B's where memory and time
      allow): MFU, model FLOPs (6 x matmul params x tokens + attention) over the step time,
      against a bf16 GEMM peak measured here (8192^3);
  (c) flash attention's XLA path (rljax.kernels, forward + backward) against
      ``jax.nn.dot_product_attention`` (cuDNN on a GPU, XLA elsewhere) at a training shape;
  (d) ten GRPO steps of a SmolLM2-shaped model (SmolLM2's layer shapes on the recipe's char
      vocabulary) through rljax.runtime, sync and async at eta 2, both roles on the one device
      (one process has one accelerator device here: the two meshes share it): step time and
      tokens per second per chip.

A part that does not fit (memory, the time budget) is recorded as skipped with the reason; the
rest still run. Writes one JSON file (--out) and prints a readable summary; the last line
printed is the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)  # scripts/ is not a package
from bench_learner import grpo_batch, model_flops  # noqa: E402
from decode_bound import decode_calls_vs_bound  # noqa: E402

from rljax.config import LearnerConfig, ModelConfig, SamplingConfig  # noqa: E402
from rljax.engine.decode import steps_per_call  # noqa: E402
from rljax.engine.paged import PagedEngine  # noqa: E402
from rljax.learner.learner import Learner  # noqa: E402
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, make_mesh  # noqa: E402
from rljax.models.transformer import init_sharded  # noqa: E402

BF16 = dict(dtype="bfloat16", param_dtype="bfloat16")
QWEN3_8B = ModelConfig(
    family="qwen3",
    vocab_size=151_936,
    hidden_size=4096,
    intermediate_size=12_288,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    qk_norm=True,
    rope_theta=1_000_000.0,
    max_position_embeddings=4096,
    **BF16,
)
LLAMA31_8B = ModelConfig(
    family="llama",
    vocab_size=128_256,
    hidden_size=4096,
    intermediate_size=14_336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500_000.0,
    max_position_embeddings=4096,
    **BF16,
)
QWEN3_1_7B = dataclasses.replace(
    QWEN3_8B, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16
)
TINY = ModelConfig(
    family="qwen3",
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    qk_norm=True,
    max_position_embeddings=256,
    **BF16,
)


def log(msg: str) -> None:
    print(msg, flush=True)


def spread(xs) -> dict:
    xs = list(xs)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _timed(fn, repeats: int) -> list[float]:
    fn()  # compiles
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return out


def copy_bandwidth_gbs(nbytes: int, repeats: int) -> float:
    """The device's copy bandwidth: a jitted ``x + 1`` over ``nbytes`` of bf16, read + write."""
    x = jnp.zeros(nbytes // 2, jnp.bfloat16)
    copy = jax.jit(lambda a: a + jnp.bfloat16(1))
    best = min(_timed(lambda: copy(x), repeats))
    return 2 * x.nbytes / best / 1e9


def gemm_peak_flops(n: int, repeats: int) -> float:
    """bf16 GEMM FLOP/s of a jitted n x n x n dot (f32 accumulation), best of ``repeats``."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    return 2.0 * n**3 / min(_timed(lambda: dot(a, b), repeats))


def one_device_mesh(axes: dict[str, int]):
    return make_mesh(jax.devices()[:1], axes)


# -- (a) decode --------------------------------------------------------------------------------


def check_decode(args, out: dict) -> None:
    models = {"tiny": TINY} if args.tiny else {"qwen3_8b": QWEN3_8B, "llama31_8b": LLAMA31_8B}
    slot_counts = (4,) if args.tiny else (64, 256)
    mesh = one_device_mesh({"data": 1, "tensor": 1})
    bandwidth = copy_bandwidth_gbs(args.copy_mib * 2**20, repeats=5)
    default = steps_per_call(0, mesh)
    out["copy_bandwidth_gbs"] = round(bandwidth, 1)
    out["default_decode_steps"] = default
    log(f"(a) copy bandwidth {bandwidth:.1f} GB/s; default decode_steps here {default}")
    for name, cfg in models.items():
        graphdef, state = init_sharded(cfg, mesh, SAMPLER_RULES, 0)
        for slots in slot_counts:
            key = f"{name}_{slots}_slots"
            if _over_budget(args, out, key):
                continue
            sampling = SamplingConfig(
                temperature=0.0,
                dtype="bfloat16",
                max_new_tokens=args.decode_tokens * 3 + 2 * max(default, 1),
                max_prefill_length=args.prompt,
                max_concurrent_decodes=slots,
                page_size=16,
            )
            engine = PagedEngine(cfg, sampling, mesh, graphdef)
            params = engine.load_params(state)
            rows = {}
            # --tiny (a test on a CPU, whose default is 1) times 4 a call as well.
            for per_call in sorted({1, default} | ({4} if args.tiny else set())):
                rows[str(per_call)] = decode_calls_vs_bound(
                    key, engine, params, bandwidth, per_call, args.decode_tokens
                )
            out[key] = rows
            del engine, params
        del state


# -- (b) learner -------------------------------------------------------------------------------


def check_learner(args, out: dict) -> None:
    models = {"tiny": TINY} if args.tiny else {"qwen3_1_7b": QWEN3_1_7B, "qwen3_8b": QWEN3_8B}
    peak = gemm_peak_flops(256 if args.tiny else 8192, repeats=5)
    out["bf16_gemm_peak_tflops"] = round(peak / 1e12, 3)
    log(f"(b) bf16 GEMM peak {peak / 1e12:.1f} TFLOP/s")
    rows, row_len = (2, 64) if args.tiny else (8, 2048)
    for name, cfg in models.items():
        if _over_budget(args, out, name):
            continue
        try:
            mesh = one_device_mesh({"fsdp": 1, "tensor": 1})
            graphdef, params = init_sharded(cfg, mesh, LEARNER_RULES, 0)
            lcfg = LearnerConfig(
                loss="grpo", group_size=2, batch_groups=rows, remat="full", grad_clip=1.0
            )
            learner = Learner(lcfg, graphdef, params, mesh)
            del params
            batch = grpo_batch(cfg.vocab_size, rows, row_len)
            train_step = learner.step
            times = _timed(lambda: train_step(batch), args.repeats)  # noqa: B023
        except Exception as exc:  # noqa: BLE001 (an out-of-memory is recorded, not fatal)
            out[name] = {"skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log(f"(b) {name} skipped: {out[name]['skipped']}")
            continue
        flops = model_flops(cfg, rows, row_len)
        step = statistics.median(times)
        out[name] = {
            "rows": rows,
            "row_len": row_len,
            "step_s": spread(times),
            "tokens_per_s": round(rows * row_len / step, 1),
            "mfu": round(flops / step / peak, 4),
        }
        log(f"(b) {name}: step {step:.3f} s, MFU {out[name]['mfu']:.3f} of the GEMM peak")


# -- (c) attention -----------------------------------------------------------------------------


def check_attention(args, out: dict) -> None:
    from rljax.kernels.flash_attention.ops import flash_attention

    b, t, n, k, h = (1, 128, 4, 2, 16) if args.tiny else (4, 4096, 32, 8, 128)
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, t, n, h), jnp.bfloat16)
    kk = jax.random.normal(keys[1], (b, t, k, h), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, k, h), jnp.bfloat16)

    def ours(q, kk, v):
        return flash_attention(q, kk, v, causal=True, impl="xla").astype(jnp.float32).sum()

    def theirs(q, kk, v):
        o = jax.nn.dot_product_attention(q, kk, v, is_causal=True, implementation=None)
        return o.astype(jnp.float32).sum()

    timings = {}
    for name, fn in (("rljax_xla", ours), ("jax_nn", theirs)):
        step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))
        timings[name] = _timed(lambda step=step: step(q, kk, v), args.repeats)
    ratio = statistics.median(timings["jax_nn"]) / statistics.median(timings["rljax_xla"])
    out.update(
        {
            "shape": [b, t, n, k, h],
            **{f"{name}_ms": spread(x * 1e3 for x in ts) for name, ts in timings.items()},
            "rljax_speed_over_jax_nn": round(ratio, 4),
        }
    )
    log(f"(c) flash attention fwd+bwd {b}x{t}, {n}/{k} heads: rljax XLA {ratio:.2f}x jax.nn")


# -- (d) GRPO ----------------------------------------------------------------------------------


def check_grpo(args, out: dict) -> None:
    from rljax.configs import arith_tiny

    from rljax.config import replace
    from rljax.runtime.run import run as run_lib

    cfg = arith_tiny.recipe("small")
    if not args.tiny:  # SmolLM2-135M's layers on the char vocabulary
        cfg = replace(
            cfg,
            **{
                "model.hidden_size": 576,
                "model.intermediate_size": 1536,
                "model.num_layers": 30,
                "model.num_heads": 9,
                "model.num_kv_heads": 3,
                "model.head_dim": 64,
            },
        )
    steps = 1 if args.tiny else 10
    for mode, eta in (("sync", 0), ("async", 2)):
        key = f"{mode}_eta{eta}"
        if _over_budget(args, out, key):
            continue
        run_cfg = replace(
            cfg,
            mode=mode,
            num_steps=steps,
            **{"buffer.max_staleness": eta, "sft.steps": 0 if args.tiny else 20},
            **{"metrics.progress_bar": False, "eval_examples": 4},
        )
        with tempfile.TemporaryDirectory() as workdir:
            summary = run_lib(run_cfg, workdir)
            with open(os.path.join(workdir, "metrics.jsonl")) as f:
                rows = [json.loads(x) for x in f if x.strip()]
        train = [r for r in rows if r.get("phase") == "train"]
        step_s = [r["step_s"] for r in train[1:]] or [r["step_s"] for r in train]
        tokens = [r.get("sampler_tokens_per_s", 0.0) for r in train[1:]] or [0.0]
        out[key] = {
            "steps": len(train),
            "step_s": spread(step_s),
            "sampler_tokens_per_s_per_chip": spread(tokens),
            "wall_s": round(summary.get("wall_s", 0.0), 1),
        }
        log(f"(d) {key}: step {statistics.median(step_s):.3f} s over {len(train)} steps")


# -- driver ------------------------------------------------------------------------------------


def _over_budget(args, out: dict, key: str) -> bool:
    left = args.budget_s - (time.perf_counter() - args.start)
    if left > 0:
        return False
    out[key] = {"skipped": f"the time budget of {args.budget_s:.0f} s was spent"}
    log(f"skipped {key}: {out[key]['skipped']}")
    return True


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a test on any machine")
    p.add_argument("--parts", default="decode,learner,attention,grpo")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no part after this")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=32, help="(a): timed tokens a slot")
    p.add_argument("--prompt", type=int, default=128, help="(a): prompt tokens a slot holds")
    p.add_argument("--copy-mib", type=int, default=4096)
    args = p.parse_args(argv)
    if args.tiny:
        args.repeats, args.decode_tokens, args.prompt, args.copy_mib = 2, 8, 16, 16
    args.start = time.perf_counter()
    return args


PARTS = {
    "decode": check_decode,
    "learner": check_learner,
    "attention": check_attention,
    "grpo": check_grpo,
}


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = jax.devices()[0]
    figures: dict = {
        "device": f"{device.platform} {device.device_kind}",
        "devices": len(jax.devices()),
        "jax": jax.__version__,
        "tiny": args.tiny,
    }
    log(f"device: {figures['device']} ({figures['devices']} visible), jax {jax.__version__}")
    for name in args.parts.split(","):
        if name not in PARTS:
            raise SystemExit(f"device_check: unknown part {name!r}; choose from {sorted(PARTS)}")
        figures[name] = {}
        if _over_budget(args, figures, name):
            continue
        start = time.perf_counter()
        try:
            PARTS[name](args, figures[name])
        except Exception as exc:  # noqa: BLE001 (one part failing must not lose the others)
            figures[name]["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            figures[name]["traceback"] = traceback.format_exc()[-3000:]
            log(f"{name} failed: {figures[name]['error']}")
        figures[name]["part_s"] = round(time.perf_counter() - start, 1)
    figures["wall_s"] = round(time.perf_counter() - args.start, 1)
    with open(args.out, "w") as f:
        json.dump(figures, f, indent=1, sort_keys=True)
    print(json.dumps(figures, sort_keys=True), flush=True)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
