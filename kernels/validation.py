"""Argument checks run by every op's public wrapper, before anything is traced.

Each check raises a one-line ValueError naming the argument, the expected shape (with the
dimension letters the op's docstring uses) and what was received, so a caller can fix the
call without reading kernel code.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp


def check_array(name: str, x: Any, expected: str, rank: int) -> tuple[int, ...]:
    """Checks that ``x`` is array-like with ``rank`` dims; returns its shape.

    Args:
      name: the argument's name in the public signature.
      x: the argument.
      expected: the expected shape spelled with letters, e.g. '[B, N, H]'.
      rank: the expected number of dimensions.
    """
    shape = getattr(x, "shape", None)
    if shape is None or getattr(x, "dtype", None) is None:
        raise ValueError(f"{name} must be an array of shape {expected}, got {type(x).__name__}.")
    if len(shape) != rank:
        raise ValueError(f"{name} must have shape {expected}, got shape {tuple(shape)}.")
    return tuple(shape)


def check_dim(name: str, shape: tuple[int, ...], expected: str, axis: int, want: int) -> None:
    """Checks ``shape[axis] == want`` for argument ``name`` of expected shape ``expected``."""
    if shape[axis] != want:
        raise ValueError(
            f"{name} must have shape {expected} with dim {axis} == {want} to match the other "
            f"arguments, got shape {shape}."
        )


def check_integer(name: str, x: Any, expected: str) -> None:
    """Checks that ``x`` has an integer dtype (page tables, lengths, ids, targets)."""
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(
            f"{name} must be an integer array of shape {expected}, got dtype {x.dtype}; "
            "cast it with .astype(jnp.int32)."
        )


def check_floating(name: str, x: Any, expected: str) -> None:
    """Checks that ``x`` has a floating dtype (activations, weights)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(
            f"{name} must be a floating array of shape {expected}, got dtype {x.dtype}."
        )


def check_positive_scalar(name: str, value: Any) -> None:
    """Checks a static, positive Python/NumPy scalar (temperatures, softmax scales)."""
    try:
        ok = float(value) > 0.0
    except TypeError as err:
        raise ValueError(f"{name} must be a positive Python float, got {value!r}.") from err
    if not ok:
        raise ValueError(f"{name} must be a positive Python float, got {value!r}.")
