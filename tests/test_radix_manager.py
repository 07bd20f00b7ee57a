"""Unit tests of ``minikv.radix_manager``: the node, the handle and every manager method.

Each test builds a small tree by hand and checks one behaviour the chapter
relies on: what a match returns and when it splits, how locks nest, which
leaf goes first on eviction, what ``page_size > 1`` changes. ``check_integrity``
runs after every scenario, so a test also fails if it leaves a broken tree.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE, manager_snapshot, nodes_with_prefix, tree_entries, tree_slots
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv import RadixCacheHandle, RadixCacheManager, RadixTreeNode, SizeInfo
from minikv.errors import ArgumentError, EvictionError, LockError, StaleHandleError
from minikv.radix_manager import child_key, match_len


def keys_by_depth(manager: RadixCacheManager) -> dict[tuple[int, ...], tuple[int, ...]]:
    """{path prefix + node key: node value}: the tree's shape at a glance."""
    return {
        prefix + tuple(node.key.tolist()): tuple(node.value.tolist()) for prefix, node in nodes_with_prefix(manager)
    }


def node_at(manager: RadixCacheManager, full_key: tuple[int, ...]) -> RadixTreeNode:
    for prefix, node in nodes_with_prefix(manager):
        if prefix + tuple(node.key.tolist()) == full_key:
            return node
    raise KeyError(full_key)


# -- module helpers -----------------------------------------------------------


def test_match_len_counts_the_common_prefix() -> None:
    a = np.array([1, 2, 3, 4])
    assert match_len(a, np.array([1, 2, 3, 4, 5])) == 4
    assert match_len(a, np.array([1, 2, 9])) == 2
    assert match_len(a, np.array([7])) == 0
    assert match_len(a, np.array([], dtype=np.int64)) == 0
    assert match_len(np.array([], dtype=np.int64), a) == 0


def test_child_key_is_the_first_token_or_the_first_page() -> None:
    key = np.array([5, 6, 7, 8, 9])
    assert child_key(key, 1) == 5 and isinstance(child_key(key, 1), int)
    assert child_key(key, 4) == (5, 6, 7, 8)
    # With an offset: the key of key[start:], without slicing it first.
    assert child_key(key, 1, 3) == 8 and child_key(key, 2, 2) == (7, 8)


# -- RadixTreeNode ------------------------------------------------------------


def make_node(key: list[int], value: list[int]) -> RadixTreeNode:
    node = RadixTreeNode()
    node.set_key_value(torch.tensor(key, dtype=torch.int64), torch.tensor(value, dtype=torch.int32))
    return node


def test_a_fresh_node_is_an_empty_parentless_leaf() -> None:
    node = RadixTreeNode(timestamp=7)
    assert node.is_root() and node.is_leaf()
    assert node.length == 0 and node.ref_count == 0 and node.timestamp == 7
    assert len(node.key) == 0 and len(node.value) == 0
    assert RadixTreeNode().uid != RadixTreeNode().uid


def test_set_key_value_refuses_different_lengths() -> None:
    node = RadixTreeNode()
    with pytest.raises(ArgumentError, match="key"):
        node.set_key_value(torch.tensor([1, 2]), torch.tensor([0], dtype=torch.int32))
    assert node.length == 0


def test_set_parent_files_the_node_under_its_first_token_or_page() -> None:
    root = RadixTreeNode()
    child = make_node([4, 5], [0, 1])
    child.set_parent(root)
    assert root.children == {4: child} and child.parent is root
    assert not root.is_leaf() and child.is_leaf() and not child.is_root()
    paged_root = RadixTreeNode()
    paged = make_node([4, 5, 6, 7], [8, 9, 10, 11])
    paged.set_parent(paged_root, page_size=2)
    assert paged_root.children == {(4, 5): paged}


def test_get_match_len_compares_with_the_nodes_key() -> None:
    node = make_node([3, 4, 5], [0, 1, 2])
    assert node.get_match_len(np.array([3, 4, 9])) == 2
    assert node.get_match_len(np.array([3, 4, 5, 6])) == 3
    assert node.get_match_len(np.array([8])) == 0


def test_split_at_puts_a_new_upper_node_in_the_old_ones_place() -> None:
    root = RadixTreeNode()
    node = make_node([1, 2, 3, 4], [10, 11, 12, 13])
    node.set_parent(root)
    node.ref_count, node.timestamp = 2, 9
    upper = node.split_at(1)
    assert root.children == {1: upper} and upper.children == {2: node}
    assert node.parent is upper and upper.parent is root
    assert upper.key.tolist() == [1] and upper.value.tolist() == [10]
    assert node.key.tolist() == [2, 3, 4] and node.value.tolist() == [11, 12, 13]
    # Every lock and use of the old node covered both halves.
    assert (upper.ref_count, upper.timestamp) == (2, 9) and (node.ref_count, node.timestamp) == (2, 9)


@pytest.mark.parametrize("pos", [0, 4, -1, 5])
def test_split_at_refuses_a_cut_outside_the_node(pos: int) -> None:
    root = RadixTreeNode()
    node = make_node([1, 2, 3, 4], [10, 11, 12, 13])
    node.set_parent(root)
    with pytest.raises(ArgumentError, match="pos"):
        node.split_at(pos)
    assert root.children == {1: node} and node.length == 4


