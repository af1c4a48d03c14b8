"""The host page allocator and slot page tables: numpy only, no device."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from rljax.engine.pages import OutOfPages, PageAllocator, SlotPages
from rljax.engine.pools import PagePools, PoolLayout


def test_pages_module_imports_without_jax(monkeypatch):
    """Loaded from its file with jax blocked: the allocator is host-only."""
    monkeypatch.setitem(sys.modules, "jax", None)
    path = pathlib.Path(__file__).parents[2] / "rljax" / "engine" / "pages.py"
    spec = importlib.util.spec_from_file_location("pages_without_jax", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.PageAllocator(4).free_count == 3


def test_allocator_never_hands_out_the_null_page_and_takes_pages_back():
    alloc = PageAllocator(5)
    assert alloc.free_count == 4
    pages = alloc.allocate(4)
    assert sorted(pages) == [1, 2, 3, 4]
    with pytest.raises(OutOfPages):
        alloc.allocate(1)
    alloc.release(pages[:2])
    assert alloc.free_count == 2
    assert sorted(alloc.allocate(2)) == sorted(pages[:2])


@pytest.mark.parametrize("bad", [[0], [3], [1, 1], [9]])
def test_allocator_refuses_pages_it_did_not_hand_out(bad):
    alloc = PageAllocator(5)
    alloc.allocate(2)  # pages 1 and 2
    with pytest.raises(ValueError, match="were not all handed out"):
        alloc.release(bad)
    assert alloc.free_count == 2


def _pages(**kw):
    args = dict(num_slots=4, kv_shards=2, pages_per_shard=5, page_size=4, max_seq_len=12)
    return SlotPages(**{**args, **kw})


def test_admit_grow_release_keep_the_page_count():
    p = _pages()
    assert p.pages_per_slot == 3 and p.free_pages == 8
    rows = p.admit([0, 2], length=5)  # 5 cached + the next token: 2 pages each
    assert rows.shape == (2, 3) and (rows[:, :2] > 0).all() and (rows[:, 2] == 0).all()
    assert [a.free_count for a in p.allocators] == [2, 2]
    assert p.positions[0] == 5 and p.active.tolist() == [True, False, True, False]
    for _ in range(3):  # positions 5, 6, 7 fit in the second page
        assert not p.grow()
        p.advance()
    assert p.grow()  # position 8 opens the third page
    assert [a.free_count for a in p.allocators] == [1, 1]
    assert p.table[0, 2] > 0 and len(p.held(0)) == 3
    p.release(0)
    p.release(2)
    assert p.free_pages == 8 and not p.active.any() and (p.table == 0).all()


def test_a_full_slot_stops_growing_and_advancing_and_takes_no_page():
    p = _pages()
    p.admit([1], length=11)  # 11 cached + the 12th: 3 pages, the slot's whole row
    p.admit([2], length=2)
    p.grow()
    p.advance()
    assert p.positions[1] == 12 and p.live().tolist() == [False, False, True, False]
    free = p.allocators[0].free_count  # slot 1's shard (slot 2 grows from shard 1)
    for _ in range(3):
        p.grow()
        p.advance()
    assert p.positions[1] == 12 and p.positions[2] == 6  # slot 2 went on; slot 1 stayed put
    assert p.allocators[0].free_count == free and len(p.held(1)) == 3
    p.release(1)
    assert p.allocators[0].free_count == free + 3


def test_out_of_pages_names_the_short_slots_and_takes_nothing():
    p = _pages(pages_per_shard=4)  # 3 usable pages per shard
    p.admit([0], length=7)  # 2 pages of shard 0
    p.admit([1], length=3)  # 1 page of shard 0: shard 0 is full
    p.admit([2], length=3)  # 1 page of shard 1
    p.advance()  # slot 0 reaches position 8, slot 1 position 4: both need a page
    with pytest.raises(OutOfPages) as e:
        p.grow()
    assert e.value.slots == [0, 1]
    assert [a.free_count for a in p.allocators] == [0, 2]
    with pytest.raises(OutOfPages):
        p.admit([3], length=8)  # shard 1 has 2 pages; this needs 3
    assert not p.active[3] and p.free_pages == 2


@pytest.mark.parametrize(
    "slots, length, match",
    [
        ([0, 0], 3, "repeat a slot"),
        ([4], 3, r"slot 4 is out of range \[0, 4\)"),
        ([0], 12, "leaves no room in a slot of max_seq_len=12"),
    ],
)
def test_admit_refuses_bad_input_taking_nothing(slots, length, match):
    p = _pages()
    with pytest.raises(ValueError, match=match):
        p.admit(slots, length)
    assert p.free_pages == 8 and not p.active.any()


def test_admit_refuses_a_busy_slot():
    p = _pages()
    p.admit([3], length=2)
    with pytest.raises(ValueError, match=r"slot 3 is busy; free_resource\(3\)"):
        p.admit([3], length=2)


def test_reset_frees_everything():
    p = _pages()
    p.admit([0, 1, 2], length=4)
    p.reset()
    assert p.free_pages == 8 and not p.active.any()
    assert np.all(p.table == 0) and np.all(p.positions == 0)


def _window_columns(p, slot):
    """The table columns ``slot`` holds a page in."""
    return np.flatnonzero(p.table[slot]).tolist()


def test_a_windowed_pool_holds_only_the_pages_the_next_token_attends():
    """Window 8, pages of 4: the token at position q attends [q - 7, q], so a slot whose next
    token goes to p holds columns (p - 7) // 4 to p // 4, no more, no fewer."""
    p = _pages(num_slots=2, kv_shards=1, pages_per_shard=9, max_seq_len=40, window=8)
    p.admit([0], length=13)  # positions [6, 13]: columns 1 to 3; 6 sits in column 1
    assert _window_columns(p, 0) == [1, 2, 3] and p.held_pages == 3
    for pos in range(13, 39):
        p.grow()
        first, last = max(0, pos - 7) // 4, pos // 4
        assert _window_columns(p, 0) == list(range(first, last + 1)), pos
        assert p.free_pages == 8 - (last - first + 1)
        p.advance()
    p.release(0)
    assert p.free_pages == 8 and not p.table.any()


