"""scripts/paced_run.py: one process whose RL learner steps are padded to a given duration runs
to the end, every step at least that long, and ends in a JSON line of its figures."""

import json
import os
import pathlib
import subprocess
import sys

from rljax.configs import arith_async

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_padded_run_reports_its_schedule(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8", XLA_FLAGS="")
    argv = [
        sys.executable,
        "scripts/paced_run.py",
        "--learner_step_s=0.3",
        "--config=configs/arith_async.py:small",
        "--config.mesh.sampler_devices=4",
        "--config.mesh.learner_devices=4",
        "--config.buffer.max_staleness=2",
        "--config.num_steps=4",
        "--config.sft.steps=0",
        "--config.eval_examples=4",
        "--config.metrics.progress_bar=False",
        f"--workdir={tmp_path / 'w'}",
    ]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["learner_step_s"] == 0.3
    assert figures["learner_busy_s_median"] >= 0.3  # the pad is a sleep of at least the rest
    groups = arith_async.recipe("small").learner.batch_groups
    assert sum(figures["staleness_hist"].values()) == 4 * groups  # every step's groups
    assert max(int(k) for k in figures["staleness_hist"]) <= 2
