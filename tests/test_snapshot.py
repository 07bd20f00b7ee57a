"""minikv.snapshot: one read of a radix tree into plain values, shared by the drawings, the checks and the book."""

from __future__ import annotations

import pytest

from minikv import RadixCacheManager, RadixTreeNode
from minikv.course.vocab import Vocab
from minikv.errors import ArgumentError, ArgumentTypeError, IntegrityError
from minikv.snapshot import NodeView, TreeSnapshot, diff_snapshots, node_path, outline


def family() -> RadixCacheManager:
    """[1 2] with children [3 4] and [5 6] (a split), and [7 8 9]; the path to [5 6] locked."""
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
    manager.insert_prefix([1, 2, 5, 6], [4, 5, 6, 7])
    manager.insert_prefix([7, 8, 9], [8, 9, 10])
    handle, _ = manager.match_prefix([1, 2, 5, 6])
    manager.lock_handle(handle)
    return manager


def public_state(manager: RadixCacheManager) -> list[tuple]:
    """Every node's fields, read directly (to show a snapshot changes nothing)."""
    out, stack = [], [manager.root_node]
    while stack:
        node = stack.pop()
        out.append((node.uid, node.key.tolist(), node.value.tolist(), node.ref_count, node.timestamp))
        stack.extend(node.children.values())
    return sorted(out)


def test_nodes_are_named_by_token_path() -> None:
    manager = family()
    snap = TreeSnapshot.of(manager)
    assert sorted(snap.nodes) == [(), (1, 2), (1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9)]
    upper = snap.nodes[(1, 2)]
    assert (upper.tokens, upper.slots, upper.parent, upper.start) == ((1, 2), (0, 1), (), 0)
    assert upper.child_paths == ((1, 2, 3, 4), (1, 2, 5, 6))
    lower = snap.nodes[(1, 2, 3, 4)]
    assert (lower.tokens, lower.slots, lower.parent, lower.filed_under) == ((3, 4), (2, 3), (1, 2), 3)
    assert [v.state for v in snap.depth_first()] == ["root", "protected", "evictable", "protected", "evictable"]
    assert [v.path for v in snap.views()] == [(1, 2), (1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9)]
    assert snap.num_nodes == manager.num_nodes == 4
    assert snap.size_info == manager.size_info
    assert snap.slots() == [0, 1, 2, 3, 6, 7, 8, 9, 10]
    assert snap.path_along([1, 2, 5, 6, 0]) == ((1, 2), (1, 2, 5, 6))
    assert all(v.parent_ok for v in snap.depth_first())


def test_reading_changes_nothing() -> None:
    manager = family()
    before = public_state(manager)
    for _ in range(3):
        TreeSnapshot.of(manager)
    assert public_state(manager) == before


def test_equal_trees_give_equal_snapshots() -> None:
    first, second = family(), family()  # other node uids, same content
    assert TreeSnapshot.of(first) == TreeSnapshot.of(second)
    assert hash(TreeSnapshot.of(first)) == hash(TreeSnapshot.of(second))
    second.match_prefix([7, 8, 9])  # touches [7 8 9]: a new time stamp, and the clock moved
    assert TreeSnapshot.of(first) != TreeSnapshot.of(second)
    assert TreeSnapshot.of(second).clock == TreeSnapshot.of(first).clock + 1
    assert TreeSnapshot.of(second).nodes[(7, 8, 9)].timestamp == TreeSnapshot.of(second).clock


def test_outline_text() -> None:
    text = outline(TreeSnapshot.of(family()))
    assert text == (
        "root (ref_count 1)\n"
        "├─ [1, 2] · slots [0, 1] · ref 1 · t=4\n"
        "│  ├─ [3, 4] · slots [2, 3] · ref 0 · t=1\n"
        "│  └─ [5, 6] · slots [6, 7] · ref 1 · t=4\n"
        "└─ [7, 8, 9] · slots [8, 9, 10] · ref 0 · t=3\n"
        "evictable_size 5, protected_size 4"
    )  # [5 6] keeps slots 6, 7: the insert found [1 2] cached (its caller frees 4, 5)
    assert str(TreeSnapshot.of(family())) == text
    vocab = Vocab(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])
    worded = outline(TreeSnapshot.of(family()), vocab, values=False, times=False)
    assert worded.splitlines()[1] == "├─ [one two] · ref 1"
    long = RadixCacheManager()
    long.insert_prefix(list(range(12)), list(range(12)))
    assert "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, … 2 more]" in outline(TreeSnapshot.of(long))
    with pytest.raises(ArgumentTypeError):
        outline(family())  # a manager, not a snapshot


