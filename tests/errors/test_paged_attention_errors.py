"""Bad options of paged decode attention: one line naming the option and the fix."""

import jax.numpy as jnp
import pytest
from rljax.kernels.paged_attention import paged_decode_attention


def _args():
    """One slot of 3 tokens in one page of 4; GQA 2:1."""
    q = jnp.zeros((1, 2, 8), jnp.float32)
    pages = jnp.zeros((1, 2, 4, 8), jnp.float32)
    return q, pages, pages, jnp.array([3], jnp.int32), jnp.zeros((1, 1), jnp.int32)


@pytest.mark.parametrize(
    "row_id, option, bad, fix",
    [("P01", "window", 0, "window=None"), ("P02", "softcap", 0.0, "softcap=None")],
)
def test_bad_paged_attention_option(check_row, row_id, option, bad, fix):
    with pytest.raises(ValueError) as info:
        paged_decode_attention(*_args(), **{option: bad})
    check_row(row_id, str(info.value), fix)
