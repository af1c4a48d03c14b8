"""Flash attention: Pallas forward and backward (interpret mode) against the reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from rljax.kernels.flash_attention import (
    BlockSizes,
    flash_attention,
    flash_attention_reference,
    sharded_flash_attention,
)
from rljax.kernels.flash_attention.kernel import flash_attention_fwd_kernel
from rljax.kernels.flash_attention.kernel_bwd import flash_attention_bwd_kernel

SEQ = 20  # Not a multiple of the 8-row blocks: exercises padding and key masking.
HEAD_DIM = 16
# Interpret-mode kernels are big XLA programs; optimising them costs more than running them.
fast_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)
BLOCKS = BlockSizes(block_q=8, block_kv=8, block_kv_bwd=8)
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 4e-2}
GRAD_TOL = {jnp.float32: 1e-4, jnp.bfloat16: 1e-1}


def make_inputs(n_heads, kv_heads, dtype, *, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(batch, SEQ, n_heads, HEAD_DIM)), dtype)
    k = jnp.asarray(rng.normal(size=(batch, SEQ, kv_heads, HEAD_DIM)), dtype)
    v = jnp.asarray(rng.normal(size=(batch, SEQ, kv_heads, HEAD_DIM)), dtype)
    # Packed rows: segments of uneven lengths, including one of a single token.
    segment_ids = np.zeros((batch, SEQ), np.int32)
    segment_ids[:, 7:8] = 1
    segment_ids[:, 8:] = 2
    segment_ids[-1, 15:] = 3
    return q, k, v, jnp.asarray(segment_ids)


def close(actual, expected, tol):
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol
    )


# GQA ratios 1, 4 and 8 in both dtypes and both mask kinds, without the full cross product.
CASES = [
    (2, 2, jnp.float32, True, True),
    (4, 1, jnp.bfloat16, True, False),
    (8, 1, jnp.float32, False, True),
    (8, 1, jnp.bfloat16, True, True),
]


def outputs_and_grads(attention, q, k, v):
    """attention(q, k, v) and the gradients of a random projection of it wrt q, k, v."""
    out, vjp = jax.vjp(attention, q, k, v)
    weights = jnp.asarray(np.random.default_rng(2).normal(size=out.shape), out.dtype)
    return out, vjp(weights)


@pytest.mark.parametrize("n_heads, kv_heads, dtype, causal, with_segments", CASES)
def test_pallas_matches_reference(n_heads, kv_heads, dtype, causal, with_segments):
    q, k, v, seg = make_inputs(n_heads, kv_heads, dtype)
    seg = seg if with_segments else None

    @fast_jit
    def both(q, k, v):
        ours = lambda *a: flash_attention(*a, seg, causal=causal, impl="pallas", block_sizes=BLOCKS)
        ref = lambda *a: flash_attention_reference(*a, seg, causal=causal, sm_scale=0.25)
        return outputs_and_grads(ours, q, k, v), outputs_and_grads(ref, q, k, v)

    (out, grads), (want, want_grads) = both(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    close(out, want, TOL[dtype])
    for got, expected in zip(grads, want_grads):
        assert got.dtype == dtype
        close(got, expected, GRAD_TOL[dtype])


def test_tpu_interpreter():
    """Forward and backward kernels under the TPU interpreter, which NaN-fills scratch."""
    q, k, v, seg = make_inputs(2, 1, jnp.float32, batch=1)
    pad = 32 - SEQ  # A multiple of both block sizes.
    to_kernel = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    static = ("causal", "sm_scale", "kv_len", "block_sizes", "interpret")
    run = fast_jit(flash_attention_fwd_kernel, static_argnames=static)
    out, lse = run(
        to_kernel(q),
        to_kernel(k),
        to_kernel(v),
        jnp.pad(seg, ((0, 0), (0, pad))),
        causal=True,
        sm_scale=0.25,
        kv_len=SEQ,
        block_sizes=BlockSizes(8, 16, 8),
        interpret=pltpu.InterpretParams(),
    )
    want = flash_attention_reference(q, k, v, seg, causal=True, sm_scale=0.25)
    close(out.transpose(0, 2, 1, 3)[:, :SEQ], want, 2e-5)
    assert np.isfinite(np.asarray(lse[:, :, :SEQ])).all()
    # Backward kernels, against autodiff of the reference.
    dout = jnp.asarray(np.random.default_rng(5).normal(size=q.shape), jnp.float32)
    run_bwd = fast_jit(flash_attention_bwd_kernel, static_argnames=static)
    grads = run_bwd(
        to_kernel(q),
        to_kernel(k),
        to_kernel(v),
        jnp.pad(seg, ((0, 0), (0, pad))),
        out,
        lse,
        to_kernel(dout),
        causal=True,
        sm_scale=0.25,
        kv_len=SEQ,
        block_sizes=BlockSizes(8, 16, 16),
        interpret=pltpu.InterpretParams(),
    )
    ref = lambda *a: flash_attention_reference(*a, seg, causal=True, sm_scale=0.25)
    want_grads = jax.vjp(ref, q, k, v)[1](dout)
    for got, expected in zip(grads, want_grads):
        close(got.transpose(0, 2, 1, 3)[:, :SEQ], expected, 1e-4)


@pytest.mark.parametrize("n_heads, kv_heads, dtype, causal, segmented", CASES)
@pytest.mark.parametrize("block_q", [8, 16, 64])  # 20 tokens: blocks of 8 + 8 + 4, 16 + 4, one
def test_xla_path_matches_reference(n_heads, kv_heads, dtype, causal, segmented, block_q):
    """The 'xla' path (time-major GQA rows, causal query blocks) equals the materialised
    reference, values and gradients, for every query-block cut of a 20-token sequence."""
    q, k, v, seg = make_inputs(n_heads, kv_heads, dtype)
    seg = seg if segmented else None
    blocks = BlockSizes(block_q=block_q)
    ours = lambda q, k, v: flash_attention(
        q, k, v, seg, causal=causal, impl="xla", block_sizes=blocks
    )
    ref = lambda q, k, v: flash_attention_reference(q, k, v, seg, causal=causal, sm_scale=0.25)
    (out, grads), (want, want_grads) = jax.jit(
        lambda *a: (outputs_and_grads(ours, *a), outputs_and_grads(ref, *a))
    )(q, k, v)
    close(out, want, TOL[dtype])
    for got, expected in zip(grads, want_grads):
        close(got, expected, GRAD_TOL[dtype])


def test_reference_matches_per_segment_dot_product_attention():
    """Independent oracle: each packed segment alone through jax.nn.dot_product_attention,
    for the reference the other tests hold the kernels to, and for the XLA path."""
    q, k, v, seg = make_inputs(4, 2, jnp.float32, batch=1)
    outs = (
        flash_attention_reference(q, k, v, seg, causal=True, sm_scale=0.25),
        flash_attention(q, k, v, seg, causal=True, impl="xla"),
    )
    for b in range(q.shape[0]):
        for s in np.unique(seg[b]):
            idx = np.flatnonzero(np.asarray(seg[b]) == s)
            want = jax.nn.dot_product_attention(
                q[b : b + 1, idx], k[b : b + 1, idx], v[b : b + 1, idx], is_causal=True
            )
            for out in outs:
                close(out[b : b + 1, idx], want, 2e-5)


def test_sharded_forward_and_gradients():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    q, k, v, seg = make_inputs(4, 2, jnp.float32, batch=4)
    kwargs = dict(causal=True, impl="pallas", block_sizes=BLOCKS)

    def sharded(q, k, v):
        return sharded_flash_attention(mesh, "data", "model", q, k, v, seg, **kwargs)

    ref = lambda q, k, v: flash_attention_reference(q, k, v, seg, causal=True, sm_scale=0.25)
    (out, grads), (want, want_grads) = fast_jit(
        lambda *a: (outputs_and_grads(sharded, *a), outputs_and_grads(ref, *a))
    )(q, k, v)
    close(out, want, 2e-5)
    for got, expected in zip(grads, want_grads):
        close(got, expected, 1e-4)


@pytest.mark.parametrize(
    "field, shape, dtype, message",
    [
        ("q", (2, SEQ, 4), jnp.float32, r"q must have shape \[B, T, N, H\], got shape"),
        (
            "k",
            (2, SEQ + 1, 2, HEAD_DIM),
            jnp.float32,
            r"k must have shape \[B, T, K, H\] with dim 1",
        ),
        ("k", (2, SEQ, 3, HEAD_DIM), jnp.float32, r"multiple of k's K=3 kv heads"),
        ("v", (2, SEQ, 2, 8), jnp.float32, r"v must have shape \[B, T, K, H\]"),
        (
            "segment_ids",
            (2, SEQ - 1),
            jnp.int32,
            r"segment_ids must have shape \[B, T\] with dim 1",
        ),
        ("segment_ids", (2, SEQ), jnp.float32, r"segment_ids must be an integer array"),
        ("q", (2, SEQ, 4, HEAD_DIM), jnp.int32, r"q must be a floating array"),
    ],
)
def test_bad_input_names_the_argument(field, shape, dtype, message):
    q, k, v, seg = make_inputs(4, 2, jnp.float32)
    args = dict(q=q, k=k, v=v, segment_ids=seg)
    if field == "k" and shape[2] == 3:
        args["v"] = jnp.zeros(shape, dtype)
    args[field] = jnp.zeros(shape, dtype)
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda a: flash_attention(**a))(args)


def test_bad_options():
    q, k, v, seg = make_inputs(4, 2, jnp.float32)
    with pytest.raises(ValueError, match="impl must be one of"):
        flash_attention(q, k, v, impl="gpu")
    with pytest.raises(ValueError, match="sm_scale must be a positive Python float, got -1"):
        flash_attention(q, k, v, sm_scale=-1.0)
    with pytest.raises(ValueError, match="block_sizes must be a flash_attention BlockSizes"):
        flash_attention(q, k, v, block_sizes=(8, 8))
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    with pytest.raises(ValueError, match="K=2 heads must both divide by mesh axis 'model'"):
        sharded_flash_attention(mesh, "data", "model", q, k, v)
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    with pytest.raises(ValueError, match="q's B=2 must divide by the 4 shards of mesh axes 'data'"):
        sharded_flash_attention(mesh, "data", "model", q, k, v)
