"""Host-side bookkeeping of the paged KV cache: which pages each decode slot holds.

Host-only (numpy): the engine asks :class:`SlotPages` which pages to write before each device
call, then ships the page table to the device. Nothing here touches jax.

The pool is split into ``kv_shards`` equal shards of ``pages_per_shard`` pages, one per device
group of the sampler's 'batch' axes. Slot ``b`` belongs to shard ``b // slots_per_shard`` and
holds pages of that shard only; page tables hold shard-local ids. Page 0 of every shard is its
null page, never handed out: free slots point at it and their discarded writes land there.

A :class:`SlotPages` given a ``window`` W keeps the pages of a model's local (sliding-window)
layers: the token written at position q attends positions [q - W + 1, q] only, so a slot whose
next token goes to position p needs the pages holding [p - W + 1, p] (and those its next device
call writes). It takes only those, and gives back every page wholly before p - W + 1 as p moves
on; their table entries point at the null page again (``docs/engine.md``, "Two page pools").
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

    ``window`` (None: every page a slot's tokens fill is kept until it is released): a local
    layers' pool, whose slots hold only the pages their next tokens attend (module docstring).
    Slot b then holds table columns ``[first[b], first[b] + len(held(b)))``; the columns before
    ``first[b]`` hold the null page.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        kv_shards: int,
        pages_per_shard: int,
        page_size: int,
        max_seq_len: int,
        window: int | None = None,
    ):
        if window is not None and window < 1:
            raise ValueError(f"window={window}: a sliding window holds at least one token")
        if kv_shards < 1 or num_slots % kv_shards:
            raise ValueError(f"kv_shards={kv_shards} must divide the {num_slots} slots")
        self.num_slots = num_slots
        self.kv_shards = kv_shards
        self.slots_per_shard = num_slots // kv_shards
        self.pages_per_shard = pages_per_shard
        self.page_size = page_size
        self.max_seq_len = max_seq_len
        self.window = window
        self.pages_per_slot = -(-max_seq_len // page_size)
        self.table = np.zeros((num_slots, self.pages_per_slot), np.int32)
        self.positions = np.zeros(num_slots, np.int64)
        self.active = np.zeros(num_slots, bool)
        self.paused = np.zeros(num_slots, bool)
        self.first = np.zeros(num_slots, np.int64)  # the first table column a slot holds
        self.reset()

    def reset(self) -> None:
        """Every slot free, every page back in its shard's pool."""
        self.allocators = [PageAllocator(self.pages_per_shard) for _ in range(self.kv_shards)]
        self._held: list[list[int]] = [[] for _ in range(self.num_slots)]
        self.table[:] = 0
        self.first[:] = 0
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

    @property
    def held_pages(self) -> int:
        """Pages held by all slots together (the page accounting)."""
        return sum(len(h) for h in self._held)

    def first_needed(self, position: int) -> int:
        """The first table column a slot whose next token goes to ``position`` still reads:
        0 without a window, else the page of position ``position - window + 1``."""
        if self.window is None:
            return 0
        return max(0, int(position) - self.window + 1) // self.page_size

    def _end(self, slot: int) -> int:
        """One past the last table column ``slot`` holds."""
        return int(self.first[slot]) + len(self._held[slot])

    def trim(self, slot: int) -> bool:
        """Give back the pages ``slot`` will never read again (those wholly before its window);
        their columns point at the null page. Returns whether any went back."""
        first = self.first_needed(self.positions[slot])
        gone = first - int(self.first[slot])
        if gone <= 0:
            return False
        held = self._held[slot]
        self.allocators[self.shard_of(slot)].release(held[:gone])
        self._held[slot] = held[gone:]
        self.table[slot, self.first[slot] : first] = 0
        self.first[slot] = first
        return True

    def admit(self, slots: Sequence[int], length: int) -> np.ndarray:
        """Arm ``slots`` with ``length`` cached tokens and room for the next one.

        Returns their page-table rows [len(slots), pages_per_slot]. Raises OutOfPages, taking
        nothing, when a shard cannot hold all of them.
        """
        slots = self.check_admit(slots, length)
        if self.admit_short(slots, length):
            raise OutOfPages(slots)
        first = self.first_needed(length)
        per_slot = length // self.page_size + 1 - first
        for slot in slots:
            self._held[slot] = self.allocators[self.shard_of(slot)].allocate(per_slot)
            self.table[slot] = 0
            self.table[slot, first : first + per_slot] = self._held[slot]
            self.first[slot] = first
            self.positions[slot] = length
            self.active[slot] = True
        return self.table[slots]

    def admit_short(self, slots: Sequence[int], length: int) -> bool:
        """Whether some shard cannot hold ``slots`` armed with ``length`` cached tokens."""
        per_slot = length // self.page_size + 1 - self.first_needed(length)
        wanted = np.bincount([self.shard_of(s) for s in slots], minlength=self.kv_shards)
        return any(
            n * per_slot > a.free_count for n, a in zip(wanted, self.allocators, strict=True)
        )

    def check_admit(self, slots: Sequence[int], length: int) -> list[int]:
        """``slots`` as ints; raises ValueError for a bad slot or length (see :meth:`admit`)."""
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
        return slots

    def live(self) -> np.ndarray:
        """Active, unpaused slots with room for one more token; a full slot stays put until
        released."""
        return self.decoding() & (self.positions < self.max_seq_len)

    def decoding(self) -> np.ndarray:
        """The slots the device decodes: active and not paused (the device's ``active``)."""
        return self.active & ~self.paused

    def extend(self, slot: int, n: int) -> np.ndarray:
        """Grow an active ``slot`` by ``n`` cached tokens and room for the next one; unpauses it.

        Returns (a copy of) the page-table row the extend's device call writes through. With a
        window that row holds the pages of the whole chunk and of the window before it, and
        the slot then keeps only its new window's pages (:meth:`trim`): the call, dispatched
        before any later one, still reads the others. Raises OutOfPages, taking nothing, when
        its shard is short, and ValueError when the slot is free or would leave no room for a
        token.
        """
        slot, length = self.check_extend(slot, n)
        if self.extend_short(slot, n):
            raise OutOfPages([slot])
        more, end = length // self.page_size + 1 - self._end(slot), self._end(slot)
        if more > 0:
            pages = self.allocators[self.shard_of(slot)].allocate(more)
            self.table[slot, end : end + more] = pages
            self._held[slot].extend(pages)
        row = self.table[slot].copy()
        self.positions[slot] = length
        self.paused[slot] = False
        self.trim(slot)
        return row

    def extend_short(self, slot: int, n: int) -> bool:
        """Whether ``slot``'s shard cannot hold its extend by ``n`` tokens."""
        more = (int(self.positions[slot]) + n) // self.page_size + 1 - self._end(slot)
        return more > self.allocators[self.shard_of(slot)].free_count

    def check_extend(self, slot: int, n: int) -> tuple[int, int]:
        """``(slot, its length after the extend)``; raises ValueError as :meth:`extend`."""
        slot = int(slot)
        if not self.active[slot]:
            raise ValueError(f"slot {slot} is free: insert a prefix before extending it")
        length = int(self.positions[slot]) + n
        if not 0 <= length < self.max_seq_len:
            raise ValueError(
                f"extending slot {slot} to {length} tokens leaves no room in a slot of "
                f"max_seq_len={self.max_seq_len}; end the conversation or raise the budget"
            )
        return slot, length

    def grow(self, ahead: np.ndarray | None = None) -> bool:
        """Give every live slot the pages its next tokens are written to (with a window, after
        giving back those every active slot left behind: :meth:`trim_all`).

        ``ahead[b]`` (default 1 for every slot) counts the tokens slot b may write in the next
        device call, capped at the room it has left; a multi-step decode asks for the whole
        call's pages at once. Returns whether the table changed. Takes nothing and raises
        OutOfPages (naming the slots) when a shard cannot serve every slot.
        """
        changed = self.trim_all()
        more = self._more(ahead)
        short = self._short(more)
        if short:
            raise OutOfPages(short)
        for s, n in more.items():
            pages = self.allocators[self.shard_of(s)].allocate(n)
            end = self._end(s)
            self.table[s, end : end + n] = pages
            self._held[s].extend(pages)
        return changed or bool(more)

    def grow_short(self, ahead: np.ndarray | None = None) -> list[int]:
        """The live slots :meth:`grow` would name in OutOfPages now (none: it fits)."""
        return self._short(self._more(ahead))

    def trim_all(self) -> bool:
        """:meth:`trim` every active slot, paused ones too; whether any page went back."""
        return any([self.trim(int(s)) for s in np.flatnonzero(self.active)])

    def _more(self, ahead: np.ndarray | None) -> dict[int, int]:
        """The pages each live slot lacks for its next ``ahead`` tokens (slots lacking none
        left out)."""
        if ahead is None:
            ahead = np.ones(self.num_slots, np.int64)
        last = np.minimum(self.positions + np.maximum(ahead, 1), self.max_seq_len) - 1
        live = [int(s) for s in np.flatnonzero(self.live())]
        more = {s: int(last[s] // self.page_size + 1 - self._end(s)) for s in live}
        return {s: n for s, n in more.items() if n > 0}

    def _short(self, more: dict[int, int]) -> list[int]:
        wanted = np.zeros(self.kv_shards, np.int64)
        for s, n in more.items():
            wanted[self.shard_of(s)] += n
        free = [a.free_count for a in self.allocators]
        return [s for s in more if wanted[self.shard_of(s)] > free[self.shard_of(s)]]

    def pause(self, slot: int) -> None:
        """Stop decoding ``slot``; it keeps its pages and length (a conversation waiting)."""
        self.paused[slot] = True

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
        self.first[slot] = 0
        self.positions[slot] = 0
        self.active[slot] = False
        self.paused[slot] = False
