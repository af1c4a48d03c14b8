"""Smoke test of scripts/bench_engine.py: the --quick run in-process, never its timings.

The figures are ratios of wall times on a shared machine, so only their presence, types and
the invariants that do not depend on speed (token counts, step counts, byte counts, greedy
agreement on the same weights) are checked. The tests run with 8 CPU devices (conftest), so
the weight-sync part runs in this process.
"""

import importlib
import importlib.util
import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.scripts.quotients import quotient_bounds

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", REPO / "scripts/bench_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def batching(bench):
    return importlib.import_module("continuous_batching")  # bench put scripts/ on sys.path


@pytest.fixture(scope="module")
def decode_bound(bench):
    return importlib.import_module("decode_bound")  # bench put scripts/ on sys.path


@pytest.fixture(scope="module")
def quick_run(bench):
    """(printed lines, returned figures) of one --quick run, shared by the tests below."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = bench.main(["--quick"])
    return buf.getvalue().strip().splitlines(), figures


def assert_spread(s):
    assert s["min"] <= s["median"] <= s["max"], s


def rounded_ratio_tolerance(a: float, b: float, parts: int, ratio: int) -> float:
    """How far a ratio rounded to ``ratio`` decimals can lie from ``a / b``, where ``a`` and
    ``b`` are its numerator and denominator rounded to ``parts`` decimals.

    Each true value lies within half a unit of its last decimal, so the true ratio lies between
    the two extreme quotients, and rounding it moves it by half a unit more. A fast machine's
    short steps round coarsely (0.5 ms to 3 decimals is 0.1 % off), so no fixed relative
    tolerance holds on every machine.
    """
    half = 0.5 * 10.0**-parts
    low, high = quotient_bounds(a, b, half, half)
    r = a / b
    return max(high - r, r - low) + 0.5 * 10.0**-ratio + 1e-12  # 1e-12: the floats' rounding


@given(st.floats(0.0, 1e3), st.floats(0.01, 1e3))
def test_rounded_ratio_tolerance_covers_the_rounding(a, b):
    ra, rb = round(a, 3), round(b, 3)
    assert abs(round(a / b, 4) - ra / rb) <= rounded_ratio_tolerance(ra, rb, 3, 4)


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
        "decode_layouts",
        "weight_sync",
        "load_average_start",
        "load_average_end",
        "rljax_timing",
    ):
        assert key in parsed, key
    assert not any(line.startswith("{") for line in lines[:-1])


def test_layouts_are_timed_in_interleaved_rounds(quick_run, decode_bound):
    ab = quick_run[1]["decode_layouts"]["batching_model"]
    assert ab["rounds"] == 2  # two per repeat, the order alternating
    assert len(ab["step_ms"]["stacked"]) == len(ab["step_ms"]["per_layer"]) == 2
    digits = decode_bound.MS_DECIMALS, decode_bound.RATIO_DECIMALS
    for (a, b), ratio in zip(zip(*ab["step_ms"].values()), ab["stacked_over_per_layer"]):
        assert ratio == pytest.approx(a / b, abs=rounded_ratio_tolerance(a, b, *digits))


def test_batching_is_a_distribution_over_seeds_and_shapes(quick_run):
    b = quick_run[1]["batching"]
    work = b["workload"]
    assert len(b["runs"]) == len(work["sigmas"]) * len(work["seeds"]) == 6
    for run in b["runs"]:
        cont, static = run["continuous"], run["static"]
        # Both drivers produce exactly the drawn token budget of the same requests.
        assert cont["tokens"] == static["tokens"] == run["tokens"] > 0
        # Refilling early never needs more generate steps than waiting for the whole batch.
        assert cont["generate_steps"] <= static["generate_steps"]
        assert 0 < static["slot_occupancy"] <= cont["slot_occupancy"] <= 1
        assert run["step_ratio"] >= 1 and run["tokens_per_s_ratio"] > 0
        # Static over continuous, both drivers timed on these requests in this run.
        steps = static["generate_steps"] / cont["generate_steps"]
        assert run["step_ratio"] == pytest.approx(steps, abs=0.5e-4 + 1e-12)
        static_s, cont_s = static["seconds"], cont["seconds"]
        tolerance = rounded_ratio_tolerance(static_s, cont_s, 4, 4)
        assert run["tokens_per_s_ratio"] == pytest.approx(static_s / cont_s, abs=tolerance)
    assert sorted(b["shapes"]) == [f"sigma_{s}" for s in sorted(work["sigmas"])]
    for shape in b["shapes"].values():
        assert shape["seeds"] == len(work["seeds"])
        mine = [r["step_ratio"] for r in b["runs"] if r["sigma"] == shape["sigma"]]
        assert shape["step_ratio"]["min"] == min(mine)
        assert shape["step_ratio"]["max"] == max(mine)
        for key in ("step_ratio", "tokens_per_s_ratio", "slot_occupancy_continuous"):
            assert_spread(shape[key])


def test_hf_rows(quick_run):
    tiny = quick_run[1]["hf_tiny_llama"]
    if "skipped" in tiny:
        pytest.skip(tiny["skipped"])
    # Same weights, both greedy, float32: the continuations must agree token for token.
    assert tiny["token_agreement"] == 1.0
    assert tiny["repeats"] == 1
    for key in ("rljax_tokens_per_s", "hf_tokens_per_s", "rljax_over_hf"):
        assert_spread(tiny[key])
        assert tiny[key]["min"] > 0
    # One repeat: the ratio is of the two rates measured beside it.
    a, b = tiny["rljax_tokens_per_s"]["median"], tiny["hf_tokens_per_s"]["median"]
    tolerance = rounded_ratio_tolerance(a, b, 4, 4)
    assert tiny["rljax_over_hf"]["median"] == pytest.approx(a / b, abs=tolerance)
    assert quick_run[1]["hf_smollm2"] == {"skipped": "--no-smollm2 (or --quick)"}


def test_bandwidth_bound_figures(quick_run, decode_bound):
    figures = quick_run[1]
    assert figures["copy_bandwidth_gbs"]["min"] > 0
    bound = figures["decode_vs_bandwidth_bound"]["batching_model"]
    assert bound["repeats"] == len(bound["runs"]) == 1
    assert_spread(bound["fraction_of_bound"])
    digits = decode_bound.MS_DECIMALS, decode_bound.RATIO_DECIMALS
    for row in bound["runs"]:
        assert row["param_bytes"] > 0 and row["kv_bytes_held"] > 0
        a, b = row["bound_ms"], row["step_ms"]
        tolerance = rounded_ratio_tolerance(a, b, *digits)
        assert row["fraction_of_bound"] == pytest.approx(a / b, abs=tolerance)
        # The multi-thread read bound, measured in the same run, is reported beside it.
        assert row["read_bandwidth_gbs"] > 0
        a = row["read_bound_ms"]
        tolerance = rounded_ratio_tolerance(a, b, *digits)
        assert row["fraction_of_read_bound"] == pytest.approx(a / b, abs=tolerance)
    assert_spread(bound["fraction_of_read_bound"])


def test_per_call_decode_in_bfloat16_reads_half_the_bytes(bench, quick_run):
    """(e) in the sampler's bfloat16: the served weights are half the float32 run's bytes, and
    every setting is timed."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["--quick", "--only-per-call", "--per-call-dtype", "bfloat16"]
        figures = bench.main([*argv, "--per-call-slot-tokens", "200"])
    half, full = figures["per_call"], quick_run[1]["per_call"]
    assert (half["dtype"], full["dtype"]) == ("bfloat16", "float32")
    assert half["slot_tokens"] == 200 > full["slot_tokens"]
    assert 2 * half["param_bytes"] == full["param_bytes"] > 0
    assert_spread(half["matmul_floor_fraction_of_bound"])
    assert_spread(half["read_floor_fraction_of_bound"])
    for n in ("1", "4"):
        assert_spread(half[n]["fraction_of_bound"])
        assert half[n]["tokens_per_s"]["min"] > 0


