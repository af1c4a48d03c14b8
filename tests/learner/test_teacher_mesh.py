"""opd's teacher on a mesh of its own (``teacher.devices``): the learner's step with it equals
the step with the teacher on the learner's mesh, its params stay on its devices through a
resize, and rows its devices do not divide are padded."""

import jax
import numpy as np
import pytest

from rljax.config import LearnerConfig, ModelConfig
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.learner.roles import Teacher
from rljax.mesh.resize import MeshCache, move_learner
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.transformer import init_sharded
from rljax.rewards.model import local_mesh

CFG = ModelConfig(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    num_layers=2,
)
OPD = LearnerConfig(advantage="opd", group_size=2, batch_groups=4, learning_rate=1e-3)


def _mesh(first=0, n=2):
    return make_mesh(jax.devices()[first : first + n], {"fsdp": n, "tensor": 1})


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    seqs = [
        TrainSequence(rng.integers(1, 32, 12).tolist(), 4, [-3.0] * 8, reward=0.0) for _ in range(8)
    ]
    return pack_batch(seqs, row_len=16, row_multiple=2)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def _learners(devices):
    """The same student and teacher: the teacher on the learner's mesh, and on ``devices``."""
    mesh = _mesh()
    graphdef, params = init_sharded(CFG, mesh, LEARNER_RULES, 0)
    t_graphdef, t_params = init_sharded(CFG, mesh, LEARNER_RULES, 7)
    here = Learner(OPD, graphdef, params, mesh, teacher=(t_graphdef, t_params))
    own = Teacher(t_graphdef, t_params, local_mesh(devices, "teacher.devices"))
    there = Learner(OPD, graphdef, params, mesh, teacher=own)
    return here, there


def _device_ids(tree):
    return {d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set}


@pytest.mark.parametrize(
    "devices",
    [(2, 3), (4, 5, 6), (1,)],
    ids=["2-way", "3-way-padded", "on-a-learner-device"],  # the last: colocated mode's sharing
)
def test_a_step_with_the_teacher_on_its_own_mesh_equals_one_on_the_learners(devices):
    here, there = _learners(devices)
    assert _device_ids(there.roles.teacher_params) == {jax.local_devices()[i].id for i in devices}
    assert _device_ids(here.roles.teacher_params) == {0, 1}
    batch = _batch()
    mask = batch.arrays["mask"] > 0
    adv_here, adv_there = _advantages(here, batch), _advantages(there, batch)
    np.testing.assert_allclose(adv_there[mask], adv_here[mask], rtol=1e-5, atol=1e-5)
    assert not adv_there[~mask].any()
    a, b = here.step(batch), there.step(batch)
    assert a.keys() == b.keys() and "opd/reverse_kl" in a
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert abs(a["opd/reverse_kl"]) > 1e-3  # a teacher unlike the student: a real signal
    # AdamW moves a weight whose gradient is f32 noise by up to one step (learning_rate):
    # a tenth of one step is the tolerance
    for x, y in zip(_leaves(here.params), _leaves(there.params), strict=True):
        np.testing.assert_allclose(y, x, rtol=0, atol=0.1 * OPD.learning_rate)


def _advantages(learner, batch):
    """The scored batch's per-token advantages, as the learner's step scores them."""
    arrays = jax.device_put(batch.arrays, learner._batch_sharding)
    teacher, arrays = learner.roles.scoring_args(arrays)
    out, _ = learner._score_fn(learner.params, None, learner.ref_params, teacher, arrays)
    assert "teacher_logprobs" not in out  # dropped before the updates
    assert out["advantages"].sharding == arrays["mask"].sharding
    return np.asarray(out["advantages"])


def test_a_resize_moves_the_learner_and_leaves_the_teacher_where_it_is():
    here, there = _learners((6, 7))
    before = there.roles.teacher_params
    moved = move_learner(there, _mesh(2, 4), MeshCache())
    assert moved is not there and there.roles.teacher_params is None  # the old learner let go
    after = moved.roles.teacher_params
    assert _device_ids(after) == {6, 7}
    # the same arrays: the teacher is frozen, so the new learner shares its one copy
    assert all(x is y for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    batch = _batch(1)
    a, b = here.step(batch), moved.step(batch)
    np.testing.assert_allclose(b["opd/reverse_kl"], a["opd/reverse_kl"], rtol=1e-5)
