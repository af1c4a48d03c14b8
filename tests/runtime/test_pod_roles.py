"""runtime.pod: which process plays which role, the requests on the wire, and the one-line
errors for pods that cannot run (no processes needed: stand-in devices)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from rljax.config import ConfigError
from rljax.engine.engine import SlotSampling
from rljax.engine.sampler import Request
from rljax.runtime import pod


def _topology(sampler_hosts, learner_hosts, per_host=2):
    def mesh(hosts):
        devices = [types.SimpleNamespace(process_index=h) for h in hosts for _ in range(per_host)]
        return types.SimpleNamespace(devices=np.array(devices, dtype=object))

    return types.SimpleNamespace(sampler=mesh(sampler_hosts), learner=mesh(learner_hosts))


def test_roles_follow_the_hosts_of_each_mesh():
    r = pod.roles(_topology([0, 1], [2, 3]), process_count=4, me=2)
    assert (r.sampler, r.learner, r.role) == ((0, 1), (2, 3), "learner")
    assert r.is_learner_leader and not r.is_leader
    leader = pod.roles(_topology([0], [1, 2, 3]), process_count=4, me=0)
    assert leader.is_leader and leader.role == "sampler"


def test_a_host_outside_both_meshes_is_refused():
    with pytest.raises(ConfigError, match=r"^process 3 owns no device of either mesh; make") as e:
        pod.roles(_topology([0, 1], [2]), process_count=4, me=0)
    assert "\n" not in str(e.value)


def test_process_0_must_sample():
    with pytest.raises(ConfigError, match="process 0 must own sampler devices"):
        pod.roles(_topology([2, 3], [0, 1]), process_count=4, me=0)


def test_requests_cross_the_wire_unchanged():
    r = Request([5, 6, 7], 4, seed=11, sampling=SlotSampling(temperature=0.0), request_id=9)
    r.max_new_tokens = 12
    back = pod.decode_request(pod.encode_request(r))
    assert (back.prompt_tokens, back.num_samples, back.seed, back.request_id) == (
        [5, 6, 7],
        4,
        11,
        9,
    )
    assert back.sampling == r.sampling and back.max_new_tokens == 12
    plain = pod.decode_request(pod.encode_request(Request([1], 2, seed=3)))
    assert plain.sampling is None
