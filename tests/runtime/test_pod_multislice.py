"""A multislice pod on the CPU: 4 processes x 2 devices as two emulated slices of two hosts,
the sampler slice (2 replicas x tensor 2) and the learner slice (fsdp 4), running
configs/arith_async.py asynchronously; the weights cross slices once a publish."""

from __future__ import annotations

import json

import pytest

from rljax.testing import pod

ETA = 2
ARGV = [
    "-m",
    "rljax.launch",
    "--config=configs/arith_async.py:small",
    "--config.mesh.num_slices=2",
    "--config.mesh.sampler_devices=4",
    "--config.mesh.learner_devices=4",
    "--config.mesh.sampler_data=2",
    "--config.mesh.sampler_tensor=2",
    f"--config.buffer.max_staleness={ETA}",
    "--config.learner.group_size=6",
    "--config.sft.steps=0",
    "--config.num_steps=3",
    "--config.eval_examples=4",
    "--config.metrics.progress_bar=False",
]


@pytest.mark.slow
def test_multislice_pod_runs_and_syncs_in_two_stages(tmp_path):
    workdir = tmp_path / "run"
    codes, logs = pod.run(
        [*ARGV, f"--workdir={workdir}"], processes=4, devices=2, logdir=tmp_path, timeout=600
    )
    assert codes == [0] * 4, logs[0][-3000:]
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if r.get("phase") == "train"]
    assert [r["step"] for r in train] == [0, 1, 2]
    assert all(r["staleness_max"] <= ETA for r in train)
    synced = [r for r in train if r["sync_bytes"]]
    assert synced, "no weight publish was recorded"
    # By role, one sampler slice: one copy crossed slices, not one per replica (two).
    assert all(r["sync_stage_bytes"] == r["sync_bytes"] for r in synced), synced
