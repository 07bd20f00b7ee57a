# %% [markdown]
# # Exercises 5: build your own radix cache
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex5_radix.ipynb)
#
# Chapter 5 explained how a radix tree shares KV slots between prompts. Here you build one:
# a single class, `MyRadixCache`, that you fill in one method at a time. At the end it
# serves requests through `minikv.lifecycle`, runs the serving engine, and the tree player
# draws its tree: your code, doing the work of `RadixCacheManager`.
#
# Every task ends with `check("radix.<task>", MyRadixCache)`. That check grades **one method**:
# the checker builds the trees it works on itself (copies of trees that minikv's own manager
# built), so the methods of later tasks may still be stubs. If the method you wrote calls
# another one that is still a stub, the report says which. The last check, `radix.cache`,
# plays random histories of requests on your class next to minikv's own manager, and shows
# the smallest history where the two disagree, with both trees drawn side by side.
#
# A class that inherits from `RadixCacheManager` runs minikv's own answers, and the check
# says so instead of grading it. A case that runs past the time limit is stopped, even inside
# a bare `except:`. Hints are in dropdowns: read them when you are stuck, not before.

# %%
import heapq

import numpy as np
import torch
from IPython.display import display

from minikv import BaseCacheManager, PagePool, RadixCacheHandle, RadixTreeNode, SizeInfo, lifecycle
from minikv.errors import EvictionError, IntegrityError, LockError
from minikv.exercises import check, tree_text
from minikv.exercises.radix import explain_errors
from minikv.radix_manager import child_key

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## The pieces you work with
#
# Your tree is made of minikv's **nodes** (`RadixTreeNode`): you decide what goes into them, and
# minikv's drawings can then draw your tree. A node is one edge of the tree, a run of tokens and
# the slots that hold their KV:
#
# | attribute or method | what it is |
# | --- | --- |
# | `node.key`, `node.value` | the tokens (a NumPy `int64` array) and their slots (an `int32` tensor), equally long |
# | `node.length` | how many tokens the node holds |
# | `node.parent`, `node.children` | the parent node, and a dict from a child's first token to the child (with `page_size > 1`: from the tuple of its first page of tokens) |
# | `node.ref_count` | how many locks pass through the node; 0 means it may be evicted |
# | `node.timestamp`, `node.uid` | the logical time of its last use; a unique number |
# | `RadixTreeNode(timestamp)` | a new, empty node |
# | `node.set_key_value(key, value)` | give a node its tokens and slots |
# | `node.set_parent(parent, page_size)` | link a node under `parent`, filed under its first token (or first page) |
# | `child_key(tokens, page_size)` | the dict key a node whose tokens start like `tokens` is filed under |
# | `RadixCacheHandle(cached_len, node)` | the handle `match_prefix` returns: the matched length and the node where the match ends |
#
# Always pass `self.page_size` to `set_parent` and `child_key`: then your methods are ready for
# pages when Task 5.9 comes.
#
# Here is the kind of tree you will build, drawn from minikv's own manager. Two prompts share
# `[1, 2]`, which was split off when the second one arrived, and the second prompt is locked:

# %%
from minikv import RadixCacheManager  # only to show a tree; your class must not use it

demo = RadixCacheManager()
demo.insert_prefix([1, 2, 3, 4], [0, 1, 2, 3])
demo.insert_prefix([1, 2, 5, 6], [4, 5, 6, 7])  # the caller frees slots 4 and 5: the tree had [1, 2] already
demo.insert_prefix([7, 8, 9], [8, 9, 10])
handle, _ = demo.match_prefix([1, 2, 5, 6])
demo.lock_handle(handle)
print(tree_text(demo))

# %% [markdown]
# ## The skeleton
#
# The class below is yours. Its `__init__` is given and must stay as it is: the checks build
# trees into `root_node` and set the counters and the clock directly, so the whole state of
# your cache is the tree under `root_node`, `evictable_size` (slots in nodes with
# `ref_count == 0`), `protected_size` (the rest) and `clock`. Keep no other state. Time is a
# logical clock: `tick()` advances it and returns the new time.
#
# Each method you write in a task below replaces the stub here (`MyRadixCache.walk = walk`),
# so you can run the cells in order, and run a task's cell again after changing it. (If you run
# this cell again, run the task cells after it again too: it makes a new class, all stubs.)
# `token_array` and `slot_tensor` turn what callers pass (lists, NumPy arrays, tensors) into
# the types the nodes hold; neither makes a copy.


