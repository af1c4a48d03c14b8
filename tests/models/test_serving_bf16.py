"""A bfloat16 sampler on the CPU (``sampling.dtype='bfloat16'``, the serving layout): every
weight and KV page read as stored, the head's logits the float32 product, the numbers the
Decoder's.

XLA's CPU backend converts a bfloat16 operand to float32 for a dot whose other operand is a
transpose, and converts a whole bfloat16 array to float32 and back to scatter into it; both
happened in every decode step (a float32 copy of every weight and of both KV pools), which made
a bfloat16 SmolLM2 decode step 4-5x slower than the float32 one (docs/benchmarks.md). The pages
here are the engine's CPU storage of a bfloat16 cache, its bits as uint16. The first test reads
the compiled step for those copies; it needs no timing.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rljax.kernels.paged_attention.xla import as_values

from rljax.models.paged_kv import pool_dtype, set_bits
from rljax.models.serving import float32_times_bfloat16, serving_converter
from rljax.models.sharding import SAMPLER_RULES, make_mesh
from rljax.models.transformer import Decoder
from rljax.testing.configs import TINY_MODEL
from rljax.testing.engines import materialised

BF16 = dict(dtype="bfloat16", param_dtype="bfloat16")
# vocab 96: every weight's [out, in] shape differs from every activation's.
MODELS = {
    "untied": dataclasses.replace(TINY_MODEL, vocab_size=96, **BF16),
    "tied": dataclasses.replace(TINY_MODEL, vocab_size=96, tie_embeddings=True, **BF16),
}
PAGES = (5, 4)  # pages, page size


def _models(cfg):
    """(Decoder, ServingDecoder) of the same random bfloat16 weights, on one device."""
    mesh = make_mesh(jax.devices()[:1], {"data": 1, "tensor": 1})
    graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
    keys = jax.random.split(jax.random.key(1), len(jax.tree.leaves(params)))
    leaves, treedef = jax.tree.flatten(params)
    leaves = [
        (0.3 * jax.random.normal(k, x.shape) + 1.0).astype(x.dtype)
        for k, x in zip(keys, leaves, strict=True)
    ]
    params = jax.tree.unflatten(treedef, leaves)
    return nnx.merge(graphdef, params), serving_converter(cfg, graphdef, mesh, SAMPLER_RULES)(
        params
    )


def _decode(m, pages, tokens_b, positions_b):
    table = jnp.asarray([[1, 2], [3, 4]], jnp.int32)
    hidden, kp, vp = m.decode(tokens_b, positions_b, pages, pages, table, impl="xla")
    return m.logits(hidden), kp, vp


def _pool(cfg):
    """Random bfloat16 KV pages as the engine stores them on the CPU: their bits, as uint16."""
    shape = (cfg.num_layers, cfg.num_kv_heads, *PAGES, cfg.head_dim)
    rng = np.random.default_rng(0)
    pages = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    return jax.lax.bitcast_convert_type(pages, pool_dtype("bfloat16", cpu=True))


@pytest.mark.parametrize("name", list(MODELS))
def test_a_bfloat16_decode_step_reads_weights_and_pages_as_stored(name):
    cfg = MODELS[name]
    _, serving = _models(cfg)
    pages = _pool(cfg)
    ids = jnp.asarray([3, 4], jnp.int32)
    hlo = jax.jit(_decode).lower(serving, pages, ids, ids).compile().as_text()
    f32_shapes = set(re.findall(r"= f32\[([\d,]+)\]", "\n".join(materialised(hlo))))
    stored = {",".join(map(str, pages.shape))}
    for x in jax.tree.leaves(serving):
        if x.ndim >= 2:
            stored |= {",".join(map(str, x.shape)), f"{x.shape[0]},{x.size // x.shape[0]}"}
            stored.add(f"{x.size // x.shape[-1]},{x.shape[-1]}")
    assert not f32_shapes & stored, sorted(f32_shapes & stored)
    # Every weight's matmul still yields [out, rows]: the weight is the left operand.
    dots = [line for line in hlo.splitlines() if " dot(" in line and "batch_dims" not in line]
    assert len(dots) == 7 * cfg.num_layers + 1
    assert all(re.search(r"= f32\[\d+,(2|6)\]", d) for d in dots), dots


@pytest.mark.parametrize("name", list(MODELS))
def test_a_bfloat16_serving_decode_equals_the_decoder(name):
    """Same weights, same bfloat16 pages: the two layouts' logits and written pages agree to
    bfloat16's precision (they round in different places, so not to float32's)."""
    cfg = MODELS[name]
    model, serving = _models(cfg)
    pages = _pool(cfg)
    tokens, positions = jnp.asarray([3, 7], jnp.int32), jnp.asarray([5, 2], jnp.int32)
    want = jax.jit(_decode)(model, pages, tokens, positions)
    got = jax.jit(_decode)(serving, pages, tokens, positions)
    scale = float(jnp.abs(want[0]).max())
    np.testing.assert_allclose(got[0], want[0], atol=0.02 * scale)
    assert float(jnp.abs(got[0] - want[0]).max()) > 0  # not the same code path
    for w, g in zip(want[1:], got[1:], strict=True):
        assert g.dtype == pages.dtype
        w, g = (np.asarray(as_values(x), np.float32) for x in (w, g))
        np.testing.assert_allclose(g, w, rtol=0.02, atol=0.02)


def test_the_head_of_a_bfloat16_model_is_the_float32_product():
    """float32 hidden states times bfloat16 weights, against the exact product (float64): within
    float32's rounding of the sum. Two bfloat16 terms instead of three miss by about 2^-17."""
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 2, 256)).astype(np.float32) * 10
    w = jnp.asarray(rng.standard_normal((50, 256)), jnp.bfloat16)
    exact = hidden.astype(np.float64) @ np.asarray(w, np.float64).T
    got = np.asarray(jax.jit(float32_times_bfloat16)(jnp.asarray(hidden), w), np.float64)
    assert got.shape == (3, 2, 50)
    magnitude = np.abs(hidden).astype(np.float64) @ np.abs(np.asarray(w, np.float64)).T
    assert np.max(np.abs(got - exact) / magnitude) < 4 * 256 * 2.0**-24


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.int32])
def test_set_bits_writes_what_a_scatter_writes(dtype):
    rng = np.random.default_rng(1)
    pool = jnp.asarray(rng.standard_normal((3, 2, 6, 4, 8)) * 100, dtype)
    new = jnp.asarray(rng.standard_normal((3, 2, 8)) * 100, jnp.float32)
    index = (1, slice(None), jnp.asarray([0, 5, 2]), jnp.asarray([3, 0, 1]))
    got = jax.jit(lambda p, n: set_bits(p, index, n))(pool, new)
    assert got.dtype == pool.dtype
    np.testing.assert_array_equal(got, pool.at[index].set(new.astype(dtype)))


def test_set_bits_stores_bfloat16_bits_in_a_uint16_pool():
    rng = np.random.default_rng(2)
    bits = jax.lax.bitcast_convert_type
    pool = bits(jnp.asarray(rng.standard_normal((3, 2, 6, 4, 8)), jnp.bfloat16), jnp.uint16)
    new = jnp.asarray(rng.standard_normal((3, 2, 8)) * 100, jnp.float32)
    index = (1, slice(None), jnp.asarray([0, 5, 2]), jnp.asarray([3, 0, 1]))
    got = jax.jit(lambda p, n: set_bits(p, index, n))(pool, new)
    assert got.dtype == jnp.uint16
    want = pool.at[index].set(bits(new.astype(jnp.bfloat16), jnp.uint16))
    np.testing.assert_array_equal(got, want)
