"""Slot homes: which decode slots a request's samples may take.

On a pod the sampler's slots are split over its hosts (the decode state's 'batch' axis, each
kv shard on one host's devices). A request read from host h's shard of the prompt stream has
home h: its samples take only host h's slots, so their KV lives on the host that read the
prompt and scores the responses. A request with no home (``None``), or a sampler whose slots
have no homes (one host, or slots replicated over hosts), takes any free slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import jax
from jax.sharding import NamedSharding

from rljax.engine.paged import PagedEngine


class SlotHomes:
    """``of_slot[s]``: the home of slot ``s``; ``None``: every slot is everyone's."""

    def __init__(self, of_slot: Sequence[int] | None = None, num_slots: int | None = None):
        self.of_slot = None if of_slot is None else tuple(int(h) for h in of_slot)
        if self.of_slot is not None and num_slots is not None and len(self.of_slot) != num_slots:
            raise ValueError(
                f"slot_homes names {len(self.of_slot)} slots but the engine has {num_slots}; "
                "give one home per decode slot"
            )
        self.homes = frozenset(self.of_slot or ())

    def check(self, home: int | None) -> None:
        if home is not None and self.of_slot is not None and home not in self.homes:
            raise ValueError(
                f"a request's home {home} owns no slot (the sampler's homes are "
                f"{sorted(self.homes)}); give one of those, or None for any slot"
            )

    def key(self, home: int | None) -> int | None:
        """The home whose slots ``home``'s samples take (None: any slot)."""
        return None if self.of_slot is None else home

    def usable(self, home: int | None, free: Sequence[int]) -> list[int]:
        """The slots of ``free`` that samples of ``home`` may take, in slot order."""
        of_slot = self.of_slot
        if of_slot is None or home is None:
            return list(free)
        return [s for s in free if of_slot[s] == home]

    def rooms(self, free: Sequence[int]) -> dict[int | None, int]:
        """How many of ``free`` each home may take (key None: any slot)."""
        out: dict[int | None, int] = {None: len(free)}
        if self.of_slot is not None:
            for s in free:
                out[self.of_slot[s]] = out.get(self.of_slot[s], 0) + 1
        return out


def process_homes(
    engine: PagedEngine,
    processes: Sequence[int],
    process_of: Callable[[jax.Device], int] = lambda d: d.process_index,
) -> list[int] | None:
    """Each slot's home on a multi-process sampler mesh: the index in ``processes`` of the one
    process whose devices hold the slot's rows of the decode state, or None when some slot is
    held by several processes (replicated slots have no home)."""
    # A DecodeState of shardings: its page_table leaf is the table's NamedSharding.
    table = cast(NamedSharding, engine.decode_state_shardings().page_table)
    shape = (engine.max_concurrent_decodes, engine.pages_per_slot)
    holders: list[set[int]] = [set() for _ in range(shape[0])]
    for device, index in table.devices_indices_map(shape).items():
        for slot in range(shape[0])[index[0]]:
            holders[slot].add(process_of(device))
    if any(len(h) != 1 for h in holders):
        return None
    order = {p: i for i, p in enumerate(processes)}
    return [order[h.pop()] for h in holders]
