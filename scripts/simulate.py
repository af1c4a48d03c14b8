"""Compares sync colocated, async static split and async with reallocation in the simulator.

  python scripts/simulate.py --config=configs/sim/pod_compare.py[:small]
  python scripts/simulate.py --config=configs/sim/verl_async_h20.py
  python scripts/simulate.py --config=configs/sim/growing_v5p128.py

Prints throughput ratios against the sync colocated baseline measured in the same run, the
gain of reallocation over the best static split, the validation table when the config has one
(every published per-step figure, its prediction and signed error: rljax.sim.validation), and
ends with one line holding a JSON object of all figures.
"""

from __future__ import annotations

import dataclasses
import json
import time

from absl import app
from ml_collections import config_flags

from rljax.sim import scenario, validation
from rljax.sim.costs import CostModel
from rljax.sim.simulator import SimConfig, Simulator
from rljax.sim.workload import LengthModel

_CONFIG = config_flags.DEFINE_config_file("config", lock_config=True)


_cost = scenario.cost_model


def _lengths(c, tail: float, **overrides) -> LengthModel:
    return scenario.length_model(c, **{"tail_prob": tail, **overrides})


def _sim_config(c, mode: str, eta: int, sampler_chips: int, steps: int | None = None):
    return scenario.sim_config(c, mode, sampler_chips, eta=eta, steps=steps, timeline=bool(c.plot))


def _splits(c, cost: CostModel) -> list[int]:
    unit = max(cost.tp, cost.chip.chips_per_host)
    chips = {max(unit, round(f * c.total_chips / unit) * unit) for f in c.sampler_fractions}
    return sorted(n for n in chips if n < c.total_chips)


def _run(cfg: SimConfig, cost: CostModel, lengths: LengthModel):
    return Simulator(cfg, cost, lengths).run()