def test_a_windowed_extend_holds_the_chunk_for_its_call_then_only_the_window():
    p = _pages(num_slots=2, kv_shards=1, pages_per_shard=9, max_seq_len=40, window=8)
    p.admit([1], length=10)  # columns 0 to 2 (positions [3, 10])
    p.pause(1)
    row = p.extend(1, 14)  # the chunk at [10, 24): its rows attend [3, 23], the next [17, 24]
    assert np.flatnonzero(row).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert _window_columns(p, 1) == [4, 5, 6] and p.positions[1] == 24 and not p.paused[1]
    assert p.free_pages == 5


def test_page_pools_take_from_every_pool_or_none():
    """A local pool short of pages refuses an admit, extend or grow the global pool could
    serve, and neither pool takes a page."""
    layout = PoolLayout(((1,), (0, 2)), pages_per_shard=(20, 4), window=4)
    pools = PagePools(layout, num_slots=2, kv_shards=1, page_size=4, max_seq_len=40)
    global_, local = pools.pools
    pools.admit([0], 13)  # local: positions [10, 13], columns 2 and 3
    assert (global_.held_pages, local.held_pages) == (4, 2)
    with pytest.raises(OutOfPages):
        pools.admit([1], 8)  # local: positions [5, 8], columns 1 and 2: one page short
    assert (global_.held_pages, local.held_pages) == (4, 2) and not pools.active[1]
    with pytest.raises(OutOfPages):
        pools.extend(0, 10)  # local: columns 2 to 5 for the call, two pages more
    assert (global_.held_pages, local.held_pages) == (4, 2) and pools.positions[0] == 13
    pools.admit([1], 2)  # local: column 0, the last free page
    pools.advance()
    pools.advance()
    pools.advance()  # slot 0 at 16 wants global column 4, local column 4 after giving back 2
    with pytest.raises(OutOfPages) as e:
        pools.grow()  # slot 1 at 5 wants local column 1: one page for two slots
    # Only the local column 2 slot 0's window left went back.
    assert e.value.slots == [0, 1] and (global_.held_pages, local.held_pages) == (5, 2)
    pools.release(1)
    pools.grow()
    assert (global_.held_pages, local.held_pages) == (5, 2)
    assert pools.usage() == {
        "global_pages_held": 5,
        "global_pages_free": 14,
        "local_pages_held": 2,
        "local_pages_free": 1,
    }
