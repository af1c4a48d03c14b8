"""The engine's KV page pools on the host: :class:`PagePools`, and how big each pool is.

Every model has one pool for its global layers, whose slots keep every page their tokens fill.
A model with local layers (sliding-window attention, Gemma 2/3's ``sliding_attention``) has a
second pool for those, a :class:`~rljax.engine.pages.SlotPages` given the window: a slot holds
there only the pages its next tokens attend, and gives back the pages its window has left
(docs/engine.md, "Two page pools"). Both pools have the slots, shards and table width of the
global one; their page tables move in lockstep, and an admit, extend or grow takes pages from
both or, raising OutOfPages, from neither.

:class:`PagePools` is the :class:`~rljax.engine.paged.PagedEngine`'s host state of slots and
pages: it answers what the engine asks of a slot (active, paused, cached length) from the
global pool, and ships both tables to the device state when they changed (:meth:`ship`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from rljax.config import ConfigError, ModelConfig, SamplingConfig
from rljax.engine.pages import OutOfPages, PageAllocator, SlotPages
from rljax.engine.state import DecodeState
from rljax.models.layer_runs import local_layers


@dataclasses.dataclass(frozen=True)
class PoolLayout:
    """Which layers each pool holds and how many pages per kv shard.

    ``layers[i]``: the model's layers whose keys and values pool i holds, in order (row j of
    the pool is layer ``layers[i][j]``); pool 0 holds the global layers (every layer of a model
    without local ones), pool 1, if any, the local layers. ``pages_per_shard[i]``: pool i's
    pages in each kv shard, its null page included. ``window``: the local layers' window.
    """

    layers: tuple[tuple[int, ...], ...]
    pages_per_shard: tuple[int, ...]
    window: int | None = None


def pool_layout(
    model_cfg: ModelConfig, sampling_cfg: SamplingConfig, kv_shards: int, decode_steps: int
) -> PoolLayout:
    """The pools of a model served with ``sampling_cfg`` over ``kv_shards`` shards, whose
    decode calls write up to ``decode_steps`` tokens a slot.

    ``sampling.num_pages`` (0: every slot at full length) sizes the global pool,
    ``sampling.num_local_pages`` the local one. A window no shorter than a slot
    (``sampling.max_seq_len``) would free nothing: the model then has the one pool. The local
    pool's default, per shard: every slot's window and its call's lookahead, plus one slot's
    full length (what one extend, a conversation's next turn, holds during its call), capped
    at every slot at full length.
    """
    b, z = sampling_cfg.max_concurrent_decodes, sampling_cfg.page_size
    per_slot = math.ceil(sampling_cfg.max_seq_len / z)
    per_shard_slots = b // kv_shards
    wanted = sampling_cfg.num_pages or b * per_slot + kv_shards
    global_pages = -(-wanted // kv_shards)  # each shard an equal share, rounded up
    local = local_layers(model_cfg)
    window = model_cfg.sliding_window
    # A window as long as a slot frees nothing: the local layers share the one pool.
    if not local or window is None or window >= sampling_cfg.max_seq_len:
        if sampling_cfg.num_local_pages:
            raise ConfigError(
                f"config key 'sampling.num_local_pages' = {sampling_cfg.num_local_pages} sizes "
                "a local layers' pool this model does not have (no sliding_attention layers, or "
                f"a window of {window} tokens covering a slot's {sampling_cfg.max_seq_len}); "
                "leave it 0"
            )
        return PoolLayout((tuple(range(model_cfg.num_layers)),), (global_pages,))
    window_pages = min(per_slot, window_page_count(window, z, decode_steps))
    full = per_shard_slots * per_slot
    local_pages = min(full, per_shard_slots * window_pages + per_slot) + 1
    if sampling_cfg.num_local_pages:
        local_pages = -(-sampling_cfg.num_local_pages // kv_shards)
        if local_pages < window_pages + 1:
            raise ConfigError(
                f"config key 'sampling.num_local_pages' = {sampling_cfg.num_local_pages} leaves "
                f"each of the {kv_shards} kv shards {local_pages} local pages, fewer than one "
                f"slot's window of {window} tokens takes ({window_pages} pages + the null "
                "page); raise it, or leave it 0 for the default"
            )
    global_layers = tuple(i for i in range(model_cfg.num_layers) if i not in local)
    return PoolLayout((global_layers, local), (global_pages, local_pages), window)


def window_page_count(window: int, page_size: int, ahead: int = 1) -> int:
    """The most pages a local-pool slot holds: those that can cover the ``window`` positions
    its next token attends and the ``ahead - 1`` after it that its decode call also writes
    (n consecutive positions touch at most ceil((n - 1) / page_size) + 1 pages)."""
    span = window + max(ahead, 1) - 1
    return math.ceil((span - 1) / page_size) + 1


class PagePools:
    """The engine's slots and the pages they hold in each pool (see the module docstring).

    ``pools[0]`` is the global layers' :class:`SlotPages`, which also answers for the slots'
    state (``active``, ``paused``, ``positions``); ``pools[1]``, with local layers, theirs.
    """

    def __init__(
        self,
        layout: PoolLayout,
        *,
        num_slots: int,
        kv_shards: int,
        page_size: int,
        max_seq_len: int,
    ):
        self.layout = layout
        windows = (None, layout.window)
        self.pools = tuple(
            SlotPages(
                num_slots=num_slots,
                kv_shards=kv_shards,
                pages_per_shard=pages,
                page_size=page_size,
                max_seq_len=max_seq_len,
                window=windows[i],
            )
            for i, pages in enumerate(layout.pages_per_shard)
        )
        self._dirty = False  # tables or slot mask changed since the device state last saw them

    # -- the slots' state (the global pool's) ------------------------------------------------

    @property
    def main(self) -> SlotPages:
        return self.pools[0]

    @property
    def active(self) -> np.ndarray:
        return self.main.active

    @property
    def paused(self) -> np.ndarray:
        return self.main.paused

    @property
    def positions(self) -> np.ndarray:
        return self.main.positions

    @property
    def table(self) -> np.ndarray:
        """The global pool's page table (every layer's, without local layers)."""
        return self.main.table

    @property
    def free_pages(self) -> int:
        """The global pool's free pages (see :meth:`usage` for every pool)."""
        return self.main.free_pages

    @property
    def allocators(self) -> list[PageAllocator]:
        """The global pool's allocators, one per kv shard."""
        return self.main.allocators

    def shard_of(self, slot: int) -> int:
        return self.main.shard_of(slot)

    def live(self) -> np.ndarray:
        return self.main.live()

    def decoding(self) -> np.ndarray:
        return self.main.decoding()

    def held(self, slot: int) -> list[int]:
        """The global pool's pages ``slot`` holds."""
        return self.main.held(slot)

    def usage(self) -> dict[str, int]:
        """The page accounting: pages held and free in each pool (``global_pages_held``,
        ``global_pages_free``, and with local layers ``local_pages_held``,
        ``local_pages_free``); a page is ``page_size`` tokens of every layer of its pool."""
        out = {}
        for name, pool in zip(("global", "local"), self.pools, strict=False):
            out[f"{name}_pages_held"] = pool.held_pages
            out[f"{name}_pages_free"] = pool.free_pages
        return out

    # -- changes, in every pool or none ------------------------------------------------------

    def reset(self) -> None:
        for pool in self.pools:
            pool.reset()
        self._dirty = False

    def admit(self, slots: Sequence[int], length: int) -> tuple[np.ndarray, ...]:
        """Each pool's :meth:`SlotPages.admit` rows; OutOfPages, taking nothing, when a pool
        is short."""
        slots = self.main.check_admit(slots, length)
        if any(pool.admit_short(slots, length) for pool in self.pools):
            raise OutOfPages(slots)
        return tuple(pool.admit(slots, length).copy() for pool in self.pools)

    def extend(self, slot: int, n: int) -> tuple[np.ndarray, ...]:
        """Each pool's :meth:`SlotPages.extend` row for the call [M + 1] int32, in global page
        ids (the chunk's rows index the whole pool, whichever shard owns the slot) and ending
        with the slot's shard's null page; OutOfPages, taking nothing, when a pool is short."""
        slot, _ = self.main.check_extend(slot, n)
        if any(pool.extend_short(slot, n) for pool in self.pools):
            raise OutOfPages([slot])
        self._dirty = True  # the slot decodes again, and a local pool gave pages back
        rows = []
        for pool in self.pools:
            offset = self.shard_of(slot) * pool.pages_per_shard
            rows.append(np.append(pool.extend(slot, n) + offset, offset).astype(np.int32))
        return tuple(rows)

    def grow(self, ahead: np.ndarray | None = None) -> None:
        """Each pool's :meth:`SlotPages.grow`; a pool with a window first gives back the pages
        its slots left behind. OutOfPages, taking nothing, names the slots some pool is short
        of."""
        self._dirty |= any([pool.trim_all() for pool in self.pools])
        short = sorted({s for pool in self.pools for s in pool.grow_short(ahead)})
        if short:
            raise OutOfPages(short)
        self._dirty |= any([pool.grow(ahead) for pool in self.pools])

    def advance(self, counts: np.ndarray | None = None) -> None:
        for pool in self.pools:
            pool.advance(counts)

    def release(self, slot: int) -> None:
        for pool in self.pools:
            pool.release(slot)
        self._dirty = True

    def pause(self, slot: int) -> None:
        if not self.active[slot]:
            raise ValueError(f"slot {slot} is free: only a slot in use can be paused")
        for pool in self.pools:
            pool.pause(slot)
        self._dirty = True

    def ship(self, state: DecodeState) -> DecodeState:
        """``state`` with the host's page tables and slot mask, if they changed since it last
        got them (small host->device copies, no recompile)."""
        if not self._dirty:
            return state
        self._dirty = False
        tables = tuple(
            jax.device_put(pool.table.copy(), table.sharding)
            for pool, (_, _, table) in zip(self.pools, state.pools(), strict=True)
        )
        active = jax.device_put(self.main.decoding(), state.active.sharding)
        return dataclasses.replace(state.with_tables(tables), active=active)
