"""Block sizes for the fused log-prob/entropy op, and their tuning table per TPU generation."""

from __future__ import annotations

import dataclasses

from rljax.kernels import dispatch


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes over tokens and vocabulary.

    Attributes:
      block_t: tokens per Pallas tile (sublane dim: multiple of 8).
      block_v: vocabulary columns per chunk, in the Pallas kernel and in the chunked jnp
        forward and backward; for TPU a multiple of 128 lanes (every table entry is). Working
        memory is about block_t (or T) * block_v * 4 bytes; the [T, V] logits never exist.
    """

    block_t: int = 256
    block_v: int = 512

    def __post_init__(self):
        for name in ("block_t", "block_v"):
            dispatch.check_positive_int("BlockSizes", name, getattr(self, name))
        # block_v's TPU rule (a multiple of 128 lanes, or the whole vocabulary) depends on the
        # vocabulary, so the kernel checks it; for_shape fits it.
        dispatch.check_multiple("BlockSizes", "block_t", self.block_t, 8)

    def for_shape(self, tokens: int, vocab: int) -> BlockSizes:
        """These sizes fitted to ``tokens`` x ``vocab``.

        Tokens are split into the fewest tiles of at most block_t rows, each rounded up to 8,
        so padding stays under 8 rows a tile (257 tokens: two tiles of 136, not two of 256).
        A vocabulary no wider than block_v is one tile of exactly V columns: TPU lane tiles
        are multiples of 128 or the whole dimension, and V rounded up to 8 (24 for V = 18) is
        neither. A wider vocabulary keeps block_v and masks its ragged last tile.
        """
        tiles = max(1, -(-tokens // self.block_t))
        return BlockSizes(
            block_t=max(8, dispatch.round_up(-(-tokens // tiles), 8)),
            block_v=min(self.block_v, vocab),
        )


DEFAULT = BlockSizes()

# block_v is a multiple of 128 lanes (and of 256 on v6e's MXU); 512 divides common vocab sizes
# such as 152064 (Qwen2) and 32768. The [D, block_v] weight tile dominates VMEM: at D = 4096
# and bf16 it is 4 MiB per buffer at block_v = 512, so only chips with larger VMEM go wider.
TUNING_TABLE: dict[str, BlockSizes] = {
    "v4": BlockSizes(block_t=256, block_v=512),
    "v5e": BlockSizes(block_t=256, block_v=512),
    "v5p": BlockSizes(block_t=512, block_v=512),
    "v6e": BlockSizes(block_t=512, block_v=1024),
}


def for_device(device_kind: str | None = None) -> BlockSizes:
    """The tuned BlockSizes for ``device_kind`` (default: the first JAX device), else DEFAULT."""
    return TUNING_TABLE.get(dispatch.tpu_generation(device_kind), DEFAULT)
