"""Block sizes for the grouped matmul, and their tuning table per TPU generation."""

from __future__ import annotations

import dataclasses

from rljax.kernels import dispatch

LANES = 128  # TPU vreg lanes: a tile's minor dim is a multiple of this or the whole dim.
_SUBLANES = 8


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes of the grouped products, forward and backward.

    Attributes:
      tm: rows of the sorted lhs per tile (sublane dim: a multiple of 8). A tile that a group
        boundary cuts is computed once per group in it, so a smaller tm wastes less when the
        groups are small (many experts, few tokens each).
      tk: columns of K per tile: the contraction of the forward and of d_rhs, the output
        columns of d_lhs. On TPU a multiple of 128 (see ``for_shape``).
      tn: columns of N per tile: the forward's output columns, the contraction of d_lhs.
        On TPU a multiple of 128.

    These are upper bounds; ``for_shape`` fits them to a problem.
    """

    tm: int = 128
    tk: int = 512
    tn: int = 512

    def __post_init__(self):
        # The TPU tiling rules (a multiple of 8 rows or all of them; a multiple of 128 lanes or
        # the whole dimension) depend on the problem's shape, so the kernel checks them, for
        # the sizes that ``for_shape`` fitted.
        for name in ("tm", "tk", "tn"):
            dispatch.check_positive_int("BlockSizes", name, getattr(self, name))

    def for_shape(self, rows: int, k: int, n: int) -> BlockSizes:
        """These sizes fitted to an lhs of ``rows`` x ``k`` and an rhs of [G, k, n].

        - tm: ``rows`` itself when it fits in one tile (a whole dimension is always a legal
          TPU tile), else tm; a ragged last row tile is masked, never padded.
        - tk, tn: the dimension itself when it fits in one tile; else the largest multiple of
          the granule that divides it and is at most the block (the granule is 128 lanes,
          or 8 for blocks below 128, which only interpret mode runs); else, when no such
          multiple divides it, the whole dimension. Contraction tiles must divide K and N
          exactly: a ragged one would add padding garbage into the sums.
        """
        return BlockSizes(
            tm=min(rows, self.tm) if rows > 0 else self.tm,
            tk=_fit(k, self.tk),
            tn=_fit(n, self.tn),
        )


def _fit(dim: int, block: int) -> int:
    """The tile for a dimension of ``dim`` under ``block`` (see ``BlockSizes.for_shape``)."""
    if dim <= block:
        return dim
    granule = LANES if block % LANES == 0 else _SUBLANES
    for size in range(block - block % granule, 0, -granule):
        if dim % size == 0:
            return size
    return dim


DEFAULT = BlockSizes()

# Starting points, not yet measured on a chip. Each step holds an lhs tile [tm, tk], an rhs
# tile [tk, tn] and an output tile [tm, tn], double-buffered, and an f32 accumulator: at
# (128, 512, 512) in bf16 about 2.6 MiB, at (256, 512, 1024) about 5 MiB, well inside the
# 16 MiB of scoped VMEM. tm stays small because every group boundary inside a tile costs a
# revisit: 128 experts over 32k rows average 256 rows each. v6e's 256x256 MXU wants tm = 256.
TUNING_TABLE: dict[str, BlockSizes] = {
    "v4": BlockSizes(tm=128, tk=512, tn=512),
    "v5e": BlockSizes(tm=128, tk=512, tn=512),
    "v5p": BlockSizes(tm=128, tk=512, tn=1024),
    "v6e": BlockSizes(tm=256, tk=512, tn=1024),
}


def for_device(device_kind: str | None = None) -> BlockSizes:
    """The tuned BlockSizes for ``device_kind`` (default: the first JAX device), else DEFAULT."""
    return TUNING_TABLE.get(dispatch.tpu_generation(device_kind), DEFAULT)
