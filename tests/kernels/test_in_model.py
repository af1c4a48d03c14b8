"""The Pallas kernels inside the model on multi-device role meshes, under shard_map.

Interpret-mode Pallas on CPU (impl='pallas') must agree with the XLA path (impl='xla') for the
learner's log-probs, one SFT step and the engine's greedy decode; the mesh axes the kernels
split over come from the role's rules.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rljax.config import LearnerConfig
from rljax.engine.sampler import Request, Sampler
from rljax.learner.batch import TrainSequence, pack_batch
from rljax.learner.learner import Learner
from rljax.models.sharding import (
    LEARNER_RULES,
    SAMPLER_RULES,
    ShardingRules,
    kernel_mesh_axes,
    make_mesh,
)
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import tiny_engine


@pytest.fixture(scope="module")
def tiny():
    return tiny_engine()


def _learner_mesh():
    return make_mesh(jax.devices()[:4], {"fsdp": 2, "tensor": 2})


def _shard_map_specs(jaxpr) -> list[tuple]:
    """in_specs of every shard_map equation, searching nested jaxprs (scan bodies, jits)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            found.append(tuple(eqn.params["in_specs"]))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_shard_map_specs(sub))
    return found


def test_kernel_mesh_axes_follow_the_role_rules_and_fall_back_to_replicated():
    learner = _learner_mesh()
    sampler4 = make_mesh(jax.devices()[:4], {"data": 1, "tensor": 4})
    one = make_mesh(jax.devices()[:1], {"fsdp": 1, "tensor": 1})
    dims = (("batch", 8), ("heads", 2))
    assert kernel_mesh_axes((learner, LEARNER_RULES), "pallas", dims) == (
        learner,
        ("fsdp", "tensor"),
    )
    # No shard_map: no sharding, the XLA path (GSPMD partitions it), or a single device.
    assert kernel_mesh_axes(None, "pallas", dims) is None
    assert kernel_mesh_axes((learner, LEARNER_RULES), "xla", dims) is None
    assert kernel_mesh_axes((one, LEARNER_RULES), "pallas", dims) is None
    # 2 kv heads on a 4-way tensor axis, and a 1-row prefill on 2 data shards: replicated.
    assert kernel_mesh_axes((sampler4, SAMPLER_RULES), "pallas", dims)[1] == ("data", None)
    sampler = make_mesh(jax.devices()[:4], {"data": 2, "tensor": 2})
    got = kernel_mesh_axes((sampler, SAMPLER_RULES), "pallas", (("batch", 1), ("heads", 2)))
    assert got[1] == (None, "tensor")
    # A mesh axis shards one dimension only; an axis the mesh lacks is replicated.
    clash = ShardingRules("x", {"batch": "tensor", "heads": "tensor"})
    assert kernel_mesh_axes((learner, clash), "pallas", dims)[1] == ("tensor", None)
    absent = ShardingRules("x", {"batch": "data", "heads": ("fsdp", "tensor")})
    assert kernel_mesh_axes((learner, absent), "pallas", dims)[1] == (None, None)
    assert kernel_mesh_axes((learner, absent), "pallas", (("heads", 4),))[1] == (
        ("fsdp", "tensor"),
    )


def test_unknown_impl_is_a_one_line_error():
    with pytest.raises(ValueError, match="impl") as exc:
        kernel_mesh_axes((_learner_mesh(), LEARNER_RULES), "mosaic", (("batch", 8),))
    assert "\n" not in str(exc.value)


