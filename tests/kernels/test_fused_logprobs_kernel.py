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
SOFTCAP = 30.0  # Gemma 2's final_logit_softcapping
CAPPED_SCALE = 50.0  # unembed * 50: h @ W has a std of about 100, so the cap bites


def make_inputs(dtype, *, tokens=TOKENS, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(tokens, DIM)), dtype)
    unembed = jnp.asarray(rng.normal(size=(DIM, VOCAB)) / 2, dtype)
    targets = jnp.asarray(rng.integers(0, VOCAB, size=tokens), jnp.int32)
    return hidden, unembed, targets.at[:2].set(jnp.array([0, VOCAB - 1]))  # Edge columns.


def capped_inputs(tokens=TOKENS):
    """f32 inputs whose raw logits h @ W mostly lie past 2c, where tanh saturates."""
    hidden, unembed, targets = make_inputs(jnp.float32, tokens=tokens)
    unembed = unembed * CAPPED_SCALE
    assert np.mean(np.abs(np.asarray(hidden @ unembed)) > 2 * SOFTCAP) > 0.5
    return hidden, unembed, targets


def materialised_logits(hidden, unembed, *, temperature, softcap):
    """The tests' own oracle, independent of the package: c * tanh(h W / c) / T."""
    raw = jnp.dot(hidden, unembed, preferred_element_type=jnp.float32)
    capped = raw if softcap is None else softcap * jnp.tanh(raw / softcap)
    return capped / temperature


def materialised(hidden, unembed, targets, *, temperature, softcap):
    """(log_softmax at the targets, entropy) of ``materialised_logits``."""
    logp = jax.nn.log_softmax(
        materialised_logits(hidden, unembed, temperature=temperature, softcap=softcap), axis=-1
    )
    target_logp = jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
    return target_logp, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


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


@pytest.mark.parametrize("impl", ["pallas", "xla", "reference"])
def test_softcap_matches_materialised_capped_logits(impl):
    """log_softmax(c * tanh(h W / c) / T) and its entropy, values and gradients wrt h and W."""
    hidden, unembed, targets = capped_inputs()
    options = dict(temperature=0.7, softcap=SOFTCAP)
    if impl == "reference":
        fn = lambda h, w: token_logprobs_and_entropy_reference(h, w, targets, **options)
    else:
        fn = lambda h, w: token_logprobs_and_entropy(
            h, w, targets, impl=impl, block_sizes=BLOCKS, **options
        )
    oracle = lambda h, w: materialised(h, w, targets, **options)
    ((logp, ent), grads), ((want_logp, want_ent), want_grads) = fast_jit(
        lambda h, w: (values_and_grads(fn, h, w), values_and_grads(oracle, h, w))
    )(hidden, unembed)
    # Logits reach c / T = 43: relative tolerances, as for any logit-sized value.
    close(logp, want_logp, 2e-5)
    close(ent, want_ent, 2e-5)
    for got, expected in zip(grads, want_grads):
        close(got, expected, 1e-4)
    # The cap changes the answer: an uncapped op could not pass the checks above.
    uncapped = materialised(hidden, unembed, targets, temperature=0.7, softcap=None)[0]
    assert np.max(np.abs(np.asarray(uncapped - want_logp))) > 10.0


@pytest.mark.parametrize("softcap", [None, SOFTCAP])
def test_tpu_interpreter(softcap):
    """The kernel under the TPU interpreter, which NaN-fills scratch and out-of-range reads."""
    if softcap is None:
        hidden, unembed, targets = make_inputs(jnp.float32, tokens=16)
    else:
        hidden, unembed, targets = capped_inputs(tokens=16)
    run = fast_jit(
        functools.partial(
            token_logprobs_kernel,
            temperature=0.7,
            softcap=softcap,
            block_sizes=BLOCKS,
            interpret=pltpu.InterpretParams(out_of_bounds_reads="uninitialized"),
        )
    )
    logp, ent, lse = run(hidden, unembed, targets)
    want_logp, want_ent = materialised(hidden, unembed, targets, temperature=0.7, softcap=softcap)
    close(logp, want_logp, 2e-5)
    close(ent, want_ent, 2e-5)
    logits = materialised_logits(hidden, unembed, temperature=0.7, softcap=softcap)
    close(lse, jax.nn.logsumexp(logits, axis=-1), 2e-5)


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
    "batch_axes, vocab_axis, softcap",
    [
        (("data", "model"), None, None),
        ("data", "model", None),
        (None, "model", None),
        (("data", "model"), None, SOFTCAP),
        ("data", "model", SOFTCAP),  # the cap under the vocab-parallel combine
    ],
)
def test_sharded_over_tokens_and_vocab(batch_axes, vocab_axis, softcap):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    if softcap is None:
        hidden, unembed, targets = make_inputs(jnp.float32, tokens=24)
    else:
        hidden, unembed, targets = capped_inputs(tokens=24)

    def sharded(h, w):
        return sharded_token_logprobs_and_entropy(
            mesh,
            batch_axes,
            h,
            w,
            targets,
            vocab_axis=vocab_axis,
            temperature=0.7,
            softcap=softcap,
            impl="pallas",
            block_sizes=BLOCKS,
        )

    ref = lambda h, w: materialised(h, w, targets, temperature=0.7, softcap=softcap)
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
