"""Exercise 5's checks (``minikv.exercises.radix``): the learner's MyRadixCache, one method per check.

A wrong answer (mutant) here is the solution's class with one method replaced by a plausible
wrong one; a correct alternative is the same class with a method written differently (a loop
instead of NumPy, recursion instead of a stack, a sort instead of a heap), which must pass.
How mutants are registered and run: ``exercise_helpers.py``.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from exercise_helpers import SOLUTIONS, WrongAnswers, chapter_ids, chapter_tests, solution_for

from minikv import RadixCacheManager, RadixTreeNode
from minikv.errors import EvictionError, IntegrityError, LockError
from minikv.exercises import check
from minikv.exercises import radix as radix_checks
from minikv.radix_manager import child_key

NS = SOLUTIONS["ex5_radix"]
Base, Paged = NS["MyRadixCache"], NS["MyPagedRadixCache"]
token_array, slot_tensor = NS["token_array"], NS["slot_tensor"]

WRONG = WrongAnswers()
RIGHT: dict[str, list[type]] = {}
"""Correct alternatives, by exercise id: each must pass."""


def variant(base: type = Base, **methods: Callable) -> type:
    """The solution's class with some methods replaced."""
    name = "_".join(methods) or "same"
    return type(f"{base.__name__}_{name}", (base,), dict(methods))


def wrong(exercise_id: str, base: type = Base, **methods: Callable) -> type:
    cls = variant(base, **methods)
    WRONG.setdefault(exercise_id, []).append(cls)
    return cls


def right(exercise_id: str, base: type = Base, **methods: Callable) -> type:
    cls = variant(base, **methods)
    RIGHT.setdefault(exercise_id, []).append(cls)
    return cls


# -- radix.match_len ------------------------------------------------------------------------------


def _ml_shorter(self, key, input_ids):
    return min(len(key), len(input_ids))


def _ml_off_by_one(self, key, input_ids):
    n = min(len(key), len(input_ids))
    differ = np.flatnonzero(key[:n] != input_ids[:n])
    return int(differ[0]) + 1 if len(differ) else n


def _ml_unbounded(self, key, input_ids):
    i = 0
    while key[i] == input_ids[i]:  # runs off the end of a full match
        i += 1
    return i


def _ml_int32(self, key, input_ids):  # small token ids only: ids above 2**31 wrap around
    a, b = key.astype(np.int32), input_ids.astype(np.int32)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _ml_float(self, key, input_ids):  # float64 cannot tell apart ids above 2**53
    a, b = key.astype(np.float64), input_ids.astype(np.float64)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


for fn in (_ml_shorter, _ml_off_by_one, _ml_unbounded, _ml_int32, _ml_float):
    wrong("radix.match_len", match_len=fn)


def _ml_loop(self, key, input_ids):
    n = 0
    for a, b in zip(key, input_ids, strict=False):
        if a != b:
            break
        n += 1
    return n


def _ml_bytes(self, key, input_ids):
    a, b = key.tobytes(), input_ids.tobytes()  # the same ids as raw bytes: the common bytes, in whole ids
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // 8


right("radix.match_len", match_len=_ml_loop)
right("radix.match_len", match_len=_ml_bytes)


# -- radix.split_at ---------------------------------------------------------------------------------


def _split_variant(
    *, copy_ref=True, link_lower=True, keep_lower=True, copy_time=True, pages=True, tick=False, check=True
):
    def split_at(self, node, pos):
        ps = self.page_size if pages else 1
        if check and not 0 < pos < node.length:
            raise ValueError("pos")
        if not keep_lower:  # the given node becomes the upper half; a new node takes the rest
            lower = RadixTreeNode(node.timestamp)
            lower.set_key_value(node.key[pos:], node.value[pos:])
            lower.ref_count = node.ref_count
            for child in list(node.children.values()):
                child.set_parent(lower, ps)
            node.children.clear()
            node.set_key_value(node.key[:pos], node.value[:pos])
            lower.set_parent(node, ps)
            return node
        upper = RadixTreeNode(node.timestamp if copy_time else 0)
        upper.set_key_value(node.key[:pos], node.value[:pos])
        if copy_ref:
            upper.ref_count = node.ref_count
        upper.set_parent(node.parent, ps)
        node.set_key_value(node.key[pos:], node.value[pos:])
        if link_lower:
            node.set_parent(upper, ps)
        else:
            upper.children[child_key(node.key, ps)] = node  # listed, but node.parent is stale
        if tick:
            upper.timestamp = self.tick()
        return upper

    return split_at


for flags in (
    {"copy_ref": False},
    {"link_lower": False},
    {"keep_lower": False},
    {"copy_time": False},
    {"pages": False},
    {"tick": True},
    {"check": False},
):
    wrong("radix.split_at", split_at=_split_variant(**flags))


def _split_cycle(self, node, pos):  # files the lower half under itself: a cycle
    upper = _split_variant()(self, node, pos)
    node.children[10**6] = upper
    return upper


wrong("radix.split_at", split_at=_split_cycle)


def _split_manual(self, node, pos):
    if not 0 < pos < node.length:
        raise ValueError(f"bad pos {pos}")
    parent, ps = node.parent, self.page_size
    upper = RadixTreeNode(node.timestamp)
    upper.key, upper.value, upper.length = node.key[:pos].copy(), node.value[:pos].clone(), pos
    upper.ref_count, upper.parent = node.ref_count, parent
    parent.children[child_key(upper.key, ps)] = upper
    node.key, node.value, node.length = node.key[pos:].copy(), node.value[pos:].clone(), node.length - pos
    node.parent = upper
    upper.children = {child_key(node.key, ps): node}
    return upper


right("radix.split_at", split_at=_split_manual)


