"""Bad input to ``rljax eval`` and ``rljax export`` (docs/errors.md, "Evaluation and export"):
each refused with one line, nothing written.

The runs read here are checkpoints holding a run config in their meta and a token array: every
refusal happens before a weight is read, so no model is built.
"""

from __future__ import annotations

import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.checkpoint import Checkpointer
from rljax.config import replace
from rljax.runtime.resume import flat_config

CFG = replace(arith_tiny.recipe("small"), **{"checkpoint.enabled": True})


def _saved_run(workdir, cfg, steps=(1, 2)):
    with Checkpointer(workdir / "checkpoints", cfg.checkpoint) as ckpt:
        for step in steps:
            meta = {"version": step, "config": flat_config(cfg)}
            params, opt_state = {"w": np.zeros(2)}, {"m": np.zeros(2)}
            assert ckpt.save(step, params=params, opt_state=opt_state, meta=meta, force=True)
    return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    full = _saved_run(root / "full", CFG)
    lora = _saved_run(root / "lora", replace(CFG, **{"lora.enabled": True}))
    return full, lora


def test_eval_of_a_missing_checkpoint(launch_error, check_row, tmp_path):
    out = tmp_path / "out"
    message = launch_error(f"--checkpoint={tmp_path}/nope", f"--out={out}", command="eval")
    check_row("X01", message, "name a run's workdir")
    assert not out.exists()


def test_a_missing_step(launch_error, check_row, runs, tmp_path):
    full, _ = runs
    for command, extra in (("eval", ()), ("export", ("--format=hf",))):
        out = tmp_path / command
        message = launch_error(
            f"--checkpoint={full}", "--step=9", f"--out={out}", *extra, command=command
        )
        check_row("X02", message, "pick one of those")
        assert "(it holds steps 1, 2)" in message
        assert not out.exists()


def test_k_below_one(launch_error, check_row, runs, tmp_path):
    message = launch_error(
        f"--checkpoint={runs[0]}", "--k=0", f"--out={tmp_path}/out", command="eval"
    )
    check_row("X03", message, "sample k >= 1")


def test_k_above_one_greedy(launch_error, check_row, runs, tmp_path):
    message = launch_error(
        f"--checkpoint={runs[0]}", "--k=4", "--temperature=0", f"--out={tmp_path}/o", command="eval"
    )
    check_row("X04", message, "set --k=1 for greedy")


@pytest.mark.parametrize(
    "row_id, run, fmt, fix",
    [("X05", 0, "peft", "use --format=hf"), ("X06", 1, "hf", "use --format=merged")],
    ids=["X05-peft-of-a-full-fine-tune", "X06-hf-of-a-lora-run"],
)
def test_an_export_format_the_run_cannot_give(
    launch_error, check_row, runs, tmp_path, row_id, run, fmt, fix
):
    out = tmp_path / "out"
    message = launch_error(
        f"--checkpoint={runs[run]}", f"--format={fmt}", f"--out={out}", command="export"
    )
    check_row(row_id, message, fix)
    assert not out.exists()


def test_export_of_a_directory_that_is_no_run(launch_error, check_row, tmp_path):
    message = launch_error(
        f"--checkpoint={tmp_path}", "--format=hf", f"--out={tmp_path}/o", command="export"
    )
    check_row("X07", message, "name the --workdir a run wrote")


def test_an_eval_flag_while_training(launch_error, check_row):
    check_row("X08", launch_error("--k=4"), "drop it or run that command")