def test_the_read_bandwidth_reads_every_byte_once(decode_bound, monkeypatch):
    # Bandwidth = bytes summed / best time: with a clock that advances 1 s per reading, each
    # timed sum takes 1 s, so the figure is the array's bytes in GB.
    import itertools

    import jax
    from jax.sharding import Mesh

    clock = itertools.count()
    monkeypatch.setattr(decode_bound.time, "perf_counter", lambda: float(next(clock)))
    mesh = Mesh(jax.devices()[:4], ("data",))
    assert decode_bound.read_bandwidth_gbs(4 * 2**20, mesh, repeats=3) == pytest.approx(
        4 * 2**20 / 1e9
    )


def test_weight_sync_publishes_every_byte_to_the_sampler(quick_run):
    sync = quick_run[1]["weight_sync"]
    assert sync["process"] == "this one"  # conftest gives this process 8 devices
    assert sync["sampler_mesh"] == {"data": 4, "tensor": 1}
    assert sync["learner_mesh"] == {"fsdp": 4, "tensor": 1}
    model = sync["batching_model"]
    f32, bf16 = model["float32"], model["bfloat16"]
    assert f32["bytes"] == model["param_bytes"] > 0
    assert bf16["bytes"] * 2 == model["param_bytes"]  # every param of the model is floating
    for row in (f32, bf16):
        # The sampler replicates the weights over its 4 data shards; fake CPU devices may
        # let replicas share a buffer, which is then counted once.
        for key in ("bytes_written_on_sampler", "device_put_bytes_written_on_sampler"):
            assert row["bytes"] <= row[key] <= 4 * row["bytes"], key
        assert_spread(row["publish_s"])
        for key in ("publish_over_device_put", "publish_over_device_put_written"):
            assert row[key] > 0, key
        # device_put's median time over the publish's, both timed in this run.
        a, b = row["device_put_s"]["median"], row["publish_s"]["median"]
        tolerance = rounded_ratio_tolerance(a, b, 5, 4)
        assert row["publish_over_device_put"] == pytest.approx(a / b, abs=tolerance)
        assert row["publish_over_numpy_copy"] > 0