# %%
def token_array(input_ids) -> np.ndarray:
    """Token ids (a list, NumPy array or tensor) as a 1-D int64 NumPy array (no copy when it already is one)."""
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.cpu().numpy()
    return np.asarray(input_ids, dtype=np.int64).reshape(-1)


def slot_tensor(indices) -> torch.Tensor:
    """Slot indices (a list, NumPy array or tensor) as a 1-D int32 tensor (no copy when it already is one)."""
    if not isinstance(indices, torch.Tensor):
        indices = torch.from_numpy(np.array(indices, dtype=np.int64))
    return indices.to(torch.int32).reshape(-1)


class MyRadixCache(BaseCacheManager):
    """A radix-tree prefix cache with LRU eviction of unlocked leaves, written by you."""

    def __init__(self, device="cpu", page_size: int = 1) -> None:
        self.device = torch.device(device)
        self.page_size = page_size
        self.root_node = RadixTreeNode()
        self.root_node.ref_count = 1  # the root is always protected, never split and never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self.clock = 0

    def tick(self) -> int:
        """Advance the clock by one and return the new time."""
        self.clock += 1
        return self.clock

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size)

    def match_len(self, key: np.ndarray, input_ids: np.ndarray) -> int:
        """How many leading tokens the two arrays share."""
        raise NotImplementedError  # Task 5.1

    def split_at(self, node: RadixTreeNode, pos: int) -> RadixTreeNode:
        """Cut ``node`` after ``pos`` tokens; return the new upper half."""
        raise NotImplementedError  # Task 5.2

    def walk(self, input_ids: np.ndarray) -> tuple[RadixTreeNode, int]:
        """Descend along ``input_ids``, splitting where the match ends inside a node: (node, prefix_len)."""
        raise NotImplementedError  # Task 5.3

    def match_prefix(self, input_ids) -> tuple[RadixCacheHandle, torch.Tensor]:
        """The longest cached prefix: its handle and its slots."""
        raise NotImplementedError  # Task 5.4

    def insert_prefix(self, input_ids, indices, *, handle=None) -> int:
        """Record that ``indices[i]`` holds the KV of ``input_ids[i]``; return how much was already cached."""
        raise NotImplementedError  # Task 5.5

    def lock_handle(self, handle: RadixCacheHandle, unlock: bool = False) -> None:
        """Protect (or release) the path from the handle's node up to the root."""
        raise NotImplementedError  # Task 5.6

    def evict(self, size: int) -> torch.Tensor:
        """Free at least ``size`` slots, least recently used unlocked leaves first; return them."""
        raise NotImplementedError  # Task 5.7

    def check_integrity(self) -> None:
        """Raise IntegrityError at the first broken rule of the tree."""
        raise NotImplementedError  # Task 5.8

    def reset(self) -> torch.Tensor:
        """Drop every cached prefix and return their slots (refused while anything is locked)."""
        raise NotImplementedError  # Task 5.10


# %% [markdown]
# ## Task 5.1 · `radix.match_len` (easy)
#
# Every step down the tree starts with one comparison: how many leading tokens does a node's
# key share with the rest of the input? Write `match_len(self, key, input_ids) -> int` for two
# 1-D `int64` NumPy arrays. Either may be empty, either may be the longer one, and token ids
# can be any `int64` (not just small numbers). Only read the arrays.
#
# ```{admonition} Hint
# :class: dropdown
# Only the first `min(len(key), len(input_ids))` positions can match. The answer is the first
# position where the two differ, or that minimum if they never do. A loop is fine; NumPy can
# find the first difference without one.
# ```