# -- radix.walk ------------------------------------------------------------------------------------


def _walk_variant(*, split=True, stamp_lower=False, stamp=True, split_prefix=True, tick_each=False):
    def walk(self, input_ids):
        now = self.tick()
        node, prefix_len = self.root_node, 0
        while prefix_len < len(input_ids):
            child = node.children.get(child_key(input_ids[prefix_len:], self.page_size))
            if child is None:
                break
            matched = self.match_len(child.key, input_ids[prefix_len:])
            if matched < child.length and not split_prefix and prefix_len + matched == len(input_ids):
                break  # the input ends inside the node: forgets to count (and split) it
            prefix_len += matched
            if tick_each:
                now = self.tick()
            if matched < child.length:
                if split:
                    if stamp_lower:
                        child.timestamp = now
                    node = self.split_at(child, matched)
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


for flags in ({"split": False}, {"stamp_lower": True}, {"stamp": False}, {"split_prefix": False}, {"tick_each": True}):
    wrong("radix.walk", walk=_walk_variant(**flags))


def _walk_recursive(self, input_ids):
    now = self.tick()

    def down(node, pos):
        child = node.children.get(child_key(input_ids[pos:], self.page_size)) if pos < len(input_ids) else None
        if child is None:
            return node, pos
        matched = self.match_len(child.key, input_ids[pos:])
        if matched < child.length:
            upper = self.split_at(child, matched)
            upper.timestamp = now
            return upper, pos + matched
        child.timestamp = now
        return down(child, pos + matched)

    return down(self.root_node, 0)


right("radix.walk", walk=_walk_recursive)


# -- radix.match_prefix ---------------------------------------------------------------------------


def _match_variant(*, fresh=True, order=True, empty_dtype=torch.int32, handle_node=True):
    def match_prefix(self, input_ids):
        node, prefix_len = self.walk(token_array(input_ids))
        values, n = [], node
        while n is not self.root_node:
            values.append(n.value)
            n = n.parent
        if not values:
            return NS["RadixCacheHandle"](0, node), torch.empty(0, dtype=empty_dtype)
        values = values[::-1] if order else values
        indices = torch.cat(values) if fresh or len(values) > 1 else values[0]
        return NS["RadixCacheHandle"](
            prefix_len, node if handle_node or node.parent is self.root_node else node.parent
        ), indices

    return match_prefix


for flags in ({"fresh": False}, {"order": False}, {"empty_dtype": torch.int64}, {"handle_node": False}):
    wrong("radix.match_prefix", match_prefix=_match_variant(**flags))


def _match_as_list(self, input_ids):
    node, prefix_len = self.walk(token_array(input_ids))
    path, n = [], node
    while n.parent is not None:
        path.insert(0, n)
        n = n.parent
    slots = [int(s) for p in path for s in p.value.tolist()]
    return NS["RadixCacheHandle"](prefix_len, node), torch.tensor(slots, dtype=torch.int32)


right("radix.match_prefix", match_prefix=_match_as_list)


# -- radix.insert_prefix -------------------------------------------------------------------------


def _insert_variant(*, clone=True, count=True, stamp=True, returns_prefix=True, inherit_lock=False, check_lengths=True):
    def insert_prefix(self, input_ids, indices, *, handle=None):
        ids, slots = token_array(input_ids), slot_tensor(indices)
        if check_lengths and len(ids) != len(slots):
            raise ValueError("lengths")
        node, prefix_len = self.walk(ids)
        if prefix_len < len(ids):
            leaf = RadixTreeNode(self.clock if stamp else 0)
            value = slots[prefix_len:]
            leaf.set_key_value(ids[prefix_len:].copy(), value.clone() if clone else value)
            if inherit_lock and node is not self.root_node:
                leaf.ref_count = node.ref_count
            leaf.set_parent(node, self.page_size)
            if count and not leaf.ref_count:
                self.evictable_size += leaf.length
            elif count:
                self.protected_size += leaf.length
        return prefix_len if returns_prefix else len(ids)

    return insert_prefix


for flags in (
    {"clone": False},
    {"count": False},
    {"stamp": False},
    {"returns_prefix": False},
    {"inherit_lock": True},
    {"check_lengths": False},
):
    wrong("radix.insert_prefix", insert_prefix=_insert_variant(**flags))


def _insert_from_handle(self, input_ids, indices, *, handle=None):
    """Uses the handle: one walk from the root for the stamps, then a leaf under the deepest match."""
    ids, slots = token_array(input_ids), slot_tensor(indices)
    if len(ids) != len(slots):
        raise ValueError("lengths")
    node, prefix_len = self.walk(ids)
    if prefix_len == len(ids):
        return prefix_len
    leaf = RadixTreeNode(node.timestamp if node is not self.root_node else self.clock)
    leaf.set_key_value(np.array(ids[prefix_len:]), torch.tensor(slots[prefix_len:].tolist(), dtype=torch.int32))
    leaf.parent = node
    node.children[child_key(leaf.key, self.page_size)] = leaf
    self.evictable_size += len(ids) - prefix_len
    return prefix_len


right("radix.insert_prefix", insert_prefix=_insert_from_handle)


# -- radix.lock_handle ---------------------------------------------------------------------------


