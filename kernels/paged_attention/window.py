"""Sliding-window and soft-capping arithmetic shared by the Pallas kernel and the XLA path.

Slot b's query sits at position ``lengths[b] - 1``. With a window of W keys it attends the
positions ``[max(0, lengths[b] - W), lengths[b])``, itself included (Gemma 2/3's sliding
layers, as Hugging Face's eager attention masks them). Those positions live in the pages
``first_page .. ceil(lengths[b] / S) - 1``; the pages before ``first_page`` are never read, so
the engine may give them back to the pool. ``reference.py`` masks by position on its own,
without these helpers, so that it stays an independent oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def window_start(length, window: int | None):
    """The first attended position: ``max(0, length - window)``; 0 without a window."""
    if window is None:
        return 0
    return jnp.maximum(length - window, 0)


def first_page(length, window: int | None, page_size: int):
    """The page holding the first attended position; 0 without a window."""
    if window is None:
        return 0
    # lax.div, not //: the operands are non-negative, and floor division's sign fix-up does
    # not lower ahead of time for TPU.
    return jax.lax.div(window_start(length, window), jnp.asarray(page_size, jnp.int32))


def attended(pos, length, window: int | None):
    """Whether the query at ``length - 1`` attends key position ``pos`` (broadcasting)."""
    valid = pos < length
    if window is None:
        return valid
    return valid & (pos >= window_start(length, window))


def soft_cap(scores, softcap: float | None):
    """Gemma 2's logit soft-capping, ``c * tanh(scores / c)``; identity for None."""
    if softcap is None:
        return scores
    return softcap * jnp.tanh(scores / softcap)
