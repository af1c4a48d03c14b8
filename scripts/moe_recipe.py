"""configs/arith_moe.py over seeds: what it learns, and the routing mismatch with replay off / on.

    python scripts/moe_recipe.py learn --seeds=0,1,2,3,4 --variants=sync,eta2
    python scripts/moe_recipe.py mismatch --seeds=0,1,2 --num_steps=30

``learn`` launches the recipe (``rljax --config=configs/arith_moe.py:<variant>``) once per seed
and variant, each as its own process (eta2 on 8 CPU devices, as its docstring says), and reports
held-out accuracy after the warm start and at the end, the gain in points, and the wall seconds
(meaningful only on an otherwise idle machine).

``mismatch`` runs the recipe with bf16 sampling (``sampling.dtype='bfloat16'``: the sampler's
weights, activations and KV in bf16, the learner's in f32) once with ``moe.router_replay='off'``
and once with ``'rollout'``, per seed, and prints per step, side by side, the router
disagreement (the fraction of (model token, MoE layer) pairs whose learner top-k set differs
from the sampler's; with replay on from an extra unforced forward, measured every step here:
``moe.disagreement_every=1``) and the log-prob mismatch (``mismatch/abs_logp``: mean
|log p_learner - log p_sampler| over the response tokens, from the loss's own forward).
On the replay-on run's batches it also prints, paired (same batch, same params, before the
update), the mismatch an unforced forward would have had (``moe/abs_logp_unforced``), the number
of flipped tokens (whose own expert set the unforced forward changed in some MoE layer), and the
forced and unforced mismatch over those tokens (``moe/abs_logp_{forced,unforced}/flipped``):
what replay changes where it changes anything.

Both end with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import tempfile

import recipe_seeds  # scripts/recipe_seeds.py, beside this file

CONFIG = "configs/arith_moe.py"
DEVICES = {"sync": 1, "eta2": 8, "off": 1, "small": 1}


def launch(variant: str, workdir: pathlib.Path, overrides: dict[str, object]) -> dict:
    """One run of the recipe; returns its summary line and wall seconds."""
    return recipe_seeds.launch(CONFIG, variant, workdir, overrides, DEVICES[variant])


def train_records(workdir: pathlib.Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "train"]


def learn(args: argparse.Namespace, root: pathlib.Path) -> dict:
    seeds = [int(s) for s in args.seeds.split(",")]
    return recipe_seeds.learn(CONFIG, args.variants.split(","), seeds, root, DEVICES)


# (table key, metric): per step, from each run's train records (nan where a step has none).
COLUMNS = (
    ("disagreement", "moe/router_disagreement"),
    ("abs_logp", "mismatch/abs_logp"),
    ("abs_logp_forced", "moe/abs_logp_forced"),
    ("abs_logp_unforced", "moe/abs_logp_unforced"),
    ("flipped_tokens", "moe/flipped_tokens"),
    ("abs_logp_forced_flipped", "moe/abs_logp_forced/flipped"),
    ("abs_logp_unforced_flipped", "moe/abs_logp_unforced/flipped"),
)


def mismatch(args: argparse.Namespace, root: pathlib.Path) -> dict:
    overrides = {
        "sampling.dtype": "bfloat16",
        "num_steps": args.num_steps,
        "learner.decay_steps": args.num_steps,
        "moe.disagreement_every": 1,
        "eval_every": 0,
    }
    table: dict[str, dict[str, list[float]]] = {}
    for seed in map(int, args.seeds.split(",")):
        for replay in ("off", "rollout"):
            workdir = root / f"{replay}_{seed}"
            if not (args.reuse and (workdir / "metrics.jsonl").exists()):
                over = {**overrides, "seed": seed, "moe.router_replay": replay}
                launch(args.base, workdir, over)
            records = train_records(workdir)
            table[f"{replay}_{seed}"] = {
                key: [r.get(m, math.nan) for r in records] for key, m in COLUMNS
            }
        print(
            f"seed {seed}   replay off:     replay on:      replay on's batch, |logp|:"
            "\n           disagree |logp|  disagree |logp|  forced  unforced  "
            "flipped tokens: n, forced / unforced"
        )
        off, on = table[f"off_{seed}"], table[f"rollout_{seed}"]
        for step in range(len(off["abs_logp"])):
            print(
                f"  step {step:3d}  {off['disagreement'][step]:.4f} {off['abs_logp'][step]:.5f}"
                f"  {on['disagreement'][step]:.4f} {on['abs_logp'][step]:.5f}"
                f"  {on['abs_logp_forced'][step]:.5f} {on['abs_logp_unforced'][step]:.5f}"
                f"  {on['flipped_tokens'][step]:4.0f} {on['abs_logp_forced_flipped'][step]:.5f}"
                f" / {on['abs_logp_unforced_flipped'][step]:.5f}",
                flush=True,
            )
    return {"per_step": table, "summary": mismatch_summary(table)}


def _median(values: list[float]) -> float:
    """The median of the values that are numbers (a step with nothing to measure is nan)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def mismatch_summary(table: dict[str, dict[str, list[float]]]) -> dict:
    """Per-seed medians over steps and their median; the paired replay-on comparisons."""
    summary: dict[str, object] = {}
    for replay in ("off", "rollout"):
        runs = [v for name, v in table.items() if name.startswith(replay)]
        keys = [key for key, _ in COLUMNS] if replay == "rollout" else ["disagreement", "abs_logp"]
        for key in keys:
            per_seed = [_median(v[key]) for v in runs]
            summary[f"{replay}_{key}_median_of_seed_medians"] = _median(per_seed)
            summary[f"{replay}_{key}_seed_medians"] = per_seed
        summary[f"{replay}_steps_disagreeing"] = [
            sum(d > 0 for d in v["disagreement"]) for v in runs
        ]
        summary[f"{replay}_steps"] = [len(v["disagreement"]) for v in runs]
    on_runs = [v for name, v in table.items() if name.startswith("rollout")]
    # Paired, on the replay-on runs' batches (same batch, same params): per step with a flipped
    # token, the unforced over the forced mismatch over the flipped tokens and over all of them.
    flipped = [
        (free, forced)
        for v in on_runs
        for free, forced in zip(v["abs_logp_unforced_flipped"], v["abs_logp_forced_flipped"])
        if not math.isnan(free)
    ]
    overall = [
        (free, forced)
        for v in on_runs
        for free, forced, n in zip(
            v["abs_logp_unforced"], v["abs_logp_forced"], v["flipped_tokens"]
        )
        if n > 0
    ]
    for name, pairs in (("flipped", flipped), ("overall", overall)):
        ratios = [free / forced for free, forced in pairs if forced > 0]
        if ratios:
            summary[f"{name}_unforced_over_forced_median"] = statistics.median(ratios)
            summary[f"{name}_unforced_over_forced_range"] = [min(ratios), max(ratios)]
            summary[f"{name}_steps_unforced_above_forced"] = sum(f > g for f, g in pairs)
            summary[f"{name}_steps_forced_above_unforced"] = sum(f < g for f, g in pairs)
            summary[f"{name}_steps"] = len(pairs)
    return summary


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("learn", "mismatch"))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--variants", default="sync,eta2", help="learn: recipe variants")
    p.add_argument("--num_steps", type=int, default=30, help="mismatch: RL steps per run")
    p.add_argument("--base", default="sync", help="mismatch: the variant ('small': a smoke run)")
    p.add_argument("--workdir", default="", help="where the runs go (default: a temporary dir)")
    p.add_argument(
        "--reuse", action="store_true", help="mismatch: read runs already in --workdir again"
    )
    args = p.parse_args(argv)
    root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="moe_recipe_"))
    figures = learn(args, root) if args.what == "learn" else mismatch(args, root)
    figures["cpu"] = recipe_seeds.cpu_name()
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
