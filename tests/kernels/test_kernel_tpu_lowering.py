"""Every Pallas kernel lowers to a Mosaic TPU custom call ahead of time, on a CPU-only host.

``jax.export`` with ``platforms=['tpu']`` runs Pallas' Mosaic lowering (block-shape and
layout rules, scalar prefetch, DMA and semaphore ops), which interpret mode skips. Mosaic's
own compiler passes still only run on a TPU.

The first tests export the kernels at one shape per tuning-table entry. The sweep at the end
exports the public ops' cores, forward and backward, the way a TPU runs them (Pallas, not
interpreted) over the shapes users hit: vocabularies from 18 (the default recipe's model) to
151,936 (Qwen), sequence lengths from 1 to 4096 including odd ones, head dims 64 and 128.
The grouped matmul (mixture-of-experts) runs over ragged row counts, expert widths that
divide no 512-column tile, and both precisions its kernels take. Each case is lowering only
(no execution); the sweep pairs its axes instead of crossing them.
"""

import math

import jax
import jax.numpy as jnp
import pytest
from jax import export
from rljax.kernels.flash_attention import BlockSizes as FlashBlockSizes
from rljax.kernels.flash_attention import block_sizes as flash_bs
from rljax.kernels.flash_attention.kernel import flash_attention_fwd_kernel
from rljax.kernels.flash_attention.kernel_bwd import flash_attention_bwd_kernel
from rljax.kernels.flash_attention.ops import flash_attention_core
from rljax.kernels.fused_logprobs import block_sizes as logprobs_bs
from rljax.kernels.fused_logprobs.kernel import token_logprobs_kernel
from rljax.kernels.fused_logprobs.ops import token_logprobs_and_entropy_core
from rljax.kernels.grouped_matmul import block_sizes as gmm_bs
from rljax.kernels.grouped_matmul.kernel import gmm_kernel, tgmm_kernel
from rljax.kernels.grouped_matmul.ops import grouped_matmul_core
from rljax.kernels.paged_attention import block_sizes as paged_bs
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel
from rljax.kernels.paged_attention.ops import paged_decode_attention_core

GENERATIONS = sorted(paged_bs.TUNING_TABLE)
_S = jax.ShapeDtypeStruct
_BF16 = jnp.bfloat16
_I32 = jnp.int32


def assert_lowers_to_mosaic(fn, *args, calls=1):
    """Exports ``fn`` for TPU; it must hold at least ``calls`` Mosaic kernels."""
    exported = export.export(jax.jit(fn), platforms=["tpu"])(*args)
    assert exported.mlir_module().count("tpu_custom_call") >= calls


