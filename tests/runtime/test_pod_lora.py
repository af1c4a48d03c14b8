"""LoRA on a pod (2 processes x 2 devices on localhost: the sampler on host 0, the learner on
host 1): the first weight move carries the base across hosts, every later one the adapters
alone; checkpoints hold the adapters, and a relaunch resumes from them."""

from __future__ import annotations

import json

import pytest

from rljax.testing import audit, pod

STEPS = 2
ARGV = [
    "-m",
    "rljax.launch",
    "--config=configs/arith_async.py:small",
    "--config.mesh.sampler_devices=2",
    "--config.mesh.learner_devices=2",
    "--config.lora.enabled=True",
    "--config.lora.rank=4",
    "--config.sft.steps=0",
    "--config.eval_examples=4",
    "--config.checkpoint.enabled=True",
    "--config.checkpoint.every_steps=1",
    "--config.metrics.progress_bar=False",
]


@pytest.mark.slow
def test_lora_pod_moves_adapters_and_resumes(tmp_path):
    workdir = tmp_path / "w"
    argv = [*ARGV, f"--workdir={workdir}"]
    codes, text = pod.run(
        [*argv, f"--config.num_steps={STEPS}"], processes=2, devices=2, logdir=tmp_path
    )
    assert codes == [0, 0], text[0][-3000:]
    rows = [r for r in audit.read_metrics(workdir) if r["phase"] == "train"]
    assert [r["step"] for r in rows] == list(range(STEPS))
    moved = [r["sync_bytes"] for r in rows]
    # TINY_MODEL in f32 at rank 4 on all 7 projections of its 2 layers: A [in, 4] and B
    # [4, out] per weight (q, o: 128 -> 128; k, v: 128 -> 64; gate, up: 128 -> 384; down).
    widths = 2 * 256 + 2 * (128 + 64) + 3 * (128 + 384)
    adapters = 4 * 2 * 4 * widths
    # The first swap moves the base too (the sampler starts without weights); then adapters.
    assert moved[0] > 10 * adapters and moved[1:] == [adapters] * (STEPS - 1), moved
    params = (workdir / "checkpoints" / str(STEPS) / "params" / "_METADATA").read_text()
    assert "wq_lora_b" in params and '"embed"' not in params

    codes, text = pod.run(
        [*argv, f"--config.num_steps={STEPS + 1}"],
        processes=2,
        devices=2,
        logdir=tmp_path,
        name="b",
    )
    assert codes == [0, 0], text[0][-3000:]
    assert "resumed from checkpoint" in text[0]
    records = audit.read_metrics(workdir)
    assert audit.audit_steps(records, STEPS + 1) == []
    last = json.loads([x for x in text[0].splitlines() if x.startswith('{"')][-1])
    assert last["steps"] == STEPS + 1
