"""The notes' worked examples (§13.4 "Hello world / Hello there / Hello world how are you",
§13.5 the root, §13.6 identical requests), run for real, step by step.

The notes get two things wrong that these tests pin down (research/kv_anchors.md §7):

* ``insert_prefix([Hello, there], [page_3])`` passes two tokens and one slot, which
  the tree refuses; callers pass the request's whole row of slots, one per token,
  and free ``indices[cached_len:already_cached]`` afterwards (§7.2);
* a running request's *own* tokens are not in the tree: Request 3 locks only the
  prefix it matched, and its "how are you" joins the tree when it finishes (§7.6c);
  and ``evict(2)`` with one evictable slot fails before evicting anything (§7.3).
"""

from __future__ import annotations

import pytest
from helpers import assert_pages_accounted, manager_snapshot, nodes_with_prefix, pool_snapshot, tree_slots

from minikv import PagePool, RadixCacheManager, Request, SizeInfo, admit, finish
from minikv.errors import ArgumentError, EvictionError

HELLO, WORLD, THERE, HOW, ARE, YOU = 101, 102, 103, 104, 105, 106


def shape(manager: RadixCacheManager) -> dict[tuple[int, ...], tuple[tuple[int, ...], int]]:
    """{tokens from the root to the end of a node: (its slots, its ref_count)}."""
    return {
        prefix + tuple(node.key.tolist()): (tuple(node.value.tolist()), node.ref_count)
        for prefix, node in nodes_with_prefix(manager)
    }


def check_accounting(manager: RadixCacheManager, pool: PagePool, running: list[Request]) -> None:
    manager.check_integrity()
    holders = {"tree": tree_slots(manager)}
    holders.update({f"request {i}": r.own_slots().tolist() for i, r in enumerate(running)})
    assert_pages_accounted(pool, holders)


