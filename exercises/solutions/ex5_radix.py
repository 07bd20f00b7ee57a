# %% [markdown]
# # Exercises 5: build the radix tree
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex5_radix.ipynb)
#
# Chapter 5 took `RadixCacheManager` apart. Here you put it back together, one method at
# a time: compare keys, split a node, lock a path, walk down the tree, insert whole pages,
# evict the least recently used leaves, and finally check that a tree is healthy.
#
# For each task the checker builds two identical trees. Your function changes one,
# minikv's own method changes the other, and the two must end up the same: same nodes,
# same slots, same ref counts, same order of last use, same size counters. While your
# function runs, the minikv method it re-writes is switched off, so calling it fails.
# Each task has a cell with `# YOUR CODE HERE`; its last line, `check(...)`, runs the
# cases. Hints are in dropdowns.

# %%
import heapq

import numpy as np
import torch

from minikv import RadixCacheManager, RadixTreeNode
from minikv.errors import ArgumentError, EvictionError, IntegrityError, LockError
from minikv.exercises import check, tree_text
from minikv.radix_manager import child_key

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## The pieces you work with
#
# A **node** (`RadixTreeNode`) is one edge of the tree: a run of tokens and the slots
# that hold their KV.
#
# | attribute or method | what it is |
# | --- | --- |
# | `node.key`, `node.value` | the tokens (a NumPy `int64` array) and their slots (`int32` tensor), equally long |
# | `node.length` | how many tokens the node holds |
# | `node.parent`, `node.children` | the parent node, and a dict from a child's first token to the child (with `page_size > 1`, from the tuple of its first page of tokens) |
# | `node.ref_count` | how many locks cover the node; 0 means it may be evicted |
# | `node.timestamp`, `node.uid` | the logical time of its last use; a unique number |
# | `RadixTreeNode(timestamp)` | a new, empty node |
# | `node.set_key_value(key, value)` | give a node its tokens and slots |
# | `node.set_parent(parent, page_size=1)` | link a node under `parent`, filed under its first token (or first page) |
# | `child_key(key_array, page_size)` | the dict key a node with these tokens is filed under |
#
# The **manager** holds `manager.root_node` (no tokens, `ref_count` 1, never locked,
# split or evicted), `manager.page_size`, and two counters: `manager.evictable_size`
# (slots in nodes with `ref_count == 0`) and `manager.protected_size` (the rest). Time is
# a logical clock: `manager.tick()` advances it and returns the new time, and
# `manager.clock` reads it.
#
# Your functions keep the tree and the counters right, but not minikv's private
# bookkeeping: its heap of evictable leaves, its node counter, the locks each node
# holds of its own and its record of which slots the tree holds. So don't mix your
# functions with minikv's `match_prefix`, `insert_prefix` or `evict` on the same tree.
# The checker never does.
#
# Here is a tree. Two prompts share `[1, 2]`, which was split off when the second one
# arrived, and the second prompt is locked by a running request:

# %%
demo = RadixCacheManager()
demo.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
demo.insert_prefix([1, 2, 5, 6], [4, 5, 6, 7])  # the caller frees slots 4 and 5: the tree had [1, 2] already
demo.insert_prefix([7, 8, 9], [8, 9, 10])
handle, _ = demo.match_prefix([1, 2, 5, 6])
demo.lock_handle(handle)
print(tree_text(demo))

# %% [markdown]
# ## Task 5.1 · `radix.match_len` (easy)
#
# Write `match_len(key, input_ids) -> int`: how many leading tokens the two arrays (1-D
# `int64` NumPy arrays) have in common. Every descent through the tree starts with this
# comparison.
#
# ```{admonition} Hint 1
# :class: dropdown
# Only the first `n = min(len(key), len(input_ids))` tokens can match. A loop works;
# NumPy can do it without one: `np.flatnonzero(key[:n] != input_ids[:n])` lists the
# positions that differ.
# ```


# %%
def match_len(key: np.ndarray, input_ids: np.ndarray) -> int:
    ### BEGIN SOLUTION
    n = min(len(key), len(input_ids))
    differ = np.flatnonzero(key[:n] != input_ids[:n])
    return int(differ[0]) if len(differ) else n
    ### END SOLUTION


