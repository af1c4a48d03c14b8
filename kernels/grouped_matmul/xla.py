"""The grouped matmul's XLA path: ``jax.lax.ragged_dot``, or row tiles on the CPU.

``jax.lax.ragged_dot`` is a grouped kernel on GPU (and TPU), but XLA's CPU backend lowers it
to a dense product masked per group: every row times every group's matrix, G times the work
(``scripts/bench_moe.py`` measures it). On the CPU the op therefore runs the tiled form
megablox uses on TPU, in plain XLA: each group's rows start on a tile boundary, every tile
holds rows of one group only, and a loop over the tiles multiplies each by its group's matrix
(read in place, ``tile_matmul``). It computes at most ``M + G * tile`` rows instead of
``M * G``; its backward is the same loop, each tile's weight gradient added into its group's.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

FORMS = ("ragged_dot", "tiled")
F32 = jnp.float32
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


class TileLayout(NamedTuple):
    """Where each slot of ``tiles * tile`` group-aligned row slots reads its row from.

    Attributes:
      tile_group: [tiles] int32, each tile's group (G for a tile past the last group).
      source: [tiles * tile] int32, the group-sorted row a slot holds (0 where not valid).
      valid: [tiles * tile] bool, the slot holds a row of some group.
    """

    tile_group: jax.Array
    source: jax.Array
    valid: jax.Array

    def clipped_groups(self, groups: int) -> jax.Array:
        """``tile_group`` clipped into [0, G): the matrix each tile multiplies (a tile past the
        groups holds no valid row, so which matrix it takes does not matter)."""
        return jnp.minimum(self.tile_group, groups - 1)


def tile_layout(group_sizes, rows: int, tile: int) -> TileLayout:
    """The group-aligned tiling of ``rows`` group-sorted rows: each group's rows start on a
    tile boundary and fill whole tiles but its last; ``-(-rows // tile) + G`` tiles in all
    (each group wastes less than one tile)."""
    groups = group_sizes.shape[0]
    tiles = -(-rows // tile) + groups
    sizes = group_sizes.astype(jnp.int32)
    starts = jnp.cumsum(sizes) - sizes
    padded = -(-sizes // tile) * tile
    padded_ends = jnp.cumsum(padded)
    padded_starts = padded_ends - padded
    tile_group = jnp.searchsorted(padded_ends, jnp.arange(tiles) * tile, side="right")
    slot_group = jnp.repeat(tile_group, tile)
    group = jnp.minimum(slot_group, groups - 1)
    offset = jnp.arange(tiles * tile) - padded_starts[group]
    valid = (slot_group < groups) & (offset < sizes[group])
    source = jnp.where(valid, starts[group] + offset, 0)
    return TileLayout(tile_group.astype(jnp.int32), source.astype(jnp.int32), valid)


def _tile(w, g):
    return jax.lax.dynamic_index_in_dim(w, g, 0, keepdims=False)


def _tile_products(x_tmk, rhs, groups_t, precision):
    def one(_, tile):
        x, g = tile
        return None, jnp.dot(x, _tile(rhs, g), precision=precision, preferred_element_type=F32)

    return jax.lax.scan(one, None, (x_tmk, groups_t))[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tile_matmul(x_tmk, rhs, groups_t, precision=None):
    """Each tile [m, K] times its group's matrix: [T, m, K], rhs [G, K, N] -> [T, m, N] f32.

    A loop over the tiles that reads each tile's matrix in place: a batched matmul would first
    gather ``rhs[groups_t]`` (T matrices, several times the experts' weights; on the CPU that
    copy costs as much as the products, ``scripts/bench_moe.py``), and its autodiff would write
    T per-tile weight gradients before adding them into the groups. The backward is the same
    loop: d_x per tile, and each tile's ``x^T d_y`` added into its group's rows of d_rhs in
    place.
    """
    return _tile_products(x_tmk, rhs, groups_t, precision)


def _tile_matmul_fwd(x_tmk, rhs, groups_t, precision):
    return _tile_products(x_tmk, rhs, groups_t, precision), (x_tmk, rhs, groups_t)


def _tile_matmul_bwd(precision, residuals, d_y):
    x_tmk, rhs, groups_t = residuals

    def one(d_rhs, tile):
        x, dy, g = tile
        dx = jnp.dot(dy, _tile(rhs, g).T, precision=precision, preferred_element_type=F32)
        dw = jnp.dot(x.T, dy, precision=precision, preferred_element_type=F32)
        mine = jax.lax.dynamic_index_in_dim(d_rhs, g, 0)
        d_rhs = jax.lax.dynamic_update_index_in_dim(d_rhs, mine + dw, g, 0)
        return d_rhs, dx.astype(x_tmk.dtype)

    tiles = (x_tmk, d_y.astype(x_tmk.dtype), groups_t)
    # A group's tiles add up in f32 (a bf16 sum over many tiles would round at every add).
    d_rhs, d_x = jax.lax.scan(one, jnp.zeros(rhs.shape, F32), tiles)
    return d_x, d_rhs.astype(rhs.dtype), None  # integer groups have no cotangent


tile_matmul.defvjp(_tile_matmul_fwd, _tile_matmul_bwd)


def tiled(lhs, rhs, group_sizes, *, precision=None, tile: int | None = None):
    """out[r] = lhs[r] @ rhs[group of r] over group-aligned row tiles (rows past the groups: 0).

    Args:
      lhs: [M, K], rows sorted by group.
      rhs: [G, K, N].
      group_sizes: [G] int32, sum <= M.
      precision: of the tiles' matmuls.
      tile: rows a tile; None: ``tile_rows(M, G)``.
    """
    (rows, _), (groups, _, n) = lhs.shape, rhs.shape
    tile = tile or tile_rows(rows, groups)
    lay = tile_layout(group_sizes, rows, tile)
    x = jnp.where(lay.valid[:, None], lhs[lay.source], 0).reshape(-1, tile, lhs.shape[1])
    y = tile_matmul(x, rhs, lay.clipped_groups(groups), precision).reshape(-1, n)
    # Back to the rows: each row's slot (a scatter of slot numbers, which autodiff leaves alone),
    # then a gather; rows past the groups have none.
    slots = jnp.arange(lay.valid.shape[0], dtype=jnp.int32)
    slot_of_row = (
        jnp.zeros(rows, jnp.int32)
        .at[jnp.where(lay.valid, lay.source, rows)]
        .set(slots, mode="drop")
    )
    inside = jnp.arange(rows) < jnp.sum(group_sizes)
    out = jnp.where(inside[:, None], y[slot_of_row], 0)
    return out.astype(jnp.result_type(lhs.dtype, rhs.dtype))


def grouped(lhs, rhs, group_sizes, *, form: str, precision=None):
    """The XLA grouped matmul in ``form`` ('ragged_dot' or 'tiled')."""
    if form == "tiled":
        return tiled(lhs, rhs, group_sizes, precision=precision)
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, precision=precision)