@pytest.mark.parametrize("generation", GENERATIONS)
def test_paged_attention_lowers(generation):
    sizes = paged_bs.TUNING_TABLE[generation]
    assert_lowers_to_mosaic(
        lambda *a: paged_decode_attention_kernel(
            *a, sm_scale=0.1, block_sizes=sizes.for_pages_per_seq(16), interpret=False
        ),
        _S((8, 32, 128), _BF16),  # q [B, N, H]
        _S((3, 8, 256, 16, 128), _BF16),  # k_pages [L, K, P, S, H]
        _S((3, 8, 256, 16, 128), _BF16),
        _S((8,), _I32),
        _S((8, 16), _I32),
        _S((), _I32),  # the layer read, traced
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
def test_flash_attention_window_and_softcap_lower(generation):
    """Forward and both backward kernels with a sliding window (band grids, clamped index maps
    with a max and a min) and a soft-cap, at Gemma 3's window of 512."""
    sizes = flash_bs.TUNING_TABLE[generation]
    q = _S((2, 8, 1024, 128), _BF16)
    kv = _S((2, 2, 1024, 128), _BF16)
    options = dict(
        causal=True, sm_scale=0.1, kv_len=1000, block_sizes=sizes, interpret=False, window=512,
        softcap=50.0,
    )  # fmt: skip

    def fn(q, k, v, s):
        out, lse = flash_attention_fwd_kernel(q, k, v, s, **options)
        return flash_attention_bwd_kernel(q, k, v, s, out, lse, out, **options)

    assert_lowers_to_mosaic(fn, q, kv, kv, _S((2, 1024), _I32), calls=3)


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


@pytest.mark.parametrize("generation", GENERATIONS)
def test_grouped_matmul_lowers(generation):
    """gmm, its transposed-rhs form (d_lhs) and tgmm (d_rhs), each at the table's tiles."""
    rows, k, n, groups = 1000, 2048, 768, 64  # a ragged last row tile; N = 768 fits tn
    sizes = gmm_bs.TUNING_TABLE[generation].for_shape(rows, k, n)
    options = dict(block_sizes=sizes, precision=None, interpret=False)

    def fn(lhs, rhs, dout, group_sizes):
        out = gmm_kernel(lhs, rhs, group_sizes, transpose_rhs=False, **options)
        d_lhs = gmm_kernel(dout, rhs, group_sizes, transpose_rhs=True, **options)
        d_rhs = tgmm_kernel(lhs, dout, group_sizes, out_dtype=_BF16, **options)
        return out, d_lhs, d_rhs

    assert_lowers_to_mosaic(
        fn,
        _S((rows, k), _BF16),  # lhs [M, K]
        _S((groups, k, n), _BF16),  # rhs [G, K, N]
        _S((rows, n), _BF16),  # dout [M, N]
        _S((groups,), _I32),
        calls=3,
    )


# -- the sweep ------------------------------------------------------------------------------

# Every tuning-table entry plus the default, cycled through the cases below.
SIZES = {"default": None, **{g: g for g in GENERATIONS}}
_TPU = dict(use_pallas=True, interpret=False)  # what resolve_impl gives on a TPU


def _table(bs, generation):
    return bs.DEFAULT if generation in (None, "default") else bs.TUNING_TABLE[generation]


def _grad_fn(core, n_diff, **options):
    """fn(*args) -> (outputs, grads of a weighted sum of the outputs wrt the first n_diff)."""

    def fn(*args):
        def loss(*diff):
            outs = core(*diff, *args[n_diff:], **options)
            return sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree.leaves(outs))

        return jax.value_and_grad(loss, argnums=tuple(range(n_diff)))(*args[:n_diff])

    return fn


# (vocabulary, tokens, hidden width, generation): every vocabulary, small and odd token counts.
LOGPROB_CASES = [
    (18, 37, 64, "default"),  # the default recipe's model: V below one 128-lane tile
    (18, 1, 128, "v6e"),
    (1000, 200, 128, "v4"),  # ragged last vocabulary tile
    (32000, 4096, 128, "v5e"),
    (50257, 129, 64, "v5p"),  # odd V and odd T
    (151936, 1000, 128, "v6e"),
]


@pytest.mark.parametrize("vocab, tokens, width, generation", LOGPROB_CASES)
def test_fused_logprobs_sweep_lowers_forward_and_backward(vocab, tokens, width, generation):
    sizes = _table(logprobs_bs, generation).for_shape(tokens, vocab)
    fn = _grad_fn(token_logprobs_and_entropy_core, 2, temperature=1.0, block_sizes=sizes, **_TPU)
    # The backward is the chunked jnp backward (see docs/kernels.md); the forward is Pallas.
    assert_lowers_to_mosaic(
        fn, _S((tokens, width), _BF16), _S((width, vocab), _BF16), _S((tokens,), _I32)
    )


# Gemma 2's final-logit soft cap (c = 30) before a temperature: V below one lane tile, a ragged
# last tile, and Gemma 2's own 256,000-token vocabulary.
SOFTCAP_LOGPROB_CASES = [
    (18, 37, 64, "default"),
    (1000, 200, 128, "v4"),
    (256000, 1000, 128, "v6e"),
]


@pytest.mark.parametrize("vocab, tokens, width, generation", SOFTCAP_LOGPROB_CASES)
def test_fused_logprobs_softcap_lowers_forward_and_backward(vocab, tokens, width, generation):
    sizes = _table(logprobs_bs, generation).for_shape(tokens, vocab)
    fn = _grad_fn(
        token_logprobs_and_entropy_core,
        2,
        temperature=0.7,
        softcap=30.0,
        block_sizes=sizes,
        **_TPU,
    )
    assert_lowers_to_mosaic(
        fn, _S((tokens, width), _BF16), _S((width, vocab), _BF16), _S((tokens,), _I32)
    )


