"""Block sizes for flash attention, and their tuning table per TPU generation."""

from __future__ import annotations

import dataclasses
import math

from rljax.kernels import dispatch

LANES = 128  # TPU vreg lanes: the minor dim of a tile is a multiple of this or the whole dim.
_SUBLANES = 8


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes along the sequence for the forward and backward kernels.

    Attributes:
      block_q: query rows per tile, forward and backward (sublane dim: multiple of 8).
      block_kv: key/value rows per forward tile; each score tile is [block_q, block_kv]. A
        lane dim on TPU: a multiple of 128 (see ``for_seq_len``).
      block_kv_bwd: key/value rows per backward tile (both backward kernels), likewise.

    These are upper bounds; ``for_seq_len`` fits them to a sequence.
    """

    block_q: int = 128
    block_kv: int = 128
    block_kv_bwd: int = 256

    def __post_init__(self):
        for name in ("block_q", "block_kv", "block_kv_bwd"):
            dispatch.check_positive_int("BlockSizes", name, getattr(self, name))
            dispatch.check_multiple("BlockSizes", name, getattr(self, name), 8)

    def for_seq_len(self, seq_len: int) -> BlockSizes:
        """Tiles fitted to a sequence of ``seq_len`` tokens; ``padded_len`` is what they tile.

        TPU tiling puts the key tiles on the lanes (the segment-id tile is [8, block_kv]), so
        a key tile must be a multiple of 128 or span the whole padded sequence. Hence:

        - a sequence no longer than the largest block is one tile, padded to 8 rows;
        - a longer one is padded to a multiple of 128 and each block shrinks to the largest
          multiple of its granule (8 rows for queries, 128 lanes for keys) that divides it.

        Padding stays under 128 rows past T (under 8 for one tile); blocks are never mixed
        sizes that only their least common multiple tiles (T = 200 once padded to 3,200).
        Key blocks below 128 (the interpret-mode tests use them to get many tiles on short
        sequences) use an 8-row granule instead and do not lower for TPU.
        """
        whole = dispatch.round_up(seq_len, _SUBLANES)
        if whole <= max(self.block_q, self.block_kv, self.block_kv_bwd):
            return BlockSizes(block_q=whole, block_kv=whole, block_kv_bwd=whole)
        lane_tiles = self.block_kv % LANES == 0 and self.block_kv_bwd % LANES == 0
        kv_granule = LANES if lane_tiles else _SUBLANES
        padded = dispatch.round_up(seq_len, kv_granule)
        return BlockSizes(
            block_q=_largest_tile(padded, self.block_q, _SUBLANES),
            block_kv=_largest_tile(padded, self.block_kv, kv_granule),
            block_kv_bwd=_largest_tile(padded, self.block_kv_bwd, kv_granule),
        )

    def padded_len(self, seq_len: int) -> int:
        """The sequence length these (fitted) tiles cover: a multiple of every block."""
        return dispatch.round_up(seq_len, math.lcm(self.block_q, self.block_kv, self.block_kv_bwd))


def _largest_tile(length: int, cap: int, granule: int) -> int:
    """The largest multiple of ``granule`` that divides ``length`` and is at most ``cap``."""
    for size in range(cap - cap % granule, 0, -granule):
        if length % size == 0:
            return size
    return granule


DEFAULT = BlockSizes()

# Larger tiles raise arithmetic intensity per DMA; they are capped by VMEM (16 MiB scoped on
# v4/v5e, more on v5p/v6e) and, on v6e, matched to its 256x256 MXU.
TUNING_TABLE: dict[str, BlockSizes] = {
    "v4": BlockSizes(block_q=128, block_kv=128, block_kv_bwd=256),
    "v5e": BlockSizes(block_q=128, block_kv=256, block_kv_bwd=256),
    "v5p": BlockSizes(block_q=256, block_kv=256, block_kv_bwd=512),
    "v6e": BlockSizes(block_q=256, block_kv=512, block_kv_bwd=512),
}


def for_device(device_kind: str | None = None) -> BlockSizes:
    """The tuned BlockSizes for ``device_kind`` (default: the first JAX device), else DEFAULT."""
    return TUNING_TABLE.get(dispatch.tpu_generation(device_kind), DEFAULT)