# %%
def match_len(self, key: np.ndarray, input_ids: np.ndarray) -> int:
    ### BEGIN SOLUTION
    n = min(len(key), len(input_ids))
    differ = np.flatnonzero(key[:n] != input_ids[:n])
    return int(differ[0]) if len(differ) else n
    ### END SOLUTION


MyRadixCache.match_len = match_len
check("radix.match_len", MyRadixCache)

# %% [markdown]
# ## Task 5.2 · `radix.split_at` (medium)
#
# When a match ends inside a node, the tree cuts that node in two so that the match ends on a
# node boundary. Write `split_at(self, node, pos) -> RadixTreeNode`: a new **upper** node takes
# the first `pos` tokens and slots and `node`'s place under its parent; `node` keeps the rest and
# hangs below the upper node, with its children. Return the upper node. A `pos` that would leave
# a half empty raises `ValueError` and changes nothing.
#
# What must the two halves keep? Think of a running request whose handle points at `node`, and
# of the locks and the uses that covered the whole node before the cut. A split is not a use.
#
# ```{admonition} Hint 1: which object is which
# :class: dropdown
# The object you were given must stay the *lower* half: a handle on it must still name the same
# prefix after the split. So the new node is the upper one.
# ```
#
# ```{admonition} Hint 2: the links
# :class: dropdown
# Filed under the same first token (or page), the upper node replaces `node` in the parent's
# `children`. The children of `node` need no change at all.
# ```


# %%
def split_at(self, node: RadixTreeNode, pos: int) -> RadixTreeNode:
    ### BEGIN SOLUTION
    if not 0 < pos < node.length:
        raise ValueError(f"pos must be in (0, {node.length}), got {pos}")
    upper = RadixTreeNode(node.timestamp)
    upper.set_key_value(node.key[:pos], node.value[:pos])
    upper.ref_count = node.ref_count
    upper.set_parent(node.parent, self.page_size)  # takes node's place: same first token
    node.set_key_value(node.key[pos:], node.value[pos:])
    node.set_parent(upper, self.page_size)
    return upper
    ### END SOLUTION


MyRadixCache.split_at = split_at
check("radix.split_at", MyRadixCache)

# %% [markdown]
# ## Task 5.3 · `radix.walk` (medium)
#
# Write `walk(self, input_ids) -> (node, prefix_len)`, the descent that `match_prefix` and
# `insert_prefix` both start with. From the root, follow the child filed under the next token;
# move into it while its whole key matches; stop when no child matches, or when the match ends
# inside a child (split it, Task 5.2). Return the last node reached (the root if nothing
# matched) and how many tokens matched.
#
# A walk is one *use*: it takes one new time from the clock, and every node on the matched path
# carries that time afterwards. Nodes off the path keep theirs.
#
# ```{admonition} Hint 1: the time
# :class: dropdown
# Tick once, before the loop, and stamp each node you move into. After a split, which half was
# used: the upper one (on the path) or the lower one (the rest of the old node)?
# ```
#
# ```{admonition} Hint 2: the edge cases
# :class: dropdown
# The input may end inside a node (it is a prefix of the node's key): that is a partial match
# too. And a child found by its first token always matches at least that token.
# ```


# %%
def walk(self, input_ids: np.ndarray) -> tuple[RadixTreeNode, int]:
    ### BEGIN SOLUTION
    now = self.tick()
    node, prefix_len = self.root_node, 0
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
    ### END SOLUTION


MyRadixCache.walk = walk
check("radix.walk", MyRadixCache)

# %% [markdown]
# ## Task 5.4 · `radix.match_prefix` (easy)
#
# Write `match_prefix(self, input_ids) -> (handle, indices)`: walk, then return a
# `RadixCacheHandle(prefix_len, node)` and the slots of the matched tokens, root first, as one
# `int32` tensor (empty when nothing matched). `input_ids` may be a list, a NumPy array or a
# tensor (`token_array` helps).
#
# The caller owns what you return: it may write into the tensor or resize it. The tree must not
# notice.
#
# ```{admonition} Hint
# :class: dropdown
# The matched slots are the values of the nodes from the handle's node up to the root, in the
# opposite order. Which torch function joins several tensors into a *new* one?
# ```


