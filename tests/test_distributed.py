"""rljax.mesh.distributed: world detection, and a real two-process run of the launcher."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rljax.data.pipeline import prompt_iterator
from rljax.mesh import distributed
from rljax.mesh.distributed import DistributedConfigError, DistributedPlan, detect

REPO = Path(__file__).resolve().parents[1]


def test_single_host_without_environment():
    assert detect({}) == DistributedPlan("single")
    # A one-host TPU VM lists only itself.
    assert detect({"TPU_WORKER_HOSTNAMES": "localhost"}).mode == "single"


@pytest.mark.parametrize(
    "env",
    [
        {"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5"},
        {"TPU_PROCESS_ADDRESSES": "a:8476,b:8476"},
        {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080"},
    ],
)
def test_tpu_pod_is_detected(env):
    assert detect(env).mode == "tpu_pod"


def test_explicit_world():
    env = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "2"}
    assert detect({**env, "JAX_PROCESS_ID": "1"}) == DistributedPlan(
        "explicit", "127.0.0.1:1234", 2, 1
    )
    assert detect({**env, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}).mode == "single"
    assert detect({**env, "JAX_PROCESS_ID": "1", "RLJAX_DISTRIBUTED": "0"}).mode == "single"


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234"},
            "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES, JAX_PROCESS_ID is not",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
            "JAX_PROCESS_ID=2 with JAX_NUM_PROCESSES=2 is invalid; the id must be in [0, 2)",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
            "JAX_NUM_PROCESSES='two' is not an integer",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
            "JAX_COORDINATOR_ADDRESS='h' has no port; use host:port",
        ),
    ],
)
def test_bad_environment_names_the_fix(env, message):
    with pytest.raises(DistributedConfigError) as e:
        detect(env)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_single_host_initialize_is_a_noop():
    info = distributed.maybe_initialize({})
    assert (info.index, info.count, info.mode, info.is_primary) == (0, 1, "single", True)
    assert distributed.data_shard() == (0, 1)


def test_process_shards_of_the_prompt_stream_are_disjoint():
    examples = [{"prompt": str(i), "answer": str(i)} for i in range(64)]
    seen = []
    for index in range(4):
        it = prompt_iterator(
            examples, batch_size=4, seed=0, shard_index=index, shard_count=4, num_epochs=1
        )
        seen.append([ex["prompt"] for batch in it for ex in batch])
    flat = [p for shard in seen for p in shard]
    assert len(flat) == len(set(flat)) == 64
    assert all(len(shard) == 16 for shard in seen)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_run_the_launcher(tmp_path):
    """Two CPU processes x 2 devices form one 4-device program; only process 0 writes."""
    port = _free_port()
    procs = []
    with contextlib.ExitStack() as stack:
        for pid in range(2):
            env = dict(os.environ)
            env.update(
                JAX_PLATFORMS="cpu",
                JAX_NUM_CPU_DEVICES="2",
                XLA_FLAGS="",
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES="2",
                JAX_PROCESS_ID=str(pid),
            )
            cmd = [
                sys.executable,
                "-m",
                "rljax.launch",
                "--config=configs/arith_tiny.py:test",
                "--config.sft.steps=0",
                "--config.num_steps=1",
                "--config.eval_examples=4",
                "--config.data.heldout_size=4",
                f"--workdir={tmp_path / f'w{pid}'}",
            ]
            log = stack.enter_context(open(tmp_path / f"log{pid}.txt", "w"))
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log))
        for p in procs:
            p.wait(timeout=400)
    logs = [(tmp_path / f"log{i}.txt").read_text() for i in range(2)]
    assert [p.returncode for p in procs] == [0, 0], logs
    rows = [json.loads(x) for x in (tmp_path / "w0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [0], rows
    assert not (tmp_path / "w1" / "metrics.jsonl").exists()
    # Only process 0 prints the run summary; both saw the 4-device global world.
    assert '"steps": 1' in logs[0] and '"steps"' not in logs[1]
