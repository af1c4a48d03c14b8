"""Grouped matmul: the Pallas kernels (interpret mode) and both XLA forms (ragged_dot, and
the CPU's group-aligned row tiles) against the per-group masked reference, values and
gradients."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from rljax.kernels.grouped_matmul import (
    BlockSizes,
    grouped_matmul,
    grouped_matmul_reference,
    xla,
)
from rljax.kernels.grouped_matmul.kernel import check_tpu_tiles, gmm_kernel, tgmm_kernel
from rljax.kernels.grouped_matmul.reference import row_groups
from rljax.kernels.grouped_matmul.schedule import gmm_schedule, tgmm_schedule

# Interpret-mode kernels are big XLA programs; optimising them costs more than running them.
fast_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)
ROWS, DIM_K, DIM_N = 40, 24, 16
BLOCKS = BlockSizes(tm=8, tk=8, tn=8)  # 5 row tiles, 3 K tiles, 2 N tiles
# Groups 0 and 6 (first and last) and 3 receive no rows; tiles 0, 2 and 3 straddle two
# groups (rows 5, 19 and 28 start a group mid-tile); rows 28..39 are past the groups.
GROUP_SIZES = (0, 5, 11, 0, 3, 9, 0)
# Values: one bf16 rounding of an f32 sum (both sides accumulate in f32); f32: sum order.
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 1e-2}
GRAD_TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}


def make_inputs(dtype, group_sizes=GROUP_SIZES, *, rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.normal(size=(rows, DIM_K)), dtype)
    rhs = jnp.asarray(rng.normal(size=(len(group_sizes), DIM_K, DIM_N)), dtype)
    return lhs, rhs, jnp.asarray(group_sizes, jnp.int32)


def values_and_grads(fn, lhs, rhs):
    """fn(lhs, rhs) and the gradients of a random linear function of it wrt lhs and rhs."""
    out, vjp = jax.vjp(fn, lhs, rhs)
    dout = jnp.asarray(np.random.default_rng(3).normal(size=out.shape), out.dtype)
    return out, vjp(dout)


def close(actual, expected, tol):
    """Relative to the array's scale: matmul outputs grow with the contraction length."""
    expected = np.asarray(expected, np.float32)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(np.asarray(actual, np.float32), expected, atol=tol * scale, rtol=tol)


def compare(group_sizes, dtype, impl, *, rows=ROWS, blocks=BLOCKS):
    """Asserts values and both gradients match the reference; returns (out, grads)."""
    lhs, rhs, sizes = make_inputs(dtype, group_sizes, rows=rows)

    @fast_jit
    def both(lhs, rhs):
        ours = lambda a, b: grouped_matmul(a, b, sizes, impl=impl, block_sizes=blocks)
        ref = lambda a, b: grouped_matmul_reference(a, b, sizes)
        return values_and_grads(ours, lhs, rhs), values_and_grads(ref, lhs, rhs)

    (out, grads), (want, want_grads) = both(lhs, rhs)
    assert out.dtype == dtype and out.shape == (rows, DIM_N)
    close(out, want, TOL[dtype])
    for got, expected, primal in zip(grads, want_grads, (lhs, rhs)):
        assert got.dtype == dtype and got.shape == primal.shape
        close(got, expected, GRAD_TOL[dtype])
    return out, grads


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_reference_with_gradients(impl, dtype):
    out, (d_lhs, d_rhs) = compare(GROUP_SIZES, dtype, impl)
    total = sum(GROUP_SIZES)
    # Exactly zero, not merely close: rows past the groups and experts without tokens.
    assert not np.any(np.asarray(out[total:], np.float32))
    assert not np.any(np.asarray(d_lhs[total:], np.float32))
    empty = [g for g, size in enumerate(GROUP_SIZES) if size == 0]
    assert not np.any(np.asarray(d_rhs[np.array(empty)], np.float32))


@pytest.mark.parametrize(
    "group_sizes, rows",
    [
        ((40,), 40),  # one group, every tile whole
        ((3, 0, 34), 37),  # ragged last row tile (37 rows, tm 8), no rows past the groups
        ((1,) * 8 + (2,), 13),  # many groups inside one tile
        ((0, 0, 0), 20),  # no rows in any group: all zeros, d_rhs zeros
        ((8, 0, 8, 0, 8), 24),  # boundaries on tile edges, empty groups between them
    ],
)
@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_group_layouts(group_sizes, rows, impl):
    out, (_, d_rhs) = compare(group_sizes, jnp.float32, impl, rows=rows)
    assert not np.any(np.asarray(out[sum(group_sizes) :]))


