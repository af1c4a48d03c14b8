"""runtime.pod and pod_resize: which process plays which role, the requests on the wire, and the
one-line errors for pods that cannot run or resume (no processes needed: stand-in devices)."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from rljax.config import ConfigError, MeshConfig
from rljax.engine.engine import SlotSampling
from rljax.engine.sampler import Request
from rljax.mesh import topology
from rljax.mesh.roles import roles
from rljax.policy.reallocation import Split
from rljax.runtime import pod, pod_replay, pod_resize, resizing
from rljax.testing.turns import scripted


def _topology(sampler_hosts, learner_hosts, per_host=2):
    def mesh(hosts):
        devices = [types.SimpleNamespace(process_index=h) for h in hosts for _ in range(per_host)]
        return types.SimpleNamespace(devices=np.array(devices, dtype=object))

    return types.SimpleNamespace(sampler=mesh(sampler_hosts), learner=mesh(learner_hosts))


def test_roles_follow_the_hosts_of_each_mesh():
    r = roles(_topology([0, 1], [2, 3]), process_count=4, me=2, per_host=2)
    assert (r.sampler, r.learner, r.role) == ((0, 1), (2, 3), "learner")
    assert r.is_learner_leader and not r.is_leader
    leader = roles(_topology([0], [1, 2, 3]), process_count=4, me=0, per_host=2)
    assert leader.is_leader and leader.role == "sampler"


def test_a_host_outside_both_meshes_is_refused():
    with pytest.raises(ConfigError, match=r"^process 3 owns no device of either mesh; make") as e:
        roles(_topology([0, 1], [2]), process_count=4, me=0, per_host=2)
    assert "\n" not in str(e.value)


def test_process_0_must_sample():
    with pytest.raises(ConfigError, match="process 0 must own sampler devices"):
        roles(_topology([2, 3], [0, 1]), process_count=4, me=0, per_host=2)


def test_requests_cross_the_wire_unchanged():
    r = Request([5, 6, 7], 4, seed=11, sampling=SlotSampling(temperature=0.0), request_id=9)
    r.max_new_tokens, r.home = 12, 1
    back = pod.decode_request(pod.encode_request(r))
    assert (back.prompt_tokens, back.num_samples, back.seed, back.request_id) == (
        [5, 6, 7],
        4,
        11,
        9,
    )
    assert back.sampling == r.sampling and back.max_new_tokens == 12 and back.home == 1
    plain = pod.decode_request(pod.encode_request(Request([1], 2, seed=3)))
    assert plain.sampling is None and plain.home is None


def test_a_conversation_crosses_the_wire_as_its_example_and_each_host_makes_its_turns():
    example = {"prompt": "37+*=", "stream_position": 3}
    r = Request([5, 6], 2, request_id=4, payload=example, turns=scripted([[7]])[0])
    made = []

    def turns(request):
        made.append((request.request_id, request.payload))
        return lambda index: index

    wire = pod.encode_request(r)
    assert wire["conversation"] == example
    back = pod.decode_request(wire, turns)
    assert made == [(4, example)] and back.payload == example and back.turns(1) == 1
    assert "conversation" not in pod.encode_request(Request([1], 2, payload=example))
    with pytest.raises(pod.PodProtocolError, match="submitted request 4 as a conversation"):
        pod.decode_request(wire)


def test_a_side_that_is_not_whole_hosts_is_refused():
    # 3 processes x 2 devices, 2 sampler + 3 learner devices: host 2 would idle a device.
    with pytest.raises(ConfigError, match=r"'mesh.learner_devices' = 3 is not whole hosts") as e:
        roles(_topology([0, 0], [1, 1, 2], per_host=1), process_count=3, me=0, per_host=2)
    assert "use a multiple of 2" in str(e.value) and "\n" not in str(e.value)


def test_a_split_that_cuts_a_host_is_refused():
    devices = [
        types.SimpleNamespace(process_index=h, id=2 * h + i) for h in range(4) for i in (0, 1)
    ]
    with pytest.raises(ConfigError, match=r"'mesh.sampler_devices' = 3 cuts host 1 in two") as e:
        topology.check_host_boundary(devices, 3)
    assert "use a multiple of 2" in str(e.value) and "\n" not in str(e.value)


def _shape(processes, sampler, learner):
    return {"processes": processes, "sampler": sampler, "learner": learner}


def test_resume_with_another_host_split_is_allowed():
    pod_resize.check_shape(_shape(4, [0, 1], [2, 3]), _shape(4, [0], [1, 2, 3]))
    pod_resize.check_shape(None, _shape(4, [0], [1, 2, 3]))  # a checkpoint of one process


def test_resume_with_another_process_count_is_refused():
    with pytest.raises(ConfigError, match=r"saved by a pod of 4 processes .* has 2; relaunch") as e:
        pod_resize.check_shape(_shape(4, [0, 1], [2, 3]), _shape(2, [0], [1]))
    assert "\n" not in str(e.value)


def test_reallocation_moves_whole_hosts():
    pod_resize.check_granularity(4, 2)
    with pytest.raises(ConfigError, match=r"moves part of a host; .* multiple of 2"):
        pod_resize.check_granularity(1, 2)


@pytest.mark.parametrize(
    ("text", "splits"),
    [("", {}), ("3:2/6", {3: (2, 6)}), ("3:2/6, 5:4/4", {3: (2, 6), 5: (4, 4)})],
)
def test_resize_schedule_parses(text, splits):
    cfg = MeshConfig(mode="split", sampler_devices=4, learner_devices=4, resize_schedule=text)
    assert cfg.scheduled_splits() == splits


@pytest.mark.parametrize("text", ["3", "3:2", "3:2/x", "0:2/6", "3:0/6", "5:2/6,3:4/4", "3:2/6/1"])
def test_a_bad_resize_schedule_is_refused(text):
    with pytest.raises(ConfigError, match=r"'mesh.resize_schedule' .* expected 'version:sampler"):
        MeshConfig(mode="split", sampler_devices=4, learner_devices=4, resize_schedule=text)


def test_a_resize_schedule_needs_split_meshes():
    with pytest.raises(ConfigError, match=r"'mesh.resize_schedule' .* unless mesh.mode='split'"):
        MeshConfig(resize_schedule="3:2/6")


def _leader(version, schedule="3:2/6,5:4/4", split=(4, 4)):
    cfg = MeshConfig(mode="split", sampler_devices=4, learner_devices=4, resize_schedule=schedule)
    return types.SimpleNamespace(
        cfg=types.SimpleNamespace(mesh=cfg, learner=types.SimpleNamespace(batch_size=24)),
        learner=types.SimpleNamespace(version=version),
        topology=types.SimpleNamespace(split=Split(*split)),
        devices=jax.devices()[:8],
        driver=object(),
        reallocation=None,
    )


def test_the_resize_decision_is_a_function_of_the_version():
    assert resizing.propose(_leader(3)) == (Split(2, 6), "schedule")
    assert resizing.propose(_leader(3)) == resizing.propose(_leader(3))  # same inputs, same split
    assert resizing.propose(_leader(4, split=(2, 6))) is None
    assert resizing.propose(_leader(5, split=(2, 6))) == (Split(4, 4), "schedule")
    assert resizing.propose(_leader(5)) is None  # already there


def test_replica_check_names_a_shard_whose_copies_differ():
    devices = jax.devices()[:4]
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ("a", "b"))
    spec = jax.sharding.PartitionSpec("a")  # rows over 'a', each row block on 2 devices
    x = jax.device_put(np.arange(8.0).reshape(4, 2), jax.sharding.NamedSharding(mesh, spec))
    same = pod_replay.shard_digests({"w": x})
    check = pod_replay.compare_replicas([same, same])
    assert check["equal"] and check["replicated_shards"] == 2, check
    other = {k: [d[::-1] for d in v] for k, v in same.items()}  # another process's bytes differ
    check = pod_replay.compare_replicas([same, other])
    assert not check["equal"] and len(check["differ"]) == 2, check
