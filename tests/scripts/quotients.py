"""A benchmark's ratio checked against the figures printed beside it, all three rounded: the
check the scripts' tests share (a ratio only checked for > 0 passes inverted)."""

from __future__ import annotations


def quotient_bounds(num: float, den: float, num_half: float, den_half: float):
    """The least and the most ``num / den`` can be when each was rounded by up to ``num_half``
    and ``den_half`` (half a unit of its last printed decimal; 0 for an exact figure)."""
    assert den > den_half, f"the denominator {den} is below its rounding ({den_half})"
    return (num - num_half) / (den + den_half), (num + num_half) / (den - den_half)


def assert_quotient(got, num, den, *, num_half: float, den_half: float, ratio_half: float):
    """``got``, itself rounded by up to ``ratio_half``, is ``num / den``: it lies between the
    extreme quotients of :func:`quotient_bounds`, widened by its own rounding."""
    low, high = quotient_bounds(num, den, num_half, den_half)
    assert low - ratio_half <= got <= high + ratio_half, (got, num, den)
