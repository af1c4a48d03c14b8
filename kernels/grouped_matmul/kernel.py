"""Pallas TPU kernels: the grouped matmul (gmm) and its transposed product (tgmm).

gmm: out[r] = lhs[r] @ rhs[g(r)] for the rows r of group g(r); rows past the groups give
zeros. Grid (N / to, visits, K / tc): the output-column tiles outermost, then the visits of
``schedule.gmm_schedule`` in row order, then the contraction, carried in an f32 VMEM
accumulator. A visit multiplies its whole row tile by its group's rhs tile and, at the last
contraction step, stores only its group's rows of the output tile: the first visit of a tile
writes zeros elsewhere, later visits keep what the earlier ones stored. The visits of one
tile are consecutive steps with one output block index, so that block stays in VMEM across
them and is written back once. The visit of the rows past the groups skips the matmul and
stores zeros. With ``transpose_rhs`` it computes dout @ rhs[g].T, the lhs cotangent.

tgmm: out[g] = lhs[rows of g].T @ dout[rows of g], [G, K, N], the rhs cotangent. Grid
(K / tk, N / tn, visits of ``schedule.tgmm_schedule``): the visits are the reduction; each
zeroes the rows outside its group in both tiles and accumulates, and a group's last visit
stores its block. A group without rows has one visit with an empty mask: it stores zeros.

Neither pads the rows: a ragged last row tile reads past the arrays, and those rows are past
the groups, so gmm never stores them (Pallas drops out-of-bounds writes) and tgmm masks them
out of both operands before the matmul (a where, so padding NaNs cannot leak through 0 * NaN).
Grid steps past the schedule's visits repeat its last block indices and do nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.grouped_matmul.block_sizes import LANES, BlockSizes
from rljax.kernels.grouped_matmul.schedule import Schedule, gmm_schedule, tgmm_schedule

_SUBLANES = 8
_NUM_PREFETCH = 6  # the Schedule's fields, in order


def check_tpu_tiles(sizes: BlockSizes, rows: int, k: int, n: int, interpret) -> None:
    """Raises a one-line ValueError if fitted tiles would not lower for TPU.

    Rows are the sublane dim of every row tile (a multiple of 8, or all rows); K and N are
    lane dims somewhere (a multiple of 128, or the whole dimension). Interpret mode has no
    such rule, and the tests use small tiles there to get many tiles on small problems.
    """
    if interpret:
        return
    if sizes.tm % _SUBLANES and sizes.tm != rows:
        raise ValueError(
            f"BlockSizes.tm={sizes.tm} does not tile {rows} rows for TPU: row tiles must be a "
            f"multiple of {_SUBLANES} or all the rows."
        )
    for name, tile, dim in (("tk", sizes.tk, k), ("tn", sizes.tn, n)):
        if tile % LANES and tile != dim:
            raise ValueError(
                f"BlockSizes.{name}={tile} does not tile a dimension of {dim} for TPU: it must "
                f"be a multiple of {LANES} or the whole dimension; fit it with "
                "BlockSizes.for_shape."
            )


def _rows_mask(shape, tile, lo, hi, tm):
    """[tm, cols] True on the rows of row tile ``tile`` that lie in [lo, hi)."""
    rows = tile * tm + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    return (rows >= lo) & (rows < hi)


def _gmm_kernel(
    group_ids,
    tile_ids,
    offsets,
    first,
    last,
    num_visits,
    lhs_ref,  # [tm, tc]
    rhs_ref,  # [tk, tn]: [tc, to], or [to, tc] with transpose_rhs
    out_ref,  # [tm, to]
    acc_ref,  # [tm, to] f32
    *,
    num_groups: int,
    tm: int,
    transpose_rhs: bool,
    precision,
):
    del last
    step, c = pl.program_id(1), pl.program_id(2)
    group = group_ids[step]
    live = step < num_visits[0]

    @pl.when(c == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(live & (group < num_groups))
    def _():
        dims = (((1,), (1,)), ((), ())) if transpose_rhs else (((1,), (0,)), ((), ()))
        acc_ref[...] += jax.lax.dot_general(
            lhs_ref[...],
            rhs_ref[...],
            dims,
            precision=precision,
            preferred_element_type=jnp.float32,
        )

    done = live & (c == pl.num_programs(2) - 1)
    mask = functools.partial(
        _rows_mask, out_ref.shape, tile_ids[step], offsets[group], offsets[group + 1], tm
    )

    @pl.when(done & (first[step] == 1))
    def _():
        out_ref[...] = jnp.where(mask(), acc_ref[...], 0.0).astype(out_ref.dtype)

    @pl.when(done & (first[step] == 0))
    def _():
        out_ref[...] = jnp.where(mask(), acc_ref[...].astype(out_ref.dtype), out_ref[...])


def gmm_kernel(
    lhs, rhs, group_sizes, *, block_sizes: BlockSizes, transpose_rhs: bool, precision, interpret
):
    """Runs gmm: [M, C] rows sorted by group, times rhs per group, into [M, O].

    Args:
      lhs: [M, C], rows sorted by group.
      rhs: [G, K, N]: C = K and O = N, or with ``transpose_rhs`` C = N and O = K (each
        group's rhs is used transposed: the lhs cotangent dout @ rhs[g].T).
      group_sizes: [G] int32 rows per group; rows past their sum come out zero.
      block_sizes: tiles fitted by ``BlockSizes.for_shape``; (tm, tk, tn) tile (M, K, N).
      transpose_rhs: see rhs.
      precision: ``lax.Precision.DEFAULT`` or ``HIGHEST`` (or None) for the MXU matmuls.
      interpret: ``pallas_call``'s interpret argument.

    Returns:
      [M, O] in lhs's dtype.
    """
    rows = lhs.shape[0]
    num_groups = rhs.shape[0]
    tm, tk, tn = block_sizes.tm, block_sizes.tk, block_sizes.tn
    k, n = (rhs.shape[1], rhs.shape[2])  # rhs is [G, K, N] either way
    check_tpu_tiles(block_sizes, rows, k, n, interpret)
    # Forward: contract K, produce N. Transposed: contract N, produce K.
    contract, out_cols, tc, to = (n, k, tn, tk) if transpose_rhs else (k, n, tk, tn)
    schedule = gmm_schedule(group_sizes, rows, tm)
    tiles_c = contract // tc

    def c_block(step, c, group_ids, num_visits):
        # Visits that multiply nothing (past the groups, past the schedule) stay on the last
        # contraction block, the one the visit before them ended on: no new DMA.
        works = (step < num_visits[0]) & (group_ids[step] < num_groups)
        return jnp.where(works, c, tiles_c - 1)

    def lhs_map(o, step, c, group_ids, tile_ids, offsets, first, last, num_visits):
        return tile_ids[step], c_block(step, c, group_ids, num_visits)

    def rhs_map(o, step, c, group_ids, tile_ids, offsets, first, last, num_visits):
        group = jnp.minimum(group_ids[step], num_groups - 1)
        cb = c_block(step, c, group_ids, num_visits)
        return (group, o, cb) if transpose_rhs else (group, cb, o)

    def out_map(o, step, c, group_ids, tile_ids, offsets, first, last, num_visits):
        return tile_ids[step], o

    kernel = functools.partial(
        _gmm_kernel,
        num_groups=num_groups,
        tm=tm,
        transpose_rhs=transpose_rhs,
        precision=precision,
    )
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=_NUM_PREFETCH,
        grid=(out_cols // to, schedule.group_ids.shape[0], tiles_c),
        in_specs=[
            pl.BlockSpec((tm, tc), lhs_map),
            pl.BlockSpec((None, tk, tn), rhs_map),  # [tc, to], or [to, tc] transposed
        ],
        out_specs=pl.BlockSpec((tm, to), out_map),
        scratch_shapes=[pltpu.VMEM((tm, to), jnp.float32)],
    )
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((rows, out_cols), lhs.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")
        ),
        interpret=interpret,
        name="rljax_gmm",
    )(*schedule, lhs, rhs)


def _tgmm_kernel(
    group_ids,
    tile_ids,
    offsets,
    first,
    last,
    num_visits,
    lhs_ref,  # [tm, tk]
    dout_ref,  # [tm, tn]
    out_ref,  # [tk, tn]
    acc_ref,  # [tk, tn] f32
    *,
    tm: int,
    precision,
):
    step = pl.program_id(2)
    live = step < num_visits[0]
    group = group_ids[step]

    @pl.when(live & (first[step] == 1))
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(live)
    def _():
        mask = functools.partial(
            _rows_mask, tile=tile_ids[step], lo=offsets[group], hi=offsets[group + 1], tm=tm
        )
        lhs = jnp.where(mask(lhs_ref.shape), lhs_ref[...], 0)
        dout = jnp.where(mask(dout_ref.shape), dout_ref[...], 0)
        acc_ref[...] += jax.lax.dot_general(
            lhs,
            dout,
            (((0,), (0,)), ((), ())),
            precision=precision,
            preferred_element_type=jnp.float32,
        )

    @pl.when(live & (last[step] == 1))
    def _():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def tgmm_kernel(
    lhs, dout, group_sizes, *, block_sizes: BlockSizes, out_dtype, precision, interpret
):
    """Runs tgmm: per group g, lhs[rows of g].T @ dout[rows of g].

    Args:
      lhs: [M, K], rows sorted by group.
      dout: [M, N], same rows.
      group_sizes: [G] int32 rows per group; rows past their sum are ignored.
      block_sizes: tiles fitted by ``BlockSizes.for_shape``; (tm, tk, tn) tile (M, K, N).
      out_dtype: the result's dtype (rhs's, for its cotangent).
      precision: ``lax.Precision.DEFAULT`` or ``HIGHEST`` (or None).
      interpret: ``pallas_call``'s interpret argument.

    Returns:
      [G, K, N] in ``out_dtype``; zeros for a group without rows.
    """
    rows, k = lhs.shape
    n = dout.shape[1]
    num_groups = group_sizes.shape[0]
    tm, tk, tn = block_sizes.tm, block_sizes.tk, block_sizes.tn
    check_tpu_tiles(block_sizes, rows, k, n, interpret)
    schedule: Schedule = tgmm_schedule(group_sizes, rows, tm)

    def lhs_map(kb, nb, step, group_ids, tile_ids, *_):
        return tile_ids[step], kb

    def dout_map(kb, nb, step, group_ids, tile_ids, *_):
        return tile_ids[step], nb

    def out_map(kb, nb, step, group_ids, *_):
        return group_ids[step], kb, nb

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=_NUM_PREFETCH,
        grid=(k // tk, n // tn, schedule.group_ids.shape[0]),
        in_specs=[pl.BlockSpec((tm, tk), lhs_map), pl.BlockSpec((tm, tn), dout_map)],
        out_specs=pl.BlockSpec((None, tk, tn), out_map),
        scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
    )
    return pl.pallas_call(
        functools.partial(_tgmm_kernel, tm=tm, precision=precision),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
        name="rljax_tgmm",
    )(*schedule, lhs, dout)
