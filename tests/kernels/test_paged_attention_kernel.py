"""Paged decode attention: Pallas (interpret mode) and XLA paths against the reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from rljax.kernels.paged_attention import (
    BlockSizes,
    ops,
    paged_decode_attention,
    paged_decode_attention_reference,
    sharded_paged_decode_attention,
)
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel
from rljax.kernels.paged_attention.xla import paged_decode_attention_xla

PAGE = 8
PAGES_PER_SEQ = 3
POOL = 32
HEAD_DIM = 16
# Covers empty, one token, mid-page (not a multiple of the page or the block) and full slots.
LENGTHS = (0, 1, PAGE + 3, PAGES_PER_SEQ * PAGE)
# Interpret-mode kernels are big XLA programs; optimising them costs more than running them.
fast_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


def make_inputs(n_heads, kv_heads, dtype, seed=0, batch=4):
    """Random q and pool; every pool slot no valid token uses is NaN, to prove it is unread."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, n_heads, HEAD_DIM))
    k = np.full((kv_heads, POOL, PAGE, HEAD_DIM), np.nan)
    v = np.full((kv_heads, POOL, PAGE, HEAD_DIM), np.nan)
    lengths = np.array((LENGTHS * batch)[:batch], np.int32)
    # Distinct pages per slot, shuffled so the table is not the identity.
    table = rng.permutation(POOL - 1)[: batch * PAGES_PER_SEQ].reshape(batch, PAGES_PER_SEQ)
    for b, length in enumerate(lengths):
        for pos in range(length):
            page, off = table[b, pos // PAGE], pos % PAGE
            k[:, page, off] = rng.normal(size=(kv_heads, HEAD_DIM))
            v[:, page, off] = rng.normal(size=(kv_heads, HEAD_DIM))
        # Entries past ceil(length / S) point at the all-NaN last page: must never be read.
        table[b, -(-length // PAGE) :] = POOL - 1
    as_dtype = lambda x: jnp.asarray(x, dtype)
    return as_dtype(q), as_dtype(k), as_dtype(v), jnp.asarray(lengths), jnp.asarray(table)


def layered(q, k, v, lengths, table):
    """The internal paths' arguments: every layer's pools (here a stack of one) and the layer."""
    k, v, layer = ops.layered(k, v, None)
    return q, k, v, lengths, table, layer


@fast_jit
def dense_reference(q, k, v, lengths, table):
    """The reference on a NaN-free copy of the pool (the reference gathers every page)."""
    clean = lambda x: jnp.nan_to_num(x.astype(jnp.float32)).astype(x.dtype)
    return paged_decode_attention_reference(
        q, clean(k), clean(v), lengths, table, sm_scale=1 / np.sqrt(HEAD_DIM)
    )


# GQA ratios 1, 4 and 8, each dtype; not the full cross product, to bound compile time.
@pytest.mark.parametrize(
    "n_heads, kv_heads, dtype",
    [(2, 2, jnp.float32), (4, 1, jnp.bfloat16), (8, 1, jnp.float32), (8, 1, jnp.bfloat16)],
)
def test_pallas_matches_reference(n_heads, kv_heads, dtype):
    q, k, v, lengths, table = make_inputs(n_heads, kv_heads, dtype)
    out = fast_jit(
        lambda *a: paged_decode_attention(
            *a, impl="pallas", block_sizes=BlockSizes(pages_per_block=2)
        )
    )(q, k, v, lengths, table)
    want = dense_reference(q, k, v, lengths, table)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(want, np.float32), atol=TOL[dtype], rtol=TOL[dtype]
    )
    np.testing.assert_array_equal(np.asarray(out[0], np.float32), 0.0)  # length 0 -> zeros


@pytest.mark.parametrize("pages_per_block", [1, 3])
def test_tpu_interpreter_and_other_block_sizes(pages_per_block):
    """The kernel under the TPU interpreter, which NaN-fills scratch and models DMAs."""
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, seed=1)
    out = fast_jit(
        lambda *a: paged_decode_attention_kernel(
            *layered(*a),
            sm_scale=1 / np.sqrt(HEAD_DIM),
            block_sizes=BlockSizes(pages_per_block),
            interpret=pltpu.InterpretParams(),
        )
    )(q, k, v, lengths, table)
    want = dense_reference(q, k, v, lengths, table)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_a_layer_of_every_layers_pools_is_that_layers_pool_alone(impl):
    """``layer=l`` over [L, K, P, S, H] pools (l traced) equals the call on pools[l]."""
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, seed=4)
    rng = np.random.default_rng(4)
    other = lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype)  # noqa: E731
    ks, vs = jnp.stack([other(k), k, other(k)]), jnp.stack([other(v), v, other(v)])
    run = fast_jit(
        lambda ks, vs, layer: paged_decode_attention(
            q, ks, vs, lengths, table, impl=impl, layer=layer
        )
    )
    outs = [run(ks, vs, jnp.int32(layer)) for layer in range(3)]
    for layer, out in enumerate(outs):
        want = paged_decode_attention(q, ks[layer], vs[layer], lengths, table, impl=impl)
        np.testing.assert_allclose(out, want, atol=1e-6, rtol=1e-6)
    assert float(jnp.abs(outs[0] - outs[1]).max()) > 0.1


