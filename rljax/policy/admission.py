"""Admission: how many group requests may be in flight, one rule for the runtime and the simulator.

Two gates decide whether the sampler starts another group:

1. the :class:`~rljax.policy.staleness.StalenessController`, AReaL's
   ``min(max_concurrent - running, staleness room)``, built here by :func:`controller` with the
   cap :func:`max_concurrent_groups`;
2. a free slot: :func:`rljax.policy.routing.route` names a replica with a slot that no queued
   sample already claims, or ``None`` (then dispatch stops until a slot frees up).

Because the second gate holds dispatch to the slots, the first counts a group by its last live
sequence: a group with one straggler left holds one slot, not G. A cap of ``slots // G`` groups
would count it as G busy slots and leave the replicas behind long tails idle, so the cap is one
group per slot; it never drops below one batch plus its surplus (``B + k``), so a sampler with
fewer slots than a batch still has a whole batch in flight (its samples wait for slots).
"""

from __future__ import annotations

from rljax.policy.staleness import StalenessController


def max_concurrent_groups(
    *, slots: int, group_size: int, batch_groups: int, overprovision: int = 0
) -> int:
    """Most group requests in flight at once on a sampler with ``slots`` decode slots in all.

    Args:
      slots: decode slots over every sampler replica (the engine's ``max_concurrent_decodes``
        times the replicas).
      group_size: G, samples per group; one replica's slots must hold a whole group, so
        ``slots >= G``.
      batch_groups: B, groups per learner step.
      overprovision: k, extra reservations per batch (redundant rollout).
    """
    if min(group_size, batch_groups) < 1 or overprovision < 0:
        raise ValueError(
            f"need group_size >= 1, batch_groups >= 1 and overprovision >= 0, got {group_size}, "
            f"{batch_groups}, {overprovision}"
        )
    if slots < group_size:
        raise ValueError(
            f"the sampler has {slots} decode slots, fewer than group_size={group_size}: a "
            "group shares one prefill, so raise max_concurrent_decodes (or tp) to hold a group"
        )
    return max(batch_groups + overprovision, slots)


def controller(
    *, slots: int, group_size: int, batch_groups: int, max_staleness: int, overprovision: int = 0
) -> StalenessController:
    """The admission controller for a sampler of ``slots`` decode slots (see the module doc)."""
    return StalenessController(
        max_staleness=max_staleness,
        batch_groups=batch_groups,
        max_concurrent=max_concurrent_groups(
            slots=slots,
            group_size=group_size,
            batch_groups=batch_groups,
            overprovision=overprovision,
        ),
        overprovision=overprovision,
    )
