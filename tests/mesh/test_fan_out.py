"""The two-stage multislice weight sync on 8 fake CPU devices (two emulated slices of 4)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.config import MeshConfig
from rljax.mesh.fan_out import fan_out, stage_shardings
from rljax.mesh.topology import build_topology
from rljax.mesh.weight_sync import WeightSync
from rljax.models.sharding import LEARNER_RULES, SAMPLER_RULES, state_shardings
from rljax.models.transformer import Decoder
from rljax.testing import pod
from rljax.testing.configs import TINY_MODEL


def _setup(layout: str):
    cfg = MeshConfig(
        mode="split",
        num_slices=2,
        slice_layout=layout,
        sampler_devices=4,
        learner_devices=4,
        sampler_data=2,
        sampler_tensor=2,
    )
    topo = build_topology(cfg)
    # Random weights on an abstract model: no initialiser to compile.
    abstract = nnx.split(nnx.eval_shape(lambda: Decoder(TINY_MODEL, rngs=nnx.Rngs(0))))[1]
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), abstract)
    params = jax.device_put(params, state_shardings(abstract, topo.learner, LEARNER_RULES))
    return topo, params, lambda tree: state_shardings(tree, topo.sampler, SAMPLER_RULES)


def _leaves(tree):
    return jax.tree.leaves(tree)


@pytest.mark.parametrize("layout", ["by_role", "spread"])
def test_two_stages_equal_one_stage_bitwise(layout):
    topo, params, targets = _setup(layout)
    one = WeightSync(targets, dtype="bfloat16")
    two = WeightSync(targets, dtype="bfloat16", slices=topo.slices)
    assert two.slices and not one.slices
    a, b = one.copy(params), two.copy(params)
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        assert x.sharding == y.sharding
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
    assert any(x.sharding.spec != jax.sharding.PartitionSpec() for x in _leaves(b))


def test_stage_one_writes_one_copy_onto_one_sampler_replica():
    topo, params, targets = _setup("by_role")
    replica = {d.id for d in topo.sampler.devices[0].flat}  # data index 0: 2 'tensor' devices
    assert replica == {0, 1}
    out, staged = fan_out(params, targets(params), topo.slices)
    for x in _leaves(staged):
        assert {d.id for d in x.devices()} <= replica
        # One copy: the shards written add up to the leaf, no device holds a duplicate.
        assert sum(sh.data.nbytes for sh in x.addressable_shards) == x.nbytes
    assert {d.id for x in _leaves(out) for d in x.devices()} == {0, 1, 2, 3}
    stats = WeightSync(targets, dtype="bfloat16", slices=topo.slices).publish(params, 1)
    assert stats.stage_bytes == stats.bytes  # one copy crossed, not one per replica (2)


def test_spread_stages_one_copy_into_each_sampler_slice():
    topo, params, targets = _setup("spread")
    slice_of = dict(topo.slices)
    stage = stage_shardings(targets(params), topo.slices)
    for s in _leaves(stage):
        ids = {d.id for d in s.device_set}
        assert {slice_of[i] for i in ids} == {0, 1}
        assert len(ids) <= 4  # at most one replica (2 devices) per slice
    stats = WeightSync(targets, slices=topo.slices).publish(params, 1)
    assert stats.stage_bytes == 2 * stats.bytes


def test_one_slice_keeps_one_stage():
    topo = build_topology(MeshConfig(mode="split", sampler_devices=4, learner_devices=4))
    assert topo.slices == () and topo.num_slices == 1
    sync = WeightSync(lambda t: t, slices=topo.slices)
    assert sync.slices == ()


_POD_SCRIPT = """
import json
import numpy as np
from rljax.mesh import distributed
distributed.maybe_initialize()
import jax
from rljax.config import MeshConfig
from rljax.mesh.topology import build_topology
from rljax.models.loading import abstract_params
from rljax.runtime.pod import PodWeights
from rljax.testing.configs import TINY_MODEL
cfg = MeshConfig(mode="split", num_slices=2, sampler_devices=4, learner_devices=4,
                 sampler_data=2, sampler_tensor=2)
topo = build_topology(cfg)
_, abstract = abstract_params(TINY_MODEL, topo.learner)
leaves, treedef = jax.tree.flatten(abstract)
rng = np.random.default_rng(0)
values = [rng.standard_normal(a.shape).astype(a.dtype) for a in leaves]
learner = any(d.process_index == jax.process_index() for d in topo.learner.devices.flat)
params = None
if learner:
    params = treedef.unflatten([
        jax.make_array_from_callback(a.shape, a.sharding, lambda i, v=v: v[i])
        for a, v in zip(leaves, values)
    ])
one = PodWeights(abstract, topo.sampler, "bfloat16")
two = PodWeights(abstract, topo.sampler, "bfloat16", topo.slices)
a, b = one.move(params), two.move(params)
out = {"stages": two.full.stages is not None, "stage_bytes": two.stage_bytes, "bytes": two.bytes}
if not learner:
    want = [v.astype(jax.numpy.bfloat16) for v in values]
    out["equal"] = all(
        np.array_equal(np.asarray(sa.data).view(np.uint16), np.asarray(sb.data).view(np.uint16))
        and np.array_equal(np.asarray(sb.data).view(np.uint16), w[sb.index].view(np.uint16))
        for x, y, w in zip(jax.tree.leaves(a), jax.tree.leaves(b), want)
        for sa, sb in zip(x.addressable_shards, y.addressable_shards)
    )
    out["leaves"] = len(jax.tree.leaves(b))
else:
    out["leaves"] = sum(x is not None for x in jax.tree.leaves(b, is_leaf=lambda x: x is None))
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_pod_moves_weights_in_two_stages_across_processes(tmp_path):
    """Two slices of two processes each: the sampler slice's first process receives the one
    copy, the other takes it from there; the same bytes as the one-stage union transfer."""
    codes, logs = pod.run(["-c", _POD_SCRIPT], processes=4, devices=2, logdir=tmp_path, timeout=300)
    assert codes == [0] * 4, logs
    out = [pod.result(log) for log in logs]
    assert all(o["stages"] and o["stage_bytes"] == o["bytes"] for o in out), out
    assert [o.get("equal") for o in out[:2]] == [True, True], out
    assert out[0]["leaves"] > 0 and [o["leaves"] for o in out[2:]] == [0, 0], out
