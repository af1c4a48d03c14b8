"""Routing: which sampler replica takes the next group request.

A group's G samples share one prefill, so a group goes to one replica. The policy picks, among
replicas with a slot that no queued sample already claims, one that is decoding now over one
still rebuilding (after a resize or a weight load), then the one with the most such slots, then
the lowest id (so the choice is deterministic, as every process must make the same one).
When no replica has an unclaimed slot it answers ``None``: dispatch waits for a slot to free up
(see :mod:`rljax.policy.admission`). Samples of the group that find no free slot on the chosen
replica wait there for one; the sampler never leaves a slot empty while a group is waiting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class ReplicaLoad(NamedTuple):
    """One replica as routing sees it (a named tuple: the simulator builds one per replica and
    dispatch, so it must be cheap).

    Attributes:
      replica: the replica's id (unique, stable across calls; not ``index``, which would hide
        ``tuple.index``).
      free_slots: decode slots with no live sequence.
      queued: samples routed here that still wait for a slot.
      ready: whether it decodes now (False while it is rebuilt or loads weights).
    """

    replica: int
    free_slots: int
    queued: int = 0
    ready: bool = True

    @property
    def headroom(self) -> int:
        """Free slots not yet promised to queued samples (negative when the queue is longer)."""
        return self.free_slots - self.queued


def route(loads: Iterable[ReplicaLoad]) -> int | None:
    """The id of the replica that takes the next group, or None when none has headroom."""
    best, best_key = None, None
    for load in loads:
        if load.free_slots < 0 or load.queued < 0:
            raise ValueError(
                f"replica {load.replica} reports free_slots={load.free_slots}, queued="
                f"{load.queued}; both count slots or samples and must be >= 0"
            )
        if load.headroom <= 0:
            continue
        key = (load.ready, load.headroom, -load.replica)
        if best_key is None or key > best_key:
            best, best_key = load.replica, key
    return best
