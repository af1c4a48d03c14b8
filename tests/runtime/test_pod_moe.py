"""A mixture of experts on a pod (4 processes x 2 devices on localhost: the sampler on hosts
0-1, the learner on hosts 2-3), expert-parallel over 2 on both meshes, so each mesh's 'expert'
axis spans its two hosts: expert-sharded weights cross the hosts at every swap, the sampler
hosts record routes, and the learner hosts train on them with replay on.

A relaunch is not repeated here (CI time): a pod's resume is tests/runtime/test_pod.py's, and a
MoE run's resume with its buffered groups' routes is the moe_async chaos scenario's
(tests/scripts/test_chaos.py)."""

from __future__ import annotations

import pytest

from rljax.testing import audit, pod

STEPS = 2
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
    "--config.checkpoint.enabled=True",  # saved at the end: expert shards from both hosts
    "--config.metrics.progress_bar=False",
]


@pytest.mark.slow
def test_moe_pod_trains_on_the_recorded_routes(tmp_path):
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
    assert (workdir / "checkpoints" / str(STEPS)).is_dir()
