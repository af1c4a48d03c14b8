"""Visit schedules: which (row tile, group) pair each step of a grouped-matmul grid works on.

The lhs rows are sorted by group, so group g owns the contiguous rows
[offsets[g], offsets[g + 1]). The kernels walk those rows in tiles of ``tm``; a *visit* is one
(row tile, group) pair. A tile wholly inside one group is visited once; a tile that a group
boundary cuts is visited once per group it holds, each visit keeping only its own group's
rows. Visits come in row order, so the visits of one tile (and of one group) are consecutive,
which is what lets a Pallas output block stay in VMEM across them.

The number of visits depends on the group sizes, which are traced, but a grid's size must be
static: each schedule has a static length, a bound on the visits, and the steps past
``num_visits`` repeat the last visit, which the kernels skip without new DMAs.

- ``gmm_schedule`` visits every row tile: the groups' rows, and then the rows past the last
  group (past sum(group_sizes)) as one more segment, whose visits write zeros. Groups with
  no rows get no visit. At most ``tiles_m + G`` visits: each of the G boundaries between
  consecutive segments adds at most one.
- ``tgmm_schedule`` visits every group, for the transposed product [G, K, N] that reduces
  over each group's rows: a group with no rows still gets one visit (its mask is empty) so
  that its output block is written with zeros; the rows past the groups get none. At most
  ``tiles_m + G - 1`` visits.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Schedule(NamedTuple):
    """Per-visit scalars, handed to the kernels as scalar-prefetch arguments (all int32).

    Attributes:
      group_ids: [V] the segment each visit multiplies by (in ``gmm_schedule``, id G is the
        rows past the groups).
      tile_ids: [V] the row tile each visit reads (and, for gmm, writes).
      offsets: [S + 1] segment s covers rows [offsets[s], offsets[s + 1]).
      first: [V] 1 where a visit is the first of its tile (gmm) or of its group (tgmm).
      last: [V] 1 where a visit is the last of its group (tgmm; unused by gmm).
      num_visits: [1] the visits that do work; later steps repeat the last one.
    """

    group_ids: jax.Array
    tile_ids: jax.Array
    offsets: jax.Array
    first: jax.Array
    last: jax.Array
    num_visits: jax.Array


def row_offsets(group_sizes: jax.Array, rows: int) -> jax.Array:
    """[G + 1] int32 start of each group's rows and, last, their end, clipped to [0, rows]."""
    ends = jnp.cumsum(jnp.maximum(group_sizes.astype(jnp.int32), 0))
    return jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.minimum(ends, rows)])


def gmm_schedule(group_sizes: jax.Array, rows: int, tm: int) -> Schedule:
    """The schedule of ``gmm``: every row tile, once per group it holds (see the module doc)."""
    tiles_m = -(-rows // tm)
    num_groups = group_sizes.shape[0]
    # The rows past the groups, up to the end of the last tile, are segment G.
    offsets = jnp.concatenate([row_offsets(group_sizes, rows), jnp.full(1, tiles_m * tm)])
    return _schedule(offsets, tm, tiles_m, tiles_m + num_groups, visit_empty=False)


def tgmm_schedule(group_sizes: jax.Array, rows: int, tm: int) -> Schedule:
    """The schedule of ``tgmm``: every group, once per row tile it spans, empty ones once."""
    tiles_m = -(-rows // tm)
    num_groups = group_sizes.shape[0]
    offsets = row_offsets(group_sizes, rows)
    return _schedule(offsets, tm, tiles_m, tiles_m + num_groups - 1, visit_empty=True)


def _schedule(
    offsets: jax.Array, tm: int, tiles_m: int, length: int, *, visit_empty: bool
) -> Schedule:
    """Enumerates the (tile, segment) visits of contiguous segments, in row order.

    Args:
      offsets: [S + 1] non-decreasing segment bounds.
      tm: rows per tile.
      tiles_m: row tiles in all.
      length: the static number of grid steps, at least the number of visits.
      visit_empty: give an empty segment one visit (at the tile where it would start).
    """
    starts, ends = offsets[:-1], offsets[1:]
    empty = ends <= starts
    first_tile = jnp.minimum(starts // tm, tiles_m - 1)
    spanned = (ends - 1) // tm - starts // tm + 1
    counts = jnp.where(empty, 1 if visit_empty else 0, spanned).astype(jnp.int32)
    ends_v = jnp.cumsum(counts)  # visit index just past each segment's visits
    num_visits = ends_v[-1]
    step = jnp.minimum(jnp.arange(length, dtype=jnp.int32), num_visits - 1)
    group_ids = jnp.searchsorted(ends_v, step, side="right").astype(jnp.int32)
    tile_ids = first_tile[group_ids] + step - (ends_v - counts)[group_ids]
    is_real = jnp.arange(length) < num_visits
    # What changes between consecutive visits: the tile (gmm) or the segment (tgmm).
    changes = group_ids if visit_empty else tile_ids
    first = is_real & (jnp.concatenate([jnp.ones(1, bool), changes[1:] != changes[:-1]]))
    last = is_real & (
        jnp.concatenate([changes[1:] != changes[:-1], jnp.ones(1, bool)])
        | (jnp.arange(length) == num_visits - 1)
    )
    return Schedule(
        group_ids=group_ids,
        tile_ids=tile_ids.astype(jnp.int32),
        offsets=offsets.astype(jnp.int32),
        first=first.astype(jnp.int32),
        last=last.astype(jnp.int32),
        num_visits=num_visits.reshape(1).astype(jnp.int32),
    )
