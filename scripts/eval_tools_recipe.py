"""Runs configs/arith_tools.py and its control on several seeds: held-out gain over the warm start.

    python scripts/eval_tools_recipe.py --seeds=0,1,2,3,4

Each seed is a whole run (``seed`` overridden: it draws the model's initialisation, the prompt
order and the train / held-out split). The recipe was written and run once on seed 0, not tuned
on any seed. The control is the same run with a blind tool (``:control``, env 'lookup_blind':
the lookup answers nothing), so any gain it shows does not come from what the env returns.
Prints one line per run and ends with one JSON line: per variant and seed the accuracy after the
warm start and after RL, the gain in points, the last step's turns per conversation, and the
median and range of the gains.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

from rljax.configs import arith_tools

from rljax.config import replace
from rljax.runtime import Run


def one_run(variant: str, seed: int) -> dict:
    cfg = replace(arith_tools.recipe(variant), seed=seed, **{"metrics.progress_bar": False})
    with tempfile.TemporaryDirectory() as workdir:
        run = Run(cfg, workdir)
        try:
            summary = run.train()
        finally:
            run.close()
    out = {
        "initial": summary["initial_accuracy"],
        "final": summary["final_accuracy"],
        "gain_points": 100 * (summary["final_accuracy"] - summary["initial_accuracy"]),
        "turns_per_conversation": summary["last"].get("turns_per_conversation"),
        "wall_s": summary["wall_s"],
    }
    print(f"{variant or 'main'} seed {seed}: {out}", flush=True)
    return out


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--variants", default="main,control")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    figures: dict = {}
    for name in args.variants.split(","):
        runs = {seed: one_run("" if name == "main" else name, seed) for seed in seeds}
        gains = [r["gain_points"] for r in runs.values()]
        figures[name] = {
            "runs": runs,
            "gain_median": statistics.median(gains),
            "gain_range": [min(gains), max(gains)],
        }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