def _lock_variant(
    *,
    skip_own=False,
    touch_root=False,
    every_change=False,
    check_unlock=True,
    own_locks=True,
    stamps=False,
    early=False,
):
    def lock_handle(self, handle, unlock=False):
        path, node = [], handle.node
        if node is self.root_node and not touch_root:
            return
        if skip_own:
            node = node.parent
        while node is not None and (touch_root or node is not self.root_node):
            path.append(node)
            node = node.parent
        if unlock and check_unlock and not early:
            first = path[0] if path else None
            own = (
                first.ref_count - (sum(c.ref_count for c in first.children.values()) if own_locks else 0)
                if first
                else 1
            )
            if own <= 0:
                raise LockError("not locked")
        for n in path:
            if unlock and early and n.ref_count <= 0:
                raise LockError("not locked")  # too late: the nodes below were already changed
            before = n.ref_count
            n.ref_count += -1 if unlock else 1
            if stamps:
                n.timestamp = self.clock
            moved = every_change or (before == 0) != (n.ref_count == 0)
            if moved and n is not self.root_node:
                sign = 1 if unlock else -1
                self.evictable_size += sign * n.length
                self.protected_size -= sign * n.length

    return lock_handle


for flags in ({"skip_own": True}, {"touch_root": True}, {"every_change": True}, {"stamps": True}):
    wrong("radix.lock_handle", lock_handle=_lock_variant(**flags))
    wrong("radix.harden_lock", lock_handle=_lock_variant(**flags))
for flags in ({"check_unlock": False}, {"own_locks": False}, {"early": True}):  # the core is right, the refusals not
    right("radix.lock_handle", lock_handle=_lock_variant(**flags))
    wrong("radix.harden_lock", lock_handle=_lock_variant(**flags))


def _lock_mini_sglang(self, handle, unlock=False):
    """mini-sglang's lock_handle, line for line (the notes, 13.3.5): it trusts its caller, refuses nothing."""
    node = handle.node
    if unlock:
        while node is not self.root_node:
            node.ref_count -= 1
            if node.ref_count == 0:
                self.evictable_size += node.length
                self.protected_size -= node.length
            node = node.parent
    else:
        while node is not self.root_node:
            if node.ref_count == 0:
                self.evictable_size -= node.length
                self.protected_size += node.length
            node.ref_count += 1
            node = node.parent


right("radix.lock_handle", lock_handle=_lock_mini_sglang)
wrong("radix.harden_lock", lock_handle=_lock_mini_sglang)


def _own_locks_by(largest: bool) -> Callable:
    def lock_handle(self, handle, unlock=False):
        node = handle.node
        if unlock and node is not self.root_node:
            counts = [c.ref_count for c in node.children.values()]
            below = max(counts, default=0) if largest else sum(counts)
            if node.ref_count - below <= 0:
                raise LockError("no lock of its own")
        _lock_mini_sglang(self, handle, unlock)

    return lock_handle


_harden_largest = _own_locks_by(largest=True)  # the lock count of the children: the largest, not the sum
wrong("radix.harden_lock", lock_handle=_harden_largest)
right("radix.lock_handle", lock_handle=_harden_largest)  # the core task does not grade refusals
right("radix.harden_lock", lock_handle=_own_locks_by(largest=False))


def _harden_any_child(self, handle, unlock=False):  # refuses whenever a child is locked: too strict
    node = handle.node
    if (
        unlock
        and node is not self.root_node
        and (node.ref_count <= 0 or any(c.ref_count for c in node.children.values()))
    ):
        raise LockError("locked below")
    _lock_mini_sglang(self, handle, unlock)


wrong("radix.harden_lock", lock_handle=_harden_any_child)


def _lock_stops_at_needed(self, handle, unlock=False):  # an unlock stops at a node that a locked child still needs
    node = handle.node
    while node is not self.root_node:
        if unlock:
            if any(c.ref_count for c in node.children.values()):
                break
            node.ref_count -= 1
            if node.ref_count == 0:
                self.evictable_size += node.length
                self.protected_size -= node.length
        else:
            if node.ref_count == 0:
                self.evictable_size -= node.length
                self.protected_size += node.length
            node.ref_count += 1
        node = node.parent


wrong("radix.lock_handle", lock_handle=_lock_stops_at_needed)


def _lock_recount(combine: Callable) -> Callable:
    """Locks or unlocks the handle's node, then recounts each ancestor from its children with ``combine``
    (``max``: the largest child instead of the sum; ``sum``: forgets the ancestor's own locks)."""

    def lock_handle(self, handle, unlock=False):
        node = handle.node
        if node is self.root_node:
            return
        step = -1 if unlock else 1
        moved = [(node, node.ref_count > 0)]
        node.ref_count += step
        parent = node.parent
        while parent is not self.root_node:
            moved.append((parent, parent.ref_count > 0))
            parent.ref_count = combine(c.ref_count for c in parent.children.values())
            parent = parent.parent
        for n, locked_before in moved:
            if locked_before != (n.ref_count > 0):
                self.evictable_size -= step * n.length
                self.protected_size += step * n.length

    return lock_handle


wrong("radix.lock_handle", lock_handle=_lock_recount(max))
wrong("radix.lock_handle", lock_handle=_lock_recount(sum))


def _lock_recursive(self, handle, unlock=False):
    node = handle.node
    if node is self.root_node:
        return
    if unlock and node.ref_count <= sum(c.ref_count for c in node.children.values()):
        raise LockError("no lock of its own")
    step = -1 if unlock else 1

    def up(n):
        if n is self.root_node:
            return
        was_locked = n.ref_count > 0
        n.ref_count += step
        if was_locked != (n.ref_count > 0):
            self.evictable_size -= step * n.length
            self.protected_size += step * n.length
        up(n.parent)

    up(node)


right("radix.lock_handle", lock_handle=_lock_recursive)
right("radix.harden_lock", lock_handle=_lock_recursive)


# -- radix.evict -------------------------------------------------------------------------------