def test_node_repr_shows_the_key_and_counts() -> None:
    assert repr(RadixTreeNode()) == "RadixTreeNode(root)"
    node = make_node(list(range(8)), list(range(8)))
    node.set_parent(RadixTreeNode())
    assert repr(node) == "RadixTreeNode(key=[0, 1, 2, 3, 4, 5]..., len=8, ref=0, t=0)"


def test_handle_is_frozen_and_carries_its_node() -> None:
    manager = RadixCacheManager()
    handle = RadixCacheHandle(0, manager.root_node)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.node = RadixTreeNode()  # type: ignore[misc]
    assert handle.cached_len == 0 and handle.node is manager.root_node


# -- construction ---------------------------------------------------------------


def test_a_new_manager_holds_nothing_and_its_root_is_protected() -> None:
    manager = RadixCacheManager()
    assert manager.size_info == SizeInfo(0, 0) and manager.num_nodes == 0
    assert manager.root_node.ref_count == 1 and manager.root_node.is_root()
    assert manager.page_size == 1 and manager.device == torch.device("cpu")
    manager.check_integrity()


@pytest.mark.parametrize("page_size", [0, -2])
def test_page_size_must_be_positive(page_size: int) -> None:
    with pytest.raises(ArgumentError, match="page_size"):
        RadixCacheManager(page_size=page_size)


# -- match_prefix ---------------------------------------------------------------


def test_match_on_an_empty_tree_returns_the_root_and_no_indices() -> None:
    manager = RadixCacheManager()
    handle, indices = manager.match_prefix([1, 2, 3])
    assert handle.cached_len == 0 and handle.node is manager.root_node
    assert indices.dtype == torch.int32 and indices.numel() == 0


def test_match_returns_the_slots_of_the_longest_cached_prefix(hello_tree: RadixCacheManager) -> None:
    for ids, expected in [
        ([1, 2, 4, 5, 6], [10, 11, 13, 14]),
        ([1, 2, 3], [10, 11, 12]),
        ([1, 2], [10, 11]),
        ([9, 1], [20]),
        ([7], []),
        ([], []),
    ]:
        handle, indices = hello_tree.match_prefix(ids)
        assert indices.tolist() == expected, ids
        assert handle.cached_len == len(expected)
        assert indices.dtype == torch.int32
    hello_tree.check_integrity()


def test_match_accepts_tensors_of_any_integer_dtype_and_numpy(hello_tree: RadixCacheManager) -> None:
    for ids in (torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3], dtype=torch.int32), np.array([1, 2, 3], np.int16)):
        assert hello_tree.match_prefix(ids)[1].tolist() == [10, 11, 12]


def test_match_ending_inside_a_node_splits_it_without_changing_what_is_cached() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
    entries_before, sizes_before = tree_entries(manager).keys(), manager.size_info
    handle, indices = manager.match_prefix([1, 2, 9])
    assert indices.tolist() == [0, 1]
    assert keys_by_depth(manager) == {(1, 2): (0, 1), (1, 2, 3, 4): (2, 3)}
    assert handle.node is node_at(manager, (1, 2))
    assert tree_entries(manager).keys() == entries_before and manager.size_info == sizes_before
    assert manager.num_nodes == 2
    manager.check_integrity()


def test_match_refreshes_the_time_of_the_matched_path_only(hello_tree: RadixCacheManager) -> None:
    before = {k: node_at(hello_tree, k).timestamp for k in [(1, 2), (1, 2, 3), (1, 2, 4, 5), (9,)]}
    hello_tree.match_prefix([1, 2, 3, 7])
    after = {k: node_at(hello_tree, k).timestamp for k in before}
    assert after[(1, 2)] > before[(1, 2)] and after[(1, 2, 3)] > before[(1, 2, 3)]
    assert after[(1, 2)] == after[(1, 2, 3)]
    assert after[(1, 2, 4, 5)] == before[(1, 2, 4, 5)] and after[(9,)] == before[(9,)]


def test_returned_indices_are_a_copy_not_a_view_of_the_tree(hello_tree: RadixCacheManager) -> None:
    _, indices = hello_tree.match_prefix([9])
    indices[0] = 999
    assert hello_tree.match_prefix([9])[1].tolist() == [20]


# -- insert_prefix --------------------------------------------------------------


def test_insert_returns_what_was_already_cached_and_adds_the_rest() -> None:
    manager = RadixCacheManager()
    assert manager.insert_prefix([1, 2, 3], [5, 6, 7]) == 0
    assert manager.insert_prefix([1, 2, 3], [8, 9, 10]) == 3  # nothing new: the tree keeps its own slots
    assert manager.insert_prefix([1, 2, 4], [5, 6, 11]) == 2
    assert keys_by_depth(manager) == {(1, 2): (5, 6), (1, 2, 3): (7,), (1, 2, 4): (11,)}
    assert manager.size_info == SizeInfo(4, 0)
    manager.check_integrity()


def test_insert_of_an_empty_prefix_changes_nothing() -> None:
    manager = RadixCacheManager()
    assert manager.insert_prefix([], []) == 0
    assert manager.num_nodes == 0 and manager.size_info == SizeInfo(0, 0)