check("radix.match_len", match_len)

# %% [markdown]
# ## Task 5.2 · `radix.split_at` (medium)
#
# When a match ends inside a node, the tree cuts that node in two so the match ends on a
# node boundary. Write `split_at(node, pos, page_size=1) -> RadixTreeNode`:
#
# * a new **upper** node takes the first `pos` tokens and slots, and `node`'s place
#   under its parent;
# * `node` itself keeps the rest and hangs below the upper node, with its children;
# * the upper node copies `ref_count` and `timestamp`, because every lock and every use
#   of the old node covered both halves;
# * return the upper node. `pos` must be in `(0, node.length)`: raise `ValueError`
#   otherwise (`ArgumentError` is one), changing nothing.
#
# Why must `node` stay the *lower* half? A running request's handle points at the node
# where its match ended. After the split, that object must still end where it ended.
#
# ```{admonition} Hint 1: the order of operations
# :class: dropdown
# Create the upper node, give it `node.key[:pos]` and `node.value[:pos]`, copy the ref
# count, and `set_parent(node.parent, page_size)`: filed under the same first token or
# page, it replaces `node` in the parent's dict. Then shorten `node` to
# `key[pos:], value[pos:]` and `set_parent(upper, page_size)`.
# ```
#
# ```{admonition} Hint 2: the children
# :class: dropdown
# `node`'s children need nothing at all: they stay in `node.children`, and `node` is
# still their parent.
# ```


# %%
def split_at(node: RadixTreeNode, pos: int, page_size: int = 1) -> RadixTreeNode:
    ### BEGIN SOLUTION
    if not 0 < pos < node.length:
        raise ArgumentError(f"pos must be in (0, {node.length}), got {pos}")
    upper = RadixTreeNode(node.timestamp)
    upper.set_key_value(node.key[:pos], node.value[:pos])
    upper.ref_count = node.ref_count
    upper.set_parent(node.parent, page_size)  # takes node's place: same first token
    node.set_key_value(node.key[pos:], node.value[pos:])
    node.set_parent(upper, page_size)
    return upper
    ### END SOLUTION


check("radix.split_at", split_at)

# %% [markdown]
# ## Task 5.3 · `radix.lock_handle` (medium)
#
# A handle (`handle.node`, `handle.cached_len`) names the node where a match ended. Write
# `lock_handle(manager, handle, unlock=False) -> None`:
#
# * **lock**: every node from `handle.node` up to the root, the root excluded, gets
#   `ref_count += 1`. The request uses the KV of the whole path, not just the last node.
# * **unlock**: the same nodes get `ref_count -= 1`. If any of them is not locked, raise
#   `LockError` and change nothing.
# * When a node's `ref_count` goes 0 → 1 its tokens move from `evictable_size` to
#   `protected_size`, and back when it goes 1 → 0. Other changes (1 → 2) move nothing.
# * The handle of an empty match points at the root: lock nothing.
#
# mini-sglang once stepped to the parent before the first update, which skipped the
# handle's own node and touched the root (commit `8827b0f`). The checker looks for both.
#
# ```{admonition} Hint
# :class: dropdown
# Collect the path first: `while node is not manager.root_node: path.append(node); node = node.parent`.
# For an unlock, check every node of the path before changing any of them.
# ```


# %%
def lock_handle(manager: RadixCacheManager, handle, unlock: bool = False) -> None:
    ### BEGIN SOLUTION
    path = []
    node = handle.node
    while node is not manager.root_node:
        path.append(node)
        node = node.parent
    if unlock:
        if any(n.ref_count <= 0 for n in path):
            raise LockError("handle: part of its path is not locked")
        for n in path:
            n.ref_count -= 1
            if n.ref_count == 0:
                manager.protected_size -= n.length
                manager.evictable_size += n.length
    else:
        for n in path:
            if n.ref_count == 0:
                manager.evictable_size -= n.length
                manager.protected_size += n.length
            n.ref_count += 1
    ### END SOLUTION


check("radix.lock_handle", lock_handle)

