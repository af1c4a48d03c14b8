"""ReplicaSet on its own, stepped by hand (no threads): routing to a lent replica, release, and
partial rollouts resumed on the sampler with the versions that produced their tokens."""

import collections

import jax

from rljax.engine.sampler import Request, Sampler
from rljax.runtime.lending.replicas import ReplicaSet
from rljax.testing.engines import tiny_engine

G = 4  # samples per group; each replica has 4 slots: one group


def _replicas():
    # One token a serve, so the counts below follow the calls.
    main = tiny_engine(max_concurrent_decodes=G, devices=jax.devices()[:1], decode_steps=1)
    lent = tiny_engine(max_concurrent_decodes=G, devices=jax.devices()[6:7], decode_steps=1)
    replicas = ReplicaSet(Sampler(main.engine, main.params, version=3))
    return replicas, Sampler(lent.engine, lent.params, version=4)


def _requests(ids):
    return [Request([1, 2, 3 + i], G, seed=i, request_id=i) for i in ids]


def _drain(replicas) -> list:
    out = []
    while replicas.has_work():
        out.extend(replicas.step())
    return out


def test_lent_requests_resume_on_the_sampler_with_their_versions():
    replicas, lent = _replicas()
    replicas.lend(lent)
    assert replicas.lent_free_slots == G
    replicas.submit(_requests([0, 1, 2]))
    # The first group fills the sampler's slots, the second the lent replica's; the third finds
    # no unclaimed slot and waits on the sampler.
    assert replicas.stats["routed_groups"] == 1
    served = sum(replicas.serve() for _ in range(3))
    # Three generate calls: the prefill's first token and one more each, then two.
    assert served == 3 and replicas.stats["served_tokens"] == 4 * G
    assert replicas.release() is lent
    assert not replicas.serve()  # released: nothing serves until the next lend
    trajs = _drain(replicas)
    groups = collections.defaultdict(list)
    for t in trajs:
        groups[t.group_id].append(t)
    # Nothing lost, nothing twice: every sample of every group, once.
    assert {g: sorted(t.sample_index for t in ts) for g, ts in groups.items()} == {
        g: list(range(G)) for g in (0, 1, 2)
    }
    budget = lent.engine.sampling_cfg.max_new_tokens
    for t in groups[1]:  # lent: 4 tokens at the lent replica's version, the rest at the sampler's
        assert len(t.response_tokens) == budget
        assert t.versions == [4] * 4 + [3] * (budget - 4)
        assert t.min_version == 3
    for g in (0, 2):
        assert all(t.versions == [3] * budget for t in groups[g])
    assert replicas.stats["handed_over_samples"] == replicas.stats["adopted_samples"] == G


def test_abort_and_interrupt_reach_the_lent_replica_and_its_inbox():
    replicas, lent = _replicas()
    replicas.lend(lent)
    replicas.submit(_requests([0, 1]))  # 1 goes to the lent replica's inbox
    replicas.abort(1)  # still in the inbox: dropped there
    assert not replicas.serve()
    replicas.submit(_requests([2]))
    assert replicas.serve()  # 2 prefilled and decoding on the lent replica
    assert replicas.interrupt(2) == G  # held on the sampler, with the lent tokens
    replicas.resume(2)
    replicas.release()
    trajs = _drain(replicas)
    assert sorted({t.group_id for t in trajs}) == [0, 2]
    assert len(trajs) == 2 * G
    assert all(t.versions[0] == 4 for t in trajs if t.group_id == 2)


def test_groups_the_lent_replica_finishes_come_back_through_step():
    replicas, lent = _replicas()
    replicas.lend(lent)
    replicas.submit(_requests([0, 1]))
    while replicas.serve():  # the lent replica finishes group 1 on its own
        pass
    assert replicas.release() is lent and replicas.stats["handed_over_samples"] == 0
    trajs = _drain(replicas)
    budget = lent.engine.sampling_cfg.max_new_tokens
    lent_trajs = [t for t in trajs if t.group_id == 1]
    assert sorted(t.sample_index for t in lent_trajs) == list(range(G))
    assert all(t.versions == [4] * budget for t in lent_trajs)
    assert replicas.stats["served_tokens"] == G * budget
