"""Pallas kernels, imported as ``rljax.kernels``.

One subpackage per op, each with a Pallas kernel, a jnp reference, a public ``ops`` wrapper
(``impl='auto'|'pallas'|'xla'``) and a per-chip ``BlockSizes`` table:

- ``rljax.kernels.paged_attention``: ``paged_decode_attention`` (sampler decode step).
- ``rljax.kernels.flash_attention``: ``flash_attention`` (learner, packed sequences, fwd+bwd).
- ``rljax.kernels.fused_logprobs``: ``token_logprobs_and_entropy`` (loss, no [T, V] logits).
- ``rljax.kernels.grouped_matmul``: ``grouped_matmul`` (mixture-of-experts, fwd+bwd).

See docs/kernels.md.
"""