def test_one_layers_pools_with_layer_is_a_one_line_error_naming_the_shape():
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, seed=4)
    with pytest.raises(ValueError) as exc:
        paged_decode_attention(q, k, v, lengths, table, layer=0)
    message = str(exc.value)
    assert message.startswith("k_pages must have shape [L, K, P, S, H] (with layer=), got shape")
    assert "\n" not in message


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_uint16_pools_are_read_as_bfloat16_bits(impl):
    q, k, v, lengths, table = make_inputs(4, 2, jnp.bfloat16, seed=5)
    bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)[None]  # noqa: E731
    out = paged_decode_attention(q, bits(k), bits(v), lengths, table, impl=impl, layer=0)
    want = paged_decode_attention(q, k, v, lengths, table, impl=impl)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def test_xla_path_and_reference_agree_with_numpy():
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, seed=2)
    k, v = jnp.nan_to_num(k), jnp.nan_to_num(v)
    outs = (
        paged_decode_attention(q, k, v, lengths, table, impl="xla"),
        paged_decode_attention_reference(q, k, v, lengths, table, sm_scale=1 / np.sqrt(HEAD_DIM)),
    )
    # Independent numpy computation, slot by slot.
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    for b, length in enumerate(np.asarray(lengths)):
        for n in range(4):
            pos = np.arange(length)
            pages, offs = np.asarray(table)[b, pos // PAGE], pos % PAGE
            keys, vals = kn[n // 2, pages, offs], vn[n // 2, pages, offs]
            for out in outs:
                if length == 0:
                    np.testing.assert_array_equal(out[b, n], 0.0)
                    continue
                s = keys @ qn[b, n] / np.sqrt(HEAD_DIM)
                p = np.exp(s - s.max())
                np.testing.assert_allclose(out[b, n], (p / p.sum()) @ vals, atol=1e-5)


@pytest.mark.parametrize("pages_per_block", [1, 2, PAGES_PER_SEQ])
@pytest.mark.parametrize("lengths", [LENGTHS, (0, 1, 3, PAGE)])
def test_xla_blocks_match_reference_on_a_pool_with_garbage(pages_per_block, lengths):
    """The XLA path, one block or several, ignores whatever fills unheld positions (NaN here).

    With every slot inside the first page (and no longer than make_inputs filled it), the
    blocks past it are never needed; the answer
    must not change however the loop is cut.
    """
    q, k, v, _, table = make_inputs(4, 2, jnp.float32, seed=3)
    lengths = jnp.asarray(lengths, jnp.int32)
    out = paged_decode_attention_xla(
        *layered(q, k, v, lengths, table),
        sm_scale=1 / np.sqrt(HEAD_DIM),
        pages_per_block=pages_per_block,
    )
    want = dense_reference(q, k, v, lengths, table)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=2e-5)


def test_sharded_over_batch_and_heads():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, seed=3, batch=8)
    out = fast_jit(
        lambda *a: sharded_paged_decode_attention(mesh, "data", "model", *a, impl="pallas")
    )(q, k, v, lengths, table)
    np.testing.assert_allclose(out, dense_reference(q, k, v, lengths, table), atol=2e-5)


def test_sharded_rejects_indivisible_heads():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, batch=2)
    with pytest.raises(ValueError, match="K=2 heads must both divide by mesh axis 'model'"):
        sharded_paged_decode_attention(mesh, "data", "model", q, k, v, lengths, table)


@pytest.mark.parametrize(
    "field, bad, message",
    [
        ("q", np.zeros((4, 4)), r"q must have shape \[B, N, H\], got shape \(4, 4\)"),
        ("k_pages", np.zeros((2, 16, 8, 15)), r"k_pages must have shape \[K, P, S, H\] with dim 3"),
        ("v_pages", np.zeros((2, 16, 4, 16)), r"v_pages must have shape \[K, P, S, H\]"),
        ("k_pages", np.zeros((3, 16, 8, 16)), r"multiple of k_pages' K=3 kv heads"),
        ("lengths", np.zeros((3,), np.int32), r"lengths must have shape \[B\] with dim 0 == 4"),
        ("lengths", np.zeros((4,), np.float32), r"lengths must be an integer array"),
        ("page_table", np.zeros((4,), np.int32), r"page_table must have shape \[B, pages_per_seq"),
        ("page_table", np.zeros((5, 3), np.int32), r"page_table must have shape .* dim 0 == 4"),
    ],
)
def test_bad_input_names_the_argument(field, bad, message):
    args = dict(
        zip(("q", "k_pages", "v_pages", "lengths", "page_table"), make_inputs(4, 2, jnp.float32))
    )
    if field == "k_pages" and bad.shape[0] == 3:
        args["v_pages"] = bad
    args[field] = bad
    with pytest.raises(ValueError, match=message):
        # Wrapping in jit proves the check runs on shapes, before any kernel is traced.
        jax.jit(lambda a: paged_decode_attention(**a))(args)


def test_bad_impl_and_block_sizes():
    args = make_inputs(4, 2, jnp.float32)
    with pytest.raises(ValueError, match="impl must be one of"):
        paged_decode_attention(*args, impl="cuda")
    with pytest.raises(ValueError, match="block_sizes must be a paged_attention BlockSizes"):
        paged_decode_attention(*args, block_sizes=4)
