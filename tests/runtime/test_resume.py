"""Kill anywhere, resume from the last checkpoint, and end bitwise where an unkilled run ends."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from rljax.checkpoint import Checkpointer, abstract_like
from rljax.config import CheckpointConfig, LearnerConfig
from rljax.learner.learner import Learner
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.testing.configs import TINY_MODEL

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 6
ARGS = [
    f"--config={ROOT / 'configs' / 'arith_tiny.py'}:small",
    f"--config.num_steps={STEPS}",
    "--config.checkpoint.enabled=True",
    "--config.checkpoint.every_steps=1",
    "--config.checkpoint.keep=10",
]
ENV = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu"}


def _start(workdir):
    return subprocess.Popen(
        [sys.executable, "-m", "rljax.launch", *ARGS, f"--workdir={workdir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )


def _finish(proc, timeout=400):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out + err


def _wait_for_step(workdir, step, proc, timeout=400):
    ckpt = workdir / "checkpoints" / str(step)
    deadline = time.time() + timeout
    while not ckpt.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, f"no checkpoint {ckpt} after {timeout}s"
        time.sleep(0.05)


def _params_at(workdir, step):
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    graphdef, params = init_sharded(TINY_MODEL, mesh, LEARNER_RULES, 0)
    learner = Learner(LearnerConfig(), graphdef, params, mesh)
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(enabled=True))
    restored, _, meta = ckpt.restore(
        step,
        abstract_params=abstract_like(learner.params),
        abstract_opt_state=abstract_like(learner.opt_state),
    )
    ckpt.close()
    assert meta["version"] == step
    return jax.tree.leaves(jax.device_get(restored)), meta


def _interrupt(workdir, after_step, sig):
    proc = _start(workdir)
    _wait_for_step(workdir, after_step, proc)
    time.sleep(0.3)  # into the next step
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def test_killed_runs_resume_bitwise(tmp_path):
    """SIGTERM mid-run (graceful), resume, SIGKILL mid-run (abrupt), resume: the final params
    equal, bit for bit, those of a run that was never interrupted, with the same data order."""
    clean = tmp_path / "clean"
    _finish(_start(clean))

    killed = tmp_path / "killed"
    code, log = _interrupt(killed, 1, signal.SIGTERM)
    assert code == 0, log[-3000:]  # the step in flight finishes and a checkpoint is forced
    assert "checkpoint saved" in log
    code, log = _interrupt(killed, 4, signal.SIGKILL)
    assert code == -signal.SIGKILL
    saved = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] < STEPS

    log = _finish(_start(killed))
    assert f"resumed from checkpoint at step {saved[-1]}" in log
    want, want_meta = _params_at(clean, STEPS)
    got, got_meta = _params_at(killed, STEPS)
    assert got_meta["data"] == want_meta["data"]
    # The metrics cursor: each training step is logged exactly once despite the two kills.
    records = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["phase"] == "train"]
    assert train_steps == list(range(STEPS))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