@pytest.mark.parametrize("form, tile", [("ragged_dot", None), ("tiled", 4), ("tiled", 16)])
@pytest.mark.parametrize("group_sizes", [GROUP_SIZES, (13, 0, 2, 25), (0, 0, 0)])
def test_xla_forms(form, tile, group_sizes):
    """Each XLA form, whichever this backend picks: tiles smaller than a group (a group spans
    several), larger (many part-filled), empty groups and rows past the groups."""
    lhs, rhs, sizes = make_inputs(jnp.float32, group_sizes)
    if form == "tiled":
        ours = lambda a, b: xla.tiled(a, b, sizes, tile=tile)  # noqa: E731
    else:
        ours = lambda a, b: xla.grouped(a, b, sizes, form=form)  # noqa: E731
    out, grads = values_and_grads(jax.jit(ours), lhs, rhs)
    reference = lambda a, b: grouped_matmul_reference(a, b, sizes)  # noqa: E731
    want, want_grads = values_and_grads(reference, lhs, rhs)
    close(out, want, TOL[jnp.float32])
    for got, expected in zip(grads, want_grads):
        close(got, expected, GRAD_TOL[jnp.float32])
    assert not np.any(np.asarray(out[sum(group_sizes) :]))


def test_tile_rows():
    assert xla.tile_rows(16384, 32) == 128  # capped
    assert xla.tile_rows(40, 7) == 8  # floored
    assert xla.tile_rows(300, 8) == 64  # the mean group's 38 rows, rounded up
    assert xla.form_for_backend("cpu") == "tiled" and xla.form_for_backend("gpu") == "ragged_dot"


def test_one_tile_covers_everything():
    """Default block sizes: each of M, K and N fits in one tile (fitted to the whole dims)."""
    compare(GROUP_SIZES, jnp.float32, "pallas", blocks=BlockSizes())


def test_tpu_interpreter():
    """Both kernels under the TPU interpreter, which NaN-fills scratch and the rows a ragged
    last tile reads past the arrays; a NaN that reached a stored value would show."""
    group_sizes = (0, 5, 11, 0, 3, 9, 9)  # every row of 37 in a group (sum 37)
    lhs, rhs, sizes = make_inputs(jnp.float32, group_sizes, rows=37)
    interpret = pltpu.InterpretParams(out_of_bounds_reads="uninitialized")
    options = dict(block_sizes=BLOCKS.for_shape(37, DIM_K, DIM_N), precision=None)
    dout = jnp.asarray(np.random.default_rng(1).normal(size=(37, DIM_N)), jnp.float32)

    @fast_jit
    def run(lhs, rhs, dout):
        out = gmm_kernel(lhs, rhs, sizes, transpose_rhs=False, interpret=interpret, **options)
        d_lhs = gmm_kernel(dout, rhs, sizes, transpose_rhs=True, interpret=interpret, **options)
        d_rhs = tgmm_kernel(lhs, dout, sizes, out_dtype=jnp.float32, interpret=interpret, **options)
        return out, d_lhs, d_rhs

    want, vjp = jax.vjp(lambda a, b: grouped_matmul_reference(a, b, sizes), lhs, rhs)
    for got, expected in zip(run(lhs, rhs, dout), (want, *vjp(dout))):
        close(got, expected, 2e-5)


