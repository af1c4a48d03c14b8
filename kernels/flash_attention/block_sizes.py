"""Block sizes for flash attention, and their tuning table per TPU generation."""

from __future__ import annotations

import dataclasses

from rljax.kernels import dispatch


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes along the sequence for the forward and backward kernels.

    Attributes:
      block_q: query rows per forward tile (sublane dim: multiple of 8).
      block_kv: key/value rows per forward tile; each score tile is [block_q, block_kv].
      block_kv_bwd: key/value rows per backward tile (both backward kernels); the backward's
        query tiles are block_q rows.
    """

    block_q: int = 128
    block_kv: int = 128
    block_kv_bwd: int = 256

    def __post_init__(self):
        for name in ("block_q", "block_kv", "block_kv_bwd"):
            dispatch.check_positive_int("BlockSizes", name, getattr(self, name))
            dispatch.check_multiple("BlockSizes", name, getattr(self, name), 8)

    def for_seq_len(self, seq_len: int) -> BlockSizes:
        """These sizes, clamped so no tile is longer than the (8-rounded) sequence."""
        cap = -(-seq_len // 8) * 8
        return BlockSizes(
            block_q=min(self.block_q, cap),
            block_kv=min(self.block_kv, cap),
            block_kv_bwd=min(self.block_kv_bwd, cap),
        )


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
