"""A recipe over seeds: held-out accuracy after the warm start and at the end, and the wall time.

    python scripts/recipe_seeds.py --config=configs/arith_gemma.py --seeds=0,1,2,3,4
    python scripts/recipe_seeds.py --config=configs/arith_moe.py --variants=sync,eta2

Launches ``rljax --config=<config>[:<variant>]`` once per seed and variant, each as its own
process (on as many CPU devices as the variant's mesh needs: ``--devices``), and reports per run
the held-out accuracy after the warm start and at the end, the gain in points and the process's
wall seconds (meaningful only on an otherwise idle machine), then per variant the median and
range. Ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def launch(
    config: str, variant: str, workdir: pathlib.Path, overrides: dict[str, object], devices: int
) -> dict:
    """One run of the recipe; returns its summary line and wall seconds."""
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices)}
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    named = f"{config}:{variant}" if variant else config
    cmd = ["rljax", f"--config={named}", f"--workdir={workdir}", *flags]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    return {**summary, "process_wall_s": round(wall, 1)}


def learn(
    config: str, variants: list[str], seeds: list[int], root: pathlib.Path, devices: dict
) -> dict:
    """Every (variant, seed) run, then each variant's median gain and wall time with ranges."""
    runs = []
    for variant in variants:
        for seed in seeds:
            workdir = root / f"{variant or 'default'}_{seed}"
            s = launch(config, variant, workdir, {"seed": seed}, devices.get(variant, 1))
            gain = 100 * (s["final_accuracy"] - s["initial_accuracy"])
            runs.append({"variant": variant, "seed": seed, "gain_points": round(gain, 1), **s})
            print(
                f"{variant or 'default':7s} seed {seed}: {100 * s['initial_accuracy']:.1f}% -> "
                f"{100 * s['final_accuracy']:.1f}% ({gain:+.1f} points), "
                f"{s['process_wall_s']:.0f} s",
                flush=True,
            )
    by_variant = {}
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        gains, walls = [r["gain_points"] for r in mine], [r["process_wall_s"] for r in mine]
        by_variant[variant or "default"] = {
            "gain_median": statistics.median(gains),
            "gain_range": [min(gains), max(gains)],
            "wall_median_s": statistics.median(walls),
            "wall_range_s": [min(walls), max(walls)],
        }
    return {"config": config, "runs": runs, "by_variant": by_variant}


def cpu_name() -> str:
    """``lscpu``'s model name, and whether the CPU has AVX-512 (XLA's CPU code differs)."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if "Model name" in ln), "")
    return model + (" (avx512)" if "avx512" in cpu else " (no avx512)")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a recipe file, e.g. configs/arith_gemma.py")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--variants", default="", help="comma-separated; '' is the recipe's default")
    p.add_argument(
        "--devices", default="", help="variant=N,... CPU devices per variant (default 1 each)"
    )
    p.add_argument("--workdir", default="", help="where the runs go (default: a temporary dir)")
    args = p.parse_args(argv)
    devices = {k: int(v) for k, v in (kv.split("=") for kv in args.devices.split(",") if kv)}
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="recipe_seeds_"))
    seeds = [int(s) for s in args.seeds.split(",")]
    figures = learn(args.config, args.variants.split(","), seeds, root, devices)
    figures["cpu"] = cpu_name()
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
