"""Exercise 5's checks (``minikv.exercises.radix``): the radix cache's methods, each with rules switched off.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import pytest
import torch
from exercise_helpers import S, WrongAnswers, chapter_tests

import minikv
from minikv import RadixTreeNode
from minikv.errors import EvictionError, IntegrityError, LockError
from minikv.exercises import _core, check
from minikv.radix_manager import child_key

WRONG = WrongAnswers()
wrong = WRONG.register


@wrong("radix.match_len")
def match_len_shorter_length(key, input_ids):
    return min(len(key), len(input_ids))


@wrong("radix.match_len")
def match_len_off_by_one(key, input_ids):
    n = min(len(key), len(input_ids))
    differ = np.flatnonzero(key[:n] != input_ids[:n])
    return int(differ[0]) + 1 if len(differ) else n


@wrong("radix.match_len")
def match_len_unbounded(key, input_ids):
    i = 0
    while key[i] == input_ids[i]:  # runs off the end of a full match
        i += 1
    return i


def _split_variant(
    *, copy_ref: bool = True, link_lower: bool = True, keep_lower: bool = True, copy_time: bool = True
) -> Callable:
    def split_at(node, pos, page_size=1):
        if not 0 < pos < node.length:
            raise ValueError("pos")
        if not keep_lower:  # the given node becomes the upper half; a new node takes the rest
            lower = RadixTreeNode(node.timestamp)
            lower.set_key_value(node.key[pos:], node.value[pos:])
            lower.ref_count = node.ref_count
            for child in list(node.children.values()):
                child.set_parent(lower, page_size)
            node.children.clear()
            node.set_key_value(node.key[:pos], node.value[:pos])
            lower.set_parent(node, page_size)
            return node
        upper = RadixTreeNode(node.timestamp if copy_time else 0)
        upper.set_key_value(node.key[:pos], node.value[:pos])
        if copy_ref:
            upper.ref_count = node.ref_count
        upper.set_parent(node.parent, page_size)
        node.set_key_value(node.key[pos:], node.value[pos:])
        if link_lower:
            node.set_parent(upper, page_size)
        else:
            upper.children[child_key(node.key, page_size)] = node  # listed, but node.parent is stale
        return upper

    return split_at


def test_the_split_variant_without_changes_passes() -> None:
    assert check("radix.split_at", _split_variant()).passed


WRONG["radix.split_at"] = [
    _split_variant(copy_ref=False),
    _split_variant(link_lower=False),
    _split_variant(keep_lower=False),
    _split_variant(copy_time=False),
]


def _walk_variant(*, split: bool = True, stamp_lower: bool = False, align: bool = True, stamp: bool = True) -> Callable:
    def walk(manager, input_ids):
        ps = manager.page_size
        now = manager.tick()
        node, prefix_len = manager.root_node, 0
        total = len(input_ids) - len(input_ids) % ps if align else len(input_ids)
        while prefix_len < total:
            child = node.children.get(child_key(input_ids[prefix_len:], ps))
            if child is None:
                break
            matched = S["match_len"](child.key, input_ids[prefix_len:total])
            if align:
                matched -= matched % ps
            prefix_len += matched
            if matched < child.length:
                if split:
                    if stamp_lower:
                        child.timestamp = now
                    node = S["split_at"](child, matched, ps)
                    if stamp:
                        node.timestamp = now
                else:
                    node = child
                break
            node = child
            if stamp:
                node.timestamp = now
        return node, prefix_len

    return walk


def test_the_walk_variant_without_changes_passes() -> None:
    assert check("radix.walk", _walk_variant()).passed


WRONG["radix.walk"] = [
    _walk_variant(split=False),
    _walk_variant(stamp_lower=True),
    _walk_variant(align=False),
    _walk_variant(stamp=False),
]


def _lock_variant(
    *, skip_own: bool = False, touch_root: bool = False, every_change: bool = False, check_unlock: bool = True
) -> Callable:
    def lock_handle(manager, handle, unlock=False):
        path, node = [], handle.node
        if node is manager.root_node and not touch_root:
            return
        if skip_own:
            node = node.parent
        while node is not None and (touch_root or node is not manager.root_node):
            path.append(node)
            node = node.parent
        if unlock and check_unlock and any(n.ref_count <= 0 for n in path):
            raise LockError("not locked")
        for n in path:
            before = n.ref_count
            n.ref_count += -1 if unlock else 1
            moved = every_change or (before == 0) != (n.ref_count == 0)
            if moved and n is not manager.root_node:
                sign = 1 if unlock else -1
                manager.evictable_size += sign * n.length
                manager.protected_size -= sign * n.length

    return lock_handle


def test_the_lock_variant_without_changes_passes() -> None:
    assert check("radix.lock_handle", _lock_variant()).passed


WRONG["radix.lock_handle"] = [
    _lock_variant(skip_own=True),
    _lock_variant(touch_root=True),
    _lock_variant(every_change=True),
    _lock_variant(check_unlock=False),
]


def _evict_variant(
    *, respect_locks: bool = True, lru: bool = True, parents: bool = True, count: bool = True, empty_dtype=torch.int32
) -> Callable:
    def evict(manager, size):
        if size < 0:
            raise ValueError("size")
        if size == 0:
            return torch.empty(0, dtype=empty_dtype)
        if size > manager.evictable_size:
            raise EvictionError("too much")
        heap, stack, order = [], [manager.root_node], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not manager.root_node and not node.children and (node.ref_count == 0 or not respect_locks):
                order += 1
                heap.append(((node.timestamp if lru else order), node.uid, node))
        heapq.heapify(heap)
        freed, evicted = 0, []
        while freed < size and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[child_key(node.key, manager.page_size)]
            if count:
                manager.evictable_size -= node.length
            freed += node.length
            evicted.append(node.value)
            if parents and parent is not manager.root_node and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, (parent.timestamp if lru else 0, parent.uid, parent))
        return torch.cat(evicted) if evicted else torch.empty(0, dtype=torch.int32)

    return evict


def test_the_evict_variant_without_changes_passes() -> None:
    assert check("radix.evict", _evict_variant()).passed


WRONG["radix.evict"] = [
    _evict_variant(respect_locks=False),
    _evict_variant(lru=False),
    _evict_variant(parents=False),
    _evict_variant(count=False),
    _evict_variant(empty_dtype=torch.float32),
]


def _insert_variant(
    *, align: bool = True, clone: bool = True, count: bool = True, page_key: bool = True, returns_prefix: bool = True
) -> Callable:
    def page_aligned_insert(manager, input_ids, indices):
        ps = manager.page_size
        aligned = len(input_ids) - len(input_ids) % ps if align else len(input_ids)
        node, prefix_len = manager.walk(input_ids[:aligned])
        if prefix_len < aligned:
            leaf = RadixTreeNode(manager.clock)
            value = indices[prefix_len:aligned]
            leaf.set_key_value(
                torch.from_numpy(input_ids[prefix_len:aligned].copy()), value.clone() if clone else value
            )
            leaf.set_parent(node, ps if page_key else 1)
            if count:
                manager.evictable_size += leaf.length
        return prefix_len if returns_prefix else aligned

    return page_aligned_insert


def test_the_insert_variant_without_changes_passes() -> None:
    assert check("radix.page_aligned_insert", _insert_variant()).passed


WRONG["radix.page_aligned_insert"] = [
    _insert_variant(align=False),
    _insert_variant(clone=False),
    _insert_variant(count=False),
    _insert_variant(page_key=False),
    _insert_variant(returns_prefix=False),
]


def _integrity_skipping(*rules: str) -> Callable:
    """The solution's check_integrity with some rules left out, as a learner might forget them."""

    def check_integrity(manager):
        root, ps = manager.root_node, manager.page_size
        if "root" not in rules and (root.ref_count != 1 or root.length != 0 or root.parent is not None):
            raise IntegrityError("root", "bad root")
        evictable = protected = 0
        seen: set[int] = set()
        stack = [root]
        while stack:
            parent = stack.pop()
            for key, node in parent.children.items():
                if "parent" not in rules and node.parent is not parent:
                    raise IntegrityError("parent link", "")
                if "empty" not in rules and node.length == 0:
                    raise IntegrityError("empty node", "")
                if "lengths" not in rules and (len(node.key) != node.length or len(node.value) != node.length):
                    raise IntegrityError("key/value length", "")
                if "key" not in rules and node.length and child_key(node.key, ps) != key:
                    raise IntegrityError("child key", "")
                if "negative" not in rules and node.ref_count < 0:
                    raise IntegrityError("ref_count", "")
                if "monotone" not in rules and parent is not root and node.ref_count > parent.ref_count:
                    raise IntegrityError("lock covers path", "")
                if "lru" not in rules and parent is not root and node.timestamp > parent.timestamp:
                    raise IntegrityError("LRU order", "")
                if "pages" not in rules and ps > 1:
                    if node.length % ps:
                        raise IntegrityError("page alignment", "")
                    pages = node.value.view(-1, ps).long()
                    if bool((pages[:, 0] % ps != 0).any()) or not torch.equal(
                        pages - pages[:, :1], torch.arange(ps).expand_as(pages)
                    ):
                        raise IntegrityError("page alignment", "")
                if "slots" not in rules:
                    for slot in node.value.tolist():
                        if slot in seen:
                            raise IntegrityError("slot held twice", "")
                        seen.add(slot)
                if node.ref_count == 0:
                    evictable += node.length
                else:
                    protected += node.length
                stack.append(node)
        if "sizes" not in rules and (evictable != manager.evictable_size or protected != manager.protected_size):
            raise IntegrityError("sizes", "")

    check_integrity.__name__ = "check_integrity_without_" + "_".join(rules)
    return check_integrity


