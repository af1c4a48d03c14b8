"""Block sizes for paged decode attention, and their tuning table per TPU generation."""

from __future__ import annotations

import dataclasses

from rljax.kernels import dispatch


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """How much of the KV cache one kernel step handles.

    Attributes:
      pages_per_block: pages DMA'd into VMEM and scored per step of the online softmax. More
        pages per step amortise the per-step overhead and give the MXU a wider matmul; fewer
        waste less work on the last, partly filled block. The kernel double-buffers, so VMEM
        use is 2 * 2 (K and V) * pages_per_block * page_size * head_dim * itemsize.
    """

    pages_per_block: int = 4

    def __post_init__(self):
        dispatch.check_positive_int("BlockSizes", "pages_per_block", self.pages_per_block)

    def for_pages_per_seq(self, pages_per_seq: int) -> BlockSizes:
        """These sizes, with pages_per_block clamped so a block never spans past the table."""
        return dataclasses.replace(self, pages_per_block=min(self.pages_per_block, pages_per_seq))


DEFAULT = BlockSizes(pages_per_block=4)

# Per-generation choices. Decode is HBM-bound: blocks are sized so one step's DMA (a few
# hundred KiB at page_size 16-64, head_dim 128) hides the previous step's compute; chips with
# more HBM bandwidth per core (v5p, v6e) want larger steps to stay bandwidth-bound.
TUNING_TABLE: dict[str, BlockSizes] = {
    "v4": BlockSizes(pages_per_block=4),
    "v5e": BlockSizes(pages_per_block=4),
    "v5p": BlockSizes(pages_per_block=8),
    "v6e": BlockSizes(pages_per_block=8),
}


def for_device(device_kind: str | None = None) -> BlockSizes:
    """The tuned BlockSizes for ``device_kind`` (default: the first JAX device), else DEFAULT."""
    return TUNING_TABLE.get(dispatch.tpu_generation(device_kind), DEFAULT)
