"""Fused log-probs: per-token log p(target) and entropy without materialising [T, V] logits."""

from rljax.kernels.fused_logprobs.block_sizes import BlockSizes
from rljax.kernels.fused_logprobs.ops import token_logprobs_and_entropy
from rljax.kernels.fused_logprobs.reference import token_logprobs_and_entropy_reference
from rljax.kernels.fused_logprobs.sharded import sharded_token_logprobs_and_entropy

__all__ = [
    "BlockSizes",
    "sharded_token_logprobs_and_entropy",
    "token_logprobs_and_entropy",
    "token_logprobs_and_entropy_reference",
]
