"""Public paged decode attention: argument checks and backend dispatch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from rljax.kernels import dispatch, validation
from rljax.kernels.paged_attention import block_sizes as block_sizes_lib
from rljax.kernels.paged_attention.kernel import paged_decode_attention_kernel
from rljax.kernels.paged_attention.xla import as_values, paged_decode_attention_xla

_Q = "[B, N, H]"
_PAGES = "[K, P, S, H]"
_LENGTHS = "[B]"
_TABLE = "[B, pages_per_seq]"

# Tokens per block of the XLA path's online softmax: wide enough that the loop's per-block
# overhead is small on a CPU, narrow enough that short sequences read few padded pages.
XLA_BLOCK_TOKENS = 256


def validate(q, k_pages, v_pages, lengths, page_table):
    """Raises ValueError naming the first misshaped argument; the pools are every layer's,
    [L, K, P, S, H] (:func:`layered`), each layer checked as [K, P, S, H]."""
    b, n, h = validation.check_array("q", q, _Q, 3)
    k_pages, v_pages = (jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in (k_pages, v_pages))
    kv_heads, _, _, _ = validation.check_array("k_pages", k_pages, _PAGES, 4)
    k_shape = tuple(k_pages.shape)
    validation.check_dim("k_pages", k_shape, _PAGES, 3, h)
    v_shape = validation.check_array("v_pages", v_pages, _PAGES, 4)
    if v_shape != k_shape:
        raise ValueError(
            f"v_pages must have shape {_PAGES} = {k_shape} like k_pages, got {v_shape}."
        )
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(
            f"q has N={n} heads, which must be a multiple of k_pages' K={kv_heads} kv heads "
            "(GQA); check k_pages' shape [K, P, S, H]."
        )
    validation.check_floating("q", q, _Q)
    lengths_shape = validation.check_array("lengths", lengths, _LENGTHS, 1)
    validation.check_dim("lengths", lengths_shape, _LENGTHS, 0, b)
    validation.check_integer("lengths", lengths, _LENGTHS)
    table_shape = validation.check_array("page_table", page_table, _TABLE, 2)
    validation.check_dim("page_table", table_shape, _TABLE, 0, b)
    if table_shape[1] == 0:
        raise ValueError(f"page_table must have shape {_TABLE} with pages_per_seq >= 1.")
    validation.check_integer("page_table", page_table, _TABLE)


@functools.partial(
    jax.jit,
    static_argnames=("sm_scale", "use_pallas", "interpret", "block_sizes", "window", "softcap"),
)
def paged_decode_attention_core(
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    layer,
    *,
    sm_scale,
    use_pallas,
    interpret,
    block_sizes,
    window=None,
    softcap=None,
):
    """The jitted op with options already resolved by ``resolve_options``; the pools are every
    layer's, [L, K, P, S, H], and ``layer`` an int32 scalar (:func:`layered`)."""
    if use_pallas:
        # A uint16 pool (the CPU engine's storage) is read whole here: interpret mode only.
        k_pages, v_pages = as_values(k_pages), as_values(v_pages)
        return paged_decode_attention_kernel(
            q,
            k_pages,
            v_pages,
            lengths,
            page_table,
            layer,
            sm_scale=sm_scale,
            block_sizes=block_sizes,
            interpret=interpret,
            window=window,
            softcap=softcap,
        )
    return paged_decode_attention_xla(
        q,
        k_pages,
        v_pages,
        lengths,
        page_table,
        layer,
        sm_scale=sm_scale,
        pages_per_block=max(1, XLA_BLOCK_TOKENS // k_pages.shape[3]),
        window=window,
        softcap=softcap,
    )


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    lengths,
    page_table,
    *,
    sm_scale: float | None = None,
    impl: str = "auto",
    block_sizes: block_sizes_lib.BlockSizes | None = None,
    window: int | None = None,
    softcap: float | None = None,
    layer: int | jax.Array | None = None,
):
    """One decode step of (grouped-query) attention over a paged KV cache. Forward only.

    Query head n attends with kv head n // (N // K). Slot b attends to its first
    ``lengths[b]`` cached tokens, stored in pages ``page_table[b, :ceil(lengths[b] / S)]``;
    the rest of its page table is never attended to, so it may hold any in-range index. The
    Pallas kernel reads only each slot's own pages; the XLA path reads, for every slot, the
    table's columns up to the longest slot's last block of ``XLA_BLOCK_TOKENS`` tokens.

    With ``window=W`` (Gemma 2/3's sliding layers) slot b's query, at position
    ``lengths[b] - 1``, attends only positions ``[max(0, lengths[b] - W), lengths[b])``, and
    both paths read only the pages holding them, ``page_table[b, max(0, lengths[b] - W) // S
    : ceil(lengths[b] / S)]``: the entries before those are never read, so the engine may free
    their pages and point the entries anywhere in range (page 0, say).

    Args:
      q: [B, N, H] float queries, one token per slot.
      k_pages: [K, P, S, H] key page pool (K kv heads, P pages, S tokens per page).
      v_pages: [K, P, S, H] value page pool.
      lengths: [B] int32 valid cached tokens per slot. 0 gives a zero output; values above
        pages_per_seq * S are clamped to it.
      page_table: [B, pages_per_seq] int32 page indices into the pool, in [0, P).
      sm_scale: softmax scale; defaults to 1 / sqrt(H).
      impl: 'auto' (Pallas on TPU, XLA elsewhere), 'pallas' (interpret mode off TPU) or 'xla'.
      block_sizes: override the tuned ``BlockSizes`` for this chip.
      window: None (global attention) or an int W >= 1: the keys each query attends, itself
        included, as Hugging Face's Gemma ``sliding_window``.
      softcap: None or a finite c > 0: scores (q.k * sm_scale) become c * tanh(scores / c)
        before the mask, as Gemma 2's ``attn_logit_softcapping``.
      layer: None, or an int (or int32 scalar array) l: ``k_pages`` and ``v_pages`` are then
        every layer's pools, [L, K, P, S, H], and the op reads layer l's pages from them.
        Slicing the layer out first instead (``k_pages[l]``) copies that layer's whole pool
        on every call, a cost that grows with the pool rather than with the pages read.

    A ``uint16`` pool holds bfloat16 bits (the engine stores a bfloat16 cache so on the CPU:
    rljax.models.paged_kv); both paths read it as bfloat16.

    Returns:
      [B, N, H] attention outputs in q's dtype.

    Raises:
      ValueError: a misshaped argument (named in the message), an unknown ``impl``, a window
        below 1 or a softcap that is not a finite positive number; raised before anything is
        traced.
    """
    k_pages, v_pages, layer = layered(k_pages, v_pages, layer)
    validate(q, k_pages, v_pages, lengths, page_table)
    options = resolve_options(
        q, k_pages, page_table, sm_scale, impl, block_sizes, window=window, softcap=softcap
    )
    return paged_decode_attention_core(q, k_pages, v_pages, lengths, page_table, layer, **options)


