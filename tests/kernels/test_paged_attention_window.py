"""Paged decode attention with a sliding window and logit soft-capping (Gemma 2/3 decoding).

Every pool here holds numbers only at the positions a slot attends; everything else is NaN,
and the page-table entries of pages wholly before a slot's window (and past its last page)
point at ``NULL_PAGE``, all NaN, as the engine leaves them after giving those pages back. A
path that reads an out-of-window position without masking it, or mis-places the window by
one, returns NaN or a different answer.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from rljax.kernels.paged_attention import (
    BlockSizes,
    ops,
    paged_decode_attention,
    paged_decode_attention_reference,
    sharded_paged_decode_attention,
)
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel
from rljax.kernels.paged_attention.xla import block_walk, paged_decode_attention_xla

PAGE = 8
PAGES_PER_SEQ = 4
POOL = 48
HEAD_DIM = 16
SM_SCALE = 1 / math.sqrt(HEAD_DIM)
NULL_PAGE = 0
# Empty, one token, one short of / on / one past a page boundary, two pages, mid-page, full.
LENGTHS = (0, 1, 7, 8, 9, 16, 29, 32)
# Scores are about N(0, 1): a cap of 0.5 changes every softmax.
SOFTCAP = 0.5
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
fast_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)


def make_inputs(n_heads, kv_heads, dtype, window, *, lengths=LENGTHS, seed=0, free=True):
    """q, k_pages, v_pages, lengths, page_table with numbers only where slots attend.

    ``free``: the entries of pages wholly before the window point at the all-NaN NULL_PAGE
    (the engine freed them); otherwise they keep the slot's own pages, whose out-of-window
    positions are NaN (stale data).
    """
    rng = np.random.default_rng(seed)
    batch = len(lengths)
    q = rng.normal(size=(batch, n_heads, HEAD_DIM))
    k = np.full((kv_heads, POOL, PAGE, HEAD_DIM), np.nan)
    v = np.full((kv_heads, POOL, PAGE, HEAD_DIM), np.nan)
    pages = 1 + rng.permutation(POOL - 1)[: batch * PAGES_PER_SEQ]
    table = pages.reshape(batch, PAGES_PER_SEQ)
    for b, length in enumerate(lengths):
        start = 0 if window is None else max(0, length - window)
        for pos in range(start, length):
            page, off = table[b, pos // PAGE], pos % PAGE
            k[:, page, off] = rng.normal(size=(kv_heads, HEAD_DIM))
            v[:, page, off] = rng.normal(size=(kv_heads, HEAD_DIM))
        if free:
            table[b, : start // PAGE] = NULL_PAGE
        table[b, -(-length // PAGE) :] = NULL_PAGE
    as_dtype = lambda x: jnp.asarray(x, dtype)
    return as_dtype(q), as_dtype(k), as_dtype(v), jnp.asarray(lengths, jnp.int32), table


def layered(q, k, v, lengths, table):
    """The internal paths' arguments: every layer's pools (here a stack of one) and the layer."""
    k, v, layer = ops.layered(k, v, None)
    return q, k, v, lengths, table, layer


@functools.partial(fast_jit, static_argnames=("window", "softcap"))
def dense_reference(q, k, v, lengths, table, *, window, softcap):
    """The reference on a NaN-free copy of the pool (the reference gathers every page)."""
    clean = lambda x: jnp.nan_to_num(x.astype(jnp.float32)).astype(x.dtype)
    return paged_decode_attention_reference(
        q, clean(k), clean(v), lengths, table, sm_scale=SM_SCALE, window=window, softcap=softcap
    )


def assert_close(out, want, dtype):
    out, want = np.asarray(out, np.float32), np.asarray(want, np.float32)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window, softcap", [(1, None), (5, SOFTCAP), (11, None), (None, 2.0)])
def test_reference_matches_naive_numpy(window, softcap):
    """The oracle against an independent float64 loop over slots and heads."""
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, window, seed=1)
    k, v = jnp.nan_to_num(k), jnp.nan_to_num(v)
    out = paged_decode_attention_reference(
        q, k, v, lengths, jnp.asarray(table), sm_scale=SM_SCALE, window=window, softcap=softcap
    )
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    for b, length in enumerate(LENGTHS):
        for n in range(4):
            if length == 0:
                np.testing.assert_array_equal(out[b, n], 0.0)
                continue
            first = 0 if window is None else max(0, length - window)
            pos = np.arange(first, length)
            pages, offs = table[b, pos // PAGE], pos % PAGE
            s = kn[n // 2, pages, offs] @ qn[b, n] * SM_SCALE
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ vn[n // 2, pages, offs]
            np.testing.assert_allclose(out[b, n], want, atol=1e-5, rtol=1e-5)


# Windows of one token, one page, not a page multiple, and two pages and more; GQA 1, 4 and 8.
@pytest.mark.parametrize(
    "window, softcap, n_heads, kv_heads, dtype, pages_per_block",
    [
        (1, None, 4, 2, jnp.float32, 2),
        (PAGE, SOFTCAP, 8, 1, jnp.float32, 2),
        (11, None, 4, 1, jnp.bfloat16, 3),
        (11, SOFTCAP, 2, 2, jnp.float32, 1),
        (2 * PAGE + 3, SOFTCAP, 8, 1, jnp.bfloat16, 4),
    ],
)
def test_pallas_matches_reference(window, softcap, n_heads, kv_heads, dtype, pages_per_block):
    q, k, v, lengths, table = make_inputs(n_heads, kv_heads, dtype, window)
    out = fast_jit(
        lambda *a: paged_decode_attention(
            *a,
            impl="pallas",
            block_sizes=BlockSizes(pages_per_block),
            window=window,
            softcap=softcap,
        )
    )(q, k, v, lengths, table)
    assert out.shape == q.shape and out.dtype == q.dtype
    want = dense_reference(q, k, v, lengths, table, window=window, softcap=softcap)
    assert_close(out, want, dtype)
    np.testing.assert_array_equal(np.asarray(out[0], np.float32), 0.0)  # length 0 -> zeros


@pytest.mark.parametrize("softcap", [None, SOFTCAP])
@pytest.mark.parametrize("pages_per_block", [1, 3])
@pytest.mark.parametrize("window", [1, PAGE, 11, 2 * PAGE + 3])
def test_xla_matches_reference(window, pages_per_block, softcap):
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, window, seed=2)
    out = jax.jit(
        lambda *a: paged_decode_attention_xla(
            *layered(*a),
            sm_scale=SM_SCALE,
            pages_per_block=pages_per_block,
            window=window,
            softcap=softcap,
        )
    )(q, k, v, lengths, table)
    want = dense_reference(q, k, v, lengths, table, window=window, softcap=softcap)
    assert_close(out, want, jnp.float32)


@pytest.mark.parametrize("free", [True, False], ids=["freed_to_null_page", "stale_nan_pages"])
@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_out_of_window_pages_may_hold_nan(impl, free):
    """A short window over long slots: most of each table is out of the window, all NaN."""
    lengths = (32, 29, 25, 17, 9)
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, 3, lengths=lengths, free=free)
    if free:  # the slots of 32 and 29 tokens have 3 freed pages each, that of 25 two.
        assert (table[:3, :2] == NULL_PAGE).all()
    out = fast_jit(
        lambda *a: paged_decode_attention(
            *a, sm_scale=SM_SCALE, impl=impl, window=3, softcap=SOFTCAP
        )
    )(q, k, v, lengths, table)
    assert_close(
        out, dense_reference(q, k, v, lengths, table, window=3, softcap=SOFTCAP), jnp.float32
    )


def test_tpu_interpreter_never_copies_a_page_before_the_window():
    """Under the TPU interpreter an out-of-bounds DMA raises: entries before the window (and
    past the last page) name a page past the pool, so a copy of any of them would fail."""
    window = 11
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, window, seed=3)
    want = dense_reference(q, k, v, lengths, table, window=window, softcap=SOFTCAP)
    table = np.where(table == NULL_PAGE, POOL + 7, table)
    out = fast_jit(
        lambda *a: paged_decode_attention_kernel(
            *layered(*a),
            sm_scale=SM_SCALE,
            block_sizes=BlockSizes(2),
            interpret=pltpu.InterpretParams(),
            window=window,
            softcap=SOFTCAP,
        )
    )(q, k, v, lengths, table)
    assert_close(out, want, jnp.float32)


@pytest.mark.parametrize(
    "window, pages_per_block, first_pages, num_blocks",
    [
        # lengths (0, 1, 7, 8, 9, 16, 29, 32), S = 8.
        (1, 1, [0, 0, 0, 0, 1, 1, 3, 3], 1),
        (PAGE, 1, [0, 0, 0, 0, 0, 1, 2, 3], 2),  # the slot of 29 spans pages 2-3
        (11, 2, [0, 0, 0, 0, 0, 0, 2, 2], 1),
        (11, 1, [0, 0, 0, 0, 0, 0, 2, 2], 2),
        (2 * PAGE + 3, 1, [0, 0, 0, 0, 0, 0, 1, 1], 3),
    ],
)
def test_xla_walk_reads_only_the_window(window, pages_per_block, first_pages, num_blocks):
    """Each slot's walk starts at its first in-window page; the loop runs the most blocks
    any slot's window spans, not the longest slot's length."""
    first, blocks = block_walk(
        jnp.asarray(LENGTHS, jnp.int32),
        page_size=PAGE,
        pages_per_block=pages_per_block,
        window=window,
    )
    np.testing.assert_array_equal(first, first_pages)
    assert int(blocks) == num_blocks


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_window_covering_every_slot_is_global_attention(impl):
    """W >= every length attends everything: the same answer as window=None."""
    lengths = (0, 1, 7, 8, 9, 16, 29)
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, None, lengths=lengths, seed=4)
    run = lambda window: fast_jit(
        lambda *a: paged_decode_attention(*a, sm_scale=SM_SCALE, impl=impl, window=window)
    )(q, k, v, lengths, table)
    np.testing.assert_allclose(run(29), run(None), atol=1e-6, rtol=1e-6)


def test_window_of_the_whole_table_runs_the_global_program():
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, None)
    resolve = lambda window: ops.resolve_options(
        q, k[None], table, None, "xla", None, window=window, softcap=None
    )
    assert resolve(PAGES_PER_SEQ * PAGE) == resolve(10**6) == resolve(None)
    assert resolve(PAGES_PER_SEQ * PAGE - 1)["window"] == PAGES_PER_SEQ * PAGE - 1


def test_softcap_changes_the_answer():
    """Guards the softcap tests: at these score scales, capping must matter."""
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, None, seed=5)
    run = lambda softcap: paged_decode_attention(
        q, k, v, lengths, table, impl="xla", softcap=softcap
    )
    assert float(jnp.max(jnp.abs(run(SOFTCAP) - run(None)))) > 1e-2


def test_sharded_over_batch_and_heads_with_window():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    q, k, v, lengths, table = make_inputs(4, 2, jnp.float32, 11, seed=6)
    out = sharded_paged_decode_attention(
        mesh, "data", "model", q, k, v, lengths, table, impl="xla", window=11, softcap=SOFTCAP
    )
    assert_close(
        out, dense_reference(q, k, v, lengths, table, window=11, softcap=SOFTCAP), jnp.float32
    )


@pytest.mark.parametrize(
    "option, bad, message",
    [
        ("window", 0, r"window must be an int >= 1 .* got 0; pass window=None"),
        ("window", -4, r"window must be an int >= 1 .* got -4;"),
        ("window", 2.5, r"window must be an int >= 1 .* got 2.5;"),
        ("window", True, r"window must be an int >= 1 .* got True;"),
        ("softcap", 0.0, r"softcap must be a finite float > 0 .* got 0.0; pass softcap=None"),
        ("softcap", -30.0, r"softcap must be a finite float > 0 .* got -30.0;"),
        ("softcap", float("inf"), r"softcap must be a finite float > 0 .* got inf;"),
        ("softcap", float("nan"), r"softcap must be a finite float > 0 .* got nan;"),
        ("softcap", "50", r"softcap must be a finite float > 0 .* got '50';"),
    ],
)
def test_bad_window_or_softcap_is_refused_before_tracing(option, bad, message):
    args = make_inputs(4, 2, jnp.float32, None)
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda *a: paged_decode_attention(*a, **{option: bad}))(*args)
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    with pytest.raises(ValueError, match=message):
        sharded_paged_decode_attention(mesh, "data", "model", *args, **{option: bad})
