"""Public grouped matmul: argument checks, backend dispatch and the custom_vjp."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from rljax.kernels import dispatch, validation
from rljax.kernels.grouped_matmul import block_sizes as block_sizes_lib
from rljax.kernels.grouped_matmul import xla
from rljax.kernels.grouped_matmul.kernel import gmm_kernel, tgmm_kernel

_LHS = "[M, K]"
_RHS = "[G, K, N]"
_GROUP_SIZES = "[G]"
# The Pallas TPU kernel's MXU matmuls take DEFAULT or HIGHEST; every path accepts only these,
# so that a precision that works off TPU cannot fail on one.
_PRECISIONS = (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST)


def validate(lhs, rhs, group_sizes) -> None:
    """Raises ValueError naming the first misshaped argument."""
    _, k = validation.check_array("lhs", lhs, _LHS, 2)
    rhs_shape = validation.check_array("rhs", rhs, _RHS, 3)
    validation.check_dim("rhs", rhs_shape, _RHS, 1, k)
    if rhs_shape[0] == 0:
        raise ValueError(f"rhs must have shape {_RHS} with G >= 1 groups, got {rhs_shape}.")
    validation.check_floating("lhs", lhs, _LHS)
    validation.check_floating("rhs", rhs, _RHS)
    sizes_shape = validation.check_array("group_sizes", group_sizes, _GROUP_SIZES, 1)
    validation.check_dim("group_sizes", sizes_shape, _GROUP_SIZES, 0, rhs_shape[0])
    validation.check_integer("group_sizes", group_sizes, _GROUP_SIZES)


def resolve_precision(precision: Any) -> jax.lax.Precision | None:
    """None, or ``lax.Precision.DEFAULT`` / ``HIGHEST`` from an enum or its string name.

    Raises:
      ValueError: any other precision (HIGH, a per-operand pair, an unknown name).
    """
    if precision is None:
        return None
    try:
        resolved = jax.lax.Precision(precision)
    except (TypeError, ValueError):
        resolved = None
    if resolved not in _PRECISIONS:
        raise ValueError(
            f"precision must be None, 'default' or 'highest' (all the TPU grouped-matmul "
            f"kernel supports), got {precision!r}."
        )
    return resolved


def _forward(lhs, rhs, group_sizes, block_sizes, precision, interpret):
    return gmm_kernel(
        lhs,
        rhs,
        group_sizes,
        block_sizes=block_sizes,
        transpose_rhs=False,
        precision=precision,
        interpret=interpret,
    )


@functools.partial(jax.custom_vjp, nondiff_argnames=("block_sizes", "precision", "interpret"))
def _gmm_pallas(lhs, rhs, group_sizes, block_sizes, precision, interpret):
    return _forward(lhs, rhs, group_sizes, block_sizes, precision, interpret)


def _gmm_pallas_fwd(lhs, rhs, group_sizes, block_sizes, precision, interpret):
    out = _forward(lhs, rhs, group_sizes, block_sizes, precision, interpret)
    return out, (lhs, rhs, group_sizes)


def _gmm_pallas_bwd(block_sizes, precision, interpret, residuals, dout):
    lhs, rhs, group_sizes = residuals
    options = dict(block_sizes=block_sizes, precision=precision, interpret=interpret)
    d_lhs = gmm_kernel(dout, rhs, group_sizes, transpose_rhs=True, **options)
    d_rhs = tgmm_kernel(lhs, dout, group_sizes, out_dtype=rhs.dtype, **options)
    return d_lhs, d_rhs, None  # integer group sizes have no cotangent


_gmm_pallas.defvjp(_gmm_pallas_fwd, _gmm_pallas_bwd)


@functools.partial(
    jax.jit, static_argnames=("block_sizes", "precision", "use_pallas", "interpret", "xla_form")
)
def grouped_matmul_core(
    lhs, rhs, group_sizes, *, block_sizes, precision, use_pallas, interpret, xla_form="ragged_dot"
):
    """The jitted op with options already resolved by ``resolve_options``."""
    dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
    group_sizes = group_sizes.astype(jnp.int32)
    if not use_pallas:
        return xla.grouped(lhs, rhs, group_sizes, form=xla_form, precision=precision)
    (rows, k), n = lhs.shape, rhs.shape[2]
    if 0 in (rows, k, n):  # nothing to tile; the result (and every cotangent) is zeros
        return jnp.zeros((rows, n), dtype)
    return _gmm_pallas(
        lhs,
        rhs,
        group_sizes,
        block_sizes=block_sizes.for_shape(rows, k, n),
        precision=precision,
        interpret=interpret,
    )


def grouped_matmul(
    lhs,
    rhs,
    group_sizes,
    *,
    impl: str = "auto",
    block_sizes: block_sizes_lib.BlockSizes | None = None,
    interpret: Any = None,
    precision: Any = None,
    xla_form: str | None = None,
):
    """Dropless grouped matmul (mixture-of-experts): each group's rows times its own matrix.

    out[r] = lhs[r] @ rhs[g] for the rows r of group g, where group g owns the contiguous rows
    [sum(group_sizes[:g]), sum(group_sizes[:g + 1])) of the group-sorted lhs. Groups may be
    empty; rows past sum(group_sizes) come out zero. Products accumulate in f32.

    Args:
      lhs: [M, K] float, rows sorted by group (tokens sorted by expert).
      rhs: [G, K, N] float, one matrix per group (expert).
      group_sizes: [G] integer rows per group, sum <= M.
      impl: 'auto' (Pallas on TPU, XLA elsewhere), 'pallas' (interpret mode off TPU) or 'xla'
        (``jax.lax.ragged_dot``; on the CPU, whose ragged_dot is a masked dense product,
        group-aligned row tiles in a loop of matmuls: ``xla.tiled``).
      block_sizes: override the tuned ``BlockSizes`` for this chip (Pallas path).
      interpret: override ``pallas_call``'s interpret argument on the Pallas path (e.g. a
        ``pltpu.InterpretParams``); None: interpret exactly when off TPU.
      precision: None, 'default' or 'highest' (or the ``lax.Precision`` members): the
        precisions the TPU kernel's MXU matmuls take.
      xla_form: the XLA path's form, 'ragged_dot' or 'tiled' (``xla.FORMS``); None: the
        backend's (tiled on the CPU, ragged_dot elsewhere).

    Returns:
      [M, N] in the common dtype of lhs and rhs. Differentiable in lhs and rhs: on the Pallas
      path d_lhs is the grouped product of the cotangent with each rhs transposed and d_rhs
      [G, K, N] the transposed grouped product (``kernel.tgmm_kernel``), zeros for an empty
      group; on the XLA path by autodiff. group_sizes gets no cotangent.

    Raises:
      ValueError: a misshaped argument (named in the message), an unknown ``impl``, a bad
        ``block_sizes`` or an unsupported ``precision``; raised before anything is traced.
    """
    validate(lhs, rhs, group_sizes)
    options = resolve_options(impl, block_sizes, interpret, precision)
    if check_form(xla_form) is not None:
        options["xla_form"] = xla_form
    return grouped_matmul_core(lhs, rhs, group_sizes, **options)


def check_form(xla_form: str | None) -> str | None:
    """``xla_form`` if it is None or one of ``xla.FORMS``; else ValueError."""
    if xla_form is not None and xla_form not in xla.FORMS:
        raise ValueError(f"xla_form must be one of {xla.FORMS} or None, got {xla_form!r}.")
    return xla_form


def path_for(impl: str = "auto", xla_form: str | None = None) -> str:
    """The path ``grouped_matmul(impl=impl, xla_form=xla_form)`` takes here: 'pallas', or
    the XLA path's form ('ragged_dot' or 'tiled'). Raises ValueError as the op does."""
    check_form(xla_form)
    if dispatch.resolve_impl(impl).use_pallas:
        return "pallas"
    return xla_form or xla.form_for_backend(jax.default_backend())


def resolve_options(impl: str, block_sizes, interpret, precision) -> dict:
    """The op's static options, checked and resolved, as keyword arguments for the core."""
    backend = dispatch.resolve_impl(impl)
    block_sizes = dispatch.resolve_block_sizes(
        "grouped_matmul", block_sizes, block_sizes_lib.BlockSizes, block_sizes_lib.for_device
    )
    return dict(
        block_sizes=block_sizes,
        precision=resolve_precision(precision),
        use_pallas=backend.use_pallas,
        interpret=backend.interpret if interpret is None or not backend.use_pallas else interpret,
        xla_form=xla.form_for_backend(jax.default_backend()),
    )
