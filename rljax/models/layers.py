"""The decoder's position-wise pieces: RMSNorm, rotary embeddings (with Llama-3 and linear
scaling, and Gemma 4's proportional partial rotation) and soft-capping."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rljax.config import ModelConfig


def rms_norm(x: jax.Array, weight: jax.Array | None, eps: float, *, unit_offset: bool = False):
    """RMSNorm computed in float32, cast back to the input dtype; ``unit_offset`` scales by
    ``1 + weight`` (Gemma 2/3's form, its weights starting at 0); ``weight=None``: no scale
    (Gemma 4's value norm)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight is None:
        return y.astype(x.dtype)
    scale = weight.astype(jnp.float32)
    return (y * (1.0 + scale if unit_offset else scale)).astype(x.dtype)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(x / cap)`` (Gemma 2's logit soft-capping); ``x`` unchanged when None."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def rope_frequencies(cfg: ModelConfig, *, local: bool = False) -> jax.Array:
    """Inverse frequencies [H/2] of a global layer, with Llama-3 or linear scaling when
    configured, and only the first ``int(partial_rotary_factor * H // 2)`` nonzero (Gemma 4's
    'proportional' RoPE: a zero frequency leaves its pair unrotated); of a local layer
    (``local``), at ``rope_local_base_freq``, unscaled and whole."""
    h = cfg.head_dim
    theta = cfg.rope_theta
    if local and cfg.rope_local_base_freq is not None:
        theta = cfg.rope_local_base_freq
    inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    if local:
        return inv_freq
    # transformers' int(f * H // 2): the pairs rotated, their frequencies still H's.
    rotated = int(cfg.partial_rotary_factor * h // 2)
    inv_freq = jnp.where(jnp.arange(h // 2) < rotated, inv_freq, 0.0)
    if cfg.rope_scaling is None:
        return inv_freq
    s = dict(cfg.rope_scaling)
    if s["rope_type"] == "linear":  # positions divided by the factor (Gemma 3's global layers)
        return inv_freq / s["factor"]
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_len / low, old_len / high
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    smooth = (old_len / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return jnp.where(is_mid, interpolated, scaled)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in the half-split layout Hugging Face checkpoints use."""
    angles = positions_bt[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
    sin = jnp.sin(angles)[..., None, :]
    cos = jnp.cos(angles)[..., None, :]
    x32 = x_bthd.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthd.dtype)
