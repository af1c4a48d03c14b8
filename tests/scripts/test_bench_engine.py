"""Smoke test of scripts/bench_engine.py: the --quick run in-process, never its timings.

The figures are ratios of wall times on a shared machine, so only their presence, types and
the invariants that do not depend on speed (token counts, step counts, greedy agreement on the
same weights) are checked.
"""

import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", REPO / "scripts/bench_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(bench):
    """(printed lines, returned figures) of one --quick run, shared by the tests below."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick"])
    return buf.getvalue().strip().splitlines(), figures


def test_last_line_is_json_of_all_figures(quick_run):
    lines, figures = quick_run
    parsed = json.loads(lines[-1])
    assert parsed == json.loads(json.dumps(figures))
    for key in (
        "batching",
        "hf_tiny_llama",
        "hf_smollm2",
        "copy_bandwidth_gbs",
        "decode_vs_bandwidth_bound",
        "load_average_start",
        "load_average_end",
        "rljax_timing",
    ):
        assert key in parsed, key
    assert not any(line.startswith("{") for line in lines[:-1])


def test_batching_figures_compare_equal_work(quick_run):
    b = quick_run[1]["batching"]
    cont, static = b["continuous"], b["static"]
    # Both drivers produce exactly the drawn token budget of the same requests.
    assert cont["tokens"] == static["tokens"] > 0
    # Refilling early never needs more generate steps than waiting for the whole batch.
    assert cont["generate_steps"] <= static["generate_steps"]
    assert 0 < static["slot_occupancy"] <= cont["slot_occupancy"] <= 1
    assert b["continuous_over_static"] > 0


def test_hf_rows(quick_run):
    tiny = quick_run[1]["hf_tiny_llama"]
    if "skipped" in tiny:
        pytest.skip(tiny["skipped"])
    # Same weights, both greedy, float32: the continuations must agree token for token.
    assert tiny["token_agreement"] == 1.0
    assert tiny["rljax_tokens_per_s"] > 0 and tiny["hf_tokens_per_s"] > 0
    assert quick_run[1]["hf_smollm2"] == {"skipped": "--no-smollm2 (or --quick)"}


def test_bandwidth_bound_figures(quick_run):
    figures = quick_run[1]
    row = figures["decode_vs_bandwidth_bound"]["batching_model"]
    assert figures["copy_bandwidth_gbs"] > 0
    assert row["param_bytes"] > 0 and row["kv_bytes_held"] > 0
    assert row["kv_bytes_gathered_by_xla_attention"] >= row["kv_bytes_held"]
    assert row["fraction_of_bound"] == pytest.approx(row["bound_ms"] / row["step_ms"], rel=0.01)


def test_lognormal_lengths_are_capped_and_positive(bench):
    import numpy as np

    lengths = bench.lognormal_lengths(np.random.default_rng(0), 2000, 32, 1.0, 256)
    assert lengths.min() >= 1 and lengths.max() == 256
    assert 28 <= np.median(lengths) <= 36


def test_agreement_counts_tokens_before_divergence(bench):
    token_frac, row_frac = bench.agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]])
    assert token_frac == pytest.approx(4 / 6)
    assert row_frac == 0.5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slots", "0"], "--slots=0 must be >= 1"),
        (["--max-prompt", "2"], "--max-prompt=2 must be >= 4"),
        (["--sigma", "-1"], "--sigma=-1.0 >= 0"),
        (["--hf-batch", "9"], "--hf-batch=9 exceeds the 4 SmolLM2 prompts"),
    ],
)
def test_bad_flags_name_the_problem(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err
