"""Public flash attention: argument checks, backend dispatch and the custom_vjp."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from rljax.kernels import dispatch, validation
from rljax.kernels.flash_attention import block_sizes as block_sizes_lib
from rljax.kernels.flash_attention.kernel import flash_attention_fwd_kernel
from rljax.kernels.flash_attention.kernel_bwd import flash_attention_bwd_kernel
from rljax.kernels.flash_attention.xla import blocked_attention

_Q = "[B, T, N, H]"
_KV = "[B, T, K, H]"
_SEG = "[B, T]"


def validate(q, k, v, segment_ids):
    """Raises ValueError naming the first misshaped argument."""
    b, t, n, h = validation.check_array("q", q, _Q, 4)
    k_shape = validation.check_array("k", k, _KV, 4)
    for axis, want in ((0, b), (1, t), (3, h)):
        validation.check_dim("k", k_shape, _KV, axis, want)
    v_shape = validation.check_array("v", v, _KV, 4)
    if v_shape != k_shape:
        raise ValueError(f"v must have shape {_KV} = {k_shape} like k, got {v_shape}.")
    kv_heads = k_shape[2]
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(
            f"q has N={n} heads, which must be a multiple of k's K={kv_heads} kv heads (GQA); "
            f"check k's shape {_KV}."
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        validation.check_floating(name, x, _Q if name == "q" else _KV)
    if segment_ids is not None:
        seg_shape = validation.check_array("segment_ids", segment_ids, _SEG, 2)
        validation.check_dim("segment_ids", seg_shape, _SEG, 0, b)
        validation.check_dim("segment_ids", seg_shape, _SEG, 1, t)
        validation.check_integer("segment_ids", segment_ids, _SEG)


_STATIC = ("causal", "sm_scale", "kv_len", "block_sizes", "interpret", "window", "softcap")


@functools.partial(jax.custom_vjp, nondiff_argnames=_STATIC)
def _flash_pallas(
    q, k, v, segment_ids, causal, sm_scale, kv_len, block_sizes, interpret, window, softcap
):
    return _flash_pallas_fwd(
        q, k, v, segment_ids, causal, sm_scale, kv_len, block_sizes, interpret, window, softcap
    )[0]


def _flash_pallas_fwd(
    q, k, v, segment_ids, causal, sm_scale, kv_len, block_sizes, interpret, window, softcap
):
    out, lse = flash_attention_fwd_kernel(
        q,
        k,
        v,
        segment_ids,
        causal=causal,
        sm_scale=sm_scale,
        kv_len=kv_len,
        block_sizes=block_sizes,
        interpret=interpret,
        window=window,
        softcap=softcap,
    )
    return out, (q, k, v, segment_ids, out, lse)


def _flash_pallas_bwd(
    causal, sm_scale, kv_len, block_sizes, interpret, window, softcap, residuals, dout
):
    q, k, v, segment_ids, out, lse = residuals
    dq, dk, dv = flash_attention_bwd_kernel(
        q,
        k,
        v,
        segment_ids,
        out,
        lse,
        dout,
        causal=causal,
        sm_scale=sm_scale,
        kv_len=kv_len,
        block_sizes=block_sizes,
        interpret=interpret,
        window=window,
        softcap=softcap,
    )
    return dq, dk, dv, None


_flash_pallas.defvjp(_flash_pallas_fwd, _flash_pallas_bwd)


@functools.partial(
    jax.jit,
    static_argnames=(
        "causal", "sm_scale", "use_pallas", "interpret", "block_sizes", "window", "softcap"
    ),
)  # fmt: skip
def flash_attention_core(
    q,
    k,
    v,
    segment_ids,
    *,
    causal,
    sm_scale,
    use_pallas,
    interpret,
    block_sizes,
    window=None,
    softcap=None,
):
    """The jitted op with options already resolved by ``resolve_options``."""
    if not use_pallas:
        return blocked_attention(
            q, k, v, segment_ids, causal=causal, sm_scale=sm_scale, block_q=block_sizes.block_q,
            window=window, softcap=softcap,
        )  # fmt: skip
    t = q.shape[1]
    sizes = block_sizes.for_seq_len(t)
    tp = sizes.padded_len(t)

    def to_kernel_layout(x):  # [B, T, heads, H] -> [B, heads, Tp, H]
        return jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    seg = None
    if segment_ids is not None:
        seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, tp - t)))
    out = _flash_pallas(
        to_kernel_layout(q),
        to_kernel_layout(k),
        to_kernel_layout(v),
        seg,
        causal=causal,
        sm_scale=sm_scale,
        kv_len=t,
        block_sizes=sizes,
        interpret=interpret,
        window=window,
        softcap=softcap,
    )
    return out.transpose(0, 2, 1, 3)[:, :t]


def flash_attention(
    q,
    k,
    v,
    segment_ids=None,
    *,
    causal: bool = True,
    sm_scale: float | None = None,
    impl: str = "auto",
    block_sizes: block_sizes_lib.BlockSizes | None = None,
    window: int | None = None,
    softcap: float | None = None,
):
    """Memory-efficient (grouped-query) attention over packed sequences; differentiable.

    Masks and soft-cap follow Hugging Face's Gemma 2/3 eager attention: scores are
    ``softcap * tanh(q.k * sm_scale / softcap)``, then masked (causal, window, segments), then
    softmaxed.

    Args:
      q: [B, T, N, H] float queries.
      k: [B, T, K, H] keys; N % K == 0 and query head n uses kv head n // (N // K).
      v: [B, T, K, H] values.
      segment_ids: [B, T] int32 or None. With ids, a query attends only to keys with the same
        id (packed sequences); every query must share an id with some allowed key, which
        holds whenever causal is on since a query always sees itself.
      causal: additionally require key index <= query index.
      sm_scale: softmax scale; defaults to 1 / sqrt(H).
      impl: 'auto' (Pallas on TPU, XLA elsewhere), 'pallas' (interpret mode off TPU) or 'xla'.
      block_sizes: override the tuned ``BlockSizes`` for this chip.
      window: None (global attention) or W >= 1, with ``causal``: query i also needs
        i - j < W to see key j, the W keys ending at itself (Gemma's ``sliding_window``). Key
        tiles wholly outside the window are skipped, not masked: a local layer's cost grows
        with W, not T. A window of T or more keys is global attention, and runs its program.
      softcap: None or c > 0, the attention-logit soft-cap (Gemma 2's
        ``attn_logit_softcapping``); gradients flow through the tanh.

    Returns:
      [B, T, N, H] in q's dtype. Gradients flow to q, k and v: on the Pallas path through the
      Pallas backward kernels (``kernel_bwd.py``), on the XLA path by autodiff.

    Raises:
      ValueError: a misshaped argument (named in the message), an unknown ``impl``, a window
        that is not an int >= 1 or comes without ``causal``, or a soft-cap that is not finite
        and > 0; raised before anything is traced.
    """
    validate(q, k, v, segment_ids)
    options = resolve_options(q, causal, sm_scale, impl, block_sizes, window, softcap)
    return flash_attention_core(q, k, v, segment_ids, **options)


def resolve_options(q, causal, sm_scale, impl, block_sizes, window=None, softcap=None) -> dict:
    """The op's static options, checked and resolved, as keyword arguments for the core.

    ``window`` and ``softcap`` are left out when None (a window of T or more keys is None), so
    the core runs, and caches, the same program as a call without them.
    """
    backend = dispatch.resolve_impl(impl)
    block_sizes = dispatch.resolve_block_sizes(
        "flash_attention", block_sizes, block_sizes_lib.BlockSizes, block_sizes_lib.for_device
    )
    options = dict(
        causal=bool(causal),
        sm_scale=dispatch.resolve_sm_scale(sm_scale, q.shape[-1]),
        use_pallas=backend.use_pallas,
        interpret=backend.interpret,
        block_sizes=block_sizes,
    )
    resolved = dict(
        window=dispatch.resolve_window(window, q.shape[1]),
        softcap=dispatch.resolve_softcap(softcap),
    )
    if window is not None and not options["causal"]:
        raise ValueError(
            f"window={window!r} needs causal=True (a sliding window looks back from each "
            "query); pass causal=True, or window=None for bidirectional attention."
        )
    options.update((name, value) for name, value in resolved.items() if value is not None)
    return options
