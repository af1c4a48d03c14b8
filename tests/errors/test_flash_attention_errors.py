"""Bad options of flash attention: one line naming the option and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from rljax.kernels.flash_attention import flash_attention, sharded_flash_attention

# Abstract arguments: tracing would fail on them with another error, so a ValueError about an
# option shows the refusal came before anything was traced.
Q = jax.ShapeDtypeStruct((4, 24, 4, 16), jnp.float32)  # [B, T, N, H]
KV = jax.ShapeDtypeStruct((4, 24, 2, 16), jnp.float32)  # [B, T, K, H]


def _message(entry, **options):
    """The ValueError's message when ``entry`` is called with ``options``."""
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    calls = {
        "single": lambda: flash_attention(Q, KV, KV, **options),
        "sharded": lambda: sharded_flash_attention(mesh, "data", "model", Q, KV, KV, **options),
    }
    with pytest.raises(ValueError) as info:
        calls[entry]()
    return str(info.value)


@pytest.mark.parametrize("entry", ["single", "sharded"])
def test_bad_window(check_row, entry):
    message = _message(entry, window=0)
    check_row("S01", message, "pass window=None for global attention")
    for bad in (-1, 2.5, True, "4"):
        assert _message(entry, window=bad) == message.replace("got 0", f"got {bad!r}")


@pytest.mark.parametrize("entry", ["single", "sharded"])
def test_bad_softcap(check_row, entry):
    message = _message(entry, softcap=0.0)
    check_row("S02", message, "pass softcap=None")
    for bad in (-50.0, float("inf"), float("nan"), True, "50"):
        assert _message(entry, softcap=bad) == message.replace("got 0.0", f"got {bad!r}")


@pytest.mark.parametrize("entry", ["single", "sharded"])
def test_window_without_causal(check_row, entry):
    message = _message(entry, window=4, causal=False)
    check_row("S03", message, "pass causal=True")
    # A window as long as the sequence would be global, but is still refused: the call is wrong.
    assert _message(entry, window=24, causal=False) == message.replace("=4 ", "=24 ")
