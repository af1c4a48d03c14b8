"""Smoke test of scripts/bench_pipeline.py: the --quick run in-process, never its timings.

Rates are wall-time figures on a shared machine, so only their presence, types, consistency
with each other and the printed JSON line are checked.
"""

import contextlib
import importlib.util
import io
import json
import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    path = REPO / "scripts/bench_pipeline.py"
    spec = importlib.util.spec_from_file_location("bench_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(bench):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick", "--seeds=0"])
    return buf.getvalue().strip().splitlines(), figures


def test_last_line_is_json_of_all_figures(quick_run):
    lines, figures = quick_run
    assert json.loads(lines[-1]) == json.loads(json.dumps(figures))
    assert any("async eta=" in line for line in lines)


def test_figures_are_consistent(quick_run, bench):
    _, f = quick_run
    assert f["quick"] is True and f["steps"] == bench.QUICK.steps and f["seeds"] == [0]
    (w,) = f["workloads"].values()
    assert set(w["async"]) == {str(eta) for eta in bench.ETAS}
    assert w["ideal_steps_per_s"] == min(
        w["sampler_limit_steps_per_s"], w["learner_limit_steps_per_s"]
    )
    sync = w["sync_steps_per_s"]["median"]
    for row in w["async"].values():
        of_ideal, vs_sync = row["of_ideal"]["median"], row["vs_sync"]["median"]
        assert math.isclose(of_ideal, row["steps_per_s"]["median"] / w["ideal_steps_per_s"])
        assert math.isclose(vs_sync, row["steps_per_s"]["median"] / sync)
        assert 0 < row["slot_occupancy"]["median"] <= 1
        # Sorting minimises the steps' summed longest groups: the drawn order's floor is lower.
        assert 0 < row["staleness_bound_in_order_of_ideal"] <= row["staleness_bound_of_ideal"]
        assert 0 <= row["multi_version_fraction"]["median"] <= 1
        # Every consumed trajectory after the warm-up is in the staleness histogram, by group.
        consumed = (bench.QUICK.steps - bench.QUICK.warmup - 1) * bench.QUICK.batch_groups
        assert sum(row["staleness_hist"].values()) == consumed
    assert set(w["async"]["0"]["staleness_hist"]) == {"0"}  # eta = 0 is on-policy
    assert f["host_overhead_us_per_trajectory"] > 0 and f["host_cpu_us_per_trajectory"] > 0
    assert f["trajectories_per_step"] == bench.QUICK.batch_groups * bench.QUICK.group_size
    assert (
        set(f["lending"]) == {w.name for w in bench.LEND_QUICK} == {w.name for w in bench.LENDING}
    )
    agents = f["agents"]  # (e): conversations waiting for tools, async eta 2 vs sync
    assert set(agents) == {"sync", "async_eta2", "async_vs_sync"}
    for row in agents.values():
        assert row["range"][0] <= row["median"] <= row["range"][1]
    assert math.isclose(  # one seed: the median ratio is the ratio of the medians
        agents["async_vs_sync"]["median"],
        agents["async_eta2"]["median"] / agents["sync"]["median"],
    )
    for row in f["lending"].values():
        assert row["ratio_range"][0] <= row["ratio"] <= row["ratio_range"][1]
        assert row["simulator_range"][0] <= row["simulator_ratio"] <= row["simulator_range"][1]
        assert row["off_samples_per_s"] > 0 and row["on_samples_per_s"] > 0
        # One seed: each ratio is lending on over off, both measured in this run.
        assert math.isclose(row["ratio"], row["on_samples_per_s"] / row["off_samples_per_s"])
        sim_on, sim_off = row["simulator_on_samples_per_s"], row["simulator_off_samples_per_s"]
        assert math.isclose(row["simulator_ratio"], sim_on / sim_off)
        assert len(row["lent_steps"]) == 1  # one record per seed


def test_limits_are_the_cost_model_at_full_occupancy(bench):
    """Fixed lengths (sigma 0): the limits by hand, not the driver's throttled rates."""
    w = bench.dataclasses.replace(bench.QUICK, sigma=0.0, median_len=10, max_len=64)
    sampler, learner = w.limits()
    trajectories = w.batch_groups * w.group_size
    per_step_s = w.decode_s + w.decode_per_slot_s * w.slots
    assert sampler == pytest.approx(w.slots / per_step_s / (trajectories * 10))
    cost = w.learn_fixed_s + w.learn_per_token_s * trajectories * (w.prompt_len + 10) + w.sync_s
    assert learner == pytest.approx(1 / cost)


def test_too_few_steps_is_rejected(bench):
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        bench.main(["--quick", "--steps=2"])
    assert "--steps=2 must exceed warmup + 1 = 3" in err.getvalue()


def test_steady_rate_needs_steps_past_warmup(bench):
    assert bench._steady_rate([0.0, 1.0, 2.0, 4.0], 1) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="raise --steps"):
        bench._steady_rate([0.0, 1.0], 1)
