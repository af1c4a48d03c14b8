"""Paged decode attention: GQA attention of one new token per slot over a paged KV cache."""

from rljax.kernels.paged_attention.block_sizes import BlockSizes
from rljax.kernels.paged_attention.ops import paged_decode_attention
from rljax.kernels.paged_attention.reference import paged_decode_attention_reference
from rljax.kernels.paged_attention.sharded import sharded_paged_decode_attention

__all__ = [
    "BlockSizes",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "sharded_paged_decode_attention",
]