# %% [markdown]
# ## Task 5.4 · `radix.walk` (medium)
#
# Write `walk(manager, input_ids) -> (node, prefix_len)`, the descent that `match_prefix`
# and `insert_prefix` both start with. `input_ids` is a 1-D `int64` NumPy array.
#
# 1. Take the time of this walk once: `now = manager.tick()`.
# 2. From the root, look up the child filed under the next token:
#    `node.children.get(child_key(input_ids[prefix_len:], page_size))`. No child: stop.
# 3. Count how many of its tokens match. If all of them do, move into the child, stamp
#    it with `now`, and go on. If only some do, split the child there (task 5.2), stamp
#    the *upper* half with `now` (the lower half was not used), and stop.
# 4. Return the last node reached (the root if nothing matched) and the matched length.
#
# With `page_size > 1`, everything goes a whole page at a time: only the first
# `len(input_ids) - len(input_ids) % page_size` tokens take part, a child is looked up
# by its first page, and a partial match is rounded down to whole pages.
#
# ```{admonition} Hint 1: the loop
# :class: dropdown
# `while prefix_len < total:` with `total` the page-aligned length. Compare with
# `match_len(child.key, input_ids[prefix_len:total])`, round down with
# `matched -= matched % page_size`, and add it to `prefix_len`.
# ```
#
# ```{admonition} Hint 2: when to split
# :class: dropdown
# If `matched < child.length`, then `node = split_at(child, matched, page_size)` and
# break. `matched` cannot be 0 there: the child was found by its first token (or page),
# which therefore matched.
# ```


# %%
def walk(manager: RadixCacheManager, input_ids: np.ndarray) -> tuple[RadixTreeNode, int]:
    ### BEGIN SOLUTION
    page_size = manager.page_size
    now = manager.tick()
    node, prefix_len = manager.root_node, 0
    total = len(input_ids) - len(input_ids) % page_size
    while prefix_len < total:
        child = node.children.get(child_key(input_ids[prefix_len:], page_size))
        if child is None:
            break
        matched = match_len(child.key, input_ids[prefix_len:total])
        matched -= matched % page_size
        prefix_len += matched
        if matched < child.length:
            node = split_at(child, matched, page_size)
            node.timestamp = now
            break
        node = child
        node.timestamp = now
    return node, prefix_len
    ### END SOLUTION


check("radix.walk", walk)

# %% [markdown]
# ## Task 5.5 · `radix.page_aligned_insert` (medium)
#
# Write `page_aligned_insert(manager, input_ids, indices) -> int`, which is
# `insert_prefix` for a tree with `page_size > 1`. `input_ids` is a 1-D `int64` NumPy
# array and `indices` an `int32` tensor of the same length (one slot per token).
#
# * Only whole pages go in: the first `len(input_ids) - len(input_ids) % page_size`
#   tokens. The caller frees the rest.
# * Walk down with `manager.walk(aligned_ids)`, which returns `(node, prefix_len)`.
#   minikv's walk is allowed here, and so is yours.
# * If part of the aligned prefix is new, hang one new leaf under `node` with those
#   tokens and slots, timestamped `manager.clock` (the time of that walk), and add its
#   length to `evictable_size`.
# * Return `prefix_len`: how much was already cached.
#
# The caller will reuse its `indices` tensor (it is a row of its page table), so the
# tree must keep **copies**, never views. mini-sglang kept a view once (fixed in commit
# `94fe255`); the checker overwrites your `indices` after the call and looks.
#
# ```{admonition} Hint
# :class: dropdown
# `leaf.set_key_value(torch.from_numpy(ids[prefix_len:aligned].copy()), indices[prefix_len:aligned].clone())`,
# then `leaf.set_parent(node, manager.page_size)`, which files it under its first page.
# ```


# %%
def page_aligned_insert(manager: RadixCacheManager, input_ids: np.ndarray, indices: torch.Tensor) -> int:
    ### BEGIN SOLUTION
    page_size = manager.page_size
    aligned = len(input_ids) - len(input_ids) % page_size
    node, prefix_len = manager.walk(input_ids[:aligned])
    if prefix_len < aligned:
        leaf = RadixTreeNode(manager.clock)
        leaf.set_key_value(torch.from_numpy(input_ids[prefix_len:aligned].copy()), indices[prefix_len:aligned].clone())
        leaf.set_parent(node, page_size)
        manager.evictable_size += leaf.length
    return prefix_len
    ### END SOLUTION


