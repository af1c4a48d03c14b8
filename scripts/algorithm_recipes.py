"""The recipes of the estimators beyond GRPO over seeds: what each learns (docs/algorithms.md).

    python scripts/algorithm_recipes.py ppo --seeds=0,1,2,3,4 --variants=sync,eta2
    python scripts/algorithm_recipes.py opd --seeds=0,1,2,3,4

``ppo`` launches configs/arith_ppo.py (GAE with a critic) once per seed and variant, each as its
own process (eta2 on 8 CPU devices, as its docstring says), and reports the held-out accuracy
after the warm start and at the end, the gain in points, the most staleness a trained token had,
and the wall seconds (meaningful only on an otherwise idle machine).

``opd`` is configs/arith_opd.py's one command. Per seed it trains the teacher (the default
recipe, configs/arith_tiny.py, with that seed and its checkpoints kept; reused when its workdir
holds them), then the student twice from the same warm start: distilled on-policy from that
teacher (``:opd``) and by GRPO on the exact-match reward (``:grpo``), both evaluated every
``--eval_every`` steps on the seed's held-out set, the teacher's. It prints both curves, and the
first evaluated step at which each reached 90 % of the teacher's held-out accuracy.

Both end with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import recipe_seeds  # scripts/recipe_seeds.py, beside this file

DEVICES = {"sync": 1, "eta2": 8, "small": 1, "opd": 1, "grpo": 1, "": 1}


def launch(config: str, variant: str, workdir: pathlib.Path, overrides: dict) -> dict:
    """One run; returns its summary line and wall seconds."""
    return recipe_seeds.launch(config, variant, workdir, overrides, DEVICES[variant])


def records(workdir: pathlib.Path, phase: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == phase]


def curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of every evaluation, the warm start's at step 0."""
    out = []
    for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()):
        if "heldout_accuracy" in r:
            out.append((int(r["step"]), float(r["heldout_accuracy"])))
    return sorted(set(out))


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def ppo(args: argparse.Namespace, root: pathlib.Path) -> dict:
    runs = []
    for variant in args.variants.split(","):
        for seed in map(int, args.seeds.split(",")):
            workdir = root / f"ppo_{variant}_{seed}"
            s = launch("configs/arith_ppo.py", variant, workdir, {"seed": seed})
            gain = 100 * (s["final_accuracy"] - s["initial_accuracy"])
            stale = max((r.get("staleness_max", 0) for r in records(workdir, "train")), default=0)
            runs.append(
                {
                    "variant": variant,
                    "seed": seed,
                    "gain_points": round(gain, 1),
                    "staleness_max": stale,
                    **s,
                }
            )
            print(
                f"{variant:5s} seed {seed}: {100 * s['initial_accuracy']:.1f}% -> "
                f"{100 * s['final_accuracy']:.1f}% ({gain:+.1f} points), staleness <= {stale}, "
                f"{s['process_wall_s']:.0f} s",
                flush=True,
            )
    by_variant = {}
    for variant in args.variants.split(","):
        mine = [r for r in runs if r["variant"] == variant]
        by_variant[variant] = {
            "gain": _spread([r["gain_points"] for r in mine]),
            "wall_s": _spread([r["process_wall_s"] for r in mine]),
            "staleness_max": max(r["staleness_max"] for r in mine),
        }
    return {"runs": runs, "by_variant": by_variant}


def first_at(points: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose accuracy reached ``target`` (None: never)."""
    return next((step for step, acc in points if acc >= target), None)


def opd(args: argparse.Namespace, root: pathlib.Path) -> dict:
    runs = []
    over = {"eval_every": args.eval_every, "metrics.progress_bar": False}
    for seed in map(int, args.seeds.split(",")):
        teacher = root / f"teacher_{seed}"
        if not (teacher / "checkpoints").is_dir():
            launch(
                "configs/arith_tiny.py",
                "",
                teacher,
                {"seed": seed, "checkpoint.enabled": True, "metrics.progress_bar": False},
            )
        teacher_acc = curve(teacher)[-1][1]
        target = args.fraction * teacher_acc
        row: dict = {"seed": seed, "teacher_accuracy": teacher_acc, "target": target}
        for variant in ("opd", "grpo"):
            workdir = root / f"{variant}_{seed}"
            extra = {"teacher.init": teacher} if variant == "opd" else {}
            s = launch("configs/arith_opd.py", variant, workdir, {"seed": seed, **over, **extra})
            points = curve(workdir)
            row[variant] = {
                "final_accuracy": s["final_accuracy"],
                "initial_accuracy": s["initial_accuracy"],
                "steps_to_target": first_at(points, target),
                "curve": points,
                "process_wall_s": s["process_wall_s"],
            }
        runs.append(row)
        o, g = row["opd"], row["grpo"]
        print(
            f"seed {seed}: teacher {100 * teacher_acc:.1f}%, target {100 * target:.1f}%; "
            f"student start {100 * o['initial_accuracy']:.1f}%\n"
            f"  opd : end {100 * o['final_accuracy']:.1f}% "
            f"({100 * o['final_accuracy'] / teacher_acc:.0f}% of the teacher), "
            f"target at step {o['steps_to_target']}\n"
            f"  grpo: end {100 * g['final_accuracy']:.1f}%, target at step {g['steps_to_target']}",
            flush=True,
        )
        for (step, a), (_, b) in zip(o["curve"], g["curve"], strict=False):
            print(f"    step {step:4d}  opd {100 * a:5.1f}%  grpo {100 * b:5.1f}%")
    ratio = [r["opd"]["final_accuracy"] / r["teacher_accuracy"] for r in runs]

    def steps(variant: str) -> list[float]:
        n = args.num_steps_cap
        return [r[variant]["steps_to_target"] or n for r in runs]

    summary = {
        "opd_fraction_of_teacher": _spread(ratio),
        "opd_steps_to_target": _spread(steps("opd")),
        "grpo_steps_to_target": _spread(steps("grpo")),
        "opd_fewer_steps_seeds": sum(
            (r["opd"]["steps_to_target"] or 10**9) < (r["grpo"]["steps_to_target"] or 10**9)
            for r in runs
        ),
    }
    print(json.dumps(summary))
    return {"runs": runs, "summary": summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("ppo", "opd"))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--variants", default="sync", help="ppo: sync, eta2 and/or small")
    p.add_argument("--eval_every", type=int, default=5, help="opd: evaluations of the curves")
    p.add_argument("--fraction", type=float, default=0.9, help="opd: of the teacher's accuracy")
    p.add_argument("--num_steps_cap", type=int, default=150, help="opd: a target never reached")
    p.add_argument("--root", default="/tmp/rljax/algorithm_recipes")
    args = p.parse_args()
    root = pathlib.Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    out = ppo(args, root) if args.what == "ppo" else opd(args, root)
    print(json.dumps(out, separators=(",", ":")), file=sys.stdout)


if __name__ == "__main__":
    main()
