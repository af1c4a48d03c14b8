"""Grouped matmul: dropless mixture-of-experts products over group-sorted rows, fwd + bwd."""

from rljax.kernels.grouped_matmul.block_sizes import BlockSizes
from rljax.kernels.grouped_matmul.ops import grouped_matmul
from rljax.kernels.grouped_matmul.reference import grouped_matmul_reference

__all__ = [
    "BlockSizes",
    "grouped_matmul",
    "grouped_matmul_reference",
]