def test_insert_of_a_prefix_of_a_node_splits_it_and_returns_its_length() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    assert manager.insert_prefix([1, 2], [0, 1]) == 2
    assert keys_by_depth(manager) == {(1, 2): (0, 1), (1, 2, 3): (2,)}
    manager.check_integrity()


def test_insert_stores_copies_of_the_callers_tensors() -> None:
    # The caller reuses its page-table row; the tree must not see later writes (mini-sglang 94fe255).
    manager = RadixCacheManager()
    ids = torch.tensor([1, 2, 3])
    row = torch.tensor([4, 5, 6], dtype=torch.int32)
    manager.insert_prefix(ids, row)
    ids[:] = 0
    row[:] = 0
    assert keys_by_depth(manager) == {(1, 2, 3): (4, 5, 6)}


def test_insert_converts_int64_and_list_indices_to_int32() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], torch.tensor([3, 4], dtype=torch.int64))
    manager.insert_prefix([7], [8])
    for _, node in nodes_with_prefix(manager):
        assert node.value.dtype == torch.int32 and node.key.dtype == np.int64
    manager.check_integrity()


@pytest.mark.parametrize("slots", [[5, 5, 6], [9, 2, 9], [4, 7, 1, 7]], ids=["adjacent", "apart", "unsorted"])
def test_insert_refuses_a_slot_listed_twice(slots: list[int]) -> None:
    manager = RadixCacheManager()
    with pytest.raises(ArgumentError, match="indices"):
        manager.insert_prefix(list(range(len(slots))), slots)
    assert manager.num_nodes == 0


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 6)), min_size=1, max_size=8))
@settings(REPRODUCIBLE, max_examples=200)
def test_insert_takes_slots_exactly_when_none_repeats(runs: list[tuple[int, int]]) -> None:
    # Ascending runs of slots in any order, overlapping or not: what a pool hands out after evictions, or a bug.
    slots = [first + i for first, length in runs for i in range(length)]
    manager = RadixCacheManager()
    if len(set(slots)) == len(slots):
        assert manager.insert_prefix(list(range(len(slots))), slots) == 0
        assert sorted(tree_slots(manager)) == sorted(slots)
        manager.check_integrity()
    else:
        with pytest.raises(ArgumentError, match="twice"):
            manager.insert_prefix(list(range(len(slots))), slots)
        assert manager.num_nodes == 0 and manager.size_info == SizeInfo(0, 0)
        manager.check_integrity()


def test_insert_accepts_distinct_slots_in_any_order() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3, 4], [30, 31, 2, 3])  # two runs, as a pool hands them out after evictions
    assert node_at(manager, (1, 2, 3, 4)).value.tolist() == [30, 31, 2, 3]
    manager.check_integrity()


@pytest.mark.parametrize(
    "slots",
    [torch.tensor([2**31 + 1], dtype=torch.int64), [2**31 + 1], torch.tensor([-(2**32) + 5], dtype=torch.int64)],
    ids=["int64 tensor", "list", "negative int64 that wraps to a valid int32"],
)
def test_insert_refuses_slots_that_do_not_fit_int32(slots: object) -> None:
    manager = RadixCacheManager()
    with pytest.raises(ArgumentError, match="indices"):
        manager.insert_prefix([1], slots)
    assert manager.num_nodes == 0