# %%
def match_prefix(self, input_ids) -> tuple[RadixCacheHandle, torch.Tensor]:
    ### BEGIN SOLUTION
    node, prefix_len = self.walk(token_array(input_ids))
    values = []
    on_path = node
    while on_path is not self.root_node:
        values.append(on_path.value)
        on_path = on_path.parent
    if not values:
        return RadixCacheHandle(0, node), torch.empty(0, dtype=torch.int32, device=self.device)
    return RadixCacheHandle(prefix_len, node), torch.cat(values[::-1])
    ### END SOLUTION


MyRadixCache.match_prefix = match_prefix
check("radix.match_prefix", MyRadixCache)

# %% [markdown]
# ## Task 5.5 · `radix.insert_prefix` (medium)
#
# Write `insert_prefix(self, input_ids, indices, *, handle=None) -> int`. A request has finished:
# `indices[i]` holds the KV of `input_ids[i]`. Walk down; if part of the input is new, hang one
# new leaf with those tokens and slots under the node where the walk ended (stamped with the
# walk's time), and count its slots as evictable. Return how many tokens were cached already.
# Lengths that differ are the caller's mistake: `ValueError`, and nothing changes.
#
# `handle` is the request's own locked match; minikv's manager uses it to skip re-walking the
# cached prefix. A full walk gives the same result, so you may ignore it.
#
# ```{admonition} Hint 1: what the caller does next
# :class: dropdown
# The caller frees the slots the tree did not take, and reuses its `indices` tensor (a row of
# its page table) for the next request. What must the tree store, then: the slots it was given,
# or its own copy of them? The same goes for the tokens.
# ```
#
# ```{admonition} Hint 2: under a lock
# :class: dropdown
# The walk may end at a locked node (another request is running on that prefix). The new leaf
# is still unlocked: nobody has locked *it*.
# ```


# %%
def insert_prefix(self, input_ids, indices, *, handle=None) -> int:
    ### BEGIN SOLUTION
    ids, slots = token_array(input_ids), slot_tensor(indices)
    if len(ids) != len(slots):
        raise ValueError(f"input_ids has {len(ids)} tokens but indices has {len(slots)} slots")
    node, prefix_len = self.walk(ids)
    if prefix_len < len(ids):
        leaf = RadixTreeNode(self.clock)
        leaf.set_key_value(ids[prefix_len:].copy(), slots[prefix_len:].clone())
        leaf.set_parent(node, self.page_size)
        self.evictable_size += leaf.length
    return prefix_len
    ### END SOLUTION


MyRadixCache.insert_prefix = insert_prefix
check("radix.insert_prefix", MyRadixCache)

# %% [markdown]
# ## Task 5.6 · `radix.lock_handle` (medium)
#
# A running request locks its match, so that eviction cannot take its slots away. Write
# `lock_handle(self, handle, unlock=False) -> None`.
#
# * Locking covers the handle's node **and every ancestor** up to the root (the root excluded):
#   the request uses the KV of the whole path. Locks nest: each lock needs its own unlock.
# * When a node goes from unlocked to locked its slots move from `evictable_size` to
#   `protected_size`, and back when it goes from locked to unlocked.
# * An unlock undoes one lock of the same handle: the caller (a request that finishes) unlocks
#   exactly what it locked, so this task trusts it, as mini-sglang does.
# * A lock is not a use: no timestamp changes, and the clock does not tick.
# * The handle of an empty match points at the root: nothing to do.
#
# mini-sglang once stepped to the parent before the first update, which skipped the handle's
# own node and touched the root (commit `8827b0f`). The checker looks for both. It also locks
# two branches below one node and unlocks that node while both stay locked: its `ref_count`
# counts every lock that passes through it.
#
# ```{admonition} Hint
# :class: dropdown
# One loop from the handle's node up to (not including) the root. The slots move between the
# counters only when a node's `ref_count` changes between 0 and 1.
# ```


