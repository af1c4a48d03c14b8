"""Smoke test of scripts/bench_learner.py: one --quick run in-process, never its timings.

The figures are ratios of wall times on a shared machine, so only their presence and the
invariants that do not depend on speed are checked: both sides start from the same weights
and batch, so their losses agree before and after one update, whatever the layer unroll.
"""

import contextlib
import importlib.util
import io
import json
import pathlib

import pytest

from tests.scripts.quotients import assert_quotient

pytest.importorskip("torch", reason="the baseline is a PyTorch train step")
pytest.importorskip("transformers", reason="the baseline is transformers' Llama")

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_learner", REPO / "scripts/bench_learner.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(bench):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick", "--layer-unroll", "0", "1"])
    return buf.getvalue().strip().splitlines(), figures


def test_last_line_is_json_of_all_figures(quick_run):
    lines, figures = quick_run
    assert json.loads(lines[-1]) == json.loads(json.dumps(figures))
    assert figures["smollm2"] == {"skipped": "--no-smollm2 (or --quick)"}
    assert figures["sgemm_gflops"]["peak"] > 0


@pytest.mark.parametrize("unroll", [0, 1])
def test_same_weights_same_losses(quick_run, unroll):
    row = quick_run[1]["tiny"][f"layer_unroll_{unroll}"]
    losses = row["losses"]
    assert len(losses["rljax"]) == len(losses["torch"]) == 2
    # f32 on both sides: the first loss checks the log-probs, the second the whole update.
    for got, want in zip(losses["rljax"], losses["torch"], strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert losses["rljax"][1] != losses["rljax"][0]  # the update changed the model
    for side in ("rljax", "torch"):
        assert row[side]["fraction_of_sgemm_peak"] > 0
        assert row[side]["tokens_per_s"] > 0
        low, high = row[side]["range_step_s"]
        assert low <= row[side]["median_step_s"] <= high


@pytest.mark.parametrize("unroll", [0, 1])
def test_ratios_are_of_the_figures_beside_them(quick_run, unroll):
    figures = quick_run[1]
    peaks = figures["sgemm_gflops"]["peak"], figures["sgemm_gflops_end"]["peak"]
    best = figures["sgemm_gflops_peak_used"]
    assert best == max(peaks)  # the higher of the two peaks measured in this run
    row = figures["tiny"][f"layer_unroll_{unroll}"]
    for side in ("rljax", "torch"):
        v = row[side]  # gflops to 2 decimals, the peak to 1, the fraction to 4
        g = v["gflops"]
        f = v["fraction_of_sgemm_peak"]  # computed from the printed gflops: exact numerator
        assert_quotient(f, g, best, num_half=0.0, den_half=0.05, ratio_half=0.5e-4)
    # rljax's tokens/s over torch's, each to 2 decimals, the ratio to 3.
    r, t = row["rljax"]["tokens_per_s"], row["torch"]["tokens_per_s"]
    assert_quotient(row["rljax_over_torch"], r, t, num_half=0.005, den_half=0.005, ratio_half=5e-4)


def test_the_headline_variant_has_a_per_op_profile(quick_run):
    """The headline (the first --layer-unroll) is profiled; each op is named by the JAX
    operation it came from, and the shares are of the traced op time."""
    tiny = quick_run[1]["tiny"]
    assert "profile" not in tiny["layer_unroll_1"]
    profile = tiny["layer_unroll_0"]["profile"]
    assert 0 < len(profile["top"]) <= 15
    assert any("dot_general" in r["op"] for r in profile["top"])
    assert all(r["s"] >= 0 and 0 <= r["share"] <= 1 for r in profile["top"])
    assert sum(r["share"] for r in profile["top"]) <= 1 + 1e-6
    assert profile["ops_s"] > 0 and profile["untraced_s"] <= profile["step_s"]


def test_model_flops_counts_matmuls_and_attention(bench):
    cfg = bench.TINY
    flops = bench.model_flops(cfg, rows=2, row_len=8)
    d, h = cfg.hidden_size, cfg.head_dim
    per_layer = d * h * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.intermediate_size
    params = cfg.num_layers * per_layer + d * cfg.vocab_size
    attention = 3 * 4 * cfg.num_layers * 2 * 8 * 8 * cfg.num_heads * h
    assert flops == 6 * params * 16 + attention


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps=0 must be >= 1"),
        (["--rows", "6"], "--rows=6 must be a power of two"),
        (["--layer-unroll", "-1"], "must be >= 0"),
    ],
)
def test_bad_flags_name_the_problem(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err
