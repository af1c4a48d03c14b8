"""Unrolling the layer scan changes the compiled program, never the numbers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import ConfigError, LearnerConfig
from rljax.models.transformer import Decoder
from rljax.testing.configs import TINY_MODEL


@functools.cache
def _loss_and_grads(unroll: int, remat: str = "none"):
    model = Decoder(TINY_MODEL, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, TINY_MODEL.vocab_size, size=(2, 12)), jnp.int32)
    positions = jnp.asarray(np.tile(np.r_[np.arange(7), np.arange(5)], (2, 1)), jnp.int32)
    segments = jnp.asarray(np.tile(np.r_[np.ones(7), 2 * np.ones(5)], (2, 1)), jnp.int32)

    def loss(p):
        m = nnx.merge(graphdef, p)
        hidden = m(tokens, positions, segments, impl="xla", remat=remat, unroll=unroll)
        logits = m.logits(hidden)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 3])

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("unroll, remat", [(0, "none"), (2, "none"), (0, "full")])
def test_unrolled_loss_and_grads_match_the_scan(unroll, remat):
    assert TINY_MODEL.num_layers >= 2  # else unrolling would be a no-op
    want_loss, want_grads = _loss_and_grads(1)
    got_loss, got_grads = _loss_and_grads(unroll, remat)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    flat_want, flat_got = jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)
    assert len(flat_got) == len(flat_want) > 10
    for g, w in zip(flat_got, flat_want, strict=True):
        assert np.abs(w).max() > 0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def test_unrolled_program_has_no_layer_loop():
    """With unroll=0 the compiled train step holds no while loop over the layers."""
    model = Decoder(TINY_MODEL, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jnp.ones((1, 8), jnp.int32)
    positions = jnp.arange(8)[None]

    def loss(p, unroll):
        return jnp.sum(nnx.merge(graphdef, p)(tokens, positions, tokens, impl="xla", unroll=unroll))

    def hlo(unroll):
        grad = jax.jit(jax.grad(loss), static_argnums=1)
        return grad.lower(params, unroll).compile().as_text()

    assert "while" in hlo(1)
    assert "while" not in hlo(0)


def test_bad_unroll_is_an_error():
    with pytest.raises(ConfigError, match="learner.layer_unroll"):
        LearnerConfig(layer_unroll=-1)
    model = Decoder(TINY_MODEL, rngs=nnx.Rngs(0))
    ones = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="unroll=True"):
        model(ones, ones, ones, impl="xla", unroll=True)
