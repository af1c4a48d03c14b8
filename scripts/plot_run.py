"""Plots a run's reward curves and its phase timeline.

    python scripts/plot_run.py --workdir=/tmp/run1
    python scripts/plot_run.py --workdir=/tmp/sync --workdir=/tmp/async --out=/tmp/plots

Reads ``<workdir>/metrics.jsonl`` (one record per line with ``step`` and ``phase``: 'train'
records carry ``reward``, the eval phases 'eval', 'eval_initial' and 'eval_final' carry
``heldout_accuracy``) and writes ``rewards.png``: training reward and held-out accuracy
against the step, one line per workdir, labelled by its folder name, so runs overlay for
comparison. Reads ``<workdir>/trace.json`` (Chrome trace events from rljax.metrics.Timeline:
'X' events with name, ts and dur in microseconds, tid = track) and writes ``timeline.png``:
one row per track, spans coloured by name. With several workdirs the timeline is the first
one's. A mixture-of-experts run (its train records carry ``moe/*``) also gets ``moe.png``: the
router disagreement, the log-prob mismatch and the expert load against the step, per run.
``--out`` defaults to the first workdir. Workdirs and ``--out`` may be ``gs://`` URLs
(every file goes through rljax.io).
"""

from __future__ import annotations

import argparse
import io as stdio
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display on a TPU VM or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from rljax import io  # noqa: E402

EVAL_PHASES = ("eval_initial", "eval", "eval_final")


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl file; a bad line raises naming the file and line."""
    if not io.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist; pass the --workdir of a run (it writes metrics.jsonl)"
        )
    records = []
    for n, line in enumerate(io.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            problem = f"{path}:{n} is not JSON ({e.msg}); is the file truncated?"
            raise ValueError(problem) from None
        if not isinstance(record, dict) or "step" not in record or "phase" not in record:
            raise ValueError(f"{path}:{n} has no 'step' and 'phase'; not an rljax metrics file")
        records.append(record)
    return records


def curves(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """``{'reward': (steps, values), 'heldout_accuracy': (steps, values)}`` sorted by step.

    A resumed run appends to the same file and may repeat steps; the last record wins.
    """
    out = {}
    for key, phases in (("reward", ("train",)), ("heldout_accuracy", EVAL_PHASES)):
        by_step = {
            r["step"]: float(r[key])
            for r in records
            if r["phase"] in phases and r.get(key) is not None
        }
        steps = sorted(by_step)
        out[key] = (steps, [by_step[s] for s in steps])
    return out


# moe.png's panels: (metric, title), one line per run.
MOE_PANELS = (
    ("moe/router_disagreement", "router disagreement (learner vs sampler top-k)"),
    ("mismatch/abs_logp", "log-prob mismatch, mean |log p_learner - log p_sampler|"),
    ("moe/load_max_over_mean", "expert load, max over mean"),
)


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """A train metric against the step (the last record of a step wins)."""
    by_step = {r["step"]: float(r[key]) for r in records if r["phase"] == "train" and key in r}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plot_moe(runs: dict[str, list[dict]], out_path: str) -> None:
    """The mixture-of-experts panels: routing mismatch and load against the step."""
    fig, axes = plt.subplots(1, len(MOE_PANELS), figsize=(15, 4))
    for ax, (key, title) in zip(axes, MOE_PANELS):
        for label, records in runs.items():
            ax.plot(*series(records, key), marker=".", label=label)
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    _save(fig, out_path)
    plt.close(fig)


def read_trace(path: str) -> list[dict]:
    """The complete ('X') events of a Chrome trace file."""
    data = json.loads(io.read_text(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path} holds no traceEvents list; pass a Timeline.write() file")
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def plot_rewards(runs: dict[str, list[dict]], out_path: str) -> None:
    """Reward and held-out accuracy against the step, one line per run."""
    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    for label, records in runs.items():
        c = curves(records)
        ax_r.plot(*c["reward"], label=label)
        ax_a.plot(*c["heldout_accuracy"], marker="o", label=label)
    ax_r.set(title="training reward", xlabel="step", ylabel="mean reward")
    ax_a.set(title="held-out accuracy", xlabel="step", ylabel="accuracy")
    for ax in (ax_r, ax_a):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    _save(fig, out_path)
    plt.close(fig)


def plot_timeline(events: list[dict], out_path: str) -> None:
    """One row per track; each span a bar from ts to ts + dur, coloured by its name."""
    if not events:
        raise ValueError("the trace has no 'X' events; was metrics.trace on for the run?")
    tracks = sorted({str(e["tid"]) for e in events})
    names = sorted({e["name"] for e in events})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colour = {name: cmap(i % cmap.N) for i, name in enumerate(names)}
    t0 = min(e["ts"] for e in events)
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(tracks)))
    for row, track in enumerate(tracks):
        for name in names:
            spans = [
                ((e["ts"] - t0) / 1e6, e["dur"] / 1e6)
                for e in events
                if str(e["tid"]) == track and e["name"] == name
            ]
            if spans:
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour[name])
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_xlabel("seconds")
    ax.legend(handles=[Patch(color=colour[n], label=n) for n in names], loc="upper right")
    fig.tight_layout()
    _save(fig, out_path)
    plt.close(fig)


def _save(fig, out_path: str) -> None:
    """Renders ``fig`` as PNG bytes and writes them through rljax.io (local or gs://)."""
    buffer = stdio.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    io.write_bytes(out_path, buffer.getvalue())


def main(argv: list[str] | None = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", action="append", required=True, help="a run's workdir; repeat")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: first workdir)")
    args = p.parse_args(argv)
    out = args.out or args.workdir[0]
    io.makedirs(out)
    runs = {}
    for workdir in args.workdir:
        label = io.path(workdir).name
        if label in runs:
            label = workdir  # two runs share a folder name: tell them apart by path
        runs[label] = read_metrics(str(io.join(workdir, "metrics.jsonl")))
    written = {"rewards": str(io.join(out, "rewards.png"))}
    plot_rewards(runs, written["rewards"])
    if any(series(r, "moe/load_max_over_mean")[0] for r in runs.values()):
        written["moe"] = str(io.join(out, "moe.png"))
        plot_moe(runs, written["moe"])
    trace = str(io.join(args.workdir[0], "trace.json"))
    if io.exists(trace):
        written["timeline"] = str(io.join(out, "timeline.png"))
        plot_timeline(read_trace(trace), written["timeline"])
    else:
        print(f"no {trace}; skipping timeline.png (set metrics.trace to record one)")
    for path in written.values():
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