def test_insert_keeps_int64_token_keys_whatever_the_key_dtype() -> None:
    node = RadixTreeNode()
    node.set_key_value(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
    assert node.key.dtype == np.int64 and node.get_match_len(np.array([1, 2, 3])) == 2


# -- lock_handle ------------------------------------------------------------------


def test_lock_protects_the_whole_path_and_unlock_releases_it(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([1, 2, 4, 5])
    hello_tree.lock_handle(handle)
    assert node_at(hello_tree, (1, 2)).ref_count == 1 and node_at(hello_tree, (1, 2, 4, 5)).ref_count == 1
    assert node_at(hello_tree, (1, 2, 3)).ref_count == 0
    assert hello_tree.size_info == SizeInfo(evictable_size=2, protected_size=4)
    hello_tree.check_integrity()
    hello_tree.lock_handle(handle, unlock=True)
    assert hello_tree.size_info == SizeInfo(6, 0)
    hello_tree.check_integrity()


def test_locks_nest_and_each_needs_its_own_unlock(hello_tree: RadixCacheManager) -> None:
    long_handle, _ = hello_tree.match_prefix([1, 2, 3])
    short_handle, _ = hello_tree.match_prefix([1, 2])
    hello_tree.lock_handle(long_handle)
    hello_tree.lock_handle(long_handle)
    hello_tree.lock_handle(short_handle)
    assert node_at(hello_tree, (1, 2)).ref_count == 3 and node_at(hello_tree, (1, 2, 3)).ref_count == 2
    hello_tree.check_integrity()
    hello_tree.lock_handle(long_handle, unlock=True)
    hello_tree.lock_handle(short_handle, unlock=True)
    assert hello_tree.size_info == SizeInfo(3, 3)
    hello_tree.lock_handle(long_handle, unlock=True)
    assert hello_tree.size_info == SizeInfo(6, 0)
    with pytest.raises(LockError, match="handle"):
        hello_tree.lock_handle(long_handle, unlock=True)
    hello_tree.check_integrity()


def test_unlocking_a_partly_locked_path_fails_and_changes_nothing(hello_tree: RadixCacheManager) -> None:
    short_handle, _ = hello_tree.match_prefix([1, 2])
    long_handle, _ = hello_tree.match_prefix([1, 2, 3])
    hello_tree.lock_handle(short_handle)  # [1, 2] locked, [3] below it not
    before = manager_snapshot(hello_tree)
    with pytest.raises(LockError, match="handle"):
        hello_tree.lock_handle(long_handle, unlock=True)
    assert manager_snapshot(hello_tree) == before


def test_the_empty_handle_locks_and_unlocks_nothing(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([42])
    before = manager_snapshot(hello_tree)
    hello_tree.lock_handle(handle)
    hello_tree.lock_handle(handle, unlock=True)
    hello_tree.lock_handle(handle, unlock=True)
    assert manager_snapshot(hello_tree) == before and hello_tree.root_node.ref_count == 1


def test_a_handle_stays_valid_when_its_node_or_an_ancestor_is_split() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
    handle, _ = manager.match_prefix([1, 2, 3, 4])
    manager.match_prefix([1, 9])  # splits the handle's node after one token
    manager.match_prefix([1, 2, 3])  # and again
    manager.lock_handle(handle)
    assert all(node.ref_count == 1 for _, node in nodes_with_prefix(manager))
    assert manager.size_info == SizeInfo(0, 4)
    manager.lock_handle(handle, unlock=True)
    manager.check_integrity()


def test_locking_a_split_node_keeps_both_halves_locked() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    handle, _ = manager.match_prefix([1, 2, 3])
    manager.lock_handle(handle)
    manager.match_prefix([1, 5])  # split a locked node
    assert manager.size_info == SizeInfo(0, 3)
    manager.check_integrity()
    with pytest.raises(EvictionError):
        manager.evict(1)
    manager.lock_handle(handle, unlock=True)
    assert sorted(manager.evict(3).tolist()) == [0, 1, 2]


def test_handles_of_evicted_or_reset_nodes_are_stale(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([9])
    hello_tree.match_prefix([1, 2, 3])
    hello_tree.match_prefix([1, 2, 4, 5])
    assert hello_tree.evict(1).tolist() == [20]  # [9] is the least recently used leaf
    with pytest.raises(StaleHandleError, match="handle"):
        hello_tree.lock_handle(handle)
    other, _ = hello_tree.match_prefix([1, 2, 3])
    hello_tree.reset()
    with pytest.raises(StaleHandleError, match="handle"):
        hello_tree.lock_handle(other)
    # A node with the same tokens inserted afterwards is a different node.
    hello_tree.insert_prefix([1, 2, 3], [10, 11, 12])
    with pytest.raises(StaleHandleError):
        hello_tree.lock_handle(other)


def test_a_handle_from_another_manager_is_refused(hello_tree: RadixCacheManager) -> None:
    other = RadixCacheManager()
    other.insert_prefix([1, 2, 3], [10, 11, 12])
    foreign, _ = other.match_prefix([1, 2, 3])
    before = manager_snapshot(hello_tree)
    with pytest.raises(StaleHandleError, match="handle"):
        hello_tree.lock_handle(foreign)
    assert manager_snapshot(hello_tree) == before


# -- evict ------------------------------------------------------------------------


def test_evict_zero_returns_an_empty_int32_tensor(hello_tree: RadixCacheManager) -> None:
    before = manager_snapshot(hello_tree)
    result = hello_tree.evict(0)
    assert result.dtype == torch.int32 and result.numel() == 0
    assert manager_snapshot(hello_tree) == before


def test_evict_takes_the_least_recently_used_leaf_first(hello_tree: RadixCacheManager) -> None:
    # Use order, oldest first: [9], [1, 2, 4, 5], [1, 2, 3].
    hello_tree.match_prefix([9])
    hello_tree.match_prefix([1, 2, 4, 5])
    hello_tree.match_prefix([1, 2, 3])
    assert hello_tree.evict(1).tolist() == [20]
    assert hello_tree.evict(1).tolist() == [13, 14]  # a whole node: more than asked
    assert hello_tree.size_info == SizeInfo(3, 0)
    hello_tree.check_integrity()


def test_a_parent_left_childless_becomes_evictable_in_lru_order() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    manager.insert_prefix([1, 2, 3], [0, 1, 2])  # [1, 2] is now an inner node
    manager.insert_prefix([7], [7])  # newer than both
    assert sorted(manager.evict(3).tolist()) == [0, 1, 2]  # [3] first, then its parent, before [7]
    assert keys_by_depth(manager) == {(7,): (7,)}
    manager.check_integrity()


def test_evict_never_takes_a_locked_prefix(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([9])
    hello_tree.lock_handle(handle)
    evicted = hello_tree.evict(hello_tree.size_info.evictable_size)
    assert sorted(evicted.tolist()) == [10, 11, 12, 13, 14]
    assert keys_by_depth(hello_tree) == {(9,): (20,)}
    assert hello_tree.size_info == SizeInfo(0, 1)
    hello_tree.check_integrity()


def test_evict_more_than_evictable_fails_before_touching_anything(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([1, 2, 3])
    hello_tree.lock_handle(handle)
    before = manager_snapshot(hello_tree)
    with pytest.raises(EvictionError, match="size"):
        hello_tree.evict(hello_tree.size_info.evictable_size + 1)
    assert manager_snapshot(hello_tree) == before


def test_evict_everything_evictable_empties_the_tree(hello_tree: RadixCacheManager) -> None:
    evicted = hello_tree.evict(6)
    assert sorted(evicted.tolist()) == [10, 11, 12, 13, 14, 20]
    assert hello_tree.num_nodes == 0 and hello_tree.size_info == SizeInfo(0, 0)
    hello_tree.check_integrity()


def test_many_matches_keep_the_lazy_heap_bounded_and_correct(hello_tree: RadixCacheManager) -> None:
    for i in range(300):
        hello_tree.match_prefix([1, 2, 3] if i % 2 else [9])
    hello_tree.check_integrity()
    assert len(hello_tree._heap) <= 2 * hello_tree.num_nodes + 64 + 1  # compaction keeps the lazy heap small
    # Last used: [1, 2, 3] (i = 299), then [9]; [1, 2, 4, 5] was never matched again.
    assert hello_tree.evict(1).tolist() == [13, 14]
    assert hello_tree.evict(1).tolist() == [20]


# -- reset, size_info, num_nodes ----------------------------------------------------


def test_reset_returns_every_slot_and_empties_the_tree(hello_tree: RadixCacheManager) -> None:
    slots = hello_tree.reset()
    assert slots.dtype == torch.int32 and sorted(slots.tolist()) == [10, 11, 12, 13, 14, 20]
    assert hello_tree.num_nodes == 0 and hello_tree.size_info == SizeInfo(0, 0)
    assert hello_tree.reset().numel() == 0
    hello_tree.check_integrity()
    assert hello_tree.insert_prefix([1, 2, 3], [1, 2, 3]) == 0  # usable again


def test_reset_is_refused_while_anything_is_locked(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([1, 2])
    hello_tree.lock_handle(handle)
    before = manager_snapshot(hello_tree)
    with pytest.raises(LockError, match="reset"):
        hello_tree.reset()
    assert manager_snapshot(hello_tree) == before


def test_num_nodes_and_sizes_follow_inserts_splits_and_evictions(hello_tree: RadixCacheManager) -> None:
    assert hello_tree.num_nodes == 4 and len(nodes_with_prefix(hello_tree)) == 4
    hello_tree.match_prefix([1, 2, 4])  # split [4, 5]
    assert hello_tree.num_nodes == 5 and hello_tree.size_info.total_size == 6
    assert sorted(tree_slots(hello_tree)) == [10, 11, 12, 13, 14, 20]


# -- page_size > 1 ----------------------------------------------------------------


def test_paged_insert_keeps_only_whole_pages() -> None:
    manager = RadixCacheManager(page_size=4)
    assert manager.insert_prefix(list(range(10)), list(range(10))) == 0
    assert keys_by_depth(manager) == {tuple(range(8)): tuple(range(8))}
    assert manager.size_info == SizeInfo(8, 0)
    assert manager.root_node.children.keys() == {(0, 1, 2, 3)}
    manager.check_integrity()


def test_paged_match_is_aligned_down_to_a_page_and_splits_on_page_boundaries() -> None:
    manager = RadixCacheManager(page_size=4)
    manager.insert_prefix(list(range(12)), list(range(100, 112)))
    handle, indices = manager.match_prefix([0, 1, 2, 3, 4, 5, 99, 7, 8])  # 6 tokens agree: one whole page
    assert handle.cached_len == 4 and indices.tolist() == [100, 101, 102, 103]
    assert keys_by_depth(manager) == {(0, 1, 2, 3): (100, 101, 102, 103), tuple(range(12)): tuple(range(104, 112))}
    manager.check_integrity()
    # Sharing three of four tokens of the first page is no match at all.
    handle, indices = manager.match_prefix([0, 1, 2, 9])
    assert handle.cached_len == 0 and indices.numel() == 0
    # A query shorter than a page cannot match.
    assert manager.match_prefix([0, 1, 2])[0].cached_len == 0


def test_paged_siblings_may_share_a_first_token_but_not_a_first_page() -> None:
    manager = RadixCacheManager(page_size=2)
    assert manager.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3]) == 0
    assert manager.insert_prefix([1, 5, 3, 4], [4, 5, 6, 7]) == 0
    assert manager.root_node.children.keys() == {(1, 2), (1, 5)}
    assert manager.match_prefix([1, 5, 3, 4])[1].tolist() == [4, 5, 6, 7]
    manager.check_integrity()


def test_paged_evict_returns_whole_pages() -> None:
    manager = RadixCacheManager(page_size=4)
    manager.insert_prefix(list(range(8)), list(range(8)))
    manager.insert_prefix([0, 1, 2, 3, 9, 9, 9, 9], [0, 1, 2, 3, 12, 13, 14, 15])
    evicted = manager.evict(1)
    assert evicted.tolist() == [4, 5, 6, 7]
    manager.check_integrity()


def test_paged_insert_refuses_slots_that_are_not_whole_pages() -> None:
    manager = RadixCacheManager(page_size=4)
    with pytest.raises(ArgumentError, match="indices"):
        manager.insert_prefix([1, 2, 3, 4], [1, 2, 3, 4])  # page 0 shifted by one slot
    assert manager.num_nodes == 0


# -- devices ------------------------------------------------------------------------


def test_a_device_named_with_an_index_is_the_same_device() -> None:
    # On a GPU the same mismatch is 'cuda' (the manager) against 'cuda:0' (every tensor made there).
    manager = RadixCacheManager(device="cpu:0")
    manager.insert_prefix([1, 2], [0, 1])
    manager.insert_prefix([1, 3], torch.tensor([0, 2], dtype=torch.int32))
    manager.check_integrity()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_manager_keeps_values_on_the_gpu() -> None:
    manager = RadixCacheManager(device=torch.device("cuda", 0))
    manager.insert_prefix([1, 2, 3], torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda:0"))
    _, indices = manager.match_prefix([1, 2])
    assert indices.is_cuda and indices.tolist() == [0, 1]
    manager.check_integrity()


# -- the public reading interface: clock, walk, nodes, path_of, evictable_leaves, held_slot_mask ---


def test_the_clock_is_read_only_and_tick_advances_it(hello_tree: RadixCacheManager) -> None:
    before = hello_tree.clock
    assert hello_tree.tick() == before + 1 == hello_tree.clock
    with pytest.raises(AttributeError):
        hello_tree.clock = 0  # type: ignore[misc]
    hello_tree.match_prefix([1, 2])
    assert hello_tree.clock == before + 2  # one tick per walk


def test_walk_is_the_match_walk_it_splits_and_stamps(hello_tree: RadixCacheManager) -> None:
    node, matched = hello_tree.walk([1, 2, 3, 9])
    assert matched == 3 and node.key.tolist() == [3] and node.timestamp == hello_tree.clock
    node, matched = hello_tree.walk(np.array([1, 9]))
    assert matched == 1 and node.key.tolist() == [1] and hello_tree.num_nodes == 5
    hello_tree.check_integrity()


def test_nodes_lists_every_node_but_the_root_parents_first(hello_tree: RadixCacheManager) -> None:
    seen: set[int] = set()
    for node in hello_tree.nodes():
        assert node.parent is not None and (node.parent.is_root() or node.parent.uid in seen)
        seen.add(node.uid)
    assert len(seen) == hello_tree.num_nodes


def test_path_of_is_the_handles_node_and_its_ancestors(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([1, 2, 4, 5])
    assert [n.key.tolist() for n in hello_tree.path_of(handle)] == [[4, 5], [1, 2]]
    assert hello_tree.path_of(RadixCacheHandle(0, hello_tree.root_node)) == []


def test_evictable_leaves_come_in_the_order_evict_takes_them() -> None:
    manager = RadixCacheManager()
    for i, ids in enumerate([[1, 2], [1, 3], [4], [5, 6], [5, 7]]):
        manager.insert_prefix(ids, [10 * i + j for j in range(len(ids))])
    manager.match_prefix([4])
    order = [tuple(n.key.tolist()) for n in manager.evictable_leaves()]
    taken = []
    while manager.size_info.evictable_size:
        leaves = manager.evictable_leaves()
        freed = manager.evict(1)
        assert freed.tolist() == leaves[0].value.tolist()
        taken.append(tuple(leaves[0].key.tolist()))
    assert order == [(2,), (3,), (6,), (7,), (4,)]  # by last use; [4] was matched last
    assert taken == [(2,), (3,), (1,), (6,), (7,), (5,), (4,)]  # parents join once they are leaves


def test_held_slot_mask_says_which_slots_the_tree_holds_and_is_read_only() -> None:
    manager = RadixCacheManager()
    assert not manager.held_slot_mask().any()
    manager.insert_prefix([1, 2, 3], [4, 9, 2])
    manager.insert_prefix([1, 2, 7], [4, 9, 5])  # [4, 9] are the tree's already: only 5 is new
    assert np.flatnonzero(manager.held_slot_mask()).tolist() == [2, 4, 5, 9]
    mask = manager.held_slot_mask()
    with pytest.raises(ValueError):
        mask[0] = True
    freed = manager.evict(1)
    held = set(np.flatnonzero(manager.held_slot_mask()).tolist())
    assert held == {2, 4, 5, 9} - set(freed.tolist())
    manager.reset()
    assert not manager.held_slot_mask().any()
    manager.check_integrity()


# -- insert_prefix(..., handle=): continue from the request's own locked match ---


def serve_one(manager: RadixCacheManager, ids: list[int], next_slot: list[int], use_handle: bool) -> int:
    """Match ids[:-1], lock, take fresh slots for the rest, insert, unlock (as a server does)."""
    handle, matched = manager.match_prefix(ids[:-1])
    manager.lock_handle(handle)
    fresh = list(range(next_slot[0], next_slot[0] + len(ids) - handle.cached_len))
    next_slot[0] += len(fresh)
    row = matched.tolist() + fresh
    already = manager.insert_prefix(ids, row, handle=handle if use_handle else None)
    manager.lock_handle(handle, unlock=True)
    return already


def observable(manager: RadixCacheManager) -> object:
    return (tree_entries(manager), manager.size_info, manager.num_nodes, manager.clock)


@given(
    page_size=st.sampled_from([1, 2, 4]),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=12),
    evictions=st.lists(st.integers(0, 6), max_size=12),
)
@settings(REPRODUCIBLE, max_examples=150)
def test_insert_from_the_handle_gives_what_a_full_walk_gives(
    page_size: int, prompts: list[list[int]], evictions: list[int]
) -> None:
    walked, handed = RadixCacheManager(page_size=page_size), RadixCacheManager(page_size=page_size)
    slots_a, slots_b = [0], [0]
    for i, ids in enumerate(prompts):
        slots_a[0] = slots_b[0] = max(slots_a[0], slots_b[0]) // page_size * page_size + page_size
        assert serve_one(walked, ids, slots_a, False) == serve_one(handed, ids, slots_b, True)
        size = min(evictions[i] if i < len(evictions) else 0, walked.size_info.evictable_size)
        assert walked.evict(size).tolist() == handed.evict(size).tolist()
        assert observable(walked) == observable(handed)
        handed.check_integrity()


def test_insert_from_a_handle_whose_node_was_split_meanwhile() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
    handle, _ = manager.match_prefix([1, 2, 3, 4])
    manager.lock_handle(handle)
    manager.match_prefix([1, 2, 9])  # splits the handle's node: it keeps ending where it ended
    assert manager.insert_prefix([1, 2, 3, 4, 5], [0, 1, 2, 3, 4], handle=handle) == 4
    manager.lock_handle(handle, unlock=True)
    assert keys_by_depth(manager)[(1, 2, 3, 4, 5)] == (4,)
    manager.check_integrity()


def test_insert_from_a_handle_finds_what_others_inserted_meanwhile() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    handle, _ = manager.match_prefix([1, 2])
    manager.lock_handle(handle)
    manager.insert_prefix([1, 2, 3, 4], [0, 1, 7, 8])  # another request, finished first
    assert manager.insert_prefix([1, 2, 3, 4, 5], [0, 1, 2, 3, 4], handle=handle) == 4
    manager.lock_handle(handle, unlock=True)
    manager.check_integrity()


def test_a_forged_handle_is_refused_and_changes_nothing(hello_tree: RadixCacheManager) -> None:
    handle, _ = hello_tree.match_prefix([1, 2, 4, 5])
    hello_tree.lock_handle(handle)
    before = manager_snapshot(hello_tree)
    with pytest.raises(ArgumentError, match="handle"):  # the right node, but a cached_len it does not hold
        hello_tree.insert_prefix([1, 2, 4, 5, 6], [10, 11, 13, 14, 15], handle=RadixCacheHandle(3, handle.node))
    with pytest.raises(ArgumentError, match="handle"):  # a length and node of another prompt
        hello_tree.insert_prefix([1, 2, 3, 5, 6], [10, 11, 12, 14, 15], handle=handle)
    assert manager_snapshot(hello_tree) == before


# -- issue 12 regressions ------------------------------------------------------------


def test_unlock_where_only_a_deeper_lock_passes_is_refused() -> None:
    # Issue 12 #1: [1, 2] was never locked, but the lock on [1, 2, 3] passes through it.
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    manager.insert_prefix([1, 2, 4], [0, 1, 3])
    deep, _ = manager.match_prefix([1, 2, 3])
    other, _ = manager.match_prefix([1, 2, 4])
    manager.lock_handle(deep)
    manager.lock_handle(other)
    shallow, _ = manager.match_prefix([1, 2])
    before = manager_snapshot(manager)
    with pytest.raises(LockError, match="no lock of its own"):
        manager.lock_handle(shallow, unlock=True)
    assert manager_snapshot(manager) == before
    manager.check_integrity()
    # The real owners unlock as usual, and then everything can go.
    manager.lock_handle(deep, unlock=True)
    manager.lock_handle(other, unlock=True)
    assert sorted(manager.evict(manager.size_info.evictable_size).tolist()) == [0, 1, 2, 3]
    manager.check_integrity()
    manager.reset()


def test_a_split_keeps_the_own_lock_with_the_handles_node() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    handle, _ = manager.match_prefix([1, 2, 3])
    manager.lock_handle(handle)
    upper, _ = manager.match_prefix([1])  # splits: [1] over [2, 3]
    with pytest.raises(LockError):
        manager.lock_handle(upper, unlock=True)
    manager.lock_handle(handle, unlock=True)
    assert manager.size_info == SizeInfo(3, 0)
    manager.check_integrity()


def test_lock_unlock_cycles_do_not_pile_up_in_the_heap() -> None:
    # Issue 12 #3: each cycle queued another live entry, and compaction kept them all.
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    handle, _ = manager.match_prefix([1, 2])
    for _ in range(9000):
        manager.lock_handle(handle)
        manager.lock_handle(handle, unlock=True)
    assert len(manager._heap) <= 2 * manager.num_nodes + 64 + 1
    manager.check_integrity()
    assert manager.evict(1).tolist() == [0, 1]


def test_insert_refuses_a_slot_another_node_holds_and_evict_returns_each_slot_once() -> None:
    # Issue 12 #6.
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    before = manager_snapshot(manager)
    with pytest.raises(ArgumentError, match="already held"):
        manager.insert_prefix([5, 6], [7, 1])
    assert manager_snapshot(manager) == before
    manager.insert_prefix([5, 6], [7, 8])
    freed = manager.evict(4).tolist()
    assert sorted(freed) == [0, 1, 7, 8]
    manager.insert_prefix([9], [1])  # evicted slots may be inserted again
    manager.check_integrity()


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_refused_insert_does_not_split_tick_or_refresh(page_size: int) -> None:
    # Issue 12 #9: validate before walking.
    manager = RadixCacheManager(page_size=page_size)
    pages = [t for t in (1, 2, 3, 4) for _ in range(page_size)]
    manager.insert_prefix(pages, list(range(4 * page_size)))
    before = manager_snapshot(manager)
    diverging = pages[: 2 * page_size] + [9] * (2 * page_size)
    bad_slots = list(range(2 * page_size)) + [40] * (2 * page_size)  # a repeated new slot
    with pytest.raises(ArgumentError, match="indices"):
        manager.insert_prefix(diverging, bad_slots)
    if page_size > 1:
        with pytest.raises(ArgumentError, match="whole page"):
            manager.insert_prefix(diverging, [*range(2 * page_size), 41, 40, 43, 42])
    assert manager_snapshot(manager) == before
    manager.check_integrity()


def test_uint64_ids_from_2_to_the_63_are_refused_not_wrapped() -> None:
    # Issue 12 #8: np.uint64(2**63) used to become -2**63, a different prompt's id.
    manager = RadixCacheManager()
    manager.insert_prefix(np.array([2**63 - 1, 5], dtype=np.uint64), [0, 1])
    with pytest.raises(ArgumentError, match="int64"):
        manager.match_prefix(np.array([2**63, 5], dtype=np.uint64))
    with pytest.raises(ArgumentError, match="int64"):
        manager.match_prefix([2**63, 5])
    assert manager.match_prefix(np.array([2**63 - 1, 5], dtype=np.uint64))[0].cached_len == 2


def test_every_empty_result_is_a_fresh_tensor() -> None:
    # The notes' shared empty_tensor: one caller resizing its "empty" result changed every later one.
    manager = RadixCacheManager()
    _, first = manager.match_prefix([1, 2])
    first.resize_(3).fill_(7)
    _, second = manager.match_prefix([3])
    assert second.tolist() == [] and manager.evict(0).tolist() == [] and manager.reset().tolist() == []
    assert second.dtype == torch.int32 and second.device == manager.device
    assert manager.empty_tensor.tolist() == []


@pytest.mark.parametrize(
    "indices",
    [np.array([4, 5], dtype=np.int32), np.array([4, 5], dtype=np.uint16), torch.tensor([4, 5], dtype=torch.int16),
     torch.tensor([4, 5], dtype=torch.uint8), (4, 5)],
    ids=["numpy-int32", "numpy-uint16", "tensor-int16", "tensor-uint8", "tuple"],
)  # fmt: skip
def test_slots_are_accepted_in_every_form_token_ids_are(indices: object) -> None:
    manager = RadixCacheManager()
    manager.insert_prefix(np.array([1, 2]), indices)  # type: ignore[arg-type]
    assert manager.match_prefix([1, 2])[1].tolist() == [4, 5]


@given(
    page_size=st.sampled_from([1, 2]),
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=10), min_size=1, max_size=6),
    steps=st.lists(st.tuples(st.sampled_from(["match", "lock", "unlock", "evict"]), st.integers(0, 30)), max_size=40),
)
@settings(REPRODUCIBLE, max_examples=150)
def test_locks_count_per_node_against_a_ledger_of_handles(
    page_size: int, prompts: list[list[int]], steps: list[tuple[str, int]]
) -> None:
    # The ledger: how many locks each handle's node holds of its own. An unlock is accepted exactly
    # when the ledger says its node holds one, whatever deeper locks pass through it.
    manager = RadixCacheManager(page_size=page_size)
    next_page = 0
    for ids in prompts:
        ids = [t for t in ids for _ in range(page_size)]
        manager.insert_prefix(ids, list(range(next_page * page_size, (next_page + len(ids) // page_size) * page_size)))
        next_page += len(ids) // page_size
    handles: list[RadixCacheHandle] = []
    own: dict[int, int] = {}
    for kind, pick in steps:
        if kind == "match" or not handles:
            ids = [t for t in prompts[pick % len(prompts)] for _ in range(page_size)]
            handles.append(manager.match_prefix(ids[: 1 + pick % len(ids)])[0])
            continue
        handle = handles[pick % len(handles)]
        if handle.cached_len == 0 or handle.node.is_evicted():
            continue
        key = handle.node.uid
        if kind == "lock":
            manager.lock_handle(handle)
            own[key] = own.get(key, 0) + 1
        elif kind == "unlock":
            if own.get(key, 0) > 0:
                manager.lock_handle(handle, unlock=True)
                own[key] -= 1
            else:
                before = manager_snapshot(manager)
                with pytest.raises(LockError):
                    manager.lock_handle(handle, unlock=True)
                assert manager_snapshot(manager) == before
        else:
            manager.evict(min(pick, manager.size_info.evictable_size))
        manager.check_integrity()
    for handle in handles:
        while own.get(handle.node.uid, 0) > 0:
            manager.lock_handle(handle, unlock=True)
            own[handle.node.uid] -= 1
    assert manager.size_info.protected_size == 0
    manager.reset()
    manager.check_integrity()
