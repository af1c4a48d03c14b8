"""The grouped matmul's XLA path: ``jax.lax.ragged_dot``, or row tiles on the CPU.

``jax.lax.ragged_dot`` is a grouped kernel on GPU (and TPU), but XLA's CPU backend lowers it
to a dense product masked per group: every row times every group's matrix, G times the work
(``scripts/bench_moe.py`` measures it). On the CPU the op therefore runs the tiled form
megablox uses on TPU, in plain XLA: each group's rows start on a tile boundary, every tile
holds rows of one group only, and a batched matmul multiplies each tile by its group's matrix.
It computes at most ``M + G * tile`` rows instead of ``M * G``; its autodiff is the same tiles
backwards, the weight gradient a scatter-add of per-tile products into the groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FORMS = ("ragged_dot", "tiled")
MAX_TILE = 128
MIN_TILE = 8


def form_for_backend(backend: str) -> str:
    """'tiled' on the CPU (whose ragged_dot is a masked dense product), else 'ragged_dot'."""
    return "tiled" if backend == "cpu" else "ragged_dot"


def tile_rows(rows: int, groups: int) -> int:
    """Rows a tile: the mean group's rows rounded up to a power of two, in [8, 128]. Smaller
    tiles waste less on partly filled tiles (up to one a group); larger ones multiply faster."""
    mean = max(1, -(-rows // groups))
    return max(MIN_TILE, min(MAX_TILE, 1 << (mean - 1).bit_length()))


def tiled(lhs, rhs, group_sizes, *, precision=None, tile: int | None = None):
    """out[r] = lhs[r] @ rhs[group of r] over group-aligned row tiles (rows past the groups: 0).

    Args:
      lhs: [M, K], rows sorted by group.
      rhs: [G, K, N].
      group_sizes: [G] int32, sum <= M.
      precision: of the batched matmul.
      tile: rows a tile; None: ``tile_rows(M, G)``.
    """
    (rows, _), (groups, _, n) = lhs.shape, rhs.shape
    tile = tile or tile_rows(rows, groups)
    tiles = -(-rows // tile) + groups  # each group wastes less than one tile
    sizes = group_sizes.astype(jnp.int32)
    starts = jnp.cumsum(sizes) - sizes
    padded = -(-sizes // tile) * tile
    padded_ends = jnp.cumsum(padded)
    padded_starts = padded_ends - padded
    # Each tile's group (G past the last one) and each tile slot's source row.
    tile_group = jnp.searchsorted(padded_ends, jnp.arange(tiles) * tile, side="right")
    slot_group = jnp.repeat(tile_group, tile)
    group = jnp.minimum(slot_group, groups - 1)
    offset = jnp.arange(tiles * tile) - padded_starts[group]
    valid = (slot_group < groups) & (offset < sizes[group])
    source = jnp.where(valid, starts[group] + offset, 0)
    x = jnp.where(valid[:, None], lhs[source], 0).reshape(tiles, tile, -1)
    w = rhs[jnp.minimum(tile_group, groups - 1)]
    y = jnp.einsum(
        "tmk,tkn->tmn", x, w, precision=precision, preferred_element_type=jnp.float32
    ).reshape(tiles * tile, n)
    # Back to the rows: row r of group g sits at padded_starts[g] + (r - starts[g]).
    row_group = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(rows), side="right")
    inside = row_group < groups
    g = jnp.minimum(row_group, groups - 1)
    target = jnp.where(inside, padded_starts[g] + jnp.arange(rows) - starts[g], 0)
    out = jnp.where(inside[:, None], y[target], 0)
    return out.astype(jnp.result_type(lhs.dtype, rhs.dtype))


def grouped(lhs, rhs, group_sizes, *, form: str, precision=None):
    """The XLA grouped matmul in ``form`` ('ragged_dot' or 'tiled')."""
    if form == "tiled":
        return tiled(lhs, rhs, group_sizes, precision=precision)
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision)
