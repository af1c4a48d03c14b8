"""A mixture of experts on a pod (4 processes x 2 devices on localhost: the sampler on hosts
0-1, the learner on hosts 2-3), expert-parallel over 2 on both meshes, so each mesh's 'expert'
axis spans its two hosts: expert-sharded weights cross the hosts at every swap, the sampler
hosts record routes, the learner hosts train on them with replay on, and a relaunch resumes."""

from __future__ import annotations

import pytest

from rljax.testing import audit, pod

STEPS = 3
ARGV = [
    "-m",
    "rljax.launch",
    "--config=configs/arith_moe.py:small",
    "--config.mode=async",
    "--config.learner.loss=decoupled_ppo",
    "--config.buffer.max_staleness=1",
    "--config.mesh.mode=split",
    "--config.mesh.sampler_devices=4",
    "--config.mesh.learner_devices=4",
    "--config.mesh.expert_parallel=2",
    "--config.moe.disagreement_every=1",
    "--config.sft.steps=0",
    "--config.eval_examples=4",
    "--config.checkpoint.enabled=True",
    "--config.checkpoint.every_steps=1",
    "--config.metrics.progress_bar=False",
]


@pytest.mark.slow
def test_moe_pod_trains_on_the_recorded_routes_and_resumes(tmp_path):
    workdir = tmp_path / "w"
    argv = [*ARGV, f"--workdir={workdir}"]
    codes, text = pod.run(
        [*argv, f"--config.num_steps={STEPS}"], processes=4, devices=2, logdir=tmp_path
    )
    assert codes == [0] * 4, text[0][-3000:]
    rows = [r for r in audit.read_metrics(workdir) if r["phase"] == "train"]
    assert [r["step"] for r in rows] == list(range(STEPS))
    # Routes crossed from the sampler hosts to the learner hosts: every step compared them.
    assert all(r["moe/routed_pairs"] > 0 for r in rows), rows
    assert all(0.0 <= r["moe/router_disagreement"] <= 1.0 for r in rows)
    assert all(r["sync_bytes"] > 0 for r in rows)

    codes, text = pod.run(
        [*argv, f"--config.num_steps={STEPS + 1}"],
        processes=4,
        devices=2,
        logdir=tmp_path,
        name="b",
    )
    assert codes == [0] * 4, text[0][-3000:]
    assert "resumed from checkpoint" in text[0]
    assert audit.audit_steps(audit.read_metrics(workdir), STEPS + 1) == []