def _evict_variant(
    *,
    respect_locks=True,
    lru=True,
    parents=True,
    count=True,
    empty_dtype=torch.int32,
    check_first=True,
    negative=True,
    unlink=True,
):
    def evict(self, size):
        if negative and size < 0:
            raise ValueError("size")
        if size <= 0:
            return torch.empty(0, dtype=empty_dtype)
        if check_first and size > self.evictable_size:
            raise EvictionError("too much")
        heap, stack, order = [], [self.root_node], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root_node and not node.children and (node.ref_count == 0 or not respect_locks):
                order += 1
                heap.append(((node.timestamp if lru else order), node.uid, node))
        heapq.heapify(heap)
        freed, evicted = 0, []
        while freed < size:
            if not heap:
                raise EvictionError("ran out")
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            if unlink:
                del parent.children[child_key(node.key, self.page_size)]
            if count:
                self.evictable_size -= node.length
            freed += node.length
            evicted.append(node.value)
            if parents and parent is not self.root_node and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, (parent.timestamp if lru else 0, parent.uid, parent))
        return torch.cat(evicted)

    return evict


for flags in (
    {"respect_locks": False},
    {"lru": False},
    {"parents": False},
    {"count": False},
    {"empty_dtype": torch.float32},
    {"check_first": False},
    {"negative": False},
    {"unlink": False},
):
    wrong("radix.evict", evict=_evict_variant(**flags))


def _evict_sorting(self, size):
    """No heap: sort the evictable leaves again after every eviction (slow, and right)."""
    if size < 0:
        raise ValueError("negative")
    if size > self.evictable_size:
        raise EvictionError("too much")

    def leaves(node):
        if not node.children:
            return [node] if node is not self.root_node and node.ref_count == 0 else []
        return [leaf for child in node.children.values() for leaf in leaves(child)]

    freed = []
    while sum(len(v) for v in freed) < size:
        oldest = min(leaves(self.root_node), key=lambda n: (n.timestamp, n.uid))
        del oldest.parent.children[child_key(oldest.key, self.page_size)]
        oldest.parent = None
        self.evictable_size -= oldest.length
        freed.append(oldest.value)
    return torch.cat(freed) if freed else torch.empty(0, dtype=torch.int32)


right("radix.evict", evict=_evict_sorting)


# -- radix.check_integrity ----------------------------------------------------------------------