def test_section_13_4_hello_world_step_by_step() -> None:
    manager, pool = RadixCacheManager(), PagePool(num_pages=16)

    # Requests 1 and 2 are scheduled together, before either finishes: neither finds anything cached.
    r1 = admit(manager, pool, [HELLO, WORLD])
    r2 = admit(manager, pool, [HELLO, THERE])
    assert (r1.cached_len, r1.indices.tolist()) == (0, [0, 1])
    assert (r2.cached_len, r2.indices.tolist()) == (0, [2, 3])
    check_accounting(manager, pool, [r1, r2])

    # Step 1: Request 1 finishes. root -> Node1 [Hello, world] = slots [0, 1].
    assert finish(manager, pool, r1) == 0
    assert shape(manager) == {(HELLO, WORLD): ((0, 1), 0)}
    assert manager.size_info == SizeInfo(evictable_size=2, protected_size=0)
    check_accounting(manager, pool, [r2])

    # Step 2 as the notes write it -- two tokens, one slot -- is refused and changes nothing.
    before = manager_snapshot(manager)
    with pytest.raises(ArgumentError, match="indices"):
        manager.insert_prefix([HELLO, THERE], [3])
    assert manager_snapshot(manager) == before

    # Step 2 done right: Request 2 passes its whole row [2, 3]. "Hello" is already cached (1 token),
    # so Node1 splits after "Hello" and only "there" joins, with slot 3. Request 2 frees its own
    # duplicate "Hello" slot: indices[cached_len=0 : already_cached=1] = [2].
    free_before = pool.num_free_pages
    assert finish(manager, pool, r2) == 1
    assert pool.num_free_pages == free_before + 1 and 2 in pool.free_slots().tolist()
    assert shape(manager) == {
        (HELLO,): ((0,), 0),
        (HELLO, WORLD): ((1,), 0),
        (HELLO, THERE): ((3,), 0),
    }
    assert manager.num_nodes == 3
    assert manager.size_info == SizeInfo(3, 0)
    check_accounting(manager, pool, [])

    # Step 3: Request 3 arrives. It matches "Hello world" (Node1 -> Node2) and locks that path;
    # its three new tokens get slots of their own (the freed slot 2 first) but are not in the tree yet.
    r3 = admit(manager, pool, [HELLO, WORLD, HOW, ARE, YOU])
    assert r3.cached_len == 2
    assert r3.indices.tolist() == [0, 1, 2, 4, 5]
    assert r3.handle.node is manager.root_node.children[HELLO].children[WORLD]
    assert shape(manager) == {
        (HELLO,): ((0,), 1),
        (HELLO, WORLD): ((1,), 1),
        (HELLO, THERE): ((3,), 0),
    }
    assert manager.size_info == SizeInfo(evictable_size=1, protected_size=2)
    check_accounting(manager, pool, [r3])

    # Step 4 (the notes' step 5): evict 2 while Request 3 runs. Only Node3 ("there", 1 slot) is
    # evictable, so the call fails up front -- it does not evict Node3 and then give up.
    before, pool_before = manager_snapshot(manager), pool_snapshot(pool)
    with pytest.raises(EvictionError, match="size"):
        manager.evict(2)
    assert manager_snapshot(manager) == before and pool_snapshot(pool) == pool_before

    # Step 5: Request 3 finishes. "how are you" joins below Node2 as Node4 with slots [2, 4, 5];
    # nothing is a duplicate (indices[2:2] is empty) and every lock is released.
    assert finish(manager, pool, r3) == 2
    assert shape(manager) == {
        (HELLO,): ((0,), 0),
        (HELLO, WORLD): ((1,), 0),
        (HELLO, THERE): ((3,), 0),
        (HELLO, WORLD, HOW, ARE, YOU): ((2, 4, 5), 0),
    }
    assert manager.size_info == SizeInfo(6, 0)
    check_accounting(manager, pool, [])

    # Step 6: now evict 2. Node3 is the least recently used leaf (1 slot), then Node4 (3 slots):
    # 4 slots come back, more than asked, because whole nodes are evicted.
    evicted = manager.evict(2)
    assert evicted.tolist() == [3, 2, 4, 5]
    pool.free(evicted)
    assert shape(manager) == {(HELLO,): ((0,), 0), (HELLO, WORLD): ((1,), 0)}
    assert manager.size_info == SizeInfo(2, 0)
    check_accounting(manager, pool, [])


def test_section_13_5_the_root_is_always_protected_and_never_evicted() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([HELLO], [0])
    manager.insert_prefix([HOW], [1])
    manager.insert_prefix([WORLD], [2])
    assert set(manager.root_node.children) == {HELLO, HOW, WORLD}
    assert sorted(manager.evict(3).tolist()) == [0, 1, 2]
    assert manager.root_node.ref_count == 1 and manager.root_node.is_leaf()
    assert manager.size_info == SizeInfo(0, 0)  # the root holds no slots and is never counted
    manager.check_integrity()


def test_section_13_6_identical_requests_refresh_the_lru_time() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([HELLO, WORLD], [0, 1])
    node1 = manager.root_node.children[HELLO]
    times = [node1.timestamp]
    for _ in range(2):  # Request 1, then Request 2 with the very same tokens
        handle, indices = manager.match_prefix([HELLO, WORLD])
        assert handle.node is node1 and handle.cached_len == 2 and indices.tolist() == [0, 1]
        times.append(node1.timestamp)
    assert times[0] < times[1] < times[2]
    assert manager.num_nodes == 1 and manager.size_info == SizeInfo(2, 0)  # no split, nothing new
    manager.check_integrity()


def test_section_13_6_a_refreshed_prefix_outlives_a_newer_one() -> None:
    # Why the refresh matters: [Hello, world] was cached first, but it is used again,
    # so the other prefix is now the least recently used and is evicted first.
    manager = RadixCacheManager()
    manager.insert_prefix([HELLO, WORLD], [0, 1])
    manager.insert_prefix([HOW, ARE], [2, 3])
    manager.match_prefix([HELLO, WORLD])
    assert manager.evict(1).tolist() == [2, 3]
    assert shape(manager) == {(HELLO, WORLD): ((0, 1), 0)}