def layered(k_pages, v_pages, layer):
    """The pools as every layer's [L, K, P, S, H] and the layer read as an int32 scalar: one
    layer's [K, P, S, H] pools (``layer`` None) become a stack of one."""
    if layer is None:
        return k_pages[None], v_pages[None], jnp.zeros((), jnp.int32)
    for name, x in (("k_pages", k_pages), ("v_pages", v_pages)):
        validation.check_array(name, x, "[L, K, P, S, H] (with layer=)", 5)
    return k_pages, v_pages, jnp.asarray(layer, jnp.int32).reshape(())


def resolve_options(
    q, k_pages, page_table, sm_scale, impl, block_sizes, *, window=None, softcap=None
) -> dict:
    """The op's static options, checked and resolved, as keyword arguments for the core
    (``k_pages``: every layer's pool, [L, K, P, S, H]).

    ``window`` and ``softcap`` are left out when None, so that the core runs (and caches) the
    same program as a call without them.
    """
    window = dispatch.resolve_window(window, page_table.shape[1] * k_pages.shape[3])
    softcap = dispatch.resolve_softcap(softcap)
    backend = dispatch.resolve_impl(impl)
    block_sizes = dispatch.resolve_block_sizes(
        "paged_attention", block_sizes, block_sizes_lib.BlockSizes, block_sizes_lib.for_device
    )
    options = dict(
        sm_scale=dispatch.resolve_sm_scale(sm_scale, q.shape[-1]),
        use_pallas=backend.use_pallas,
        interpret=backend.interpret,
        block_sizes=block_sizes.for_pages_per_seq(page_table.shape[1]),
    )
    if window is not None:
        options["window"] = window
    if softcap is not None:
        options["softcap"] = softcap
    return options