def sweep(c, cost: CostModel) -> tuple[list[dict], dict]:
    """Runs the eta x tail matrix; returns rows and the results used for plotting."""
    rows, for_plot = [], {}
    splits = _splits(c, cost)
    for tail in c.tails:
        lengths = _lengths(c, tail)
        sync = _run(_sim_config(c, "sync", 0, c.total_chips), cost, lengths)
        for eta in c.etas:
            static = {n: _run(_sim_config(c, "async", eta, n), cost, lengths) for n in splits}
            best_n = max(static, key=lambda n: static[n].samples_per_s)
            start = splits[len(splits) // 2]
            realloc = _run(_sim_config(c, "realloc", eta, start), cost, lengths)
            rows.append(
                {
                    "tail": tail,
                    "eta": eta,
                    "sync_step_s": round(sync.step_s, 2),
                    "best_static_split": best_n,
                    "best_static_vs_sync": round(
                        static[best_n].samples_per_s / sync.samples_per_s, 3
                    ),
                    "realloc_vs_sync": round(realloc.samples_per_s / sync.samples_per_s, 3),
                    "realloc_vs_best_static": round(
                        realloc.samples_per_s / static[best_n].samples_per_s, 3
                    ),
                    "realloc_moves": len(realloc.moves),
                    "realloc_final_split": list(realloc.final_split),
                    "mean_staleness": realloc.summary()["mean_staleness"],
                }
            )
            for_plot = {"sync": sync, f"async {best_n}": static[best_n], "realloc": realloc}
    return rows, for_plot


def _timed_run(cfg: SimConfig, cost: CostModel, lengths: LengthModel):
    """Runs one simulation; returns it with its (wall, CPU) seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    res = _run(cfg, cost, lengths)
    return res, (time.perf_counter() - wall, time.process_time() - cpu)


def growth_gain(c, cost: CostModel) -> dict:
    """Reallocation vs the best static split when response lengths grow over training.

    Every static split in ``c.growth.splits`` (default: the sweep's) runs the same workload;
    reallocation starts from each split in ``c.growth.starts`` (default: the smallest).
    """
    g = c.growth
    overrides = dict(median=g.median, growth=g.growth, growth_steps=c.steps)
    overrides.update({k: g[k] for k in ("sigma", "max_tokens") if k in g})
    lengths = _lengths(c, g.tail, **overrides)
    splits = list(g.splits) if "splits" in g else _splits(c, cost)
    static, cpu = {}, {}
    for n in splits:
        static[n], cpu[f"static {n}"] = _timed_run(_sim_config(c, "async", g.eta, n), cost, lengths)
        print(
            f"static {n}:{c.total_chips - n}: {static[n].samples_per_s:.3f} samples/s, "
            f"{cpu[f'static {n}'][0]:.1f} s wall ({cpu[f'static {n}'][1]:.1f} s CPU)",
            flush=True,
        )
    best_n = max(static, key=lambda n: static[n].samples_per_s)
    runs = {}
    for start in list(g.starts) if "starts" in g else [min(static)]:
        res, cpu[f"realloc from {start}"] = _timed_run(
            _sim_config(c, "realloc", g.eta, start), cost, lengths
        )
        runs[start] = res
        print(
            f"realloc from {start}: {res.samples_per_s:.3f} samples/s, "
            f"moves {[m[1] for m in res.moves]}, {cpu[f'realloc from {start}'][0]:.1f} s wall "
            f"({cpu[f'realloc from {start}'][1]:.1f} s CPU)",
            flush=True,
        )
    best = static[best_n].samples_per_s
    figures = {
        "mean_response_tokens": [round(lengths.mean(v)) for v in (0, c.steps // 2, c.steps)],
        "static_samples_per_s": {str(n): round(r.samples_per_s, 3) for n, r in static.items()},
        "best_static_split": best_n,
        "best_static_samples_per_s": round(best, 3),
        "realloc": [
            {
                "start_split": start,
                "samples_per_s": round(res.samples_per_s, 3),
                "vs_best_static": round(res.samples_per_s / best, 3),
                "moves": [[round(m[0]), m[1]] for m in res.moves],
            }
            for start, res in runs.items()
        ],
        "wall_s": {k: round(v[0], 1) for k, v in cpu.items()},
        "cpu_s": {k: round(v[1], 1) for k, v in cpu.items()},
        "switch_cost_s": round(
            Simulator(
                _sim_config(c, "realloc", g.eta, best_n), cost, lengths
            ).estimated_switch_cost_s(),
            1,
        ),
    }
    if g.get("plot"):
        try:
            plot_growth(static, runs, c.total_chips, g.plot)
            figures["plot"] = g.plot
        except ImportError:
            print("matplotlib is not installed; skipping the growth plot")
    return figures


def plot_growth(static: dict, runs: dict, total: int, path: str) -> None:
    """Throughput of every static split and of reallocation, and reallocation's split over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    splits = sorted(static)
    left.plot(splits, [static[n].samples_per_s for n in splits], "o-", label="static split")
    for start, res in runs.items():
        left.axhline(res.samples_per_s, ls="--", color="tab:red", alpha=0.6)
        left.annotate(f"realloc from {start}", (splits[0], res.samples_per_s), fontsize=8)
        times = [0.0] + [m[0] for m in res.moves] + [res.wall_s]
        chips = [start] + [m[1] for m in res.moves]
        right.step(
            times[:-1] + [times[-1]], chips + [chips[-1]], where="post", label=f"from {start}"
        )
    left.set_xlabel(f"sampler chips (of {total})")
    left.set_ylabel("samples/s over the run")
    right.set_xlabel("simulated seconds")
    right.set_ylabel("sampler chips")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def validate(c) -> dict:
    """Fits to one published run's per-phase times, predicts every other published per-step
    figure without refitting, prints the table of all of them (signed errors, phase errors),
    then the band over the unpublished settings (``c.validation.knobs``)."""
    fitted, fit_figures = validation.fit(c)
    print("fitted:", fit_figures, flush=True)
    rows = validation.score(c, validation.predict(c, fitted))
    print(validation.table(rows), flush=True)
    bands, settings = validation.band(c, fitted, rows)
    for row in settings:
        print("band:", row, flush=True)
    return {
        "fit_to": dict(c.validation.fit),
        "fitted": fit_figures,
        "figures": [
            {
                **dataclasses.asdict(r),
                "error": round(r.error, 4),
                "band": [round(x, 3) for x in bands[(r.system, r.figure)]],
            }
            for r in rows
        ],
        "band_settings": settings,
    }


def plot(results: dict, path: str) -> None:
    """Draws one timeline panel per mode (first 15% of the run) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"decode": "tab:blue", "train": "tab:orange", "sync": "tab:green", "switch": "red"}
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 3 * len(results)), squeeze=False)
    for ax, (label, res) in zip(axes[:, 0], results.items()):
        horizon = res.wall_s * 0.15
        lanes = sorted({s.lane for s in res.spans if s.role == "sampler"})
        row = {lane: i + 1 for i, lane in enumerate(lanes)}
        for span in res.spans:
            if span.start > horizon:
                continue
            y = 0 if span.role == "learner" else row[span.lane]
            width = min(span.end, horizon) - span.start
            ax.broken_barh([(span.start, width)], (y, 0.8), color=colors[span.kind])
        ax.set_title(f"{label}: {res.samples_per_s:.1f} samples/s")
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("learner (0) / sampler replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv) -> None:
    del argv
    c = _CONFIG.value
    cost = _cost(c)
    figures: dict = {"config": c.name}
    if c.validation.enabled:
        figures["validation"] = validate(c)
    if c.tails and c.etas:
        rows, for_plot = sweep(c, cost)
        for row in rows:
            print(row)
        figures["sweep"] = rows
        if c.plot:
            try:
                plot(for_plot, c.plot)
                figures["plot"] = c.plot
            except ImportError:
                print("matplotlib is not installed; skipping the timeline plot")
    if c.growth.median > 0:
        figures["growing_lengths"] = growth_gain(c, cost)
        print("growing lengths:", figures["growing_lengths"])
    if c.perf_steps:
        # Simulator speed: one pod-scale realloc run, timed against the simulated wall clock.
        cfg = dataclasses.replace(
            _sim_config(c, "realloc", max(c.etas), _splits(c, cost)[0], c.perf_steps),
            timeline=False,
        )
        start = time.perf_counter()
        res = _run(cfg, cost, _lengths(c, max(c.tails)))
        elapsed = time.perf_counter() - start
        figures["perf"] = {
            "steps": c.perf_steps,
            "chips": c.total_chips,
            "samples": res.samples,
            "cpu_s": round(elapsed, 2),
            "simulated_s_per_cpu_s": round(res.wall_s / elapsed, 1),
        }
        print("perf:", figures["perf"])
    print(json.dumps(figures))


if __name__ == "__main__":
    app.run(main)
