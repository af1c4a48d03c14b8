"""scripts/device_check.py at tiny shapes on this CPU, in-process: every part runs, the JSON
file holds what it printed last, and each figure is a ratio to a limit measured in the run."""

import contextlib
import importlib.util
import io
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


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
    assert figures["learner"]["tiny"]["mfu"] > 0
    assert figures["attention"]["rljax_speed_over_jax_nn"] > 0
    for key in ("sync_eta0", "async_eta2"):
        assert figures["grpo"][key]["steps"] >= 1


def test_an_unknown_part_is_refused(check, tmp_path):
    with pytest.raises(SystemExit, match="unknown part 'decod'"):
        check.main(["--tiny", "--parts=decod", f"--out={tmp_path / 'x.json'}"])
