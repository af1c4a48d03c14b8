"""Public fused token log-probs and entropy: argument checks, dispatch and custom_vjp."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from rljax.kernels import dispatch, validation
from rljax.kernels.fused_logprobs import block_sizes as block_sizes_lib
from rljax.kernels.fused_logprobs.chunked import logprob_grads_chunked, logprob_stats_chunked
from rljax.kernels.fused_logprobs.kernel import token_logprobs_kernel

_HIDDEN = "[T, D]"
_UNEMBED = "[D, V]"
_TARGETS = "[T]"


def validate(hidden, unembed, targets):
    """Raises ValueError naming the first misshaped argument."""
    t, d = validation.check_array("hidden", hidden, _HIDDEN, 2)
    w_shape = validation.check_array("unembed", unembed, _UNEMBED, 2)
    validation.check_dim("unembed", w_shape, _UNEMBED, 0, d)
    if w_shape[1] == 0:
        raise ValueError(f"unembed must have shape {_UNEMBED} with V >= 1, got {w_shape}.")
    validation.check_floating("hidden", hidden, _HIDDEN)
    validation.check_floating("unembed", unembed, _UNEMBED)
    t_shape = validation.check_array("targets", targets, _TARGETS, 1)
    validation.check_dim("targets", t_shape, _TARGETS, 0, t)
    validation.check_integer("targets", targets, _TARGETS)


def check_softcap(softcap) -> float | None:
    """``softcap`` as a float, or None; raises a one-line ValueError unless finite and > 0."""
    message = f"softcap={softcap!r} must be a finite number > 0 (Gemma 2 uses 30.0), or None"
    message += " for no cap"
    return dispatch.resolve_softcap(softcap, message)


def forward_stats(
    hidden, unembed, targets, temperature, softcap, block_sizes, use_pallas, interpret
):
    """(logprobs, entropy, lse) [T] f32 from the Pallas kernel or the chunked jnp forward."""
    if not use_pallas:
        return logprob_stats_chunked(
            hidden,
            unembed,
            targets,
            temperature=temperature,
            softcap=softcap,
            block_v=block_sizes.block_v,
        )
    tokens = hidden.shape[0]
    pad = -tokens % block_sizes.block_t
    logp, ent, lse = token_logprobs_kernel(
        jnp.pad(hidden, ((0, pad), (0, 0))),
        unembed,
        jnp.pad(targets.astype(jnp.int32), (0, pad)),
        temperature=temperature,
        block_sizes=block_sizes,
        interpret=interpret,
        softcap=softcap,
    )
    return logp[:tokens], ent[:tokens], lse[:tokens]


@functools.partial(
    jax.custom_vjp,
    nondiff_argnames=("temperature", "softcap", "block_sizes", "use_pallas", "interpret"),
)
def _fused(hidden, unembed, targets, temperature, softcap, block_sizes, use_pallas, interpret):
    logp, ent, _ = forward_stats(
        hidden, unembed, targets, temperature, softcap, block_sizes, use_pallas, interpret
    )
    return logp, ent


def _fused_fwd(hidden, unembed, targets, temperature, softcap, block_sizes, use_pallas, interpret):
    logp, ent, lse = forward_stats(
        hidden, unembed, targets, temperature, softcap, block_sizes, use_pallas, interpret
    )
    return (logp, ent), (hidden, unembed, targets, lse, ent)


def _fused_bwd(temperature, softcap, block_sizes, use_pallas, interpret, residuals, cotangents):
    del use_pallas, interpret  # One chunked backward serves both forwards; see docs/kernels.md.
    hidden, unembed, targets, lse, ent = residuals
    g_logp, g_ent = cotangents
    d_hidden, d_unembed = logprob_grads_chunked(
        hidden,
        unembed,
        targets,
        lse,
        ent,
        g_logp,
        g_ent,
        temperature=temperature,
        softcap=softcap,
        block_v=block_sizes.block_v,
    )
    return d_hidden, d_unembed, None


_fused.defvjp(_fused_fwd, _fused_bwd)


@functools.partial(
    jax.jit,
    static_argnames=("temperature", "softcap", "block_sizes", "use_pallas", "interpret"),
)
def token_logprobs_and_entropy_core(
    hidden, unembed, targets, *, temperature, block_sizes, use_pallas, interpret, softcap=None
):
    """The jitted op with options already resolved by ``resolve_options``."""
    return _fused(
        hidden,
        unembed,
        targets,
        temperature=temperature,
        softcap=softcap,
        block_sizes=block_sizes,
        use_pallas=use_pallas,
        interpret=interpret,
    )


def token_logprobs_and_entropy(
    hidden,
    unembed,
    targets,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    impl: str = "auto",
    block_sizes: block_sizes_lib.BlockSizes | None = None,
):
    """Per-token log p(target) and softmax entropy, without materialising [T, V] logits.

    logits = hidden @ unembed / temperature, accumulated in f32, processed block_v vocabulary
    columns at a time with an online logsumexp, forward and backward alike. With ``softcap``
    c the logits are c * tanh(hidden @ unembed / c) / temperature: capped first, as a sampler
    caps the model's logits (Gemma 2's final_logit_softcapping) before its temperature.

    Args:
      hidden: [T, D] float final hidden states.
      unembed: [D, V] float output projection.
      targets: [T] int32 token ids in [0, V).
      temperature: positive logits divisor (a static Python float).
      softcap: None (no cap), or a static finite c > 0; gradients go through the tanh.
      impl: 'auto' (Pallas on TPU, chunked XLA elsewhere), 'pallas' (interpret mode off TPU)
        or 'xla'.
      block_sizes: override the tuned ``BlockSizes`` for this chip.

    Returns:
      (logprobs [T] f32, entropy [T] f32). Both are differentiable wrt hidden and unembed.

    Raises:
      ValueError: a misshaped argument (named in the message), an unknown ``impl`` or a
        ``softcap`` that is not finite and > 0; raised before anything is traced.
    """
    validate(hidden, unembed, targets)
    options = resolve_options(
        hidden.shape[0], unembed.shape[1], temperature, impl, block_sizes, softcap
    )
    return token_logprobs_and_entropy_core(hidden, unembed, targets, **options)


def resolve_options(tokens, vocab, temperature, impl, block_sizes, softcap=None):
    """Checks and resolves the op's static options into keyword arguments for the jitted core.

    Args:
      tokens, vocab: T and V of the (per-device) problem; blocks are clamped to them.
      temperature, impl, block_sizes, softcap: as in ``token_logprobs_and_entropy``.

    Returns:
      dict with temperature, softcap, block_sizes, use_pallas and interpret.
    """
    backend = dispatch.resolve_impl(impl)
    validation.check_positive_scalar("temperature", temperature)
    softcap = check_softcap(softcap)
    block_sizes = dispatch.resolve_block_sizes(
        "fused_logprobs", block_sizes, block_sizes_lib.BlockSizes, block_sizes_lib.for_device
    )
    return dict(
        temperature=float(temperature),
        softcap=softcap,
        block_sizes=block_sizes.for_shape(tokens, vocab),
        use_pallas=backend.use_pallas,
        interpret=backend.interpret,
    )
