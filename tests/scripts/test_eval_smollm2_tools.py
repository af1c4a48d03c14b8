"""scripts/eval_smollm2_tools.py: the gain in standard errors, and the figures of a run."""

import importlib.util
import math
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "eval_smollm2_tools.py"
_SPEC = importlib.util.spec_from_file_location("eval_smollm2_tools", _PATH)
script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(script)


def test_gain_in_standard_errors_is_the_pooled_two_proportion_z():
    # 0.25 -> 0.75 on 96 each: p = 0.5, se = sqrt(2 * 0.25 / 96) = 0.0722
    assert script.gain_in_standard_errors(0.25, 0.75, 96) == pytest.approx(0.5 / 0.0722, rel=1e-3)
    assert script.gain_in_standard_errors(0.0, 1.0, 96) == pytest.approx(1 / math.sqrt(0.5 / 96))
    assert script.gain_in_standard_errors(0.5, 0.4, 96) < 0
    assert script.gain_in_standard_errors(0.0, 0.0, 96) == 0.0
    assert script.gain_in_standard_errors(1.0, 1.0, 96) == 0.0


def test_one_seed_reads_the_curve_after_the_warm_start(monkeypatch):
    runs = []

    def fake_train(cfg):
        runs.append(cfg)
        if cfg.num_steps == 0:  # the base model: no warm start, no RL
            return {"initial_accuracy": 0.01}, [], 5.0
        records = [
            {"step": 0, "phase": "eval_initial", "heldout_accuracy": 0.1},
            {"step": 0, "phase": "train", "reward": 0.2},
            {"step": 2, "phase": "eval", "heldout_accuracy": 0.5},
            {"step": 4, "phase": "eval_final", "heldout_accuracy": 0.6},
        ]
        summary = {"last": {"turns_per_conversation": 2.0}, "phase_s": {"learn": 1.234}}
        return summary, records, 99.0

    monkeypatch.setattr(script, "train", fake_train)
    out = script.one_seed(3)
    assert [c.seed for c in runs] == [3, 3] and runs[0].sft.steps == 0 and runs[1].sft.steps > 0
    assert out["base"] == 0.01 and out["curve"] == {0: 0.1, 2: 0.5, 4: 0.6}
    assert out["gain_points"] == pytest.approx(50.0)
    assert out["phase_s"] == {"learn": 1.2} and out["wall_s"] == 99.0
