"""Bad options of the fused log-prob op: one line naming the option and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from rljax.kernels.fused_logprobs import (
    sharded_token_logprobs_and_entropy,
    token_logprobs_and_entropy,
)

# Abstract arguments: tracing would fail on them with another error, so a ValueError about
# softcap shows the refusal came before anything was traced.
HIDDEN = jax.ShapeDtypeStruct((24, 16), jnp.float32)  # [T, D]
UNEMBED = jax.ShapeDtypeStruct((16, 100), jnp.float32)  # [D, V]
TARGETS = jax.ShapeDtypeStruct((24,), jnp.int32)  # [T]


def _call(entry, softcap):
    """The ValueError's message when ``entry`` is called with ``softcap``."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    args = (HIDDEN, UNEMBED, TARGETS)
    calls = {
        "single": lambda: token_logprobs_and_entropy(*args, softcap=softcap),
        "vocab_parallel": lambda: sharded_token_logprobs_and_entropy(
            mesh, "data", *args, vocab_axis="model", softcap=softcap
        ),
        "token_parallel": lambda: sharded_token_logprobs_and_entropy(
            mesh, ("data", "model"), *args, softcap=softcap
        ),
    }
    with pytest.raises(ValueError) as info:
        calls[entry]()
    return str(info.value)


@pytest.mark.parametrize("entry", ["single", "vocab_parallel", "token_parallel"])
def test_bad_softcap(check_row, entry):
    message = _call(entry, 0)
    check_row("L01", message, "or None for no cap")
    for bad in (-30.0, float("inf"), float("nan"), True, "30"):
        assert _call(entry, bad) == message.replace("softcap=0", f"softcap={bad!r}")