def test_a_broken_tree_is_recorded_as_it_is() -> None:
    manager = family()
    upper = manager.root_node.children[1]
    upper.children[9] = upper.children.pop(3)  # filed under the wrong first token
    empty = RadixTreeNode(manager.root_node.timestamp)  # no tokens: its path is the root's
    manager.root_node.children[42] = empty
    snap = TreeSnapshot.of(manager)
    views = list(snap.depth_first())
    assert len(views) == 6 and snap.num_nodes == 5
    assert [v.filed_under for v in snap.root.children] == [1, 7, 42]
    assert [v.filed_under for v in snap.nodes[(1, 2)].children] == [5, 9]  # by key, as they are filed
    assert snap.nodes[()].is_root and not views[-1].is_root  # the empty node does not hide the root
    assert views[-1].parent_ok is False  # its parent link was never set
    assert "parent link broken" in outline(snap).splitlines()[-2]


def test_a_loop_stops_the_walk() -> None:
    manager = family()
    leaf = manager.root_node.children[7]
    leaf.children[7] = leaf  # a node listed as its own child
    for max_nodes in (50, None):  # found as a cycle, with or without a bound on the size
        with pytest.raises(IntegrityError, match="its own ancestor: the tree has a cycle"):
            TreeSnapshot.of(manager, max_nodes=max_nodes)


def test_max_nodes_stops_the_walk_of_a_tree_larger_than_expected() -> None:
    manager = RadixCacheManager()
    for first in range(60):
        manager.insert_prefix([first, 1], [2 * first, 2 * first + 1])
    with pytest.raises(IntegrityError, match="more than 50 nodes"):
        TreeSnapshot.of(manager, max_nodes=50)
    assert TreeSnapshot.of(manager, max_nodes=60).num_nodes == 60


def test_a_deep_chain_needs_no_recursion() -> None:
    manager = RadixCacheManager()
    for n in range(1, 2001):  # each insert adds one node under the last: depth 2000
        manager.insert_prefix(list(range(n)), list(range(n)))
    snap = TreeSnapshot.of(manager)
    assert snap.num_nodes == 2000 and snap == TreeSnapshot.of(manager)
    assert len(outline(snap).splitlines()) == 2002


def test_paged_tree() -> None:
    manager = RadixCacheManager(page_size=2)
    manager.insert_prefix([0, 1, 2, 3], [0, 1, 2, 3])
    manager.insert_prefix([0, 1, 7, 7], [4, 5, 6, 7])
    snap = TreeSnapshot.of(manager)
    assert snap.page_size == 2
    assert [v.filed_under for v in snap.nodes[(0, 1)].children] == [(2, 3), (7, 7)]


def test_diff_names_split_insert_evict_and_lock() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    before = TreeSnapshot.of(manager)
    manager.insert_prefix([1, 2, 9], [3, 4, 5])
    after = TreeSnapshot.of(manager)
    changes = diff_snapshots(before, after, walked=[1, 2])
    assert changes.split == (((1, 2), (1, 2, 3)),)
    assert changes.split_before == (before.nodes[(1, 2, 3)],)
    assert changes.inserted == ((1, 2, 9),) and changes.walked == ((1, 2),)
    assert changes.event_of((1, 2)) == "split" and changes.event_of((1, 2, 9)) == "inserted"
    handle, _ = manager.match_prefix([1, 2, 9])
    manager.lock_handle(handle)
    locked = TreeSnapshot.of(manager)
    assert diff_snapshots(after, locked).ref_changed == ((1, 2), (1, 2, 9))
    manager.evict(1)
    gone = diff_snapshots(locked, TreeSnapshot.of(manager))
    assert [v.path for v in gone.evicted] == [(1, 2, 3)]
    assert diff_snapshots(gone_snapshot := TreeSnapshot.of(manager), gone_snapshot).empty


def test_node_path_and_views() -> None:
    manager = family()
    handle, _ = manager.match_prefix([1, 2, 5, 6])
    assert node_path(handle.node) == (1, 2, 5, 6)
    assert node_path(manager.root_node) == ()
    view = TreeSnapshot.of(manager).nodes[(1, 2, 5, 6)]
    assert isinstance(view, NodeView) and "path=[1, 2, 5, 6]" in repr(view) and "0x" not in repr(view)
    assert repr(TreeSnapshot.of(manager)) == "<TreeSnapshot: 4 nodes, 9 slots (4 protected, 5 evictable)>"


