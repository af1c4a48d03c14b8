"""The launcher end to end, and its one-line errors for bad input."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from absl import flags
from rljax.configs import arith_tiny

from rljax import config as config_lib
from rljax import launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "arith_tiny.py") + ":small"


def _launch(*args, devices=8, timeout=300):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "rljax.launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_launcher_runs_the_small_config_end_to_end(tmp_path):
    proc = _launch(f"--config={CONFIG}", f"--workdir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    phases = {r["phase"] for r in records}
    assert {"sft", "eval_initial", "train", "eval_final", "summary"} <= phases
    train = [r for r in records if r["phase"] == "train"]
    for key in (
        "reward",
        "response_length",
        "clip_frac",
        "entropy",
        "sampler_tokens_per_s",
        "sampler_busy_s",
        "learner_busy_s",
    ):
        assert key in train[-1], key
    assert "held-out accuracy after warm start" in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config.learner.lr=0.1"], "unknown config key 'learner.lr'"),
        (["--config.learner.learning_rate=-0.1"], "'learner.learning_rate' = -0.1 is invalid"),
        (["--config.learner.group_size=1"], "'learner.group_size' = 1 is invalid"),
        (
            ["--config.learner.group_size=3", "--config.learner.batch_groups=3"],
            "not divisible over the 8 data-parallel learner devices",
        ),
        (["--workdir=/proc/rljax_cannot_write_here"], "is not writable"),
    ],
    ids=["unknown_key", "negative_lr", "group_size_1", "batch_not_divisible", "bad_workdir"],
)
def test_bad_input_gets_a_one_line_error(tmp_path, args, message):
    if not any(a.startswith("--workdir") for a in args):
        args = [*args, f"--workdir={tmp_path}"]
    proc = _launch(f"--config={CONFIG}", *args, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rljax: ")
    assert message in last
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "config, message",
    [
        ("configs/arith_tiny.py:test", "unknown variant 'test' of configs/arith_tiny.py; use one"),
        ("configs/no_such_recipe.py", "cannot load the --config file"),
    ],
    ids=["unknown_variant", "missing_file"],
)
@pytest.mark.parametrize("override", [[], ["--config.seed=1"]], ids=["", "with_override"])
def test_bad_config_file_gets_a_one_line_error(tmp_path, config, message, override):
    proc = _launch(f"--config={config}", *override, f"--workdir={tmp_path}", timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"rljax: {message}")
    assert "Traceback" not in proc.stderr


def _parsed_run_config(monkeypatch, *args):
    """The RunConfig the launcher builds from ``rljax *args``, without running it."""
    argv = ["rljax", *args]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv
    try:
        launch._parse_flags(argv)
        return launch._run_config(config_lib)
    finally:
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # the override flags parsing defined: the next parse's


def test_no_config_runs_the_default_recipe(monkeypatch):
    assert _parsed_run_config(monkeypatch) == arith_tiny.recipe()


@pytest.mark.parametrize(
    "args",
    [
        ["--config.learner.loss=dapo"],  # the README's first command, plus an override
        [f"--config={ROOT / 'configs' / 'arith_tiny.py'}", "--config.learner.loss=dapo"],
    ],
    ids=["no_config", "config"],
)
def test_overrides_apply_to_the_default_recipe(monkeypatch, args):
    assert _parsed_run_config(monkeypatch, *args) == config_lib.replace(
        arith_tiny.recipe(), **{"learner.loss": "dapo"}
    )
