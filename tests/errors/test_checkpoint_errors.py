"""Damaged checkpoints: a resume refuses with one line and moves nothing aside.

The checkpoint is written once per module, straight from a fresh learner (no training run),
then copied into each test's workdir and damaged there.
"""

import shutil

import jax
import numpy as np
import pytest
from rljax.configs import arith_tiny

from rljax.checkpoint import Checkpointer, CheckpointError
from rljax.config import replace
from rljax.learner.learner import Learner
from rljax.mesh.topology import build_topology
from rljax.models.loading import abstract_params
from rljax.runtime.run import Run

CFG = replace(arith_tiny.recipe("small"), **{"checkpoint.enabled": True})
STEP = 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A workdir whose checkpoints/ holds step 2 of the small recipe's tiny model."""
    workdir = tmp_path_factory.mktemp("saved")
    mesh = build_topology(CFG.mesh, jax.devices()).learner
    # The abstract state a resumed run restores onto, filled with zeros: no init, no compile.
    graphdef, abstract = abstract_params(CFG.model, mesh)
    target = Learner.abstract(CFG.learner, graphdef, abstract, mesh, loss=CFG.learner.loss)
    zeros = lambda s: jax.device_put(np.zeros(s.shape, s.dtype), s.sharding)  # noqa: E731
    params, opt_state = jax.tree.map(zeros, (target.params, target.opt_state))
    # The meta a run writes (without the run config, as checkpoints before it was stored).
    meta = {"version": STEP, "data": {}, "initial_accuracy": 0.5, "metrics_offset": 0}
    with Checkpointer(workdir / "checkpoints", CFG.checkpoint) as ckpt:
        assert ckpt.save(STEP, params=params, opt_state=opt_state, meta=meta, force=True)
        # Undamaged, the step restores onto the target a resumed run builds.
        ckpt.restore(abstract_params=target.params, abstract_opt_state=target.opt_state)
    (workdir / "metrics.jsonl").write_text('{"step": 1, "phase": "train"}\n')
    return workdir


@pytest.fixture
def workdir(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "workdir")


def _step_dir(workdir):
    return workdir / "checkpoints" / str(STEP)


def _tamper_meta(workdir):
    """Bit rot in the JSON meta: still valid JSON, no longer what was saved."""
    files = [p for p in (_step_dir(workdir) / "meta").rglob("*") if p.is_file()]
    [file] = [p for p in files if b'"initial_accuracy": 0.5' in p.read_bytes()]
    text = file.read_text()
    file.write_text(text.replace('"initial_accuracy": 0.5', '"initial_accuracy": 0.9'))


def _garble_arrays(workdir):
    """Every array file of the params item overwritten with noise (same sizes)."""
    files = [p for p in (_step_dir(workdir) / "params").rglob("*") if p.is_file()]
    data = [p for p in files if p.parent.name == "d"]
    assert data, files
    for p in data:
        p.write_bytes(bytes(reversed(p.read_bytes())))


def _drop_params(workdir):
    """A half-copied step: the params item is gone."""
    shutil.rmtree(_step_dir(workdir) / "params")


FIX = "aside (or use a new workdir) to start afresh"
DAMAGE = [
    ("K01", _tamper_meta),
    ("K02", _garble_arrays),
    ("K03", _drop_params),
]


@pytest.mark.parametrize("row_id, damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_checkpoint(refused, check_row, workdir, row_id, damage):
    damage(workdir)
    message = refused(lambda: Run(CFG, str(workdir)), CheckpointError, workdir)
    check_row(row_id, message, FIX)


def test_checkpoint_of_another_model(refused, check_row, workdir):
    """A checkpoint restored onto a model of another shape (a meta without the run config)."""
    wider = replace(CFG, **{"model.hidden_size": 64})
    message = refused(lambda: Run(wider, str(workdir)), CheckpointError, workdir)
    check_row("K04", message, FIX)


def test_damaged_checkpoint_from_the_command_line(launch_error, check_row, workdir):
    _tamper_meta(workdir)
    message = launch_error("--config.checkpoint.enabled=True", target=workdir)
    check_row("K05", message, FIX)


def test_restore_of_a_step_that_is_not_there(check_row, workdir):
    ckpt = Checkpointer(workdir / "checkpoints", CFG.checkpoint)
    with ckpt, pytest.raises(CheckpointError) as info:
        ckpt.restore(7, abstract_params=None, abstract_opt_state=None)
    check_row("K06", str(info.value), "pass one of those, or step=None for the latest")


def test_restore_from_an_empty_directory(check_row, tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", CFG.checkpoint)
    with ckpt, pytest.raises(CheckpointError) as info:
        ckpt.restore(abstract_params=None, abstract_opt_state=None)
    check_row("K07", str(info.value), "start from scratch or point the run at the directory")
