"""``check_integrity`` really checks: each corruption below breaks one invariant on purpose.

Every mutation starts from a healthy tree (which must pass), breaks exactly one
rule by reaching into the nodes, and expects an :class:`IntegrityError` whose
``invariant`` names that rule -- not just *some* error.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import nodes_with_prefix

from minikv import RadixCacheManager, RadixTreeNode
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
    node(m, 1, 2, 3)._parent = node(m, 9)


def key_value_length_mismatch(m: RadixCacheManager) -> None:
    leaf = node(m, 1, 2, 4, 5)
    leaf._value = leaf._value[:-1]


def slot_held_by_two_nodes(m: RadixCacheManager) -> None:
    # [9] now claims the slots of [3]: same length, so only the sharing is wrong.
    node(m, 9)._value = node(m, 1, 2, 3)._value.clone()


def empty_non_root_node(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf._key = leaf._key[:0]
    leaf._value = leaf._value[:0]
    leaf._length = 0


def misaligned_page(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf._value = leaf._value + 1  # still unique slots, but the page starts mid-page


def partial_page_node(m: RadixCacheManager) -> None:
    # [4, 5] (two pages) loses its last token and slot: key and value still agree, but end mid-page.
    leaf = node(m, 1, 2, 4, 5)
    leaf._key, leaf._value = leaf._key[:-1], leaf._value[:-1]
    leaf._length -= 1


def lock_not_covering_the_path(m: RadixCacheManager) -> None:
    # [3] claims a second lock that its parent [1, 2] never received.
    leaf = node(m, 1, 2, 3)
    leaf.ref_count = node(m, 1, 2).ref_count + 1
    m.evictable_size -= leaf.length
    m.protected_size += leaf.length


def evictable_leaf_missing_from_heap(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    m._evictable_leaves = [entry for entry in m._evictable_leaves if entry[2] is not leaf]


def child_newer_than_parent(m: RadixCacheManager) -> None:
    node(m, 1, 2, 3).timestamp = node(m, 1, 2).timestamp + 5


def value_of_the_wrong_dtype(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf._value = leaf._value.to(torch.int64)


def negative_slot(m: RadixCacheManager) -> None:
    leaf = node(m, 9)
    leaf._value = leaf._value - 10_000


def root_unprotected(m: RadixCacheManager) -> None:
    m.root_node.ref_count = 0


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


def test_at_least_eight_distinct_rules_are_covered() -> None:
    assert len({invariant for _, invariant, _ in CASES}) >= 8