def test_model_attention_runs_under_shard_map_only_on_the_pallas_path(tiny):
    mesh = _learner_mesh()
    model = nnx.merge(tiny.graphdef, tiny.state)
    tokens = jnp.ones((4, 8), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(8), (4, 8))

    def specs(impl, sharding):
        fn = lambda: model(tokens, pos, jnp.ones_like(tokens), impl=impl, sharding=sharding)
        return _shard_map_specs(jax.make_jaxpr(fn)().jaxpr)

    (got,) = specs("pallas", (mesh, LEARNER_RULES))
    assert got[0] == P("fsdp", None, "tensor", None)  # q: rows over fsdp, heads over tensor
    assert got[3] == P("fsdp", None)  # segment ids
    assert specs("xla", (mesh, LEARNER_RULES)) == []
    assert specs("pallas", None) == []

    cfg = TINY_MODEL
    k_pages = jnp.zeros(
        (cfg.num_layers, cfg.num_kv_heads, 9, 4, cfg.head_dim), jnp.float32
    )  # [L, K, P, Z, H]
    sampler = make_mesh(jax.devices()[:4], {"data": 2, "tensor": 2})
    decode = lambda: model.decode(
        tokens[:, 0],
        pos[:, 0],
        k_pages,
        k_pages,
        jnp.zeros((4, 2), jnp.int32),
        impl="pallas",
        sharding=(sampler, SAMPLER_RULES),
    )
    (got,) = _shard_map_specs(jax.make_jaxpr(decode)().jaxpr)
    assert got[0] == P("data", "tensor", None)  # slots over data, heads over tensor
    # Every layer's pool, the layer read inside: kv heads only, as in the engine.
    assert got[1] == P(None, "tensor", None, None, None)


def _sft_batch(dp):
    seqs = [
        TrainSequence([1, 3, 5, 7, 9, 11], 2),
        TrainSequence([1, 4, 8, 12], 1),
        TrainSequence([2, 6, 10, 14, 15], 3),
        TrainSequence([1, 2, 3], 1),
    ]
    return pack_batch(seqs, row_len=8, micro_batches=2, row_multiple=dp)


def _learners(tiny, **kw):
    mesh = _learner_mesh()
    cfg = LearnerConfig(group_size=2, batch_groups=2, micro_batches=2, learning_rate=1e-2)
    return {
        impl: Learner(cfg, tiny.graphdef, tiny.state, mesh, kernel_impl=impl, **kw)
        for impl in ("pallas", "xla")
    }


def test_learner_logprobs_and_sft_step_match_xla_on_fsdp_tensor_mesh(tiny):
    learners = _learners(tiny, loss="sft", temperature=0.7)
    batch = _sft_batch(learners["xla"].dp)
    logp = {impl: lrn.token_logprobs(batch) for impl, lrn in learners.items()}
    mask = batch.arrays["mask"] > 0
    assert np.all(logp["xla"][mask] < 0)
    np.testing.assert_allclose(logp["pallas"][mask], logp["xla"][mask], atol=2e-5)

    metrics = {impl: lrn.step(batch) for impl, lrn in learners.items()}
    assert metrics["xla"]["grad_norm"] > 0
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(metrics["pallas"][key], metrics["xla"][key], rtol=1e-4)


def test_engine_greedy_tokens_match_xla_on_data_tensor_mesh():
    requests = [
        Request([1, 4, 6, 2, 3], max_new_tokens=4, num_samples=2),
        Request([5, 9], max_new_tokens=4),
        Request([7, 8, 10, 11, 12, 13, 14], max_new_tokens=3),
    ]
    tokens = {}
    for impl in ("pallas", "xla"):
        tiny = tiny_engine(
            temperature=0.0,
            impl=impl,
            devices=jax.devices()[:4],
            data=2,
            max_new_tokens=4,
            max_prefill_length=8,
        )
        assert dict(tiny.engine.mesh.shape) == {"data": 2, "tensor": 2}
        trajs = Sampler(tiny.engine, tiny.params).run(requests)
        tokens[impl] = sorted((t.prompt_tokens, t.response_tokens) for t in trajs)
    assert len(tokens["xla"]) == 4
    assert tokens["pallas"] == tokens["xla"]
    prompt, response = tokens["xla"][0]
    assert response == tiny.greedy_reference(prompt, len(response))
