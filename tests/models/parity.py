"""Logit parity at the precision the computation has (docs/design.md, "Testing").

Two implementations of one float32 model (rljax and transformers, or one before and after an
export) sum the same products in different orders: XLA and torch tile their dot products
differently, and so does one CPU's vector width against another's. Each sum's rounding error
is a few float32 ulps (2^-24 = 6e-8) of the sum's *terms*, not of its result, and it compounds
through the layers. So a logit near 0 carries the same absolute error as the largest logit of
its row, and the right bound is relative to the logits' scale: ``rtol * max |want|``. An
absolute constant is wrong both ways: 1e-4 is 2e-4 of a tiny model's logits (O(0.5), loose
enough to miss a real bug) and 2e-6 of SmolLM2's (O(55), where another CPU's summation order
already moves them 1.2e-4).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

# float32 forward passes of two layers, 64-576 wide: the gap measured is 2e-7 to 9e-7 of the
# logits' scale on an AMD EPYC and 2.2e-6 on an Intel Xeon with AVX-512 (SmolLM2's adapter
# test), so 1e-5 leaves 4x over the worst. A real bug is larger: scaling one layer's MLP output
# weights by 1 + 1e-3 moved these tests' logits by 1.1e-5 to 9.6e-4 of their scale, and every
# one of them failed on it (the old absolute 1e-4 let 7 of them pass).
F32_RTOL = 1e-5


def assert_logits_close(got, want, rtol: float = F32_RTOL, err_msg: str = "") -> None:
    """``got`` equals ``want`` to ``rtol`` of ``want``'s largest magnitude, element by
    element; ``rtol`` is the computation's relative precision (:data:`F32_RTOL` for float32)."""
    want = np.asarray(want, np.float64)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(
        np.asarray(got, np.float64), want, rtol=0, atol=rtol * scale, err_msg=err_msg
    )


def rljax_logits(graphdef, params, tokens: np.ndarray) -> np.ndarray:
    """The Decoder's logits [B, T, V] over rows of ``tokens`` [B, T], one sequence a row."""
    model = nnx.merge(graphdef, params)
    positions = np.tile(np.arange(tokens.shape[1]), (tokens.shape[0], 1))
    hidden = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.ones(tokens.shape, jnp.int32))
    return np.asarray(model.logits(hidden))


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """A transformers causal LM's logits [B, T, V] over ``tokens``, in float32."""
    import torch  # a test dependency, imported where a parity test runs

    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


def randomise_norms(model, centre: float) -> None:
    """Draws a transformers model's 1-D weights (norms, scales) about ``centre`` (1 for norms
    scaled by w, 0 for Gemma 2/3's 1 + w) and its ``layer_scalar`` buffers in [0.5, 1.5), so
    a mis-mapped or un-offset one shows in the logits (initialisers make them all equal)."""
    import torch

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(centre + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
