"""Fused log-probs/entropy: Pallas (interpret mode) and chunked XLA paths against the naive one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from rljax.kernels.fused_logprobs import (
    BlockSizes,
    sharded_token_logprobs_and_entropy,
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_reference,
)
from rljax.kernels.fused_logprobs.kernel import token_logprobs_kernel

# Interpret-mode kernels are big XLA programs; optimising them costs more than running them.
fast_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)
TOKENS, DIM, VOCAB = 20, 16, 100  # Neither T nor V is a multiple of its block.
BLOCKS = BlockSizes(block_t=8, block_v=32)
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}
GRAD_TOL = {jnp.float32: 1e-4, jnp.bfloat16: 5e-2}


def make_inputs(dtype, *, tokens=TOKENS, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(tokens, DIM)), dtype)
    unembed = jnp.asarray(rng.normal(size=(DIM, VOCAB)) / 2, dtype)
    targets = jnp.asarray(rng.integers(0, VOCAB, size=tokens), jnp.int32)
    return hidden, unembed, targets.at[:2].set(jnp.array([0, VOCAB - 1]))  # Edge columns.


def values_and_grads(fn, hidden, unembed):
    """(logprobs, entropy) and gradients of a random mix of both wrt hidden and unembed."""
    (logp, ent), vjp = jax.vjp(fn, hidden, unembed)
    rng = np.random.default_rng(3)
    g_logp, g_ent = (jnp.asarray(rng.normal(size=logp.shape), jnp.float32) for _ in range(2))
    return (logp, ent), vjp((g_logp, g_ent))


def close(actual, expected, tol):
    np.testing.assert_allclose(
        np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol
    )


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("dtype, temperature", [(jnp.float32, 0.7), (jnp.bfloat16, 1.0)])
def test_matches_reference_with_gradients(impl, dtype, temperature):
    hidden, unembed, targets = make_inputs(dtype)

    @fast_jit
    def both(hidden, unembed):
        ours = lambda h, w: token_logprobs_and_entropy(
            h, w, targets, temperature=temperature, impl=impl, block_sizes=BLOCKS
        )
        ref = lambda h, w: token_logprobs_and_entropy_reference(
            h, w, targets, temperature=temperature
        )
        return values_and_grads(ours, hidden, unembed), values_and_grads(ref, hidden, unembed)

    ((logp, ent), grads), ((want_logp, want_ent), want_grads) = both(hidden, unembed)
    assert logp.dtype == ent.dtype == jnp.float32 and logp.shape == ent.shape == (TOKENS,)
    close(logp, want_logp, TOL[dtype])
    close(ent, want_ent, TOL[dtype])
    for got, expected in zip(grads, want_grads):
        assert got.dtype == dtype
        close(got, expected, GRAD_TOL[dtype])


def test_entropy_gradient_alone():
    """d(entropy)/d(inputs) with no log-prob cotangent: the entropy term of the backward."""
    hidden, unembed, targets = make_inputs(jnp.float32, seed=1)
    loss = lambda fn: lambda h, w: jnp.sum(fn(h, w)[1] ** 2)
    ours = lambda h, w: token_logprobs_and_entropy(h, w, targets, impl="xla", block_sizes=BLOCKS)
    ref = lambda h, w: token_logprobs_and_entropy_reference(h, w, targets)
    grads = jax.grad(loss(ours), argnums=(0, 1))(hidden, unembed)
    want = jax.grad(loss(ref), argnums=(0, 1))(hidden, unembed)
    for got, expected in zip(grads, want):
        close(got, expected, 1e-4)


def test_tpu_interpreter():
    """The kernel under the TPU interpreter, which NaN-fills scratch and out-of-range reads."""
    hidden, unembed, targets = make_inputs(jnp.float32, tokens=16)
    run = fast_jit(
        functools.partial(
            token_logprobs_kernel,
            temperature=1.0,
            block_sizes=BLOCKS,
            interpret=pltpu.InterpretParams(out_of_bounds_reads="uninitialized"),
        )
    )
    logp, ent, lse = run(hidden, unembed, targets)
    want_logp, want_ent = token_logprobs_and_entropy_reference(hidden, unembed, targets)
    close(logp, want_logp, 2e-5)
    close(ent, want_ent, 2e-5)
    close(lse, jax.nn.logsumexp(hidden @ unembed, axis=-1), 2e-5)


def test_properties_single_token_vocab_and_uniform_logits():
    hidden, _, targets = make_inputs(jnp.float32, tokens=8)
    logp, ent = token_logprobs_and_entropy(
        hidden, jnp.zeros((DIM, VOCAB)), targets, impl="xla", block_sizes=BLOCKS
    )
    close(logp, -np.log(VOCAB), 1e-5)
    close(ent, np.log(VOCAB), 1e-5)
    logp, ent = token_logprobs_and_entropy(
        hidden, jnp.ones((DIM, 1)), jnp.zeros(8, jnp.int32), impl="xla"
    )
    close(logp, 0.0, 1e-6)
    close(ent, 0.0, 1e-6)


def test_never_materialises_logits():
    """Compiled temp + output bytes stay far below the [T, V] f32 logits, forward and backward."""
    tokens, dim, vocab = 1024, 256, 152064
    hidden = jax.ShapeDtypeStruct((tokens, dim), jnp.float32)
    unembed = jax.ShapeDtypeStruct((dim, vocab), jnp.float32)
    targets = jax.ShapeDtypeStruct((tokens,), jnp.int32)
    logits_bytes = tokens * vocab * 4
    fwd = lambda h, w, t: token_logprobs_and_entropy(h, w, t, impl="xla")
    stats = jax.jit(fwd).lower(hidden, unembed, targets).compile().memory_analysis()
    assert stats.temp_size_in_bytes + stats.output_size_in_bytes < logits_bytes / 8
    # The backward's outputs include d_unembed, as big as unembed itself; its scratch must not
    # scale with T * V.
    loss = lambda h, w, t: sum(x.sum() for x in fwd(h, w, t))
    grad = jax.grad(loss, argnums=(0, 1))
    stats = jax.jit(grad).lower(hidden, unembed, targets).compile().memory_analysis()
    assert stats.temp_size_in_bytes < logits_bytes / 8
    # The naive path really would materialise them: the bound is meaningful.
    naive = jax.jit(token_logprobs_and_entropy_reference).lower(hidden, unembed, targets)
    assert naive.compile().memory_analysis().temp_size_in_bytes >= logits_bytes


@pytest.mark.parametrize(
    "batch_axes, vocab_axis",
    [(("data", "model"), None), ("data", "model"), (None, "model")],
)
def test_sharded_over_tokens_and_vocab(batch_axes, vocab_axis):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    hidden, unembed, targets = make_inputs(jnp.float32, tokens=24)

    def sharded(h, w):
        return sharded_token_logprobs_and_entropy(
            mesh,
            batch_axes,
            h,
            w,
            targets,
            vocab_axis=vocab_axis,
            temperature=0.7,
            impl="pallas",
            block_sizes=BLOCKS,
        )

    ref = lambda h, w: token_logprobs_and_entropy_reference(h, w, targets, temperature=0.7)
    ((logp, ent), grads), ((want_logp, want_ent), want_grads) = fast_jit(
        lambda h, w: (values_and_grads(sharded, h, w), values_and_grads(ref, h, w))
    )(hidden, unembed)
    close(logp, want_logp, 2e-5)
    close(ent, want_ent, 2e-5)
    # d_unembed sums over token shards; d_hidden sums over vocabulary shards.
    for got, expected in zip(grads, want_grads):
        close(got, expected, 1e-4)


def test_sharded_rejects_indivisible_shapes():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    hidden, unembed, targets = make_inputs(jnp.float32)
    with pytest.raises(ValueError, match="hidden's T=20 must divide by the 8 shards"):
        sharded_token_logprobs_and_entropy(mesh, ("data", "model"), hidden, unembed, targets)
    with pytest.raises(ValueError, match="V=99 must divide by the 2 shards of mesh axes 'model'"):
        sharded_token_logprobs_and_entropy(
            mesh, "data", hidden, unembed[:, :99], targets, vocab_axis="model"
        )


@pytest.mark.parametrize(
    "field, shape, dtype, message",
    [
        ("hidden", (TOKENS,), jnp.float32, r"hidden must have shape \[T, D\], got shape \(20,\)"),
        ("unembed", (DIM + 1, VOCAB), jnp.float32, r"unembed must have shape \[D, V\] with dim 0"),
        ("unembed", (DIM, VOCAB), jnp.int32, r"unembed must be a floating array"),
        ("targets", (TOKENS, 1), jnp.int32, r"targets must have shape \[T\], got shape"),
        ("targets", (TOKENS - 1,), jnp.int32, r"targets must have shape \[T\] with dim 0 == 20"),
        ("targets", (TOKENS,), jnp.float32, r"targets must be an integer array"),
    ],
)
def test_bad_input_names_the_argument(field, shape, dtype, message):
    args = dict(zip(("hidden", "unembed", "targets"), make_inputs(jnp.float32)))
    args[field] = jnp.zeros(shape, dtype)
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda a: token_logprobs_and_entropy(**a))(args)


def test_bad_options():
    args = make_inputs(jnp.float32)
    with pytest.raises(ValueError, match="temperature must be a positive Python float, got 0"):
        token_logprobs_and_entropy(*args, temperature=0.0)
    with pytest.raises(ValueError, match="impl must be one of"):
        token_logprobs_and_entropy(*args, impl="mosaic")
    with pytest.raises(ValueError, match="block_sizes must be a fused_logprobs BlockSizes"):
        token_logprobs_and_entropy(*args, block_sizes={"block_v": 8})