def _dot_precisions(jaxpr) -> list:
    """The precision of every dot_general in ``jaxpr``, searching nested jaxprs (kernels)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_dot_precisions(sub))
    return found


def test_precision_highest():
    """Values match, and every kernel matmul, forward and backward, runs at HIGHEST: on the
    CPU a dropped precision gives the same float32 numbers, so only the program shows it."""
    lhs, rhs, sizes = make_inputs(jnp.float32)
    op = lambda a, b: grouped_matmul(  # noqa: E731
        a, b, sizes, impl="pallas", block_sizes=BLOCKS, precision="highest"
    )
    close(fast_jit(op)(lhs, rhs), grouped_matmul_reference(lhs, rhs, sizes), TOL[jnp.float32])
    grads = jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1))
    precisions = _dot_precisions(jax.make_jaxpr(grads)(lhs, rhs).jaxpr)
    highest = (jax.lax.Precision.HIGHEST,) * 2
    assert len(precisions) >= 3 and set(precisions) == {highest}, precisions


def test_schedules_visit_each_row_once_with_its_group():
    """The visit lists, for random group sizes: gmm covers every row of every tile exactly
    once (with its group, or G past the groups); tgmm covers each group's rows exactly once and
    gives every group, empty or not, consecutive visits; both stay within their static length."""
    rng = np.random.default_rng(0)
    tm, groups = 8, 6
    schedules = {
        f: jax.jit(f, static_argnums=(1, 2)) for f in (gmm_schedule, tgmm_schedule)
    }  # one compile per row count, not per case
    for rows in (1, 8, 21, 40) * 5:
        sizes = rng.multinomial(int(rng.integers(0, rows + 1)), np.ones(groups) / groups)
        sizes[rng.random(groups) < 0.3] = 0
        want = np.asarray(row_groups(jnp.asarray(sizes), -(-rows // tm) * tm))
        for schedule, is_gmm in ((gmm_schedule, True), (tgmm_schedule, False)):
            s = schedules[schedule](jnp.asarray(sizes, jnp.int32), rows, tm)
            s = jax.tree.map(np.asarray, s)
            visits = int(s.num_visits[0])
            assert visits <= len(s.group_ids)
            seen = np.zeros(len(want), int)
            for g, t in zip(s.group_ids[:visits], s.tile_ids[:visits]):
                r = np.arange(t * tm, (t + 1) * tm)
                mine = r[(r >= s.offsets[g]) & (r < s.offsets[g + 1])]
                assert np.all(want[mine] == g)
                seen[mine] += 1
            assert np.all(seen == (1 if is_gmm else want < groups)), (sizes, rows)
            key = s.tile_ids if is_gmm else s.group_ids
            assert np.all(np.diff(key[:visits]) >= 0)  # consecutive revisits only
            if not is_gmm:
                assert set(s.group_ids[:visits]) == set(range(groups))


def test_block_sizes_fit_the_problem():
    sizes = BlockSizes(tm=128, tk=512, tn=512)
    assert sizes.for_shape(37, 2048, 768) == BlockSizes(tm=37, tk=512, tn=384)
    assert sizes.for_shape(4096, 1408, 200) == BlockSizes(tm=128, tk=128, tn=200)
    assert BLOCKS.for_shape(40, 24, 20) == BlockSizes(tm=8, tk=8, tn=20)
    with pytest.raises(ValueError, match=r"^BlockSizes.tk must be a positive int, got 0\.$"):
        BlockSizes(tk=0)
    with pytest.raises(ValueError, match=r"BlockSizes.tm=12 does not tile 40 rows for TPU"):
        check_tpu_tiles(BlockSizes(tm=12, tk=128, tn=128), 40, 128, 128, interpret=False)
    with pytest.raises(ValueError, match=r"BlockSizes.tn=64 does not tile a dimension of 256"):
        check_tpu_tiles(BlockSizes(tm=8, tk=128, tn=64), 40, 128, 256, interpret=False)
    check_tpu_tiles(BlockSizes(tm=40, tk=24, tn=8), 40, 24, 16, interpret=True)


@pytest.mark.parametrize(
    "field, shape, dtype, message",
    [
        ("lhs", (ROWS,), jnp.float32, r"lhs must have shape \[M, K\], got shape \(40,\)"),
        ("lhs", (ROWS, DIM_K), jnp.int32, r"lhs must be a floating array"),
        ("rhs", (7, DIM_K + 1, DIM_N), jnp.float32, r"rhs must have shape \[G, K, N\] with dim 1"),
        ("rhs", (0, DIM_K, DIM_N), jnp.float32, r"rhs must have shape \[G, K, N\] with G >= 1"),
        ("group_sizes", (6,), jnp.int32, r"group_sizes must have shape \[G\] with dim 0 == 7"),
        ("group_sizes", (7,), jnp.float32, r"group_sizes must be an integer array"),
    ],
)
def test_bad_input_names_the_argument(field, shape, dtype, message):
    args = dict(zip(("lhs", "rhs", "group_sizes"), make_inputs(jnp.float32)))
    args[field] = jnp.zeros(shape, dtype)
    with pytest.raises(ValueError, match=message):
        grouped_matmul(**args)


@pytest.mark.parametrize("precision", ["high", jax.lax.Precision.HIGH, "fp8", ("highest",) * 2])
def test_refuses_precisions_the_tpu_kernel_cannot_run(precision):
    with pytest.raises(ValueError, match=r"^precision must be None, 'default' or 'highest'"):
        grouped_matmul(*make_inputs(jnp.float32), impl="xla", precision=precision)


def test_bad_options():
    args = make_inputs(jnp.float32)
    with pytest.raises(ValueError, match="impl must be one of"):
        grouped_matmul(*args, impl="mosaic")
    with pytest.raises(ValueError, match="block_sizes must be a grouped_matmul BlockSizes"):
        grouped_matmul(*args, block_sizes=(8, 8, 8))
