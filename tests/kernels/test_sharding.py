"""kernels/sharding.py: the one axis_size, the mesh-axis checks the sharded_* wrappers share."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from rljax.kernels import sharding
from rljax.kernels.flash_attention import sharded_flash_attention
from rljax.kernels.fused_logprobs import sharded_token_logprobs_and_entropy
from rljax.kernels.paged_attention import sharded_paged_decode_attention

from rljax.models import sharding as model_sharding


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def test_axis_size_counts_names_tuples_and_none(mesh):
    assert sharding.axis_size(mesh, None) == 1
    assert sharding.axis_size(mesh, "data") == 4
    assert sharding.axis_size(mesh, ("data", "model")) == 8
    # A rule table may name an axis one of its meshes lacks: it splits nothing.
    assert sharding.axis_size(mesh, ("data", "fsdp")) == 4


def test_models_use_the_same_axis_size():
    assert model_sharding.axis_size is sharding.axis_size
    assert model_sharding.axis_names is sharding.axis_names


def test_checks_are_one_line_errors_naming_the_fix(mesh):
    sharding.check_axes(mesh, batch_axes=("data", "model"), head_axis=None)
    with pytest.raises(ValueError, match=r"head_axis='tensor' names mesh axes \['tensor'\]") as e:
        sharding.check_axes(mesh, batch_axes="data", head_axis="tensor")
    assert "\n" not in str(e.value) and "pick from ('data', 'model')" in str(e.value)
    sharding.check_divides("q's B", 8, mesh, "data", "pad the batch")
    with pytest.raises(ValueError, match="q's B=6 must divide by the 4 shards of mesh axes 'data'"):
        sharding.check_divides("q's B", 6, mesh, "data", "pad the batch")


def test_every_sharded_wrapper_rejects_an_axis_the_mesh_lacks(mesh):
    q = jnp.zeros((4, 8, 2, 16))
    with pytest.raises(ValueError, match="head_axis='tensor' names mesh axes"):
        sharded_flash_attention(mesh, "data", "tensor", q, q, q)
    pages = jnp.zeros((2, 8, 4, 16))
    lengths, table = jnp.zeros((4,), jnp.int32), jnp.zeros((4, 2), jnp.int32)
    with pytest.raises(ValueError, match="batch_axes='rows' names mesh axes"):
        sharded_paged_decode_attention(mesh, "rows", None, q[:, 0], pages, pages, lengths, table)
    args = (jnp.zeros((8, 16)), jnp.zeros((16, 32)), jnp.zeros((8,), jnp.int32))
    with pytest.raises(ValueError, match="vocab_axis='vocab' names mesh axes"):
        sharded_token_logprobs_and_entropy(mesh, "data", *args, vocab_axis="vocab")


def test_sharded_wrappers_reject_unknown_options(mesh):
    q = jnp.zeros((4, 8, 2, 16))
    with pytest.raises(ValueError, match=r"unexpected keyword arguments \['causal_mask'\]"):
        sharded_flash_attention(mesh, "data", "model", q, q, q, causal_mask=True)
