"""rljax.mesh.distributed: world detection, host all-gathers, prompts sharded by process, and
real two-process runs (the gather helpers alone, and the launcher)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from rljax.configs import arith_tiny

from rljax import runtime
from rljax.config import ConfigError
from rljax.data.pipeline import prompt_iterator
from rljax.mesh import distributed
from rljax.mesh.distributed import (
    DistributedConfigError,
    DistributedPlan,
    detect,
)
from rljax.testing import pod


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


def test_allgather_objects_on_one_process():
    value = {"prompt": "1+2=", "rewards": [0.5, 1.0], "pair": (1, 2)}
    # The JSON round trip runs on one process too, so a tuple comes back as a list everywhere.
    assert distributed.allgather_objects(value) == [{**value, "pair": [1, 2]}]
    assert distributed.allgather_objects([]) == [[]]
    with pytest.raises(TypeError, match="not JSON-serialisable .*; convert numpy scalars"):
        distributed.allgather_objects({"x": object()})


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: dataclasses.replace(
                c, learner=dataclasses.replace(c.learner, batch_groups=3)
            ),
            "config key 'learner.batch_groups' = 3 does not divide by the process count 2 (each "
            "process reads an equal share of the prompts); set it to a multiple of 2",
        ),
        (
            lambda c: dataclasses.replace(c, mode="async"),
            "config key 'mode' = 'async' on 2 processes needs split meshes",
        ),
    ],
)
def test_multi_process_run_config_is_checked_first(monkeypatch, tmp_path, change, message):
    # The checks run before anything is built, so a pretend second process costs nothing.
    monkeypatch.setattr(distributed, "data_shard", lambda: (0, 2))
    with pytest.raises(ConfigError) as e:
        runtime.Run(change(arith_tiny.recipe("small")), str(tmp_path))
    assert message in str(e.value) and "\n" not in str(e.value)


def _launch(tmp_path, argv: list[str], name: str, devices: int) -> list[str]:
    """Runs ``python argv`` as process 0 and 1 of a localhost world; returns their logs."""
    codes, logs = pod.run(
        argv, processes=2, devices=devices, logdir=tmp_path, name=name, timeout=400
    )
    assert codes == [0, 0], logs
    return logs


_GATHER_SCRIPT = """
import json
from rljax.mesh import distributed
from rljax.runtime.exchange import AllGather
from rljax.runtime.prompts import PromptStream

distributed.maybe_initialize()
index = distributed.process_index()
out = {"gather": distributed.allgather_objects({"process": index, "text": "ab" * (1 + 50 * index)})}
examples = [{"prompt": str(k)} for k in range(40)]
stream = PromptStream(examples, seed=0, batch_size=4, exchange=AllGather())
out["batch"] = [ex["prompt"] for ex in next(stream)]
out["state"] = stream.get_state()
print("RESULT " + json.dumps(out))
"""


def test_two_processes_gather_objects_and_read_one_stream(tmp_path):
    """The real collective (gloo): unequal lengths, process order; the prompt stream read in
    strides and all-gathered gives both processes the one-process batch."""
    logs = _launch(tmp_path, ["-c", _GATHER_SCRIPT], "gather", devices=1)
    out = [pod.result(log) for log in logs]
    expected = [{"process": 0, "text": "ab"}, {"process": 1, "text": "ab" * 51}]
    assert out[0]["gather"] == out[1]["gather"] == expected
    it = prompt_iterator([{"prompt": str(k)} for k in range(40)], batch_size=4, seed=0)
    assert out[0]["batch"] == out[1]["batch"] == [ex["prompt"] for ex in next(it)]
    assert out[0]["state"] == out[1]["state"] == {"position": 4}


def _data_events(log: str) -> list[tuple[str, dict]]:
    """The JSON lines Run logs at DEBUG level ('data read|scored|learner {...}')."""
    return [
        (m.group(1), json.loads(m.group(2)))
        for m in re.finditer(r"\] data (read|scored|learner) (\{.*\})$", log, re.MULTILINE)
    ]


@pytest.mark.slow
def test_two_processes_run_the_launcher(tmp_path):
    """Two CPU processes x 2 devices form one 4-device program; only process 0 writes.

    Each process reads its own half of the step's prompts (every other position of the stream)
    and scores only those; the learner on both processes trains on the union, in stream order.
    """
    argv = [
        "-m",
        "rljax.launch",
        "--config=configs/arith_tiny.py:small",
        "--config.sft.steps=0",
        "--config.num_steps=1",
        "--config.eval_examples=4",
        "--config.data.heldout_size=4",
        "--logger_levels=rljax.runtime:DEBUG",
        f"--workdir={tmp_path}/w{{pid}}",
    ]
    logs = _launch(tmp_path, argv, "log", devices=2)
    rows = [json.loads(x) for x in (tmp_path / "w0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [0], rows
    assert not (tmp_path / "w1" / "metrics.jsonl").exists()
    # Only process 0 prints the run summary; both saw the 4-device global world.
    assert '"steps": 1' in logs[0] and '"steps"' not in logs[1]

    events = [_data_events(log) for log in logs]
    reads = [[e["prompts"] for kind, e in ev if kind == "read"] for ev in events]
    assert [len(r) for r in reads] == [1, 1], logs  # one step, one read per process
    read0, read1 = reads[0][0], reads[1][0]
    assert len(read0) == len(read1) == 2 and not set(read0) & set(read1)  # batch_groups 4 / 2
    learner = [[e["prompts"] for kind, e in ev if kind == "learner"] for ev in events]
    in_stream_order = [p for pair in zip(read0, read1, strict=True) for p in pair]
    assert learner == [[in_stream_order], [in_stream_order]]  # process p read positions p, p+2
    for p, ev in enumerate(events):
        scored = [e for kind, e in ev if kind == "scored"]
        train = [e for e in scored if e["of"] == 4 * 8]  # 4 groups of 8 samples
        assert [(e["prompts"], e["trajectories"]) for e in train] == [(sorted(reads[p][0]), 16)]
        # Held-out evaluation (before and after): 4 greedy samples, 2 scored on each process.
        assert [(e["trajectories"], e["of"]) for e in scored if e["of"] == 4] == [(2, 4)] * 2


def test_processes_with_different_configs_are_refused_on_every_process(monkeypatch):
    from rljax.configs import arith_tiny

    from rljax.config import replace
    from rljax.mesh import distributed as dist

    cfg = arith_tiny.recipe("small")
    hashes = {}

    def record(obj):  # one process: remember the hash the config gave
        hashes["mine"] = obj
        return [obj]

    monkeypatch.setattr(dist, "allgather_objects", record)
    dist.check_same_config(replace(cfg, seed=1))
    other = hashes["mine"]
    # Two processes: this one, and one launched with seed=1.
    monkeypatch.setattr(dist, "allgather_objects", lambda obj: [obj, other])
    dist.check_same_config(replace(cfg, seed=1))  # the same config on both: accepted
    with pytest.raises(ConfigError, match=r"process 1 runs a different config than process 0"):
        dist.check_same_config(cfg)