def _integrity_skipping(*rules: str, leaves_only: bool = False) -> Callable:
    """The solution's check_integrity with some rules left out, as a learner might forget them
    (``leaves_only``: the path rules checked for leaves only, the corner the old checks looked at)."""

    def check_integrity(self):
        root, ps = self.root_node, self.page_size
        if "root" not in rules and (root.ref_count != 1 or root.length != 0 or root.parent is not None):
            raise IntegrityError("root", "bad root")
        evictable = protected = 0
        seen: set[int] = set()
        stack = [root]
        while stack:
            parent = stack.pop()
            for key, node in parent.children.items():
                checked = not leaves_only or not node.children
                if "parent" not in rules and node.parent is not parent:
                    raise IntegrityError("parent link", "")
                if "empty" not in rules and node.length == 0:
                    raise IntegrityError("empty node", "")
                if "lengths" not in rules and (len(node.key) != node.length or len(node.value) != node.length):
                    raise IntegrityError("key/value length", "")
                if "key" not in rules and checked and node.length and child_key(node.key, ps) != key:
                    raise IntegrityError("child key", "")
                if "negative" not in rules and node.ref_count < 0:
                    raise IntegrityError("ref_count", "")
                if "monotone" not in rules and checked and parent is not root and node.ref_count > parent.ref_count:
                    raise IntegrityError("lock covers path", "")
                if "lru" not in rules and checked and parent is not root and node.timestamp > parent.timestamp:
                    raise IntegrityError("LRU order", "")
                if "pages" not in rules and ps > 1 and checked:
                    if node.length % ps:
                        raise IntegrityError("page alignment", "")
                    pages = node.value.view(-1, ps).long()
                    if ("page_start" not in rules and bool((pages[:, 0] % ps != 0).any())) or not torch.equal(
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
        if "sizes" not in rules and (evictable != self.evictable_size or protected != self.protected_size):
            raise IntegrityError("sizes", "")

    check_integrity.__name__ = "check_integrity_without_" + "_".join(rules or ("nothing",))
    return check_integrity


def test_the_integrity_variant_without_omissions_passes() -> None:
    assert check("radix.check_integrity", variant(check_integrity=_integrity_skipping())).passed


for rule in ("root", "parent", "empty", "lengths", "key", "monotone", "lru", "pages", "page_start", "slots", "sizes"):
    wrong("radix.check_integrity", check_integrity=_integrity_skipping(rule))
wrong("radix.check_integrity", check_integrity=_integrity_skipping("negative", "sizes"))
wrong("radix.check_integrity", check_integrity=_integrity_skipping(leaves_only=True))
wrong("radix.check_integrity", check_integrity=lambda self: None)  # mini-sglang's: `pass`


def _always_raises(self):
    raise IntegrityError("paranoid", "everything looks wrong to me")


def _changes_the_tree(self):  # "repairs" what it checks
    self.evictable_size = sum(n.length for n in _all_nodes(self) if n.ref_count == 0)
    NS["check_integrity"](self)


def _all_nodes(cache):
    stack, out = list(cache.root_node.children.values()), []
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


wrong("radix.check_integrity", check_integrity=_always_raises)
wrong("radix.check_integrity", check_integrity=_changes_the_tree)


def _integrity_recursive(self):
    ps = self.page_size
    if self.root_node.ref_count != 1 or self.root_node.length or self.root_node.parent is not None:
        raise IntegrityError("root", "")
    totals = [0, 0]
    slots: set[int] = set()

    def visit(parent):
        for key, node in parent.children.items():
            if (
                node.parent is not parent
                or not node.length
                or len(node.key) != node.length
                or len(node.value) != node.length
            ):
                raise IntegrityError("shape", "", node)
            if child_key(node.key, ps) != key or node.ref_count < 0:
                raise IntegrityError("key or ref", "", node)
            if parent is not self.root_node and (
                node.ref_count > parent.ref_count or node.timestamp > parent.timestamp
            ):
                raise IntegrityError("path", "", node)
            values = node.value.tolist()
            if ps > 1 and (
                node.length % ps
                or any(
                    values[i] % ps or values[i : i + ps] != list(range(values[i], values[i] + ps))
                    for i in range(0, len(values), ps)
                )
            ):
                raise IntegrityError("pages", "", node)
            if slots & set(values):
                raise IntegrityError("slots", "", node)
            slots.update(values)
            totals[node.ref_count > 0] += node.length
            visit(node)

    visit(self.root_node)
    if tuple(totals) != (self.evictable_size, self.protected_size):
        raise IntegrityError("sizes", "")


right("radix.check_integrity", check_integrity=_integrity_recursive)


# -- radix.page_aligned_insert ----------------------------------------------------------------------


def _paged_ml_round_up(self, key, input_ids):
    n = Base.match_len(self, key, input_ids)
    return -(-n // self.page_size) * self.page_size if n < min(len(key), len(input_ids)) else n


def _paged_insert_untrimmed(self, input_ids, indices, *, handle=None):
    return Base.insert_prefix(self, input_ids, indices, handle=handle)


def _paged_insert_trim_ids_only(self, input_ids, indices, *, handle=None):
    ids = token_array(input_ids)
    aligned = len(ids) - len(ids) % self.page_size
    return Base.insert_prefix(self, ids[:aligned], slot_tensor(indices)[: len(ids)], handle=handle)


wrong("radix.page_aligned_insert", match_len=Paged.match_len, insert_prefix=_paged_insert_untrimmed)
wrong("radix.page_aligned_insert", match_len=Base.match_len, insert_prefix=Paged.insert_prefix)
wrong("radix.page_aligned_insert", match_len=_paged_ml_round_up, insert_prefix=Paged.insert_prefix)
wrong("radix.page_aligned_insert", match_len=Paged.match_len, insert_prefix=_paged_insert_trim_ids_only)
WRONG["radix.page_aligned_insert"].append(
    variant(Paged, split_at=_split_variant(pages=False), evict=_evict_variant())  # split files halves by token
)


def _paged_walk(self, input_ids):
    """Another shape: a page-aware walk instead of a page-aware match_len."""
    ps = self.page_size
    end = len(input_ids) - len(input_ids) % ps
    node, pos = Base.walk(self, input_ids[:end])
    return node, pos - pos % ps


def _paged_walk_own(self, input_ids):
    now = self.tick()
    ps, node, pos = self.page_size, self.root_node, 0
    end = len(input_ids) - len(input_ids) % ps
    while pos < end:
        child = node.children.get(tuple(int(t) for t in input_ids[pos : pos + ps]) if ps > 1 else int(input_ids[pos]))
        if child is None:
            break
        n = Base.match_len(self, child.key, input_ids[pos:end])
        n -= n % ps
        pos += n
        if n < child.length:
            node = self.split_at(child, n)
            node.timestamp = now
            break
        node, node.timestamp = child, now
    return node, pos


right("radix.page_aligned_insert", base=Paged, walk=_paged_walk_own, match_len=Base.match_len)


# -- radix.cache ------------------------------------------------------------------------------------


def _reset_keeps_counters(self):
    held = [n.value for n in _all_nodes(self)]
    self.root_node.children.clear()
    return torch.cat(held) if held else torch.empty(0, dtype=torch.int32)


def _reset_ignores_locks(self):
    held = [n.value for n in _all_nodes(self)]
    self.root_node.children.clear()
    self.evictable_size = self.protected_size = 0
    return torch.cat(held) if held else torch.empty(0, dtype=torch.int32)


wrong("radix.cache", Paged, reset=_reset_keeps_counters)
wrong("radix.cache", Paged, reset=_reset_ignores_locks)
wrong("radix.cache", Paged, evict=_evict_variant(parents=False))
wrong("radix.cache", Paged, insert_prefix=_paged_insert_untrimmed)
wrong("radix.cache", Paged, lock_handle=_lock_variant(every_change=True))
wrong("radix.cache", Paged, walk=_walk_variant(stamp=False))
wrong("radix.cache", Paged, check_integrity=_always_raises)
right(
    "radix.cache",
    Paged,
    walk=_walk_recursive,
    evict=_evict_sorting,
    lock_handle=_lock_recursive,
    check_integrity=_integrity_recursive,
    match_prefix=_match_as_list,
)


# -- more plausible slips, one per method ------------------------------------------------------------


def _integrity_shallow(self):  # checks the root's children only, never deeper
    for key, node in self.root_node.children.items():
        if node.parent is not self.root_node or node.length == 0 or child_key(node.key, self.page_size) != key:
            raise IntegrityError("shape", "")
    if self.evictable_size < 0 or self.protected_size < 0:
        raise IntegrityError("sizes", "")


def _insert_extra_tick(self, input_ids, indices, *, handle=None):  # the new leaf gets a time of its own
    ids, slots = token_array(input_ids), slot_tensor(indices)
    if len(ids) != len(slots):
        raise ValueError("lengths")
    node, prefix_len = self.walk(ids)
    if prefix_len < len(ids):
        leaf = RadixTreeNode(self.tick())
        leaf.set_key_value(ids[prefix_len:].copy(), slots[prefix_len:].clone())
        leaf.set_parent(node, self.page_size)
        self.evictable_size += leaf.length
    return prefix_len


def _walk_without_tick(self, input_ids):  # stamps the path with the previous walk's time
    now, node, prefix_len = self.clock, self.root_node, 0
    while prefix_len < len(input_ids):
        child = node.children.get(child_key(input_ids[prefix_len:], self.page_size))
        if child is None:
            break
        matched = self.match_len(child.key, input_ids[prefix_len:])
        prefix_len += matched
        if matched < child.length:
            node = self.split_at(child, matched)
            node.timestamp = now
            break
        node = child
        node.timestamp = now
    return node, prefix_len


def _lock_own_node_only(self, handle, unlock=False):  # the handle's node, not the path
    node = handle.node
    if node is self.root_node:
        return
    if unlock and node.ref_count <= 0:
        raise LockError("not locked")
    before = node.ref_count
    node.ref_count += -1 if unlock else 1
    if (before == 0) != (node.ref_count == 0):
        sign = 1 if unlock else -1
        self.evictable_size += sign * node.length
        self.protected_size -= sign * node.length


def _evict_by_age_of_node(self, size):  # oldest *node* (by uid), not least recently used
    if size < 0:
        raise ValueError("negative")
    if size > self.evictable_size:
        raise EvictionError("too much")
    heap, stack = [], [self.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not self.root_node and not node.children and node.ref_count == 0:
            heap.append((node.uid, node))
    heapq.heapify(heap)
    freed, out = 0, [torch.empty(0, dtype=torch.int32)]
    while freed < size:
        _, node = heapq.heappop(heap)
        parent = node.parent
        del parent.children[child_key(node.key, self.page_size)]
        self.evictable_size -= node.length
        freed += node.length
        out.append(node.value)
        if parent is not self.root_node and not parent.children and parent.ref_count == 0:
            heapq.heappush(heap, (parent.uid, parent))
    return torch.cat(out)


wrong("radix.check_integrity", check_integrity=_integrity_shallow)
wrong("radix.insert_prefix", insert_prefix=_insert_extra_tick)
wrong("radix.walk", walk=_walk_without_tick)
wrong("radix.lock_handle", lock_handle=_lock_own_node_only)
wrong("radix.evict", evict=_evict_by_age_of_node)
wrong("radix.cache", Paged, evict=_evict_by_age_of_node)
wrong("radix.cache", Paged, insert_prefix=_insert_extra_tick)
wrong(
    "radix.match_prefix",
    match_prefix=lambda self, ids: (
        NS["match_prefix"](self, list(ids)[:-1]) if len(ids) else NS["match_prefix"](self, ids)
    ),
)


# -- issue 26: one wrong answer per class of input the checks now draw or watch ------------------------


def _integrity_contiguous(self):  # demands that a node's slots count up, as they do when the pool is fresh
    NS["check_integrity"](self)
    for node in _all_nodes(self):
        values = node.value.tolist()
        if values != list(range(values[0], values[0] + len(values))):
            raise IntegrityError("slots", "a node's slots must be contiguous", node)


wrong("radix.check_integrity", check_integrity=_integrity_contiguous)


def _split_stale_length(self, node, pos):  # sets key and value by hand: node.length is left as it was
    if not 0 < pos < node.length:
        raise ValueError("pos")
    upper = RadixTreeNode(node.timestamp)
    upper.set_key_value(node.key[:pos], node.value[:pos])
    upper.ref_count = node.ref_count
    upper.set_parent(node.parent, self.page_size)
    node.key, node.value = node.key[pos:], node.value[pos:]
    node.set_parent(upper, self.page_size)
    return upper


wrong("radix.split_at", split_at=_split_stale_length)


def _match_memo(self, input_ids):  # keeps each path's slots on its node and hands out the same tensor
    handle, indices = NS["match_prefix"](self, input_ids)
    node = handle.node
    kept = getattr(node, "_kept", None)
    if kept is None or kept.tolist() != indices.tolist():
        node._kept = kept = indices
    return handle, kept


def _match_copied_node(self, input_ids):  # the handle holds a copy of the node, not the tree's own
    handle, indices = NS["match_prefix"](self, input_ids)
    node = handle.node
    if node is self.root_node:
        return handle, indices
    copy = RadixTreeNode(node.timestamp)
    copy.set_key_value(node.key, node.value)
    copy.parent, copy.ref_count = node.parent, node.ref_count
    return NS["RadixCacheHandle"](handle.cached_len, copy), indices


def _match_int64(self, input_ids):  # slots as int64 (the dtype of torch.tensor(list))
    handle, indices = NS["match_prefix"](self, input_ids)
    return handle, indices.long()


for fn in (_match_memo, _match_copied_node, _match_int64):
    wrong("radix.match_prefix", match_prefix=fn)
wrong("radix.cache", Paged, match_prefix=_match_int64)


def _insert_variant_keys(*, copy_ids=True, int32_slots=True):
    def insert_prefix(self, input_ids, indices, *, handle=None):
        ids, slots = token_array(input_ids), slot_tensor(indices)
        if len(ids) != len(slots):
            raise ValueError("lengths")
        node, prefix_len = self.walk(ids)
        if prefix_len < len(ids):
            leaf = RadixTreeNode(self.clock)
            key = ids[prefix_len:].copy() if copy_ids else ids[prefix_len:]
            value = slots[prefix_len:].clone()
            leaf.set_key_value(key, value if int32_slots else value.long())
            leaf.set_parent(node, self.page_size)
            self.evictable_size += leaf.length
        return prefix_len

    return insert_prefix


wrong("radix.insert_prefix", insert_prefix=_insert_variant_keys(copy_ids=False))  # keeps the caller's buffer
wrong("radix.insert_prefix", insert_prefix=_insert_variant_keys(int32_slots=False))


def _evict_one_more(self, size):  # `while freed <= size`: one node too many when a node ends exactly at size
    if size < 0:
        raise ValueError("negative")
    if size > self.evictable_size:
        raise EvictionError("too much")
    freed = NS["evict"](self, size)
    if len(freed) == size and self.evictable_size:
        freed = torch.cat([freed, NS["evict"](self, 1)])
    return freed


wrong("radix.evict", evict=_evict_one_more)
wrong("radix.cache", Paged, evict=_evict_one_more)


def _size_info_method(self):  # the @property line deleted
    return NS["SizeInfo"](self.evictable_size, self.protected_size)


for exercise_id in ("radix.lock_handle", "radix.evict", "radix.cache"):
    wrong(exercise_id, Paged if exercise_id == "radix.cache" else Base, size_info=_size_info_method)


def _reset_new_root(self):  # a fresh root, as __init__ makes one, but a new object
    freed = NS["reset"](self)
    self.root_node = RadixTreeNode()
    self.root_node.ref_count = 1
    return freed


def _reset_new_root_unlocked(self):  # a fresh root that forgets the root's ref_count of 1
    freed = NS["reset"](self)
    self.root_node = RadixTreeNode()
    return freed


wrong("radix.cache", Paged, reset=_reset_new_root)
wrong("radix.cache", Paged, reset=_reset_new_root_unlocked)
wrong("radix.cache", Paged, lock_handle=_harden_largest)  # hardened, with the largest child for the sum
right("radix.cache", Paged, lock_handle=_own_locks_by(largest=False))
right("radix.cache", Paged, lock_handle=_lock_mini_sglang)


# -- minikv's own answers, under other names ---------------------------------------------------------


class _Inheriting(RadixCacheManager):
    pass


BORROWED = {
    "radix.evict": [variant(evict=RadixCacheManager.evict), _Inheriting],
    "radix.check_integrity": [variant(check_integrity=RadixCacheManager.check_integrity)],
    "radix.cache": [_Inheriting, variant(Paged, evict=RadixCacheManager.evict)],
}
for exercise_id, classes in BORROWED.items():
    WRONG.setdefault(exercise_id, []).extend(classes)


@pytest.mark.parametrize(("exercise_id", "cls"), [(e, c) for e, cs in BORROWED.items() for c in cs])
def test_minikv_own_answer_under_another_name_is_refused(exercise_id: str, cls: type) -> None:
    result = check(exercise_id, cls)
    assert not result.passed
    problem = result.smallest_failure.problem
    assert "minikv's own" in problem or "RadixCacheManager" in problem, problem


# -- correct alternatives pass ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exercise_id", "cls"), [(e, c) for e, cs in RIGHT.items() for c in cs], ids=lambda v: getattr(v, "__name__", v)
)
def test_a_correct_alternative_passes(exercise_id: str, cls: type) -> None:
    result = check(exercise_id, cls)
    assert result.passed, str(result)


# -- reports a learner can act on ----------------------------------------------------------------------


def test_the_stub_that_is_missing_is_named() -> None:
    cls = variant(split_at=_stub_method())
    result = check("radix.walk", cls)
    assert not result.passed and not result.not_written
    assert "calls self.split_at, which is still the stub (Task 5.2)" in result.smallest_failure.problem
    assert check("radix.split_at", cls).not_written


def _stub_method() -> Callable:
    def split_at(self, node, pos):
        raise NotImplementedError  # Task 5.2

    return split_at


def test_a_class_of_stubs_is_not_written_for_every_check() -> None:
    stubs = {name: _stub_method() for name in radix_checks.TASKS}
    cls = type("Stubs", (Base,), stubs)
    for exercise_id in ("radix.match_len", "radix.walk", "radix.evict", "radix.cache"):
        result = check(exercise_id, cls)
        assert result.not_written, str(result)
        assert "not written yet" in str(result)


def test_a_cycle_is_reported_as_a_cycle() -> None:
    result = check("radix.split_at", variant(split_at=_split_cycle))
    problem = result.smallest_failure.problem
    assert "cycle" in problem and "RecursionError" not in problem and "return type" not in problem


def test_a_wrong_tree_is_drawn_beside_the_expected_one_with_a_diff() -> None:
    result = check("radix.split_at", variant(split_at=_split_variant(copy_ref=False)))
    failure = result.smallest_failure
    assert "the expected tree" in failure.expected and "your tree" in failure.expected and "│" in failure.expected
    assert failure.got.startswith("what differs (- expected, + yours):")
    assert "- " in failure.got and "+ " in failure.got


def test_the_time_message_does_not_contradict_itself() -> None:
    result = check("radix.walk", variant(walk=_walk_variant(stamp=False)))
    problem = result.smallest_failure.problem
    assert "newest time" in problem
    times = re.findall(r"t=(\d+)", problem)
    assert len(set(times)) == len(times), problem  # "should carry t=3, but it has t=3" never again


def test_a_failing_history_is_shrunk_and_shown() -> None:
    result = check("radix.cache", variant(Paged, evict=_evict_variant(parents=False)))
    failure = result.smallest_failure
    assert "the smallest history that still fails has" in failure.problem
    steps = [line for line in failure.expected.splitlines() if line.strip()[:2].rstrip(".").isdigit()]
    assert 1 <= len(steps) <= 8, failure.expected
    assert "<- fails here" in failure.expected


def test_explain_errors_prints_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    cache = variant(evict=_stub_method())()
    with radix_checks.explain_errors():
        cache.evict(3)
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and out.count("\n") == 1 and "Traceback" not in out


def test_the_package_passes_its_own_histories(monkeypatch: pytest.MonkeyPatch) -> None:
    """minikv's RadixCacheManager passes radix.cache once the sentence about minikv's own answer is off."""
    from minikv.exercises import _core

    monkeypatch.setattr(_core, "minikv_own", lambda fn: None)
    monkeypatch.setattr(radix_checks.Subject, "precheck", lambda self: None)  # it has no match_len
    result = check("radix.cache", RadixCacheManager)
    assert result.passed, str(result)


def test_minikv_check_integrity_rejects_every_corruption_shown() -> None:
    """The corruptions shown to learners are real: minikv's own check rejects each of them."""
    import random

    for name, corrupt, tree, seed in radix_checks.corruption_cases():
        manager, _ = tree.build()
        corrupt(manager, random.Random(seed))
        with pytest.raises(IntegrityError):
            manager.check_integrity()
        assert name


def test_the_smallest_failing_case_is_reported() -> None:
    result = check("radix.evict", variant(evict=_evict_variant(parents=False)))
    failing = [case for case in result.cases if not case.passed]
    assert len(failing) >= 2
    assert result.smallest_failure is min(failing, key=lambda case: case.size)


# -- issue 26: reports that blame no one but the learner, and say what went wrong ------------------------


def _problem(exercise_id: str, cls: type) -> str:
    result = check(exercise_id, cls)
    assert not result.passed, exercise_id
    failure = result.smallest_failure
    return f"{failure.problem}\n{failure.expected}\n{failure.got}"


def test_a_stale_length_after_a_split_is_named_not_blamed_on_the_checker() -> None:
    text = _problem("radix.split_at", variant(split_at=_split_stale_length))
    assert "the checker could not use" not in text
    assert "length" in text and "set_key_value" in text, text


def test_a_size_info_without_property_gets_its_own_message() -> None:
    for exercise_id in ("radix.lock_handle", "radix.evict", "radix.walk"):
        text = _problem(exercise_id, variant(size_info=_size_info_method))
        assert "@property" in text and "the checker could not use" not in text, text


def test_a_cycle_the_checker_made_is_not_blamed_on_the_learner() -> None:
    result = check("radix.check_integrity", variant(check_integrity=lambda self: None))
    cycle = next(c for c in result.cases if "cycle" in c.description)
    assert not cycle.passed
    assert "your code" not in cycle.expected and "your tree" not in cycle.expected, cycle.expected
    assert "cycle" in cycle.expected


def test_when_only_the_outcome_differs_the_report_does_not_speak_of_last_use() -> None:
    text = _problem("radix.cache", variant(Paged, match_prefix=_match_int64))
    assert "int64" in text and "order of last use" not in text, text
    assert "only the outcome" in text, text


def test_over_eviction_is_reported_as_a_count() -> None:
    text = _problem("radix.evict", variant(evict=_evict_one_more))
    assert re.search(r"evicted \d+ slots, but \d+ were needed", text), text


def test_a_random_lock_case_shows_the_shortest_sequence_of_calls() -> None:
    result = check("radix.lock_handle", variant(lock_handle=_lock_variant(every_change=True)))
    drawn = [c for c in result.cases if "drawn at random" in c.description and not c.passed]
    assert drawn
    for case in drawn:
        assert "the shortest sequence of calls found that fails has" in case.problem
        assert "the calls:" in case.expected and "<- fails here" in case.expected
        calls = [line for line in case.expected.splitlines() if re.match(r"\s+\d+\. ", line)]
        assert 1 <= len(calls) <= 4, case.expected


@pytest.mark.parametrize("reset", [_reset_new_root, _reset_new_root_unlocked])
def test_a_bug_in_reset_is_blamed_on_reset(reset: Callable) -> None:
    text = _problem("radix.cache", variant(Paged, reset=reset))
    first = text.splitlines()[0]
    assert "your reset" in first and "lock_handle" not in first, text


def test_mini_sglangs_lock_handle_passes_the_core_task_and_not_the_hardening() -> None:
    cls = variant(lock_handle=_lock_mini_sglang)
    assert check("radix.lock_handle", cls).passed
    assert not check("radix.harden_lock", cls).passed
    assert check("radix.cache", variant(Paged, lock_handle=_lock_mini_sglang)).passed


def test_the_largest_child_for_the_sum_fails_the_hardening_and_the_whole_cache() -> None:
    text = _problem("radix.harden_lock", variant(lock_handle=_harden_largest))
    assert "LockError" in text
    text = _problem("radix.cache", variant(Paged, lock_handle=_harden_largest))
    assert "lock_handle(its handle, unlock=True)" in text and "LockError" in text, text


def test_healthy_trees_with_scattered_slots_are_drawn() -> None:
    """The integrity check shows trees whose nodes hold slots that do not count up, at several page sizes."""
    from minikv.exercises._trees import snapshot

    page_sizes = set()
    for tree in radix_checks.drawn_trees(800, 24):
        manager, _ = tree.build()
        for view in snapshot(manager).views():
            slots = list(view.slots)
            if slots != list(range(slots[0], slots[0] + len(slots))):
                page_sizes.add(tree.page_size)
    assert page_sizes >= {1, 2, 3, 4, 8}, page_sizes


BUDGET_S = dict.fromkeys(chapter_ids("radix"), 2.0) | {"radix.cache": 5.0}
"""Each check's time budget on one CPU core (issue 26), for the solution."""


@pytest.mark.parametrize("exercise_id", chapter_ids("radix"))
def test_each_check_stays_within_its_time_budget(exercise_id: str) -> None:
    """CPU time, not wall time, so that a loaded machine does not fail it; and three times the budget, so that
    only a real regression (more draws than the budget affords, or a slow checker) does."""
    start = time.process_time()
    result = check(exercise_id, solution_for(exercise_id))
    spent = time.process_time() - start
    assert result.passed, str(result)
    assert spent < 3 * BUDGET_S[exercise_id], f"{exercise_id} took {spent:.2f} s of CPU time"


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("radix", WRONG)
