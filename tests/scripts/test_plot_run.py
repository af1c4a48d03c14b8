"""scripts/plot_run.py on synthetic metrics and a trace written by the real Timeline."""

import contextlib
import importlib.util
import io
import json
import pathlib
import sys

import numpy as np
import pytest

from rljax.metrics import Timeline

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plot():
    spec = importlib.util.spec_from_file_location("plot_run", REPO / "scripts/plot_run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _write_run(workdir: pathlib.Path, slope: float, *, trace: bool = True) -> None:
    workdir.mkdir(parents=True)
    records = [{"step": 0, "phase": "sft", "loss": 2.0}]
    records.append({"step": 0, "phase": "eval_initial", "heldout_accuracy": 0.1})
    for step in range(10):
        records.append(
            {
                "step": step,
                "phase": "train",
                "reward": 0.2 + slope * step,
                "staleness_hist": {"0": 3, "1": 1},
                "sampler_busy_s": 0.5,
            }
        )
    records.append({"step": 5, "phase": "eval", "heldout_accuracy": 0.3})
    records.append({"step": 10, "phase": "eval_final", "heldout_accuracy": 0.5})
    records.append({"step": 10, "phase": "summary", "final_accuracy": 0.5})
    (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    if trace:
        timeline = Timeline()
        for i in range(5):
            timeline.add("generate", i * 0.1, i * 0.1 + 0.08, track="sampler")
            timeline.add("reward", i * 0.1 + 0.08, i * 0.1 + 0.09, track="rewards")
            timeline.add("learn", i * 0.1 + 0.02, i * 0.1 + 0.07, track="learner")
        timeline.write(str(workdir / "trace.json"))


def _is_png(path: pathlib.Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_writes_both_pngs(plot, tmp_path):
    _write_run(tmp_path / "run", 0.05)
    with contextlib.redirect_stdout(io.StringIO()):
        written = plot.main([f"--workdir={tmp_path / 'run'}"])
    assert set(written) == {"rewards", "timeline"}
    assert all(_is_png(pathlib.Path(p)) for p in written.values())
    assert pathlib.Path(written["rewards"]).parent == tmp_path / "run"


def test_overlays_runs_into_out_dir(plot, tmp_path):
    _write_run(tmp_path / "sync", 0.02)
    _write_run(tmp_path / "async", 0.05, trace=False)
    out = tmp_path / "plots"
    with contextlib.redirect_stdout(io.StringIO()):
        written = plot.main(
            [f"--workdir={tmp_path / 'sync'}", f"--workdir={tmp_path / 'async'}", f"--out={out}"]
        )
    assert _is_png(out / "rewards.png") and _is_png(out / "timeline.png")
    assert written["timeline"] == str(out / "timeline.png")


def test_curves_pick_phases_and_last_record_wins(plot, tmp_path):
    _write_run(tmp_path / "run", 0.05, trace=False)
    records = plot.read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    records.append({"step": 9, "phase": "train", "reward": 0.0})  # a resumed run's rewrite
    c = plot.curves(records)
    steps, rewards = c["reward"]
    assert steps == list(range(10))
    np.testing.assert_allclose(rewards, [0.2 + 0.05 * s for s in range(9)] + [0.0])
    assert c["heldout_accuracy"] == ([0, 5, 10], [0.1, 0.3, 0.5])


def test_trace_events_from_timeline(plot, tmp_path):
    _write_run(tmp_path / "run", 0.05)
    events = plot.read_trace(str(tmp_path / "run" / "trace.json"))
    assert len(events) == 15 and {e["tid"] for e in events} == {"sampler", "rewards", "learner"}


def test_missing_trace_skips_timeline(plot, tmp_path):
    _write_run(tmp_path / "run", 0.05, trace=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        written = plot.main([f"--workdir={tmp_path / 'run'}"])
    assert set(written) == {"rewards"} and "skipping timeline.png" in buf.getvalue()


def test_bad_inputs_name_the_problem(plot, tmp_path):
    with pytest.raises(FileNotFoundError, match="pass the --workdir of a run"):
        plot.read_metrics(str(tmp_path / "nope" / "metrics.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0, "phase": "train"}\n{"step": 1, "pha\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not JSON .*truncated"):
        plot.read_metrics(str(bad))
    bad.write_text('{"reward": 1.0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1 has no 'step' and 'phase'"):
        plot.read_metrics(str(bad))
    with pytest.raises(ValueError, match="the trace has no 'X' events"):
        plot.plot_timeline([], str(tmp_path / "t.png"))
    (tmp_path / "t.json").write_text('{"traceEvents": 3}')
    with pytest.raises(ValueError, match="holds no traceEvents list"):
        plot.read_trace(str(tmp_path / "t.json"))


def test_reads_and_writes_a_gcs_workdir(plot, tmp_path):
    """A gs:// workdir (GCS emulator): metrics and trace read, both PNGs written there."""
    from rljax import io as rio
    from rljax.testing.filesystems import gcs_workdir

    _write_run(tmp_path / "run", 0.05)
    with gcs_workdir() as workdir:
        for name in ("metrics.jsonl", "trace.json"):
            rio.write_bytes(f"{workdir}/{name}", (tmp_path / "run" / name).read_bytes())
        with contextlib.redirect_stdout(io.StringIO()):
            written = plot.main([f"--workdir={workdir}"])
        assert written == {k: f"{workdir}/{k}.png" for k in ("rewards", "timeline")}
        assert all(rio.read_bytes(p)[:8] == b"\x89PNG\r\n\x1a\n" for p in written.values())


def test_a_mixture_of_experts_run_gets_its_routing_panels(plot, tmp_path):
    _write_run(tmp_path / "moe", 0.05, trace=False)
    path = tmp_path / "moe" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        if r["phase"] == "train":
            r |= {"moe/router_disagreement": 0.1, "mismatch/abs_logp": 0.01}
            r |= {"moe/load_max_over_mean": 1.5 + r["step"] / 10}
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with contextlib.redirect_stdout(io.StringIO()):
        written = plot.main([f"--workdir={tmp_path / 'moe'}"])
    assert _is_png(pathlib.Path(written["moe"]))
    assert plot.series(records, "moe/load_max_over_mean")[1][:2] == [1.5, 1.6]
    # A dense run gets no moe.png.
    _write_run(tmp_path / "dense", 0.05, trace=False)
    with contextlib.redirect_stdout(io.StringIO()):
        assert "moe" not in plot.main([f"--workdir={tmp_path / 'dense'}"])
