"""Lending vs every static split and the coarse reallocator, in the simulator.

  python scripts/sim_lending.py --config=configs/sim/lend_growing_v5p128.py
  python scripts/sim_lending.py --config=configs/sim/lend_verl_h20.py
  python scripts/sim_lending.py --config=configs/sim/lend_asyncflow64.py
  python scripts/sim_lending.py --config=configs/sim/lend_short.py
  (append :small to any of them for a quick run)

Every static split in ``c.lend.splits`` runs the workload in mode ``async``; the best of them
is the baseline measured in the same run. The coarse reallocator (mode ``realloc``) starts from
the best static split and from the middle one; lending (mode ``lend``, the policy in
``rljax.policy.lending``) runs on every static split. Prints each figure as a ratio against the
best static split and ends with one line holding a JSON object of all figures.
"""

from __future__ import annotations

import dataclasses
import json
import time

from absl import app
from ml_collections import config_flags

from rljax.policy.lending import LendingConfig
from rljax.sim import scenario
from rljax.sim.costs import CostModel
from rljax.sim.simulator import SimConfig, Simulator
from rljax.sim.workload import LengthModel

_CONFIG = config_flags.DEFINE_config_file("config", lock_config=True)

cost_model = scenario.cost_model


def sim_config(c, mode: str, sampler_chips: int, steps: int | None = None) -> SimConfig:
    """One run of the config's workload in ``mode`` on ``sampler_chips``, lending enabled with
    the config's overrides (only mode "lend" consults it)."""
    lending = LendingConfig(enabled=True, **c.lend.lending.to_dict())
    return scenario.sim_config(c, mode, sampler_chips, eta=c.lend.eta, steps=steps, lending=lending)


def timed(cfg: SimConfig, cost: CostModel, lengths: LengthModel):
    """Runs one simulation; returns it with its wall seconds."""
    start = time.perf_counter()
    result = Simulator(cfg, cost, lengths).run()
    return result, time.perf_counter() - start


def compare(c) -> dict:
    """Static splits, the reallocator and lending on one workload; figures as plain data."""
    cost = cost_model(c)
    lengths = scenario.length_model(c)
    splits = list(c.lend.splits)
    static, wall = {}, {}
    for n in splits:
        static[n], wall[f"static {n}"] = timed(sim_config(c, "async", n), cost, lengths)
        print(
            f"static {n}:{c.total_chips - n}: {static[n].samples_per_s:.3f} samples/s", flush=True
        )
    best_n = max(splits, key=lambda n: static[n].samples_per_s)
    best = static[best_n].samples_per_s
    realloc = {}
    for start in sorted({best_n, splits[len(splits) // 2]}):
        res, wall[f"realloc from {start}"] = timed(sim_config(c, "realloc", start), cost, lengths)
        realloc[start] = res
        print(f"realloc from {start}: {res.samples_per_s / best:.3f}x best static", flush=True)
    lend = {}
    for n in splits:
        res, wall[f"lend {n}"] = timed(sim_config(c, "lend", n), cost, lengths)
        lend[n] = res
        print(
            f"lend on {n}:{c.total_chips - n}: {res.samples_per_s / best:.3f}x best static "
            f"({res.samples_per_s / static[n].samples_per_s:.3f}x the same split), "
            f"lent steps {dict(res.lent_steps)}, {wall[f'lend {n}']:.1f} s wall",
            flush=True,
        )
    best_lend = max(splits, key=lambda n: lend[n].samples_per_s)
    return {
        "lending_costs": c.lend.lending.to_dict(),
        "costs_basis": c.lend.get("costs_basis", ""),
        "workload": c.name,
        "steps": c.steps,
        "chips": c.total_chips,
        "eta": c.lend.eta,
        "mean_response_tokens": round(lengths.mean(0)),
        "static_samples_per_s": {str(n): round(r.samples_per_s, 3) for n, r in static.items()},
        "best_static_split": best_n,
        "best_static_samples_per_s": round(best, 3),
        "realloc_vs_best_static": {
            str(n): round(r.samples_per_s / best, 3) for n, r in realloc.items()
        },
        "lend_vs_best_static": {str(n): round(r.samples_per_s / best, 3) for n, r in lend.items()},
        "lend_vs_same_split": {
            str(n): round(r.samples_per_s / static[n].samples_per_s, 3) for n, r in lend.items()
        },
        "lend_on_best_static_vs_best_static": round(lend[best_n].samples_per_s / best, 3),
        "best_lend_split": best_lend,
        "best_lend_vs_best_static": round(lend[best_lend].samples_per_s / best, 3),
        "lent_steps_on_best_static": dict(lend[best_n].lent_steps),
        "wall_s": {k: round(v, 1) for k, v in wall.items()},
    }


def perf(c) -> dict:
    """The timed pod-scale lending run (``c.lend.perf_steps`` steps on the middle split)."""
    cost = cost_model(c)
    lengths = scenario.length_model(c)
    split = list(c.lend.splits)[len(c.lend.splits) // 2]
    cfg = dataclasses.replace(sim_config(c, "lend", split, c.lend.perf_steps), timeline=False)
    cpu = time.process_time()
    res, wall = timed(cfg, cost, lengths)
    return {
        "steps": c.lend.perf_steps,
        "chips": c.total_chips,
        "samples": res.samples,
        "lent_steps": dict(res.lent_steps),
        "wall_s": round(wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def main(argv) -> None:
    del argv
    c = _CONFIG.value
    print(f"loan costs: {c.lend.lending.to_dict()} ({c.lend.get('costs_basis', '')})", flush=True)
    figures = compare(c)
    if c.lend.perf_steps:
        figures["perf"] = perf(c)
        print("perf:", figures["perf"])
    print(
        f"{c.name}: best static {figures['best_static_split']}:"
        f"{c.total_chips - figures['best_static_split']}; lending on it "
        f"{figures['lend_on_best_static_vs_best_static']}x, best lending "
        f"{figures['best_lend_vs_best_static']}x (on {figures['best_lend_split']}), "
        f"reallocator {figures['realloc_vs_best_static']}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    app.run(main)