def test_split_topology_is_the_runtimes(bench):
    import jax

    topology = bench.weight_sync_bandwidth.split_topology(jax.devices())
    assert [d.id for d in topology.sampler.devices.flat] == [0, 1, 2, 3]
    assert [d.id for d in topology.learner.devices.flat] == [4, 5, 6, 7]
    assert not topology.colocated


def test_child_environment_drops_a_forced_device_count(bench, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_foo=1")
    env = bench.child_environment()
    assert env["JAX_NUM_CPU_DEVICES"] == "8" and env["XLA_FLAGS"] == "--xla_foo=1"


def test_spread(batching):
    assert batching.spread([3, 1, 2, 10]) == {"median": 2.5, "min": 1, "max": 10}


def test_lognormal_lengths_are_capped_and_positive(batching):
    import numpy as np

    lengths = batching.lognormal_lengths(np.random.default_rng(0), 2000, 32, 1.0, 256)
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
        (["--seeds", "0"], "--seeds=0 must be >= 1"),
        (["--repeats", "0"], "--repeats=0 must be >= 1"),
        (["--max-prompt", "2"], "--max-prompt=2 must be >= 4"),
        (["--sigmas", "1", "-1"], "--sigmas=[1.0, -1.0] >= 0"),
        (["--hf-batch", "9"], "--hf-batch=9 exceeds the 4 SmolLM2 prompts"),
    ],
)
def test_bad_flags_name_the_problem(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err
