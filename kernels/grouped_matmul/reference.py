"""Plain-jnp grouped matmul: one masked dense matmul per group. The test oracle.

It multiplies every row by every group's rhs, G times the work of the grouped product, so it
is never used by the op itself; the op's ``'xla'`` path is in ``xla.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_groups(group_sizes, rows: int):
    """[rows] int32 group of each row of a group-sorted lhs; G for rows past sum(group_sizes)."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(rows, dtype=jnp.int32), side="right")


def grouped_matmul_reference(lhs, rhs, group_sizes, *, precision=jax.lax.Precision.HIGHEST):
    """out[r] = lhs[r] @ rhs[group of r], through G masked dense matmuls accumulated in f32.

    Args:
      lhs: [M, K], rows sorted by group.
      rhs: [G, K, N].
      group_sizes: [G] int rows per group; rows past their sum come out zero.
      precision: of the dense matmuls.

    Returns:
      [M, N] in the common dtype of lhs and rhs; differentiable in lhs and rhs by autodiff.
    """
    groups = row_groups(group_sizes, lhs.shape[0])
    mask_gm = groups[None, :] == jnp.arange(rhs.shape[0])[:, None]
    out_gmn = jnp.einsum(
        "mk,gkn->gmn", lhs, rhs, precision=precision, preferred_element_type=jnp.float32
    )
    out = jnp.sum(jnp.where(mask_gm[:, :, None], out_gmn, 0.0), axis=0)
    return out.astype(jnp.result_type(lhs.dtype, rhs.dtype))
