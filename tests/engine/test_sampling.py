"""Token filters: per-row settings, gated at trace time or on the device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.engine import sampling


def test_top_p_of_one_keeps_the_tail_where_float_mass_reaches_one():
    """softmax([30, 0, 0, 0]) puts float32 mass 1.0 on the first token; p = 1 keeps the rest."""
    logits = jnp.asarray([[30.0, 0.0, 0.0, 0.0]])
    out = sampling.filter_logits(logits, jnp.asarray([0]), jnp.asarray([1.0]), jnp.asarray([0.0]))
    np.testing.assert_array_equal(out, logits)


@pytest.mark.parametrize("gate", [False, True])
def test_a_device_side_gate_equals_the_trace_time_choice(gate):
    """Row 0 asks for top-k 2, row 1 for top-p 0.5, row 2 for nothing."""
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 11)), jnp.float32)
    keys = jax.vmap(jax.random.key)(jnp.arange(3))
    args = (
        logits,
        keys,
        jnp.asarray([1.0, 0.5, 1.0]),
        jnp.asarray([2, 0, 0], jnp.int32),
        jnp.asarray([1.0, 0.5, 1.0]),
        jnp.asarray([0.0, 0.0, 0.0]),
    )
    want = sampling.sample(*args, use_filters=gate)
    got = jax.jit(lambda flag: sampling.sample(*args, use_filters=flag))(jnp.asarray(gate))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    filtered = sampling.sample(*args, use_filters=True)
    np.testing.assert_allclose(got[1][2], filtered[1][2], rtol=1e-6)  # row 2 never filtered
    if not gate:
        assert got[1][0] != pytest.approx(float(filtered[1][0]))  # the gate did something
