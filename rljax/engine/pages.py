"""Host-side bookkeeping of the paged KV cache: which pages each decode slot holds.

Host-only (numpy): the engine asks :class:`SlotPages` which pages to write before each device
call, then ships the page table to the device. Nothing here touches jax.

The pool is split into ``kv_shards`` equal shards of ``pages_per_shard`` pages, one per device
group of the sampler's 'batch' axes. Slot ``b`` belongs to shard ``b // slots_per_shard`` and
holds pages of that shard only; page tables hold shard-local ids. Page 0 of every shard is its
null page, never handed out: free slots point at it and their discarded writes land there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class OutOfPages(RuntimeError):
    """The page pool cannot grow these slots; the caller should preempt a request."""

    def __init__(self, slots: list[int]):
        super().__init__(f"KV page pool exhausted while growing slots {slots}")
        self.slots = slots


class PageAllocator:
    """Free list of one shard's KV pages. Page 0 is reserved as the null page."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"num_pages={num_pages}: need at least 2 (page 0 is reserved)")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))
        self._out = np.zeros(num_pages, bool)  # handed out and not yet released

    @property
    def free_count(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """``n`` pages, lowest ids first; raises OutOfPages, taking none, when short."""
        if n > len(self._free):
            raise OutOfPages([])
        pages = [self._free.pop() for _ in range(n)]
        self._out[pages] = True
        return pages

    def release(self, pages: Sequence[int]) -> None:
        """Take ``pages`` back; a page that is not out (null, free, foreign) is refused."""
        pages = [int(p) for p in pages]
        ok = all(0 < p < self.num_pages for p in pages) and len(set(pages)) == len(pages)
        if not (ok and self._out[pages].all()):
            raise ValueError(f"pages {pages} were not all handed out by this allocator")
        self._out[pages] = False
        self._free.extend(reversed(pages))


class SlotPages:
    """The page table of every slot, its cached length, and the per-shard allocators.

    ``positions[b]`` counts the tokens cached for slot b, which is also where the next token
    it feeds is written. A slot holds at most ``max_seq_len`` tokens. A ``paused`` slot (a
    conversation waiting for its env) keeps its pages and length but does not decode.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        kv_shards: int,
        pages_per_shard: int,
        page_size: int,
        max_seq_len: int,
    ):
        if kv_shards < 1 or num_slots % kv_shards:
            raise ValueError(f"kv_shards={kv_shards} must divide the {num_slots} slots")
        self.num_slots = num_slots
        self.kv_shards = kv_shards
        self.slots_per_shard = num_slots // kv_shards
        self.pages_per_shard = pages_per_shard
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        self.pages_per_slot = -(-max_seq_len // page_size)
        self.table = np.zeros((num_slots, self.pages_per_slot), np.int32)
        self.positions = np.zeros(num_slots, np.int64)
        self.active = np.zeros(num_slots, bool)
        self.paused = np.zeros(num_slots, bool)
        self.reset()

    def reset(self) -> None:
        """Every slot free, every page back in its shard's pool."""
        self.allocators = [PageAllocator(self.pages_per_shard) for _ in range(self.kv_shards)]
        self._held: list[list[int]] = [[] for _ in range(self.num_slots)]
        self.table[:] = 0
        self.positions[:] = 0
        self.active[:] = False
        self.paused[:] = False

    def shard_of(self, slot: int) -> int:
        """The kv shard whose pages ``slot`` uses."""
        return int(slot) // self.slots_per_shard

    @property
    def free_pages(self) -> int:
        """Pages not held by any slot, over all shards (each shard's null page excluded)."""
        return sum(a.free_count for a in self.allocators)

    def held(self, slot: int) -> list[int]:
        """The shard-local pages ``slot`` holds, in sequence order."""
        return list(self._held[slot])

    def admit(self, slots: Sequence[int], length: int) -> np.ndarray:
        """Arm ``slots`` with ``length`` cached tokens and room for the next one.

        Returns their page-table rows [len(slots), pages_per_slot]. Raises OutOfPages, taking
        nothing, when a shard cannot hold all of them.
        """
        slots = [int(s) for s in slots]
        for slot in slots:
            if not 0 <= slot < self.num_slots:
                raise ValueError(
                    f"slot {slot} is out of range [0, {self.num_slots}); use a slot index "
                    "below max_concurrent_decodes"
                )
            if self.active[slot]:
                raise ValueError(
                    f"slot {slot} is busy; free_resource({slot}) before inserting into it"
                )
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots {slots} repeat a slot; give each sample its own")
        if not 0 <= length < self.max_seq_len:
            raise ValueError(
                f"a prefix of {length} cached tokens leaves no room in a slot of "
                f"max_seq_len={self.max_seq_len}; shorten the sequence"
            )
        per_slot = length // self.page_size + 1
        wanted = np.bincount([self.shard_of(s) for s in slots], minlength=self.kv_shards)
        if any(n * per_slot > a.free_count for n, a in zip(wanted, self.allocators, strict=True)):
            raise OutOfPages(slots)
        for slot in slots:
            self._held[slot] = self.allocators[self.shard_of(slot)].allocate(per_slot)
            self.table[slot] = 0
            self.table[slot, :per_slot] = self._held[slot]
            self.positions[slot] = length
            self.active[slot] = True
        return self.table[slots]

    def live(self) -> np.ndarray:
        """Active, unpaused slots with room for one more token; a full slot stays put until
        released."""
        return self.decoding() & (self.positions < self.max_seq_len)

    def decoding(self) -> np.ndarray:
        """The slots the device decodes: active and not paused (the device's ``active``)."""
        return self.active & ~self.paused

    def extend(self, slot: int, n: int) -> np.ndarray:
        """Grow an active ``slot`` by ``n`` cached tokens and room for the next one; unpauses it.

        Returns its page-table row. Raises OutOfPages, taking nothing, when its shard is short,
        and ValueError when the slot is free or would leave no room for a token.
        """
        slot = int(slot)
        if not self.active[slot]:
            raise ValueError(f"slot {slot} is free: insert a prefix before extending it")
        length = int(self.positions[slot]) + n
        if not 0 <= length < self.max_seq_len:
            raise ValueError(
                f"extending slot {slot} to {length} tokens leaves no room in a slot of "
                f"max_seq_len={self.max_seq_len}; end the conversation or raise the budget"
            )
        held = self._held[slot]
        more = length // self.page_size + 1 - len(held)
        if more > 0:
            held.extend(self.allocators[self.shard_of(slot)].allocate(more))
            self.table[slot, : len(held)] = held
        self.positions[slot] = length
        self.paused[slot] = False
        return self.table[slot]

    def grow(self, ahead: np.ndarray | None = None) -> bool:
        """Give every live slot the pages its next tokens are written to.

        ``ahead[b]`` (default 1 for every slot) counts the tokens slot b may write in the next
        device call, capped at the room it has left; a multi-step decode asks for the whole
        call's pages at once. Returns whether the table changed. Takes nothing and raises
        OutOfPages (naming the slots) when a shard cannot serve every slot.
        """
        live = np.flatnonzero(self.live())
        if ahead is None:
            ahead = np.ones(self.num_slots, np.int64)
        last = np.minimum(self.positions + np.maximum(ahead, 1), self.max_seq_len) - 1
        more = {int(s): int(last[s] // self.page_size + 1 - len(self._held[s])) for s in live}
        more = {s: n for s, n in more.items() if n > 0}
        wanted = np.zeros(self.kv_shards, np.int64)
        for s, n in more.items():
            wanted[self.shard_of(s)] += n
        short = [
            s
            for s in more
            if wanted[self.shard_of(s)] > self.allocators[self.shard_of(s)].free_count
        ]
        if short:
            raise OutOfPages(short)
        for s, n in more.items():
            pages = self.allocators[self.shard_of(s)].allocate(n)
            held = self._held[s]
            self.table[s, len(held) : len(held) + n] = pages
            held.extend(pages)
        return bool(more)

    def advance(self, counts: np.ndarray | None = None) -> None:
        """Every live slot cached one more token after a generate, or ``counts[b]`` more after
        a multi-step decode."""
        live = self.live()
        self.positions[live] += 1 if counts is None else np.asarray(counts)[live]

    def release(self, slot: int) -> None:
        """Return ``slot``'s pages to its shard and park it on the null page."""
        self.allocators[self.shard_of(slot)].release(self._held[slot])
        self._held[slot] = []
        self.table[slot] = 0
        self.positions[slot] = 0
        self.active[slot] = False
        self.paused[slot] = False