# (T, head dim, segment ids, generation): odd lengths, one tile, lane tiles, long sequences.
FLASH_CASES = [
    (1, 64, True, "default"),
    (7, 128, False, "v4"),
    (100, 64, True, "v5e"),
    (200, 128, True, "default"),  # padded to 3,200 before, and its backward did not lower
    (300, 64, True, "v6e"),  # padded to 4,864 before
    (513, 128, False, "v5p"),
    (1000, 64, True, "v4"),
    (4095, 128, True, "v6e"),
]


@pytest.mark.parametrize("seq_len, head_dim, with_segments, generation", FLASH_CASES)
def test_flash_attention_sweep_lowers_forward_and_backward(
    seq_len, head_dim, with_segments, generation
):
    sizes = _table(flash_bs, generation)
    fn = _grad_fn(
        flash_attention_core,
        3,
        causal=True,
        sm_scale=1 / math.sqrt(head_dim),
        block_sizes=sizes,
        **_TPU,
    )
    q = _S((1, seq_len, 4, head_dim), _BF16)  # [B, T, N, H]
    kv = _S((1, seq_len, 2, head_dim), _BF16)  # GQA: two query heads per kv head
    seg = _S((1, seq_len), _I32) if with_segments else None
    assert_lowers_to_mosaic(fn, q, kv, kv, seg, calls=3)  # forward, dK/dV, dQ


# (T, head dim, segment ids, generation, window, softcap): windows below, at and across tiles.
FLASH_WINDOW_CASES = [
    (100, 64, True, "v5e", 16, 50.0),  # one tile: the window is all the masking
    (300, 64, True, "v6e", 100, None),  # a window cut mid-tile
    (513, 128, False, "v5p", 1, None),  # a query sees only itself
    (1000, 64, True, "v4", 128, 50.0),  # window = tile
    (4095, 128, True, "v6e", 512, 50.0),  # Gemma 3's local layers
    (200, 128, True, "default", None, 30.0),  # soft-cap alone
]


@pytest.mark.parametrize(
    "seq_len, head_dim, with_segments, generation, window, softcap", FLASH_WINDOW_CASES
)
def test_flash_attention_window_sweep_lowers_forward_and_backward(
    seq_len, head_dim, with_segments, generation, window, softcap
):
    fn = _grad_fn(
        flash_attention_core,
        3,
        causal=True,
        sm_scale=1 / math.sqrt(head_dim),
        block_sizes=_table(flash_bs, generation),
        window=window,
        softcap=softcap,
        **_TPU,
    )
    q = _S((1, seq_len, 4, head_dim), _BF16)
    kv = _S((1, seq_len, 2, head_dim), _BF16)
    seg = _S((1, seq_len), _I32) if with_segments else None
    assert_lowers_to_mosaic(fn, q, kv, kv, seg, calls=3)


# (rows M, K, N, groups G, dtype, precision, generation): Qwen-MoE-like expert widths (768,
# 1408 = 11 * 128), one row, rows and widths no multiple of a tile, HIGHEST for f32.
GMM_CASES = [
    (1, 64, 128, 4, _BF16, None, "default"),
    (37, 200, 96, 3, jnp.float32, "highest", "v4"),  # whole-dimension tiles
    (1000, 2048, 768, 64, _BF16, None, "v5e"),
    (4096, 2048, 1408, 128, _BF16, "default", "v6e"),
    (513, 1408, 2048, 60, jnp.float32, "highest", "v5p"),
]


@pytest.mark.parametrize("rows, k, n, groups, dtype, precision, generation", GMM_CASES)
def test_grouped_matmul_sweep_lowers_forward_and_backward(
    rows, k, n, groups, dtype, precision, generation
):
    fn = _grad_fn(
        grouped_matmul_core,
        2,
        block_sizes=_table(gmm_bs, generation),
        precision=None if precision is None else jax.lax.Precision(precision),
        **_TPU,
    )
    lhs, rhs, sizes = _S((rows, k), dtype), _S((groups, k, n), dtype), _S((groups,), _I32)
    assert_lowers_to_mosaic(fn, lhs, rhs, sizes, calls=3)  # gmm, d_lhs gmm, tgmm