check("radix.page_aligned_insert", page_aligned_insert)

# %% [markdown]
# ## Task 5.6 · `radix.evict` (hard)
#
# Write `evict(manager, size) -> Tensor`: free at least `size` slots and return them as
# one `int32` tensor.
#
# * Only **leaves** with `ref_count == 0` can go: a leaf's KV is needed by no one below
#   it, and a locked node is in use.
# * The least recently used goes first (smallest `timestamp`). Whole nodes go, so you
#   may free more than `size`.
# * When a leaf goes, its parent may become a leaf. If it is unlocked and not the root,
#   it is now a candidate too, and it may be older than the other leaves.
# * Remove an evicted node from its parent's `children` and take its length off
#   `evictable_size`.
# * `evict(0)` returns an empty `int32` tensor. A negative `size` raises `ValueError`.
#   A `size` above `evictable_size` raises `EvictionError`. Both change nothing.
#
# ```{admonition} Hint 1: finding the candidates
# :class: dropdown
# Walk the whole tree once (a stack from the root) and collect the unlocked leaves into a
# heap of `(node.timestamp, node.uid, node)`. `uid` breaks ties, so `heapq` never has to
# compare two nodes.
# ```
#
# ```{admonition} Hint 2: the loop
# :class: dropdown
# `while freed < size`: pop the oldest, delete it from `parent.children` (its key is
# `child_key(node.key, manager.page_size)`), count it, and push the parent if it
# is not the root, has no children left and has `ref_count == 0`. Finding enough is
# guaranteed once `size <= evictable_size`: a locked node's ancestors are locked, so every
# unlocked node can be reached by evicting leaves.
# ```


