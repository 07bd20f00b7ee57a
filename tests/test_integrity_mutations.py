"""``check_integrity`` really checks: each corruption below breaks one invariant on purpose.

Every mutation starts from a healthy tree (which must pass), breaks exactly one
rule by reaching into the nodes, and expects an :class:`IntegrityError` whose
``invariant`` names that rule -- not just *some* error.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import nodes_with_prefix

from minikv import RadixCacheManager, RadixTreeNode, integrity, radix_manager
from minikv.errors import IntegrityError


def healthy_tree(page_size: int = 1) -> RadixCacheManager:
    """[1, 2] locked once, with leaves [3] (unlocked) and [4, 5] (locked); [9] alone, unlocked.

    With page_size 2 every token is doubled, so each node holds whole pages.
    """
    manager = RadixCacheManager(page_size=page_size)

    def tokens(*ids: int) -> list[int]:
        return [t for t in ids for _ in range(page_size)]

    def slots(*first: int) -> list[int]:
        return [f * page_size + i for f in first for i in range(page_size)]

    manager.insert_prefix(tokens(1, 2, 3), slots(10, 11, 12))
    manager.insert_prefix(tokens(1, 2, 4, 5), slots(10, 11, 13, 14))
    manager.insert_prefix(tokens(9), slots(20))
    handle, _ = manager.match_prefix(tokens(1, 2, 4, 5))
    manager.lock_handle(handle)
    return manager


def node(manager: RadixCacheManager, *tokens: int) -> RadixTreeNode:
    """The node whose path from the root spells ``tokens`` (each repeated page_size times)."""
    ps = manager.page_size
    full = tuple(t for t in tokens for _ in range(ps))
    for prefix, candidate in nodes_with_prefix(manager):
        if prefix + tuple(candidate.key.tolist()) == full:
            return candidate
    raise KeyError(tokens)


def negative_ref_count(m: RadixCacheManager) -> None:
    node(m, 1, 2, 3).ref_count = -1


def evictable_counter_off(m: RadixCacheManager) -> None:
    m.evictable_size += 1


def protected_counter_off(m: RadixCacheManager) -> None:
    m.protected_size -= 1


def node_counter_off(m: RadixCacheManager) -> None:
    m._num_nodes += 1


def child_under_wrong_key(m: RadixCacheManager) -> None:
    parent = node(m, 1, 2)
    leaf = node(m, 1, 2, 3)
    key = next(k for k, child in parent.children.items() if child is leaf)
    wrong = 7 if m.page_size == 1 else (7,) * m.page_size  # a token (page) the leaf does not start with
    parent.children[wrong] = parent.children.pop(key)


def broken_parent_link(m: RadixCacheManager) -> None:
    node(m, 1, 2, 3).parent = node(m, 9)


def key_value_length_mismatch(m: RadixCacheManager) -> None:
    leaf = node(m, 1, 2, 4, 5)
    leaf.value = leaf.value[:-1]


def slot_held_by_two_nodes(m: RadixCacheManager) -> None:
    # [9] now claims the slots of [3]: same length, so only the sharing is wrong.
    node(m, 9).value = node(m, 1, 2, 3).value.clone()


def empty_non_root_node(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf.key = leaf.key[:0]
    leaf.value = leaf.value[:0]
    leaf.length = 0


def misaligned_page(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf.value = leaf.value + 1  # still unique slots, but the page starts mid-page


def partial_page_node(m: RadixCacheManager) -> None:
    # [4, 5] (two pages) loses its last token and slot: key and value still agree, but end mid-page.
    leaf = node(m, 1, 2, 4, 5)
    leaf.key, leaf.value = leaf.key[:-1], leaf.value[:-1]
    leaf.length -= 1


def lock_not_covering_the_path(m: RadixCacheManager) -> None:
    # [3] claims a second lock that its parent [1, 2] never received.
    leaf = node(m, 1, 2, 3)
    leaf.ref_count = node(m, 1, 2).ref_count + 1
    m.evictable_size -= leaf.length
    m.protected_size += leaf.length


def evictable_leaf_missing_from_heap(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    m._heap = [entry for entry in m._heap if entry[2] is not leaf]


def child_newer_than_parent(m: RadixCacheManager) -> None:
    node(m, 1, 2, 3).timestamp = node(m, 1, 2).timestamp + 5


def value_of_the_wrong_dtype(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf.value = leaf.value.to(torch.int64)


def negative_slot(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf.value = leaf.value - 10_000


def root_unprotected(m: RadixCacheManager) -> None:
    m.root_node.ref_count = 0


def lock_nobody_took(m: RadixCacheManager) -> None:
    # [1, 2] claims a second lock of its own (and counts stay consistent): no handle holds it.
    node(m, 1, 2).ref_count += 1


def top_leaf_locked_without_a_handle(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf.ref_count = 1
    m.evictable_size -= leaf.length
    m.protected_size += leaf.length


def key_of_int32(m: RadixCacheManager) -> None:
    node(m, 9).key = node(m, 9).key.astype(np.int32)


def key_of_floats(m: RadixCacheManager) -> None:
    node(m, 9).key = node(m, 9).key.astype(np.float64)


def key_as_a_tensor(m: RadixCacheManager) -> None:
    node(m, 9).key = torch.from_numpy(node(m, 9).key)


def key_is_none(m: RadixCacheManager) -> None:
    node(m, 9).key = None  # type: ignore[assignment]


def key_is_2d(m: RadixCacheManager) -> None:
    node(m, 9).key = node(m, 9).key.reshape(1, -1)


def value_is_none(m: RadixCacheManager) -> None:
    node(m, 9).value = None  # type: ignore[assignment]


def value_is_2d(m: RadixCacheManager) -> None:
    node(m, 9).value = node(m, 9).value.reshape(1, -1)


def ref_count_is_none(m: RadixCacheManager) -> None:
    node(m, 9).ref_count = None  # type: ignore[assignment]


def child_is_not_a_node(m: RadixCacheManager) -> None:
    m.root_node.children[42] = "a string"  # type: ignore[assignment]


def heap_out_of_order(m: RadixCacheManager) -> None:
    m._heap.append((-1, 0, node(m, 9)))  # the smallest entry, at the bottom of the heap


def heap_entry_names_another_node(m: RadixCacheManager) -> None:
    t, _, leaf = m._heap[0]
    m._heap[0] = (t, leaf.uid + 1000, leaf)


def heap_entry_malformed(m: RadixCacheManager) -> None:
    m._heap.append((1, 2))  # type: ignore[arg-type]


def heap_holds_a_node_of_another_tree(m: RadixCacheManager) -> None:
    other = RadixCacheManager(page_size=m.page_size)
    other.insert_prefix([5] * m.page_size, list(range(m.page_size)))
    (stranger,) = other.nodes()
    m._heap.append((stranger.timestamp + 10**6, stranger.uid, stranger))
    stranger.timestamp += 10**6


def clock_behind_the_timestamps(m: RadixCacheManager) -> None:
    m._clock = 0


def root_holds_a_token(m: RadixCacheManager) -> None:
    m.root_node.key = np.array([7], dtype=np.int64)
    m.root_node.value = torch.tensor([99], dtype=torch.int32)
    m.root_node.length = 1


def counter_not_an_int(m: RadixCacheManager) -> None:
    m.evictable_size = None  # type: ignore[assignment]


def held_slot_record_off(m: RadixCacheManager) -> None:
    m._slot_held[node(m, 9).value.tolist()] = False


Mutation = Callable[[RadixCacheManager], None]

CASES: list[tuple[Mutation, str, int]] = [
    (negative_ref_count, "ref_count", 1),
    (evictable_counter_off, "evictable_size", 1),
    (protected_counter_off, "protected_size", 1),
    (node_counter_off, "node count", 1),
    (child_under_wrong_key, "child key", 1),
    (child_under_wrong_key, "child key", 2),
    (broken_parent_link, "parent link", 1),
    (key_value_length_mismatch, "key/value length", 1),
    (slot_held_by_two_nodes, "slot held twice", 1),
    (slot_held_by_two_nodes, "slot held twice", 2),
    (empty_non_root_node, "empty node", 1),
    (misaligned_page, "page alignment", 2),
    (partial_page_node, "page alignment", 2),
    (lock_not_covering_the_path, "lock covers path", 1),
    (evictable_leaf_missing_from_heap, "evictable leaves", 1),
    (child_newer_than_parent, "LRU order", 1),
    (value_of_the_wrong_dtype, "value tensor", 1),
    (negative_slot, "slot range", 1),
    (root_unprotected, "root", 1),
    (lock_nobody_took, "lock accounting", 1),
    (lock_nobody_took, "lock accounting", 2),
    (top_leaf_locked_without_a_handle, "lock accounting", 1),
    (key_of_int32, "key array", 1),
    (key_of_floats, "key array", 1),
    (key_as_a_tensor, "key array", 1),
    (key_is_none, "key array", 1),
    (key_is_2d, "key array", 1),
    (value_is_none, "value tensor", 1),
    (value_is_2d, "value tensor", 1),
    (ref_count_is_none, "field types", 1),
    (child_is_not_a_node, "child type", 1),
    (heap_out_of_order, "eviction heap", 1),
    (heap_entry_names_another_node, "eviction heap", 1),
    (heap_entry_malformed, "eviction heap", 1),
    (heap_holds_a_node_of_another_tree, "eviction heap", 1),
    (clock_behind_the_timestamps, "clock", 1),
    (root_holds_a_token, "root", 1),
    (counter_not_an_int, "counters", 1),
    (held_slot_record_off, "held slots", 1),
    (held_slot_record_off, "held slots", 2),
]


@pytest.mark.parametrize("page_size", [1, 2])
def test_the_healthy_tree_passes(page_size: int) -> None:
    manager = healthy_tree(page_size)
    manager.check_integrity()
    # Unlocked: [3] and [9]; locked: [1, 2] and [4, 5]. Counted in slots, so doubled with page_size 2.
    assert manager.size_info == (2 * page_size, 4 * page_size)


@pytest.mark.parametrize(
    ("mutate", "invariant", "page_size"),
    CASES,
    ids=[f"{m.__name__}-ps{ps}" for m, _, ps in CASES],
)
def test_each_corruption_is_named(mutate: Mutation, invariant: str, page_size: int) -> None:
    manager = healthy_tree(page_size)
    manager.check_integrity()
    mutate(manager)
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.invariant == invariant, str(caught.value)
    assert str(caught.value).startswith(f"[{invariant}]")


def test_node_level_errors_point_at_the_node() -> None:
    manager = healthy_tree()
    negative_ref_count(manager)
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.node is node(manager, 1, 2, 3)


def test_global_counter_errors_have_no_node() -> None:
    manager = healthy_tree()
    evictable_counter_off(manager)
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.node is None


def test_every_invariant_check_integrity_names_has_a_mutation() -> None:
    # Every rule the modules can report (the first argument of each IntegrityError they raise) is
    # broken on purpose above, except "readable state", the net under the typed checks (next test).
    source = inspect.getsource(radix_manager) + inspect.getsource(integrity)
    named = set(re.findall(r'IntegrityError\(\s*"([^"]+)"', source))
    covered = {invariant for _, invariant, _ in CASES}
    assert named - covered == {"readable state"}, named - covered
    assert covered <= named


def test_state_too_broken_to_read_is_an_integrity_error_not_a_crash() -> None:
    manager = healthy_tree()
    node(manager, 9).children = None  # type: ignore[assignment]
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.invariant == "readable state" and "AttributeError" in str(caught.value)


def test_evict_on_a_counter_that_lies_raises_integrity_error_not_index_error() -> None:
    manager = healthy_tree()
    manager._heap.clear()
    with pytest.raises(IntegrityError, match="evictable_size"):
        manager.evict(1)
