"""Flash attention's sliding window and score soft-cap (Gemma 2/3), on every path.

The reference is held to a naive loop and to Hugging Face's Gemma eager attention; the XLA
path and the Pallas kernels (interpret mode), values and gradients, to the reference; the
tile band the kernels walk to a brute-force list of the tiles the mask leaves unmasked.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from rljax.kernels.flash_attention import (
    BlockSizes,
    flash_attention,
    flash_attention_reference,
    sharded_flash_attention,
)
from rljax.kernels.flash_attention.band import TileBand
from rljax.kernels.flash_attention.kernel import flash_attention_fwd_kernel
from rljax.kernels.flash_attention.kernel_bwd import flash_attention_bwd_kernel
from rljax.kernels.flash_attention.ops import resolve_options

from tests.kernels.test_flash_attention_kernel import (
    GRAD_TOL,
    TOL,
    close,
    fast_jit,
    outputs_and_grads,
)

SEQ = 45  # Padded to 48: several tiles of 8 or 16, a window cut mid-tile, padded queries.
HEAD_DIM = 16
SCALE = 0.25  # q.k * SCALE is about N(0, 1): a cap of 1 or 2 bends the scores.


def make_inputs(n_heads, kv_heads, dtype, *, batch=2, seq=SEQ, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(batch, seq, n_heads, HEAD_DIM)), dtype)
    k = jnp.asarray(rng.normal(size=(batch, seq, kv_heads, HEAD_DIM)), dtype)
    v = jnp.asarray(rng.normal(size=(batch, seq, kv_heads, HEAD_DIM)), dtype)
    # Packed rows: a window reaching back across a segment start, a one-token segment.
    segment_ids = np.zeros((batch, seq), np.int32)
    segment_ids[:, 11:12] = 1
    segment_ids[:, 12:] = 2
    segment_ids[-1, 30:] = 3
    return q, k, v, jnp.asarray(segment_ids)


def naive_attention(q, k, v, segment_ids, *, window, softcap, sm_scale):
    """One query at a time, the keys it may see listed by the rule itself."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, n, _ = q.shape
    group = n // k.shape[2]
    out = np.zeros_like(q)
    for bi, ni, i in itertools.product(range(b), range(n), range(t)):
        keys = [
            j
            for j in range(t)
            if j <= i
            and (window is None or i - j < window)
            and (segment_ids is None or segment_ids[bi, j] == segment_ids[bi, i])
        ]
        s = np.array([q[bi, i, ni] @ k[bi, j, ni // group] for j in keys]) * sm_scale
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        p = np.exp(s - s.max())
        out[bi, i, ni] = (p / p.sum()) @ v[bi, keys, ni // group]
    return out


@pytest.mark.parametrize(
    "window, softcap", [(None, None), (1, None), (3, None), (None, 0.5), (3, 0.5)]
)
def test_reference_matches_a_naive_loop(window, softcap):
    q, k, v, _ = make_inputs(2, 1, jnp.float32, batch=1, seq=9)
    seg = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1]], np.int32)
    got = flash_attention_reference(
        q, k, v, jnp.asarray(seg), sm_scale=1.0, window=window, softcap=softcap
    )
    want = naive_attention(q, k, v, seg, window=window, softcap=softcap, sm_scale=1.0)
    close(got, want, 1e-5)
    if (window, softcap) != (None, None):  # the options bite at this size
        plain = naive_attention(q, k, v, seg, window=None, softcap=None, sm_scale=1.0)
        assert np.abs(want - plain).max() > 0.1


def test_reference_matches_hugging_face_gemma_eager_attention():
    """transformers' Gemma 2 eager attention, masked by its own sliding-window and packed-
    sequence mask functions, with soft-cap and GQA."""
    torch = pytest.importorskip("torch", reason="the oracle is transformers on torch")
    pytest.importorskip("transformers")
    from transformers import masking_utils
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    window, softcap, t = 4, 1.5, 12
    q, k, v, _ = make_inputs(4, 2, jnp.float32, batch=2, seq=t)
    seg = np.zeros((2, t), np.int64)
    seg[:, 5:] = 1
    seg[1, 9:] = 2
    allowed = masking_utils.and_masks(
        masking_utils.sliding_window_causal_mask_function(window),
        masking_utils.packed_sequence_mask_function(torch.tensor(seg)),
    )
    b_idx, q_idx, kv_idx = torch.meshgrid(
        torch.arange(2), torch.arange(t), torch.arange(t), indexing="ij"
    )
    mask = allowed(b_idx, torch.tensor(0), q_idx, kv_idx)[:, None]  # [B, 1, T, T]
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)

    class Module(torch.nn.Module):
        num_key_value_groups = 2
        head_dim = HEAD_DIM

    to_torch = lambda x: torch.tensor(np.asarray(x)).transpose(1, 2)  # [B, heads, T, H]
    want, _ = eager_attention_forward(
        Module().eval(), to_torch(q), to_torch(k), to_torch(v), additive,
        scaling=SCALE, softcap=softcap,
    )  # fmt: skip
    got = flash_attention_reference(
        q, k, v, jnp.asarray(seg, jnp.int32), sm_scale=SCALE, window=window, softcap=softcap
    )
    close(got, want.numpy(), 1e-5)


