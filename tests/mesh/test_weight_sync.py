"""WeightSync's cast to the sampler's dtype, and the sampler's model in that dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax.mesh.weight_sync import WeightSync, sampler_model
from rljax.models.sharding import make_mesh
from rljax.models.transformer import Decoder
from rljax.testing.configs import TINY_MODEL


def _sync(dtype):
    mesh = make_mesh(jax.devices()[1:3], {"data": 2})  # a mesh of its own, like the sampler's
    replicated = NamedSharding(mesh, PartitionSpec())
    return WeightSync(lambda tree: jax.tree.map(lambda _: replicated, tree), dtype=dtype)


def _params():
    return {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) / 7.0, "ids": jnp.arange(5)}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_publish_casts_floats_to_the_sampler_dtype_and_keeps_the_master(dtype):
    sync, params = _sync(dtype), _params()
    stats = sync.publish(params, 1)
    copy, version = sync.acquire()
    assert version == 1
    assert copy["w"].dtype == jnp.dtype(dtype)
    assert copy["ids"].dtype == jnp.int32  # integer leaves are never cast
    np.testing.assert_array_equal(copy["w"], params["w"].astype(dtype))
    assert params["w"].dtype == jnp.float32  # the learner's master copy is untouched
    assert stats.bytes == 12 * jnp.dtype(dtype).itemsize + 5 * 4
    assert {d.id for d in copy["w"].devices()} == {1, 2}
    # The sampler's first params (not a publish) go through the same cast.
    first = sync.copy(params)
    assert first["w"].dtype == jnp.dtype(dtype)
    assert sync.acquire()[1] == 1


def test_no_dtype_keeps_each_leaf():
    sync = _sync(None)
    half = {"w": jnp.ones(3, jnp.bfloat16)}
    assert sync.copy(half)["w"].dtype == jnp.bfloat16
    assert sync.copy(_params())["w"].dtype == jnp.float32


def test_sampler_model_computes_in_the_sampler_dtype():
    model = nnx.eval_shape(lambda: Decoder(TINY_MODEL, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    assert sampler_model(TINY_MODEL, graphdef, "float32") == (TINY_MODEL, graphdef)
    cfg, bf16_graphdef = sampler_model(TINY_MODEL, graphdef, "bfloat16")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "bfloat16")
    assert cfg.hidden_size == TINY_MODEL.hidden_size
    # The graphdef carries the config the decoder computes with (its activations, KV pages).
    assert nnx.merge(bf16_graphdef, state).cfg.dtype == "bfloat16"
    assert nnx.merge(graphdef, state).cfg.dtype == "float32"