@pytest.mark.parametrize(
    "seq_len, head_dim, page_size, generation",
    [(1, 64, 16, "default"), (200, 128, 16, "v5e"), (4096, 64, 32, "v6e")],
)
def test_paged_attention_sweep_lowers(seq_len, head_dim, page_size, generation):
    pages_per_seq = -(-seq_len // page_size)
    sizes = _table(paged_bs, generation).for_pages_per_seq(pages_per_seq)
    fn = lambda *a: paged_decode_attention_core(
        *a, sm_scale=1 / math.sqrt(head_dim), block_sizes=sizes, **_TPU
    )
    assert_lowers_to_mosaic(
        fn,
        _S((4, 8, head_dim), _BF16),  # q [B, N, H]
        _S((2, 2, 4 * pages_per_seq, page_size, head_dim), _BF16),  # [L, K, P, S, H]
        _S((2, 2, 4 * pages_per_seq, page_size, head_dim), _BF16),
        _S((4,), _I32),
        _S((4, pages_per_seq), _I32),
        _S((), _I32),
    )


# Gemma 2/3's sliding layers over a 4096-token table: windows of one token, one page, a page
# multiple wider than a block and one that is not; Gemma 2's attention-logit soft cap (50).
PAGED_WINDOW_CASES = [
    (1, None, 16, "default"),
    (16, 50.0, 16, "v4"),
    (512, None, 32, "v5p"),
    (1000, 50.0, 16, "v6e"),
]


@pytest.mark.parametrize("window, softcap, page_size, generation", PAGED_WINDOW_CASES)
def test_paged_attention_window_and_softcap_lower(window, softcap, page_size, generation):
    pages_per_seq = 4096 // page_size
    sizes = _table(paged_bs, generation).for_pages_per_seq(pages_per_seq)
    fn = lambda *a: paged_decode_attention_core(
        *a, sm_scale=0.0625, block_sizes=sizes, window=window, softcap=softcap, **_TPU
    )
    assert_lowers_to_mosaic(
        fn,
        _S((4, 8, 256), _BF16),  # q [B, N, H]; Gemma 2 9B's head_dim
        _S((1, 4, 4 * pages_per_seq, page_size, 256), _BF16),  # [L, K, P, S, H]
        _S((1, 4, 4 * pages_per_seq, page_size, 256), _BF16),
        _S((4,), _I32),
        _S((4, pages_per_seq), _I32),
        _S((), _I32),
    )


def _padding(sizes: FlashBlockSizes, seq_len: int) -> float:
    return sizes.for_seq_len(seq_len).padded_len(seq_len) / seq_len


def test_padding_overhead_is_reported_and_under_2x_from_128_tokens(capsys):
    """Every length 1..4096 under every table entry: flash attention pads T, log-probs T."""
    lengths = range(1, 4097)
    rows = []
    for name, generation in SIZES.items():
        flash = _table(flash_bs, generation)
        logprobs = _table(logprobs_bs, generation)
        flash_pad = {t: _padding(flash, t) for t in lengths}
        logprob_pad = {}
        for t in lengths:
            block_t = logprobs.for_shape(t, 32000).block_t
            logprob_pad[t] = -(-t // block_t) * block_t / t
        for label, pad in (("flash_attention", flash_pad), ("fused_logprobs", logprob_pad)):
            long = {t: p for t, p in pad.items() if t >= 128}
            worst = max(long, key=long.get)
            rows.append(
                f"{label:16s} {name:8s} worst(T>=128) {long[worst]:.3f}x at T={worst}; "
                f"T=200 {pad[200]:.3f}x, T=300 {pad[300]:.3f}x, T=1 {pad[1]:.0f}x"
            )
            assert long[worst] < 2.0, rows[-1]
    with capsys.disabled():
        print("\npadding overhead (padded / T):\n" + "\n".join(rows))