# %%
def lock_handle(self, handle: RadixCacheHandle, unlock: bool = False) -> None:
    ### BEGIN SOLUTION
    node = handle.node
    while node is not self.root_node:
        if unlock:
            node.ref_count -= 1
            if node.ref_count == 0:
                self.protected_size -= node.length
                self.evictable_size += node.length
        else:
            if node.ref_count == 0:
                self.evictable_size -= node.length
                self.protected_size += node.length
            node.ref_count += 1
        node = node.parent
    ### END SOLUTION


MyRadixCache.lock_handle = lock_handle
check("radix.lock_handle", MyRadixCache)

# %% [markdown]
# ## Optional task 5.6b · `radix.harden_lock` (medium): harden it
#
# Your `lock_handle` is mini-sglang's, and SGLang's does the same: it trusts its caller. A
# caller with a bug (a request finished twice, or a handle unlocked that was never locked)
# silently drives a count down that another request's lock holds up, and eviction may then
# take slots that request still reads. minikv's `RadixCacheManager` refuses such a call
# instead. Harden yours the same way, in a subclass, so the rest of the exercise keeps the
# version above:
#
# * A lock belongs to the node its handle ends at. Unlocking a handle whose node holds no lock
#   of its own raises `LockError` and changes nothing, even when deeper locks pass through that
#   node.
# * Everything else stays as in Task 5.6.
#
# This task is optional: the later tasks do not need it. (`radix.cache` also tries unlocks
# nobody took, but only on a class whose `lock_handle` refuses them.)
#
# ```{admonition} Hint 1: a lock of its own
# :class: dropdown
# You may keep no extra state, and you do not need any: every lock that passes through a node
# either ends at the node itself or also passes through exactly one of its children. Compare
# the node's `ref_count` with its children's.
# ```
#
# ```{admonition} Hint 2: refusing cleanly
# :class: dropdown
# Decide whether an unlock is allowed before you change any node; then let Task 5.6's method do
# the work (`super()`).
# ```


# %%
class MyHardenedRadixCache(MyRadixCache):
    """MyRadixCache whose lock_handle refuses an unlock that no lock of the handle's node backs."""

    def lock_handle(self, handle: RadixCacheHandle, unlock: bool = False) -> None:
        ### BEGIN SOLUTION
        node = handle.node
        if unlock and node is not self.root_node:
            own = node.ref_count - sum(child.ref_count for child in node.children.values())
            if own <= 0:
                raise LockError("handle: its node holds no lock of its own")
        super().lock_handle(handle, unlock)
        ### END SOLUTION


check("radix.harden_lock", MyHardenedRadixCache)

# %% [markdown]
# ## Task 5.7 · `radix.evict` (hard)
#
# Write `evict(self, size) -> Tensor`: free at least `size` slots and return them as one `int32`
# tensor.
#
# * Only **leaves** with `ref_count == 0` can go: nobody below needs a leaf's KV, and a locked
#   node is in use. Whole nodes go, so you may free more than `size`.
# * The least recently used goes first.
# * When a leaf goes, its parent may become a leaf. It is then a candidate too, and it may be
#   older than the leaves that are waiting.
# * An evicted node leaves its parent's `children`, and its slots leave `evictable_size`.
# * `evict(0)` returns an empty `int32` tensor. A negative `size` raises `ValueError`; a `size`
#   above `evictable_size` raises `EvictionError`. Both change nothing. Eviction is not a use.
#
# ```{admonition} Hint 1: which leaf next
# :class: dropdown
# You keep taking the oldest of a changing set of candidates: the standard library has a data
# structure for exactly that. Break ties between equal times with something unique, so that two
# nodes are never compared.
# ```
#
# ```{admonition} Hint 2: will there be enough?
# :class: dropdown
# Once `size <= evictable_size`, evicting leaves always finds enough: a locked node's ancestors
# are locked too, so every unlocked node is reachable by taking leaves one after another.
# ```


