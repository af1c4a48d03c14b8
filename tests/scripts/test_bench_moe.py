"""Smoke test of scripts/bench_moe.py at its tiny shapes, never its timings: every figure is
present, the last line is their JSON, the baselines compute what they stand in for (dense
experts equal the sorted ones; the dense decode model has the mixture's active parameters), and
the sizes that do not depend on speed are exact."""

import contextlib
import importlib.util
import io
import json
import pathlib

import numpy as np

from rljax.models import moe, presets
from rljax.sim.measured import tiny_preset
from tests.scripts.quotients import assert_quotient

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_moe", REPO / "scripts/bench_moe.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


H = 0.5e-4  # the figures are rounded to 4 decimals


def _is_ratio(got, num, den, num_h=H):
    """``got`` is ``num / den``, each of the three rounded to 4 decimals (``den`` > ``H``)."""
    assert_quotient(got, num, den, num_half=num_h, den_half=H, ratio_half=H)


def test_figures_and_exact_sizes():
    bench = _bench()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick", "--repeats", "1", "--iters", "1"])
    assert json.loads(buf.getvalue().strip().splitlines()[-1]) == json.loads(json.dumps(figures))
    assert isinstance(figures["cpu_model"], str)
    tokens, d, e, k, f = bench.QUICK_LAYER
    layer = figures["layer"]
    assert layer["active_flops"] == 6 * tokens * k * 3 * d * f
    for key in ("fraction", "speedup", "sorted_s", "dense_s", "sgemm_flops"):
        assert layer[key]["min"] <= layer[key]["median"] <= layer[key]["max"], key
        assert layer[key]["median"] > 0
    # One repeat: each ratio is of the times measured beside it in the same run.
    med = {key: v["median"] for key, v in layer.items() if isinstance(v, dict) and "median" in v}
    _is_ratio(med["speedup"], med["dense_s"], med["sorted_s"])
    _is_ratio(med["over_ragged_dot"], med["ragged_dot_s"], med["sorted_s"])
    active_over_peak = layer["active_flops"] / med["sgemm_flops"]  # the peak rounded to 1 FLOP/s
    _is_ratio(med["fraction"], active_over_peak, med["sorted_s"], num_h=1e-9 * active_over_peak)
    decode = figures["decode"]
    assert decode["layouts"]["moe"] == "stacked" and decode["layouts"]["dense_stacked"] == "stacked"
    assert decode["moe"]["median"] > 0 and decode["moe_over_dense"]["median"] > 0
    for base in ("dense", "dense_stacked"):
        _is_ratio(
            decode[f"moe_over_{base}"]["median"], decode["moe"]["median"], decode[base]["median"]
        )
    crossover = figures["crossover"]
    assert [row["pairs"] for row in crossover["table"]] == list(bench.QUICK_PAIRS)
    assert crossover["gather_max_pairs"] == moe.GATHER_MAX_PAIRS


def test_dense_baseline_computes_the_sorted_experts():
    bench = _bench()
    x, ids, weights, w = bench.layer_inputs(64, 32, 8, 2, 16)
    want = moe.experts_sorted(x, ids, weights, *w, impl="xla")
    got = bench.dense_experts(x, ids, weights, *w)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * scale)
    gathered = moe.experts_gathered(x[:3], ids[:3], weights[:3], *w)
    np.testing.assert_allclose(np.asarray(gathered), np.asarray(want[:3]), atol=1e-5 * scale)


def test_the_dense_decode_model_has_the_mixtures_active_parameters():
    for quick in (True, False):
        mixture, dense = _bench().decode_models(quick)
        router = mixture.num_layers * mixture.hidden_size * mixture.num_experts
        active = presets.active_param_count(tiny_preset(mixture))
        assert active == presets.param_count(tiny_preset(dense)) + router
