"""``paged_decode_attention`` under shard_map: slots over batch axes, heads over a model axis.

Every device keeps the whole page pool for its kv heads (the pool is sharded over K only), so
a slot's pages may live anywhere in the pool. Query heads are split in contiguous blocks,
which keeps each GQA group with its kv head.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P
from rljax.kernels import sharding
from rljax.kernels.paged_attention import ops


def sharded_paged_decode_attention(
    mesh, batch_axes, head_axis, q, k_pages, v_pages, lengths, page_table, layer=None, **kwargs
):
    """``paged_decode_attention`` under ``shard_map``: slots over ``batch_axes``, heads over
    ``head_axis``.

    Args:
      mesh: the ``jax.sharding.Mesh``.
      batch_axes: mesh axis name (or tuple of names, or None) sharding B.
      head_axis: mesh axis name (or None) sharding N and K; both must divide by its size.
      q, k_pages, v_pages, lengths, page_table, layer: as in ``paged_decode_attention``.
      **kwargs: ``sm_scale``, ``impl``, ``block_sizes``, ``window``, ``softcap``.

    Returns:
      [B, N, H] outputs, sharded like q.
    """
    k_pages, v_pages, layer = ops.layered(k_pages, v_pages, layer)
    ops.validate(q, k_pages, v_pages, lengths, page_table)
    sharding.check_axes(mesh, batch_axes=batch_axes, head_axis=head_axis)
    sharding.check_divides("q's B", q.shape[0], mesh, batch_axes, "pad the batch")
    heads = sharding.axis_size(mesh, head_axis)
    if q.shape[1] % heads or k_pages.shape[1] % heads:
        raise ValueError(
            f"q's N={q.shape[1]} and k_pages' K={k_pages.shape[1]} heads must both divide "
            f"by mesh axis {head_axis!r} of size {heads}; pick another head_axis."
        )
    options = ops.resolve_options(
        q,
        k_pages,
        page_table,
        kwargs.pop("sm_scale", None),
        kwargs.pop("impl", "auto"),
        kwargs.pop("block_sizes", None),
        window=kwargs.pop("window", None),
        softcap=kwargs.pop("softcap", None),
    )
    if kwargs:
        raise ValueError(f"unexpected keyword arguments {sorted(kwargs)}; see the docstring.")
    fn = lambda *args: ops.paged_decode_attention_core(*args, **options)
    pages_spec = P(None, head_axis, None, None, None)
    in_specs = (
        P(batch_axes, head_axis, None),
        pages_spec,
        pages_spec,
        P(batch_axes),
        P(batch_axes, None),
        P(),
    )
    args = (q, k_pages, v_pages, lengths, page_table, layer)
    return sharding.run_sharded(fn, mesh, in_specs, P(batch_axes, head_axis, None), args)
