"""The gated MLP's hand-written backward (SwiGLU, and Gemma's GeGLU) against autodiff of the
plain formula."""

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

from rljax.models.layouts import gated_mlp, swiglu


def plain(x, w_gate, w_up, w_down, act=jax.nn.silu):
    gate = jnp.einsum("BTD,DF->BTF", x, w_gate)
    up = jnp.einsum("BTD,DF->BTF", x, w_up)
    return jnp.einsum("BTF,FD->BTD", act(gate) * up, w_down)


def geglu(x, w_gate, w_up, w_down):
    return gated_mlp(x, w_gate, w_up, w_down, "gelu_pytorch_tanh")


def plain_geglu(x, w_gate, w_up, w_down):
    return plain(x, w_gate, w_up, w_down, lambda g: jax.nn.gelu(g, approximate=True))


def _inputs(dtype, b=2, t=5, d=8, f=12, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((b, t, d), (d, f), (d, f), (f, d), (b, t, d))
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


@pytest.mark.parametrize("ours,theirs", [(swiglu, plain), (geglu, plain_geglu)])
def test_values_and_gradients_match_autodiff(ours, theirs):
    *args, dy = _inputs(jnp.float32)
    np.testing.assert_allclose(ours(*args), theirs(*args), rtol=1e-6, atol=1e-6)
    grads = jax.grad(lambda *a: jnp.vdot(ours(*a), dy), argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(lambda *a: jnp.vdot(theirs(*a), dy), argnums=(0, 1, 2, 3))(*args)
    for name, got, ref in zip(("dx", "d_gate", "d_up", "d_down"), grads, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("fn", [swiglu, geglu])
def test_numerical_gradients(fn):
    *args, _ = _inputs(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32, b=1, t=3)
    jax.test_util.check_grads(fn, args, order=1, modes=("rev",), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_keeps_the_input_dtype_under_jit(dtype):
    *args, dy = _inputs(dtype)
    out, grads = jax.jit(
        jax.value_and_grad(lambda *a: jnp.vdot(swiglu(*a), dy).astype(jnp.float32), (0, 1))
    )(*args)
    assert grads[0].dtype == dtype and grads[1].dtype == dtype
