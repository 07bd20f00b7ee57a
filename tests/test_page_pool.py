"""``PagePool``: whole pages out, whole pages back, eviction on demand, and no slot lost or doubled."""

from __future__ import annotations

import pytest
import torch
from helpers import manager_snapshot, pool_snapshot

from minikv import NaiveCacheManager, PagePool, RadixCacheManager
from minikv.errors import ArgumentError, ArgumentTypeError, DoubleFreeError, OutOfSlotsError, SlotIndexError


def test_a_new_pool_is_all_free() -> None:
    pool = PagePool(num_pages=5, page_size=4)
    assert (pool.num_pages, pool.page_size, pool.num_slots) == (5, 4, 20)
    assert (pool.num_free_pages, pool.num_free_slots, pool.num_used_pages) == (5, 20, 0)
    assert pool.free_slots().tolist() == list(range(20))
    assert pool.num_evicted_slots == 0
    assert repr(pool) == "PagePool(num_pages=5, page_size=4, free_pages=5)"


@pytest.mark.parametrize(("tokens", "pages"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_pages_for_rounds_up(tokens: int, pages: int) -> None:
    assert PagePool(4, page_size=4).pages_for(tokens) == pages


def test_allocate_hands_out_the_lowest_pages_first_one_slot_per_token() -> None:
    pool = PagePool(num_pages=4)
    first = pool.allocate(3)
    assert first.tolist() == [0, 1, 2] and first.dtype == torch.int32
    assert pool.allocate(1).tolist() == [3]
    assert pool.num_free_pages == 0
    assert pool.allocate(0).numel() == 0


def test_a_paged_allocation_covers_whole_pages_but_returns_one_slot_per_token() -> None:
    pool = PagePool(num_pages=4, page_size=4)
    slots = pool.allocate(6)
    assert slots.tolist() == [0, 1, 2, 3, 4, 5]  # page 1's slots 6 and 7 are reserved, not returned
    assert pool.num_free_pages == 2 and pool.num_used_pages == 2
    assert pool.free_slots().tolist() == list(range(8, 16))


def test_freed_pages_are_handed_out_again_most_recent_first() -> None:
    pool = PagePool(num_pages=6)
    pool.allocate(4)
    pool.free([1])
    pool.free(torch.tensor([3], dtype=torch.int64))
    assert pool.free_slots().tolist() == [1, 3, 4, 5]  # always ascending
    assert pool.allocate(3).tolist() == [3, 1, 4]


def test_free_takes_whole_pages_and_a_cut_short_last_page() -> None:
    pool = PagePool(num_pages=4, page_size=4)
    slots = pool.allocate(10)  # pages 0, 1 and 2 (half used)
    pool.free(slots[4:])  # page 1, then page 2 cut short
    assert pool.num_free_pages == 3
    assert pool.free_slots().tolist() == list(range(4, 16))


def test_free_of_nothing_is_a_no_op() -> None:
    pool = PagePool(num_pages=2)
    pool.allocate(1)
    before = pool_snapshot(pool)
    pool.free(torch.empty(0, dtype=torch.int32))
    pool.free([])
    assert pool_snapshot(pool) == before


def test_allocation_evicts_just_enough_from_the_manager() -> None:
    pool = PagePool(num_pages=4)
    manager = RadixCacheManager()
    slots = pool.allocate(4)
    manager.insert_prefix([1, 2], slots[:2])
    manager.insert_prefix([3, 4], slots[2:])
    more = pool.allocate(2, evict_from=manager)
    assert more.tolist() == [0, 1]  # the least recently used prefix [1, 2] was evicted
    assert pool.num_evicted_slots == 2
    assert manager.match_prefix([1, 2])[0].cached_len == 0
    assert manager.match_prefix([3, 4])[0].cached_len == 2
    manager.check_integrity()


def test_allocation_evicts_nothing_when_free_pages_suffice() -> None:
    pool, manager = PagePool(num_pages=4), RadixCacheManager()
    manager.insert_prefix([1], pool.allocate(1))
    pool.allocate(2, evict_from=manager)
    assert pool.num_evicted_slots == 0 and manager.size_info.evictable_size == 1


def test_paged_allocation_evicts_whole_pages() -> None:
    pool, manager = PagePool(num_pages=3, page_size=2), RadixCacheManager(page_size=2)
    manager.insert_prefix([1, 2, 3, 4], pool.allocate(4))
    manager.insert_prefix([5, 6], pool.allocate(2))
    slots = pool.allocate(3, evict_from=manager)  # needs 2 pages: evicts the 4-slot node
    assert sorted(slots.tolist()) == [0, 1, 2]
    assert pool.num_evicted_slots == 4 and pool.num_free_pages == 0
    manager.check_integrity()


def test_out_of_slots_changes_neither_pool_nor_manager() -> None:
    pool, manager = PagePool(num_pages=4), RadixCacheManager()
    manager.insert_prefix([1, 2], pool.allocate(2))
    handle, _ = manager.match_prefix([1])
    manager.lock_handle(handle)  # one of the two cached slots is protected
    pool_before, manager_before = pool_snapshot(pool), manager_snapshot(manager)
    with pytest.raises(OutOfSlotsError, match="num_tokens"):
        pool.allocate(4, evict_from=manager)  # 2 free + 1 evictable < 4
    assert pool_snapshot(pool) == pool_before and manager_snapshot(manager) == manager_before
    with pytest.raises(OutOfSlotsError, match="num_tokens"):
        pool.allocate(3)  # no manager to evict from
    assert pool_snapshot(pool) == pool_before


def test_the_out_of_slots_message_counts_everything_in_slots() -> None:
    pool, manager = PagePool(num_pages=4, page_size=4), RadixCacheManager(page_size=4)
    manager.insert_prefix(list(range(4)), pool.allocate(4))  # one page cached, evictable
    pool.allocate(4)  # another page held by a request
    assert pool.allocate(10, evict_from=manager).numel() == 10  # 8 free slots + 4 evicted: exactly enough
    with pytest.raises(OutOfSlotsError, match="1 tokens need 4 slots in pages of 4; 0 slots are free and 0 are"):
        pool.allocate(1, evict_from=manager)


def test_a_naive_manager_has_nothing_to_evict() -> None:
    pool = PagePool(num_pages=2)
    pool.allocate(2)
    with pytest.raises(OutOfSlotsError):
        pool.allocate(1, evict_from=NaiveCacheManager())


def test_manager_page_size_must_match_the_pool() -> None:
    pool = PagePool(num_pages=2, page_size=2)
    before = pool_snapshot(pool)
    with pytest.raises(ArgumentError, match="evict_from"):
        pool.allocate(1, evict_from=RadixCacheManager(page_size=1))
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize(
    ("slots", "error", "match"),
    [
        ([0], DoubleFreeError, "already free"),  # page 0 was never allocated
        ([1, 1], DoubleFreeError, "twice"),
        ([2, 1, 2], DoubleFreeError, "twice"),
        ([4], SlotIndexError, "slots"),
        ([-1], SlotIndexError, "slots"),
        (torch.tensor([1.0]), ArgumentTypeError, "slots"),
        (torch.tensor([[1]]), ArgumentError, "slots"),
        ("1", ArgumentTypeError, "slots"),
    ],
)
def test_bad_frees_are_refused_and_free_nothing(slots: object, error: type, match: str) -> None:
    pool = PagePool(num_pages=4)
    pool.allocate(4)
    pool.free([0])
    before = pool_snapshot(pool)
    with pytest.raises(error, match=match):
        pool.free(slots)  # type: ignore[arg-type]
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize(
    "slots",
    [[1, 2, 3, 4], [4, 5, 6, 8], [4, 6, 5, 7], [4, 5, 6, 7, 9]],
    ids=["misaligned", "gap", "out-of-order", "second-page-cut-wrong"],
)
def test_paged_free_refuses_anything_but_whole_pages(slots: list[int]) -> None:
    pool = PagePool(num_pages=4, page_size=4)
    pool.allocate(16)
    before = pool_snapshot(pool)
    with pytest.raises(ArgumentError, match="slots"):
        pool.free(slots)
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize("slots", [[1.7], [True]])
def test_free_refuses_a_list_of_non_ints(slots: list[object]) -> None:
    pool = PagePool(num_pages=4)
    pool.allocate(4)
    before = pool_snapshot(pool)
    with pytest.raises(ArgumentTypeError, match="slots"):
        pool.free(slots)  # type: ignore[arg-type]
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize(
    ("kwargs", "name"), [({"num_pages": 0}, "num_pages"), ({"num_pages": 2, "page_size": 0}, "page_size")]
)
def test_sizes_must_be_positive(kwargs: dict[str, int], name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        PagePool(**kwargs)


@pytest.mark.parametrize("num_tokens", [-1, 1.5, True])
def test_allocate_refuses_a_bad_count(num_tokens: object) -> None:
    pool = PagePool(num_pages=2)
    before = pool_snapshot(pool)
    with pytest.raises((ArgumentError, ArgumentTypeError), match="num_tokens"):
        pool.allocate(num_tokens)  # type: ignore[arg-type]
    assert pool_snapshot(pool) == before


def test_allocation_order_is_the_order_allocate_hands_pages_out() -> None:
    pool = PagePool(num_pages=5, page_size=2)
    assert pool.allocation_order() == [0, 1, 2, 3, 4]
    pool.allocate(6)
    pool.free([2, 3])
    assert pool.allocation_order() == [1, 3, 4]
    assert pool.allocate(4).tolist() == [2, 3, 6, 7]
    assert pool.allocation_order() == [4]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_free_takes_every_integer_dtype_the_managers_take(dtype: torch.dtype) -> None:
    pool = PagePool(num_pages=4)
    pool.allocate(4)
    pool.free(torch.tensor([2, 0], dtype=dtype))
    assert pool.free_slots().tolist() == [0, 2]


@pytest.mark.parametrize("slots", [[2**63], [2**64 + 1], [-(2**63) - 1], torch.tensor([2**62])])
def test_free_refuses_a_slot_too_big_for_any_integer_type_with_a_minikv_error(slots: object) -> None:
    pool = PagePool(num_pages=4)
    pool.allocate(4)
    before = pool_snapshot(pool)
    with pytest.raises(SlotIndexError, match="slots"):
        pool.free(slots)  # type: ignore[arg-type]
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize("evict_from", [3, "manager", object()])
def test_allocate_refuses_something_that_is_not_a_manager(evict_from: object) -> None:
    pool = PagePool(num_pages=2)
    pool.allocate(2)
    before = pool_snapshot(pool)
    with pytest.raises(ArgumentTypeError, match="evict_from"):
        pool.allocate(1, evict_from=evict_from)  # type: ignore[arg-type]
    assert pool_snapshot(pool) == before


@pytest.mark.parametrize(
    ("foreign_slots", "match"), [([7, 100], "outside"), ([5, 6], "free in this pool")], ids=["outside", "free"]
)
def test_allocate_refuses_to_evict_from_a_manager_holding_slots_this_pool_did_not_hand_out(
    foreign_slots: list[int], match: str
) -> None:
    pool, manager = PagePool(num_pages=8), RadixCacheManager()
    manager.insert_prefix([1, 2], pool.allocate(2))
    pool.allocate(4)  # held by running requests: 2 pages left free, slots 6 and 7
    manager.insert_prefix([3, 4], foreign_slots)  # slots the pool never handed out (or has free)
    before = (pool_snapshot(pool), manager_snapshot(manager))
    with pytest.raises(ArgumentError, match=f"evict_from.*{match}"):
        pool.allocate(4, evict_from=manager)  # short by 2: would evict
    assert (pool_snapshot(pool), manager_snapshot(manager)) == before


def test_a_paged_pool_refuses_a_manager_holding_a_page_that_is_free_in_it() -> None:
    pool, manager = PagePool(num_pages=4, page_size=2), RadixCacheManager(page_size=2)
    manager.insert_prefix([1, 2], pool.allocate(2))
    pool.allocate(4)  # pages 1 and 2 held by running requests; page 3 (slots 6, 7) free
    manager.insert_prefix([3, 4], [6, 7])
    before = (pool_snapshot(pool), manager_snapshot(manager))
    with pytest.raises(ArgumentError, match="evict_from: the manager holds slot 6, which is free in this pool"):
        pool.allocate(4, evict_from=manager)
    assert (pool_snapshot(pool), manager_snapshot(manager)) == before


def test_the_check_before_evicting_reads_the_managers_record_not_its_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """One comparison whatever the size of the tree: allocate never lists the nodes."""
    pool, manager = PagePool(num_pages=64), RadixCacheManager()
    for first in range(0, 64, 4):
        manager.insert_prefix([first, first + 1, first + 2, first + 3], pool.allocate(4))

    def no_walk() -> None:
        raise AssertionError("allocate walked the tree")

    monkeypatch.setattr(manager, "nodes", no_walk)
    assert len(pool.allocate(8, evict_from=manager)) == 8
    assert pool.num_evicted_slots == 8


def test_a_paged_pool_checks_the_managers_pages_before_evicting() -> None:
    pool, manager = PagePool(num_pages=4, page_size=2), RadixCacheManager(page_size=2)
    manager.insert_prefix([1, 2, 3, 4], pool.allocate(4))
    assert pool.allocate(6, evict_from=manager).tolist() == [0, 1, 2, 3, 4, 5]  # its own pages: evicted
    manager.check_integrity()


def test_free_refuses_a_meta_tensor_with_a_minikv_error() -> None:
    pool = PagePool(num_pages=4)
    pool.allocate(4)
    before = pool_snapshot(pool)
    with pytest.raises(ArgumentError, match="slots is a meta tensor"):
        pool.free(torch.tensor([0, 1], device="meta"))
    assert pool_snapshot(pool) == before
