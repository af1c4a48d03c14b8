"""Flash attention: blockwise GQA attention with causal, sliding-window and segment masks
and a score soft-cap, fwd + bwd."""

from rljax.kernels.flash_attention.block_sizes import BlockSizes
from rljax.kernels.flash_attention.ops import flash_attention
from rljax.kernels.flash_attention.reference import flash_attention_reference
from rljax.kernels.flash_attention.sharded import sharded_flash_attention

__all__ = [
    "BlockSizes",
    "flash_attention",
    "flash_attention_reference",
    "sharded_flash_attention",
]
