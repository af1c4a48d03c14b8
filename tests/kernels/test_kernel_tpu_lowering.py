"""Every Pallas kernel lowers to a Mosaic TPU custom call ahead of time, on a CPU-only host.

``jax.export`` with ``platforms=['tpu']`` runs Pallas' Mosaic lowering (block-shape and
layout rules, scalar prefetch, DMA and semaphore ops), which interpret mode skips. Mosaic's
own compiler passes still only run on a TPU.
"""

import jax
import jax.numpy as jnp
import pytest
from jax import export
from rljax.kernels.flash_attention import block_sizes as flash_bs
from rljax.kernels.flash_attention.kernel import flash_attention_fwd_kernel
from rljax.kernels.flash_attention.kernel_bwd import flash_attention_bwd_kernel
from rljax.kernels.fused_logprobs import block_sizes as logprobs_bs
from rljax.kernels.fused_logprobs.kernel import token_logprobs_kernel
from rljax.kernels.paged_attention import block_sizes as paged_bs
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel

GENERATIONS = sorted(paged_bs.TUNING_TABLE)
_S = jax.ShapeDtypeStruct
_BF16 = jnp.bfloat16
_I32 = jnp.int32


def assert_lowers_to_mosaic(fn, *args):
    exported = export.export(jax.jit(fn), platforms=["tpu"])(*args)
    assert "tpu_custom_call" in exported.mlir_module()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_paged_attention_lowers(generation):
    sizes = paged_bs.TUNING_TABLE[generation]
    assert_lowers_to_mosaic(
        lambda *a: paged_decode_attention_kernel(
            *a, sm_scale=0.1, block_sizes=sizes.for_pages_per_seq(16), interpret=False
        ),
        _S((8, 32, 128), _BF16),  # q [B, N, H]
        _S((8, 256, 16, 128), _BF16),  # k_pages [K, P, S, H]
        _S((8, 256, 16, 128), _BF16),
        _S((8,), _I32),
        _S((8, 16), _I32),
    )


@pytest.mark.parametrize("with_segments", [False, True])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_flash_attention_lowers(generation, with_segments):
    sizes = flash_bs.TUNING_TABLE[generation]
    seg = _S((2, 1024), _I32) if with_segments else None
    assert_lowers_to_mosaic(
        lambda q, k, v, s: flash_attention_fwd_kernel(
            q,
            k,
            v,
            s,
            causal=True,
            sm_scale=0.1,
            kv_len=1000,
            block_sizes=sizes,
            interpret=False,
        ),
        _S((2, 8, 1024, 128), _BF16),  # q [B, N, Tp, H]
        _S((2, 2, 1024, 128), _BF16),
        _S((2, 2, 1024, 128), _BF16),
        seg,
    )


@pytest.mark.parametrize("with_segments", [False, True])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_flash_attention_backward_lowers(generation, with_segments):
    sizes = flash_bs.TUNING_TABLE[generation]
    seg = _S((2, 1024), _I32) if with_segments else None
    q = _S((2, 8, 1024, 128), _BF16)
    kv = _S((2, 2, 1024, 128), _BF16)
    lse = _S((2, 8, 1024, 1), jnp.float32)
    assert_lowers_to_mosaic(
        lambda q, k, v, s, o, lse, do: flash_attention_bwd_kernel(
            q,
            k,
            v,
            s,
            o,
            lse,
            do,
            causal=True,
            sm_scale=0.1,
            kv_len=1000,
            block_sizes=sizes,
            interpret=False,
        ),
        q,
        kv,
        kv,
        seg,
        q,
        lse,
        q,
    )


@pytest.mark.parametrize("generation", GENERATIONS)
def test_fused_logprobs_lowers(generation):
    sizes = logprobs_bs.TUNING_TABLE[generation]
    assert_lowers_to_mosaic(
        lambda h, w, t: token_logprobs_kernel(
            h, w, t, temperature=1.0, block_sizes=sizes, interpret=False
        ),
        _S((1024, 256), _BF16),
        _S((256, 152064), _BF16),
        _S((1024,), _I32),
    )