# %%
def evict(self, size: int) -> torch.Tensor:
    ### BEGIN SOLUTION
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if size > self.evictable_size:
        raise EvictionError(f"size: asked for {size} slots, only {self.evictable_size} are evictable")
    heap = []
    stack = [self.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not self.root_node and not node.children and node.ref_count == 0:
            heap.append((node.timestamp, node.uid, node))
    heapq.heapify(heap)
    freed, evicted = 0, [torch.empty(0, dtype=torch.int32, device=self.device)]
    while freed < size:
        _, _, node = heapq.heappop(heap)
        parent = node.parent
        del parent.children[child_key(node.key, self.page_size)]
        node.parent = None
        self.evictable_size -= node.length
        freed += node.length
        evicted.append(node.value)
        if parent is not self.root_node and not parent.children and parent.ref_count == 0:
            heapq.heappush(heap, (parent.timestamp, parent.uid, parent))
    return torch.cat(evicted)
    ### END SOLUTION


MyRadixCache.evict = evict
check("radix.evict", MyRadixCache)

# %% [markdown]
# ## Task 5.8 · `radix.check_integrity` (hard)
#
# mini-sglang's `check_integrity` is `pass`. Write a real one: `check_integrity(self) -> None`
# raises `IntegrityError(invariant, detail, node)` at the first broken rule and returns quietly
# on a healthy tree (changing nothing). The checker shows it healthy trees, then trees with one
# thing broken, anywhere in the tree. The rules:
#
# 1. The root has `ref_count` 1, no tokens and no parent.
# 2. Every child's `parent` is the node whose `children` list it.
# 3. No node but the root is empty, and each node's key and value have `node.length` elements.
# 4. Each child is filed under its own first token (or first page).
# 5. No `ref_count` is negative, and no node is locked more often than its parent (below the
#    root): a lock covers the whole path.
# 6. No node was used after its parent (below the root): a walk stamps the whole path.
# 7. With `page_size > 1`, every node holds whole pages: its length is a multiple of
#    `page_size`, and its slots come in runs of `page_size` that start at a multiple of
#    `page_size` and count up by one.
# 8. No slot is held by two nodes.
# 9. `evictable_size` and `protected_size` equal the slots in unlocked and in locked nodes.
#
# ```{admonition} Hint 1: one walk
# :class: dropdown
# Visit every node once, from the root down, checking each child against the parent it is
# listed under. Add up the counters as you go and compare them at the end.
# ```
#
# ```{admonition} Hint 2: a broken tree can trap you
# :class: dropdown
# A corrupted tree may list a node below itself. If you check rule 2 before you descend, your
# walk can never go round in a circle. And an empty node has no first token: check rule 3
# before you compute a child key.
# ```


# %%
def check_integrity(self) -> None:
    ### BEGIN SOLUTION
    root, page_size = self.root_node, self.page_size
    if root.ref_count != 1 or root.length != 0 or root.parent is not None:
        raise IntegrityError("root", "the root must have ref_count 1, no tokens and no parent", root)
    evictable = protected = 0
    seen_slots: set[int] = set()
    stack = [root]
    while stack:
        parent = stack.pop()
        for key, node in parent.children.items():
            if node.parent is not parent:
                raise IntegrityError("parent link", "its parent is not the node that lists it", node)
            if node.length == 0 or len(node.key) != node.length or len(node.value) != node.length:
                raise IntegrityError("node length", f"{len(node.key)} tokens, {len(node.value)} slots", node)
            if child_key(node.key, page_size) != key:
                raise IntegrityError("child key", f"filed under {key!r}", node)
            if node.ref_count < 0 or (parent is not root and node.ref_count > parent.ref_count):
                raise IntegrityError("ref_count", f"ref_count {node.ref_count}, parent's {parent.ref_count}", node)
            if parent is not root and node.timestamp > parent.timestamp:
                raise IntegrityError("LRU order", f"t={node.timestamp} is after its parent's", node)
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
                    raise IntegrityError("slot held twice", f"slot {slot}", node)
                seen_slots.add(slot)
            if node.ref_count == 0:
                evictable += node.length
            else:
                protected += node.length
            stack.append(node)
    if (evictable, protected) != (self.evictable_size, self.protected_size):
        raise IntegrityError("sizes", f"counters {self.size_info}, nodes hold {evictable} and {protected}")
    ### END SOLUTION


MyRadixCache.check_integrity = check_integrity
check("radix.check_integrity", MyRadixCache)

# %% [markdown]
# ## Task 5.9 · `radix.page_aligned_insert` (medium)
#
# With `page_size > 1` the pool hands out whole pages, and the tree holds whole pages only:
# children are filed under their first page, a match counts whole pages (a match that ends
# inside a page counts up to the page before), and an insert takes the whole pages of its input
# and leaves the partial last page to the caller, who frees it.
#
# Write the page-aware cache as a subclass that changes as little as possible. If every one of
# your methods passes `self.page_size` on and compares through `self.match_len`, two methods are
# enough: `match_len` (whole pages) and `insert_prefix` (whole pages only); use `super()` for
# the rest of the work. Write more if your `walk` needs it. The checks of this task use page
# sizes 2 and 4.
#
# ```{admonition} Hint 1: where a partial page shows up
# :class: dropdown
# Inside a node, when the input stops agreeing in the middle of a page; and at the end of the
# input, when fewer tokens than a page are left. Does your walk look up a child when fewer than
# `page_size` tokens are left? What does `child_key` return then?
# ```
#
# ```{admonition} Hint 2: the insert
# :class: dropdown
# Trim both `input_ids` and `indices` to the whole pages before anything else, then insert as
# before. The return value counts cached tokens in whole pages too.
# ```


# %%
class MyPagedRadixCache(MyRadixCache):
    """MyRadixCache for any page_size: whole pages only."""

    def match_len(self, key: np.ndarray, input_ids: np.ndarray) -> int:
        ### BEGIN SOLUTION
        matched = super().match_len(key, input_ids)
        return matched - matched % self.page_size
        ### END SOLUTION

    def insert_prefix(self, input_ids, indices, *, handle=None) -> int:
        ### BEGIN SOLUTION
        ids, slots = token_array(input_ids), slot_tensor(indices)
        if len(ids) != len(slots):
            raise ValueError(f"input_ids has {len(ids)} tokens but indices has {len(slots)} slots")
        aligned = len(ids) - len(ids) % self.page_size
        return super().insert_prefix(ids[:aligned], slots[:aligned], handle=handle)
        ### END SOLUTION


check("radix.page_aligned_insert", MyPagedRadixCache)

# %% [markdown]
# ## Task 5.10 · `radix.cache` (easy to write, hard to pass)
#
# One method is left: `reset(self) -> Tensor` drops every cached prefix and returns the slots
# the tree held (an empty `int32` tensor for an empty tree). It is refused with `LockError`,
# changing nothing, while anything is locked.
#
# Then the whole class meets the real test. The check plays random histories on
# `MyPagedRadixCache` at page sizes 1, 2 and 4: requests admitted and finished through
# `minikv.lifecycle` (so your `insert_prefix` runs under locked paths), aborted requests,
# matches, evictions (some refused) and resets, with a real page pool. After every step your
# cache must give the answers minikv's manager gives, hold the same tree, account for every
# page of the pool exactly once, and pass your own `check_integrity`. A failing history is cut
# down to the smallest one that still fails, and shown step by step.
#
# ```{admonition} Hint
# :class: dropdown
# After a reset, the running requests' handles point into a tree that is gone. A node that
# left the tree has no parent.
# ```


# %%
def reset(self) -> torch.Tensor:
    ### BEGIN SOLUTION
    if self.protected_size:
        raise LockError(f"reset: {self.protected_size} slots are locked")
    held = [torch.empty(0, dtype=torch.int32, device=self.device)]
    stack = list(self.root_node.children.values())
    while stack:
        node = stack.pop()
        held.append(node.value)
        stack.extend(node.children.values())
    for top in self.root_node.children.values():
        top.parent = None
    self.root_node.children.clear()
    self.evictable_size = 0
    return torch.cat(held)
    ### END SOLUTION


MyRadixCache.reset = reset
check("radix.cache", MyPagedRadixCache)

# %% [markdown]
# ## Your cache serves requests
#
# `lifecycle.serve` runs a request through the seven steps of chapter 2 with any cache
# manager: match, lock, allocate (evicting from your cache when the pool runs short), insert,
# free, unlock. A `TreeRecorder` stands in front of your cache and draws its tree after every
# call. Until your class is complete, these cells print which method is still missing.

# %%
from minikv.course.vocab import Vocab
from minikv.snapshot import TreeSnapshot, outline
from minikv.viz import TreeRecorder, label

vocab = Vocab()
prompts = ["the cat sat on the mat", "the cat sat on a dog", "the dog ran", "the cat sat on the mat"]
with explain_errors():
    pool = PagePool(5, page_size=2)
    recorder = TreeRecorder(MyPagedRadixCache(page_size=2), vocab, pool=pool)
    for text in prompts:
        request = lifecycle.serve(recorder, pool, vocab.encode(text))
        print(f"{text!r}: {request.cached_len} tokens cached, {request.evicted} slots evicted")
    recorder.check_integrity()
    print(outline(TreeSnapshot.of(recorder), vocab))
    display(recorder.player(title=label("ex5.four_requests")))

# %% [markdown]
# And the serving engine of chapter 6 runs on it: prompts that share prefixes, batched, with
# preemption when the pool runs dry. Its output must equal a recompute from scratch.

# %%
from minikv.engine import make_engine, recompute
from minikv.tiny_model import TinyDecoder

with explain_errors():
    model = TinyDecoder(vocab_size=32, max_positions=64, seed=0)
    page_size = 2
    engine = make_engine(model, num_pages=16, page_size=page_size, manager=MyPagedRadixCache(model.device, page_size))
    batch = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9], [1, 2, 3, 4, 5, 6, 8, 8], [7, 7, 1]]
    outputs = engine.generate(batch, max_new_tokens=6)
    assert outputs == [recompute(model, prompt, 6) for prompt in batch]
    print("the engine's output equals a recompute from scratch:", outputs)
    engine.check()  # every slot free, in your tree, or held by a request: your tree is read too
    print(tree_text(engine.cache))

