"""``flash_attention`` under shard_map: sequences over batch axes, heads over a model axis.

Attention is independent per sequence and per head, so no collectives are needed. Query and
kv heads are split in contiguous blocks, which keeps each GQA group with its kv head.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P
from rljax.kernels import sharding
from rljax.kernels.flash_attention import ops


def sharded_flash_attention(mesh, batch_axes, head_axis, q, k, v, segment_ids=None, **kwargs):
    """``flash_attention`` under ``shard_map``: B over ``batch_axes``, heads over ``head_axis``.

    Args:
      mesh: the ``jax.sharding.Mesh``.
      batch_axes: mesh axis name (or tuple of names, or None) sharding B.
      head_axis: mesh axis name (or None) sharding N and K; both must divide by its size.
      q, k, v, segment_ids: as in ``flash_attention``.
      **kwargs: ``causal``, ``sm_scale``, ``impl``, ``block_sizes``, ``window``, ``softcap``.

    Returns:
      [B, T, N, H] outputs, sharded like q; differentiable.
    """
    ops.validate(q, k, v, segment_ids)
    sharding.check_axes(mesh, batch_axes=batch_axes, head_axis=head_axis)
    sharding.check_divides("q's B", q.shape[0], mesh, batch_axes, "pad the batch")
    heads = sharding.axis_size(mesh, head_axis)
    if q.shape[2] % heads or k.shape[2] % heads:
        raise ValueError(
            f"q's N={q.shape[2]} and k's K={k.shape[2]} heads must both divide by mesh "
            f"axis {head_axis!r} of size {heads}; pick another head_axis."
        )
    options = ops.resolve_options(
        q,
        kwargs.pop("causal", True),
        kwargs.pop("sm_scale", None),
        kwargs.pop("impl", "auto"),
        kwargs.pop("block_sizes", None),
        kwargs.pop("window", None),
        kwargs.pop("softcap", None),
    )
    if kwargs:
        raise ValueError(f"unexpected keyword arguments {sorted(kwargs)}; see the docstring.")
    spec = P(batch_axes, None, head_axis, None)
    if segment_ids is None:
        fn = lambda q_, k_, v_: ops.flash_attention_core(q_, k_, v_, None, **options)
        return sharding.run_sharded(fn, mesh, (spec, spec, spec), spec, (q, k, v))
    fn = lambda q_, k_, v_, s_: ops.flash_attention_core(q_, k_, v_, s_, **options)
    in_specs = (spec, spec, spec, P(batch_axes, None))
    return sharding.run_sharded(fn, mesh, in_specs, spec, (q, k, v, segment_ids))