# (N, K, dtype, window, softcap, segments, (block_q, block_kv, block_kv_bwd)).
PALLAS_CASES = [
    (2, 2, jnp.float32, 1, None, True, (8, 8, 8)),  # a query sees only itself
    (4, 1, jnp.float32, 8, None, True, (8, 8, 8)),  # window = block
    (4, 2, jnp.float32, 13, None, True, (16, 8, 8)),  # not a multiple; tiles cut mid-window
    (8, 1, jnp.bfloat16, 5, 2.0, True, (8, 16, 16)),  # window and cap, GQA 8, bf16
    (2, 1, jnp.float32, 20, None, False, (8, 8, 16)),  # no segments; backward tiles differ
    (4, 2, jnp.float32, None, 1.0, True, (8, 8, 8)),  # cap alone
    (
        4,
        2,
        jnp.float32,
        SEQ - 1,
        1.0,
        False,
        (16, 16, 8),
    ),  # all but the first key of the last query
]


@pytest.mark.parametrize(
    "n_heads, kv_heads, dtype, window, softcap, segmented, blocks", PALLAS_CASES
)
def test_pallas_matches_reference(n_heads, kv_heads, dtype, window, softcap, segmented, blocks):
    q, k, v, seg = make_inputs(n_heads, kv_heads, dtype)
    seg = seg if segmented else None
    options = dict(sm_scale=SCALE, window=window, softcap=softcap)

    @fast_jit
    def both(q, k, v):
        ours = lambda *a: flash_attention(
            *a, seg, impl="pallas", block_sizes=BlockSizes(*blocks), **options
        )
        ref = lambda *a: flash_attention_reference(*a, seg, **options)
        return outputs_and_grads(ours, q, k, v), outputs_and_grads(ref, q, k, v)

    (out, grads), (want, want_grads) = both(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    close(out, want, TOL[dtype])
    for got, expected in zip(grads, want_grads):
        close(got, expected, GRAD_TOL[dtype])


# (N, K, dtype, window, softcap, segments): every window edge on the XLA path's blocks.
XLA_CASES = [
    (2, 2, jnp.float32, 1, None, True),
    (4, 1, jnp.float32, 5, None, True),
    (4, 2, jnp.float32, 8, 2.0, False),
    (8, 1, jnp.bfloat16, 13, None, True),
    (4, 2, jnp.float32, 16, 1.0, True),
    (2, 1, jnp.float32, 17, None, True),
    (4, 2, jnp.float32, SEQ - 1, None, True),
    (4, 2, jnp.float32, None, 1.0, True),  # cap on the causal blocks
]


@pytest.mark.parametrize("n_heads, kv_heads, dtype, window, softcap, segmented", XLA_CASES)
@pytest.mark.parametrize("block_q", [8, 64])  # window blocks of 8 (6 of them) or 16 (3)
def test_xla_path_matches_reference(n_heads, kv_heads, dtype, window, softcap, segmented, block_q):
    q, k, v, seg = make_inputs(n_heads, kv_heads, dtype)
    seg = seg if segmented else None
    options = dict(sm_scale=SCALE, window=window, softcap=softcap)
    ours = lambda *a: flash_attention(
        *a, seg, impl="xla", block_sizes=BlockSizes(block_q=block_q), **options
    )
    ref = lambda *a: flash_attention_reference(*a, seg, **options)
    (out, grads), (want, want_grads) = jax.jit(
        lambda *a: (outputs_and_grads(ours, *a), outputs_and_grads(ref, *a))
    )(q, k, v)
    close(out, want, TOL[dtype])
    for got, expected in zip(grads, want_grads):
        close(got, expected, GRAD_TOL[dtype])


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_a_window_of_the_whole_sequence_is_global_attention(impl):
    q, k, v, seg = make_inputs(4, 2, jnp.float32, seq=20)
    run = lambda window: flash_attention(
        q, k, v, seg, impl=impl, block_sizes=BlockSizes(8, 8, 8), window=window
    )
    for window in (20, 100):
        np.testing.assert_array_equal(run(window), run(None))
        close(
            flash_attention_reference(q, k, v, seg, sm_scale=SCALE, window=window),
            flash_attention_reference(q, k, v, seg, sm_scale=SCALE),
            1e-6,
        )
    # One key short of the sequence is not global: the last query loses key 0.
    assert "window" not in resolve_options(q, True, None, impl, None, 20, None)
    assert resolve_options(q, True, None, impl, None, 19, None)["window"] == 19


def test_window_and_softcap_under_the_tpu_interpreter():
    """Window and cap under the TPU interpreter (NaN-filled scratch, modelled DMA)."""
    q, k, v, seg = make_inputs(2, 1, jnp.float32, batch=1)
    pad = 48 - SEQ
    to_kernel = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    seg_p = jnp.pad(seg, ((0, 0), (0, pad)))
    options = dict(
        causal=True, sm_scale=SCALE, kv_len=SEQ, window=11, softcap=2.0,
        interpret=pltpu.InterpretParams(),
    )  # fmt: skip
    static = ("causal", "sm_scale", "kv_len", "block_sizes", "interpret", "window", "softcap")
    fwd = fast_jit(flash_attention_fwd_kernel, static_argnames=static)
    out, lse = fwd(
        to_kernel(q), to_kernel(k), to_kernel(v), seg_p, block_sizes=BlockSizes(8, 16, 8),
        **options,
    )  # fmt: skip
    ref = lambda *a: flash_attention_reference(*a, seg, sm_scale=SCALE, window=11, softcap=2.0)
    close(out.transpose(0, 2, 1, 3)[:, :SEQ], ref(q, k, v), 2e-5)
    dout = jnp.asarray(np.random.default_rng(5).normal(size=q.shape), jnp.float32)
    bwd = fast_jit(flash_attention_bwd_kernel, static_argnames=static)
    grads = bwd(
        to_kernel(q), to_kernel(k), to_kernel(v), seg_p, out, lse, to_kernel(dout),
        block_sizes=BlockSizes(16, 16, 8), **options,
    )  # fmt: skip
    for got, expected in zip(grads, jax.vjp(ref, q, k, v)[1](dout)):
        close(got.transpose(0, 2, 1, 3)[:, :SEQ], expected, 1e-4)


def test_sharded_window_and_softcap():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    q, k, v, seg = make_inputs(4, 2, jnp.float32, batch=4)
    options = dict(sm_scale=SCALE, window=6, softcap=1.0)

    def sharded(q, k, v):
        return sharded_flash_attention(mesh, "data", "model", q, k, v, seg, impl="xla", **options)

    ref = lambda *a: flash_attention_reference(*a, seg, **options)
    (out, grads), (want, want_grads) = jax.jit(
        lambda *a: (outputs_and_grads(sharded, *a), outputs_and_grads(ref, *a))
    )(q, k, v)
    close(out, want, 2e-5)
    for got, expected in zip(grads, want_grads):
        close(got, expected, 1e-4)


def _needed(band, qi, kj):
    """Brute force: whether tile (qi, kj) holds an entry the causal, windowed mask keeps."""
    rows = range(qi * band.block_q, (qi + 1) * band.block_q)
    cols = range(kj * band.block_kv, (kj + 1) * band.block_kv)
    return any(c <= r and (band.window is None or r - c < band.window) for r in rows for c in cols)


BANDS = [
    TileBand(bq, bk, length, causal=True, window=window)
    for bq, bk, length in [(8, 8, 48), (16, 8, 48), (8, 16, 48), (16, 32, 96), (32, 16, 96)]
    for window in (None, 1, 2, 7, 8, 9, 16, 17, 40, 95, 200)
]


@pytest.mark.parametrize("band", BANDS, ids=str)
def test_band_computes_each_needed_tile_once_and_fetches_nothing_else(band):
    """Each needed tile is computed at exactly one step; a skipped step fetches the tile its
    previous step fetched (no DMA), or the band's first tile (fetched once, then computed)."""
    sides = [
        (band.q_tiles, band.kv_tiles, band.kv_steps(), band.kv_tile, band.kv_run, band.kv_fetch,
         lambda outer, inner: _needed(band, outer, inner)),
        (band.kv_tiles, band.q_tiles, band.q_steps(), band.q_tile, band.q_run, band.q_fetch,
         lambda outer, inner: _needed(band, inner, outer)),
    ]  # fmt: skip
    for outer_tiles, inner_tiles, steps, tile, run, fetch, needed in sides:
        assert steps <= inner_tiles
        for outer in range(outer_tiles):
            computed, fetched = [], []
            for step in range(steps):
                inner = tile(outer, step)
                fetched.append(int(fetch(outer, inner)))
                assert 0 <= fetched[-1] < inner_tiles
                if run(outer, inner):
                    computed.append(inner)
                    assert fetched[-1] == inner
            want = [i for i in range(inner_tiles) if needed(outer, i)]
            assert computed == want, (outer, computed, want)
            # The fetched tile changes only to a tile that is then computed.
            changes = [f for prev, f in zip([None, *fetched], fetched) if f != prev]
            assert set(changes) <= set(want), (outer, fetched, want)


def test_band_steps_grow_with_the_window_not_the_sequence():
    for length in (1024, 8192):
        band = TileBand(128, 128, length, causal=True, window=512)
        assert band.kv_steps() == 5 and band.q_steps() == 5  # 512 / 128 + the diagonal tile
        assert TileBand(128, 256, length, causal=True, window=512).q_steps() == 6