# %% [markdown]
# Last, a real model: SmolLM2-135M-Instruct from [chapter 7](../book/07_real_model.ipynb),
# answering three questions that share a system prompt, with your cache keeping its K/V. The
# answers must be the ones it gives with minikv's own radix cache.

# %%
from minikv.models import load_smollm2

with explain_errors():
    smol, tokenizer = load_smollm2(max_positions=256)
    system = {"role": "system", "content": "You answer in one short sentence."}
    questions = ["What is a tree?", "What is a leaf?", "What is a root?"]
    chats = [tokenizer.apply_chat_template([system, {"role": "user", "content": q}], True) for q in questions]
    stop = tokenizer.encode("<|im_end|>")
    yours = make_engine(smol, num_pages=256, manager=MyRadixCache(smol.device))
    answers = yours.generate(chats[:1], max_new_tokens=20, stop_tokens=stop)
    answers += yours.generate(chats[1:], max_new_tokens=20, stop_tokens=stop)  # these find the first in your tree
    minikvs = make_engine(smol, num_pages=256, manager="radix")
    assert answers == minikvs.generate(chats[:1], 20, stop) + minikvs.generate(chats[1:], 20, stop)
    for question, answer in zip(questions, answers, strict=True):
        print(f"{question} {tokenizer.decode(answer, skip_special_tokens=True)}")
    print(f"prompt tokens from your cache: {yours.stats.cached_tokens} of {yours.stats.prompt_tokens}")
    yours.check()

# %% [markdown]
# ## What you have built
#
# A radix cache is a handful of short methods over one invariant-rich tree: `walk` finds and
# splits, `split_at` keeps handles valid, `lock_handle` protects a whole path, `evict` frees
# the least recently used leaves and then their parents, and `check_integrity` states every
# rule the others must keep. Compare yours with `minikv/radix_manager.py`. It differs on
# purpose in a few places: it checks every argument before it changes anything, and instead of
# walking the whole tree on every `evict` it keeps a heap of evictable leaves up to date across
# calls. SGLang 0.5.23 keeps a set of evictable leaves and builds a heap from it on each `evict`;
# a heap kept across calls is only proposed there, in open pull requests.