def test_the_integrity_variant_without_omissions_passes() -> None:
    assert check("radix.check_integrity", _integrity_skipping()).passed


WRONG["radix.check_integrity"] = [
    _integrity_skipping(rule)
    for rule in ("root", "parent", "empty", "lengths", "key", "monotone", "lru", "pages", "slots", "sizes")
] + [
    _integrity_skipping("negative", "sizes"),
    lambda manager: None,  # mini-sglang's: `pass`
]


def _always_raises(manager):
    raise IntegrityError("paranoid", "everything looks wrong to me")


WRONG["radix.check_integrity"].append(_always_raises)


def test_the_smallest_failing_case_is_reported() -> None:
    result = check("radix.evict", _evict_variant(parents=False))
    failing = [case for case in result.cases if not case.passed]
    assert len(failing) >= 2
    assert result.smallest_failure is min(failing, key=lambda case: case.size)


def test_minikv_check_integrity_agrees_with_every_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """The corruptions shown to learners are real: minikv's own check rejects each and passes the healthy trees."""
    import dataclasses

    entry = _core.REGISTRY["radix.check_integrity"]
    monkeypatch.setitem(_core.REGISTRY, "radix.check_integrity", dataclasses.replace(entry, forbidden=()))
    result = check("radix.check_integrity", minikv.RadixCacheManager.check_integrity)
    assert result.passed, str(result)
    assert sum(case.description.startswith("catch:") for case in result.cases) >= 12


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("radix", WRONG)
