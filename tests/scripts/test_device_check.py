"""scripts/device_check.py at tiny shapes on this CPU, in-process: every part runs, the JSON
file holds what it printed last, and each figure is a ratio to a limit measured in the run."""

import contextlib
import importlib.util
import io
import json
import pathlib

import pytest

from tests.scripts.quotients import assert_quotient

REPO = pathlib.Path(__file__).resolve().parents[2]
# A ratio printed to 4 decimals, and the floats' own rounding.
R = 0.5e-4 + 1e-12


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts/device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_part_runs_at_tiny_shapes(check, tmp_path):
    out = tmp_path / "check.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        figures = check.main(["--tiny", f"--out={out}"])
    assert json.loads(out.read_text()) == json.loads(buf.getvalue().strip().splitlines()[-1])
    assert json.loads(json.dumps(figures)) == json.loads(out.read_text())
    for part in ("decode", "learner", "attention", "grpo"):
        assert "error" not in figures[part], figures[part].get("traceback")
    decode = figures["decode"]
    default = str(decode["default_decode_steps"])
    for slots in (4,):
        rows = decode[f"tiny_{slots}_slots"]
        assert set(rows) == {"1", "4", default}
        for row in rows.values():
            assert row["slots"] == slots and row["tokens_per_s"] > 0
            assert row["fraction_of_bound"] > 0 and 0 <= row["host_share"] <= 1
            # The copy bound over the step, both as printed (3 decimals), the ratio to 4.
            bound, step = row["bound_ms"], row["step_ms"]
            h = 0.5e-3
            assert_quotient(
                row["fraction_of_bound"], bound, step, num_half=h, den_half=h, ratio_half=R
            )
    learner = figures["learner"]["tiny"]
    assert learner["mfu"] > 0
    # The tiny model's FLOPs a step over the median step and the GEMM peak measured in the run
    # (printed in TFLOP/s to 3 decimals; the figure to 4).
    flops = check.model_flops(check.TINY, learner["rows"], learner["row_len"])
    step = learner["step_s"]["median"]
    assert_quotient(
        learner["mfu"],
        flops / step,
        figures["learner"]["bf16_gemm_peak_tflops"] * 1e12,
        num_half=0.0,
        den_half=0.5e9,
        ratio_half=R,
    )
    assert learner["tokens_per_s"] == pytest.approx(
        learner["rows"] * learner["row_len"] / step, abs=0.05 + 1e-9
    )
    attention = figures["attention"]
    assert attention["rljax_speed_over_jax_nn"] > 0
    # jax.nn's median time over rljax's, both timed in the run.
    speed = attention["jax_nn_ms"]["median"] / attention["rljax_xla_ms"]["median"]
    assert attention["rljax_speed_over_jax_nn"] == pytest.approx(speed, abs=0.5e-4 + 1e-9)
    for key in ("sync_eta0", "async_eta2"):
        assert figures["grpo"][key]["steps"] >= 1


def test_an_unknown_part_is_refused(check, tmp_path):
    with pytest.raises(SystemExit, match="unknown part 'decod'"):
        check.main(["--tiny", "--parts=decod", f"--out={tmp_path / 'x.json'}"])