# %%
def evict(manager: RadixCacheManager, size: int) -> torch.Tensor:
    ### BEGIN SOLUTION
    if size < 0:
        raise ArgumentError(f"size must be >= 0, got {size}")
    if size == 0:
        return torch.empty(0, dtype=torch.int32)
    if size > manager.evictable_size:
        raise EvictionError(f"size: asked for {size} slots, only {manager.evictable_size} are evictable")
    heap = []
    stack = [manager.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not manager.root_node and not node.children and node.ref_count == 0:
            heap.append((node.timestamp, node.uid, node))
    heapq.heapify(heap)
    freed, evicted = 0, []
    while freed < size:
        _, _, node = heapq.heappop(heap)
        parent = node.parent
        del parent.children[child_key(node.key, manager.page_size)]
        manager.evictable_size -= node.length
        freed += node.length
        evicted.append(node.value)
        if parent is not manager.root_node and not parent.children and parent.ref_count == 0:
            heapq.heappush(heap, (parent.timestamp, parent.uid, parent))
    return torch.cat(evicted)
    ### END SOLUTION


check("radix.evict", evict)

# %% [markdown]
# ## Task 5.7 · `radix.check_integrity` (hard)
#
# mini-sglang's `check_integrity` is `pass`. Write a real one:
# `check_integrity(manager) -> None` raises `IntegrityError(invariant, detail, node)` at
# the first broken rule and returns quietly on a healthy tree. The checker shows it
# healthy trees, then trees with one corruption each. The rules:
#
# 1. The root has `ref_count` 1, no tokens and no parent.
# 2. Every child's `parent` is the node whose `children` list it.
# 3. No node but the root is empty, and each node's key and value have `node.length`
#    elements.
# 4. Each child is filed under its own first token (or first page): check with `child_key`.
# 5. No `ref_count` is negative, and no node is locked more often than its parent (below
#    the root): a lock covers the whole path.
# 6. No node was used after its parent (below the root): a walk stamps the whole path.
# 7. With `page_size > 1`, every node holds whole pages: its length is a multiple of
#    `page_size`, and its slots come in runs of `page_size` that start at a multiple of
#    `page_size` and count up by one.
# 8. No slot is held by two nodes.
# 9. `evictable_size` and `protected_size` equal the tokens in unlocked and in locked
#    nodes.
#
# ```{admonition} Hint 1: one walk
# :class: dropdown
# Visit every node once with a stack of parents. For each `(key, child)` in
# `parent.children.items()`, check rules 2 to 8 about the child, and add its length to a
# running evictable or protected total. Compare the totals at the end.
# ```
#
# ```{admonition} Hint 2: order matters
# :class: dropdown
# Check that a node is not empty *before* computing its child key: `child_key` of an empty
# key fails with an `IndexError`, and the checker wants an `IntegrityError`.
# ```
#
# ```{admonition} Hint 3: whole pages
# :class: dropdown
# `pages = node.value.view(-1, page_size).long()`; the first column must be divisible by
# `page_size`, and `pages - pages[:, :1]` must equal `torch.arange(page_size)` in every row.
# ```


# %%
def check_integrity(manager: RadixCacheManager) -> None:
    ### BEGIN SOLUTION
    root, page_size = manager.root_node, manager.page_size
    if root.ref_count != 1 or root.length != 0 or root.parent is not None:
        raise IntegrityError("root", "the root must have ref_count 1, no tokens and no parent", root)
    evictable = protected = 0
    seen_slots: set[int] = set()
    stack = [root]
    while stack:
        parent = stack.pop()
        for key, node in parent.children.items():
            if node.parent is not parent:
                raise IntegrityError("parent link", f"listed under {parent!r}, but its parent is {node.parent!r}", node)
            if node.length == 0:
                raise IntegrityError("empty node", "only the root may hold no tokens", node)
            if len(node.key) != node.length or len(node.value) != node.length:
                raise IntegrityError(
                    "key/value length", f"{len(node.key)} tokens, {len(node.value)} slots, length {node.length}", node
                )
            if child_key(node.key, page_size) != key:
                raise IntegrityError("child key", f"filed under {key!r}", node)
            if node.ref_count < 0:
                raise IntegrityError("ref_count", f"negative ref_count {node.ref_count}", node)
            if parent is not root and node.ref_count > parent.ref_count:
                raise IntegrityError(
                    "lock covers path", f"ref_count {node.ref_count} > parent's {parent.ref_count}", node
                )
            if parent is not root and node.timestamp > parent.timestamp:
                raise IntegrityError(
                    "LRU order", f"used at t={node.timestamp}, after its parent (t={parent.timestamp})", node
                )
            if page_size > 1:
                if node.length % page_size:
                    raise IntegrityError("page alignment", f"length {node.length} is not whole pages", node)
                pages = node.value.view(-1, page_size).long()
                if bool((pages[:, 0] % page_size != 0).any()) or not torch.equal(
                    pages - pages[:, :1], torch.arange(page_size).expand_as(pages)
                ):
                    raise IntegrityError("page alignment", "slots do not form whole pages", node)
            for slot in node.value.tolist():
                if slot in seen_slots:
                    raise IntegrityError("slot held twice", f"slot {slot} is held by two nodes", node)
                seen_slots.add(slot)
            if node.ref_count == 0:
                evictable += node.length
            else:
                protected += node.length
            stack.append(node)
    if evictable != manager.evictable_size:
        raise IntegrityError("evictable_size", f"counter is {manager.evictable_size}, unlocked nodes hold {evictable}")
    if protected != manager.protected_size:
        raise IntegrityError("protected_size", f"counter is {manager.protected_size}, locked nodes hold {protected}")
    ### END SOLUTION


check("radix.check_integrity", check_integrity)

# %% [markdown]
# ## What you have shown
#
# A radix cache is a handful of short functions over one invariant-rich tree. `walk`
# finds and splits, `split_at` keeps handles valid, `lock_handle` protects a whole path,
# `evict` frees the least recently used leaves and then their parents, and
# `check_integrity` states every rule that the others must keep. Compare yours with
# `minikv/radix_manager.py`. It differs in one place on purpose: instead of walking the
# whole tree on every `evict`, it keeps a heap of evictable leaves up to date, the fix
# SGLang adopted when that walk started to dominate its scheduler.