def test_needs_a_tree() -> None:
    with pytest.raises(ArgumentTypeError, match="RadixCacheManager"):
        TreeSnapshot.of(object())


def test_the_module_example_runs() -> None:
    import doctest

    import minikv.snapshot

    result = doctest.testmod(minikv.snapshot, extraglobs={"RadixCacheManager": RadixCacheManager})
    assert result.attempted == 3 and result.failed == 0


# -- who owns each slot ------------------------------------------------------------------


def test_slot_ownership_names_every_owner() -> None:
    from minikv import PagePool, admit, finish
    from minikv.snapshot import SLOT_STATES, SlotOwnership

    manager, pool = RadixCacheManager(), PagePool(10)
    first = admit(manager, pool, [1, 2, 3])
    finish(manager, pool, first)  # [1 2 3] cached in slots 0-2, unlocked
    running = admit(manager, pool, [1, 2, 7, 8])  # matches [1 2] (locks it), holds 2 new slots
    owners = SlotOwnership.of(TreeSnapshot.of(manager), pool)
    assert owners.num_slots == 10 and tuple(owners.counts()) == tuple(SLOT_STATES)
    new = running.indices[running.cached_len :].tolist()
    assert owners.slots("locked") == [0, 1]  # the running request's matched prefix
    assert owners.slots("evictable") == [2]
    assert owners.slots("request") == sorted(new)
    assert owners.slots("free") == sorted(pool.free_slots().tolist())
    assert str(owners) == "LLe" + "".join("r" if s in new else "." for s in range(3, 10))
    assert owners.counts() == {"free": 5, "evictable": 1, "locked": 2, "evicted": 0, "request": 2, "conflict": 0}


def test_evicted_slots_are_on_their_way_not_owned_by_a_request() -> None:
    from minikv import PagePool, admit, finish
    from minikv.snapshot import SlotOwnership

    manager, pool = RadixCacheManager(), PagePool(6)
    finish(manager, pool, admit(manager, pool, [1, 2, 3]))
    finish(manager, pool, admit(manager, pool, [1, 4]))  # tree: [1] -> [2 3], [4]; no request runs
    evicted = manager.evict(2)  # the caller holds these until it frees them into the pool
    assert len(evicted) == 2
    blind = SlotOwnership.of(TreeSnapshot.of(manager), pool)  # the pool alone cannot tell
    assert blind.slots("request") == sorted(evicted.tolist())
    owners = SlotOwnership.of(TreeSnapshot.of(manager), pool, evicted=evicted)
    assert owners.slots("evicted") == sorted(evicted.tolist()) and owners.slots("request") == []
    assert owners.counts()["evicted"] == 2 and "x" in str(owners) and "r" not in str(owners)
    pool.free(evicted)
    back = SlotOwnership.of(TreeSnapshot.of(manager), pool, evicted=evicted)  # back in the pool: free
    assert back.slots("evicted") == [] and set(evicted.tolist()) <= set(back.slots("free"))
    tree_slot = back.slots("evictable")[0]  # a slot still in the tree stays the tree's
    assert SlotOwnership.of(TreeSnapshot.of(manager), pool, evicted=[tree_slot]).states == back.states
    with pytest.raises(ArgumentTypeError, match="evicted"):
        SlotOwnership.of(TreeSnapshot.of(manager), pool, evicted="01")
    with pytest.raises(ArgumentError, match="evicted: slot 6"):
        SlotOwnership.of(TreeSnapshot.of(manager), pool, evicted=[0, 6])


def test_a_slot_with_two_owners_is_a_conflict() -> None:
    from minikv import PagePool
    from minikv.snapshot import SlotOwnership

    manager, pool = RadixCacheManager(), PagePool(4)
    slots = pool.allocate(2)
    manager.insert_prefix([5, 6], slots)
    pool.free(slots[:1])  # the step-5 slice bug: a slot the tree still holds goes back to the pool
    owners = SlotOwnership.of(TreeSnapshot.of(manager), pool)
    assert owners.slots("conflict") == [int(slots[0])]
    assert SlotOwnership.of(None, pool).slots("free") == sorted(pool.free_slots().tolist())  # no tree
    with pytest.raises(ArgumentTypeError):
        SlotOwnership.of(None, object())
    with pytest.raises(ArgumentTypeError, match="state"):
        owners.slots("borrowed")
