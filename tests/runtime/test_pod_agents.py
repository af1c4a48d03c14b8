"""Agents on a pod: 3 processes x 2 CPU devices on localhost (the sampler on hosts 0-1, the
learner on host 2) run configs/arith_tools.py:small. Each conversation's env steps on the
sampler host that read its prompt, the leader posts each step's env answers with the step, and
the pod trains exactly what one process does with the same config and split, bit for bit,
decoding four tokens a device call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rljax.testing import audit, pod

ARGV = [
    "-m",
    "rljax.launch",
    "--config=configs/arith_tools.py:small",
    "--config.mesh.mode=split",
    "--config.mesh.sampler_devices=4",
    "--config.mesh.learner_devices=2",
    "--config.num_steps=2",
    # Four tokens a decode call: the followers replay multi-step calls, turns ending inside one.
    "--config.sampling.decode_steps=4",
    "--config.eval_examples=4",
    "--config.metrics.progress_bar=False",
]


def _summary(log: str) -> dict:
    return json.loads([x for x in log.splitlines() if x.startswith('{"')][-1])


@pytest.mark.slow
def test_each_host_steps_its_conversations_envs_and_the_pod_trains_what_one_process_does(
    tmp_path,
):
    pod_dir, one_dir = tmp_path / "pod", tmp_path / "one"
    # A hang (a follower that ignored the leader's answers would wait for its own envs, or
    # step a different program) fails here rather than waiting for ever.
    codes, logs = pod.run(
        [*ARGV, f"--workdir={pod_dir}"], processes=3, devices=2, logdir=tmp_path, timeout=240
    )
    assert codes == [0, 0, 0], "\n".join(log[-2000:] for log in logs)
    hosts = _summary(logs[0])["pod"]
    assert (hosts["sampler"], hosts["learner"]) == ([0, 1], [2])
    # Both sampler hosts' envs answered turns (evaluation's included): host 1's reached the
    # leader through the channel.
    turns = hosts["env_turns_by_host"]
    assert sorted(turns) == ["0", "1"] and min(turns.values()) > 0, hosts
    assert hosts["scored_by_host"] == {"0": 0, "1": 0}, "a conversation's reward is its env's"
    pod_metrics = audit.read_metrics(pod_dir)
    train = [r for r in pod_metrics if r["phase"] == "train"]
    assert len(train) == 2
    assert all(r["turns_per_conversation"] > 0 for r in train), train
    assert sum(r["tool_calls"] for r in train) > 0, [r["tool_calls"] for r in train]
    assert all(r["env_errors/raised"] == r["env_errors/timeout"] == 0 for r in train)

    # One process with the same config and split: the same metrics, bit for bit.
    one = subprocess.run(
        [sys.executable, *ARGV, f"--workdir={one_dir}"],
        cwd=pod.REPO,
        env=pod.cpu_env(6),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    one_metrics = audit.read_metrics(Path(one_dir))
    # occupancy is timed (slot-seconds over busy seconds): it differs between any two runs
    assert audit.audit_same_metrics(one_metrics, pod_metrics, ("sampler_occupancy",)) == []
    evals = [(r["phase"], r["heldout_accuracy"]) for r in one_metrics if "eval" in r["phase"]]
    assert evals == [
        (r["phase"], r["heldout_accuracy"]) for r in pod_metrics if "eval" in r["phase"]
    ]
