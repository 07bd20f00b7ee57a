"""``RadixCacheManager``: share KV slots between requests whose prompts share a prefix.

Read this file beside chapter 5. The order is the order of the chapter:
the node (``RadixTreeNode``, ``get_match_len``, ``_split_at``), the handle, then the
manager (``_walk``, ``match_prefix``, ``insert_prefix``, ``lock_handle``, ``evict``,
``reset``, ``size_info``, ``check_integrity``).

Where this differs from the code the notes study (mini-sglang's old
``radix_manager.py``), it is on purpose:

* stored keys and values are copies, never views of the caller's tensors;
* time is a logical clock, so runs are reproducible;
* evict keeps a heap of evictable leaves up to date instead of scanning the
  whole tree on every call;
* unlock, evict and reset check their preconditions and raise clear errors
  before touching anything; ``check_integrity`` really checks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._validate import _INT64, as_count, as_positive, as_slot_array, as_token_ids, canonical_device
from .base import BaseCacheHandle, BaseCacheManager, SizeInfo
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    EvictionError,
    IntegrityError,
    LockError,
    StaleHandleError,
)

ChildKey = int | tuple[int, ...]

_node_ids = itertools.count()
# Shared by every node before set_key_value (and by the root forever): never written to.
_EMPTY_KEY = np.empty(0, dtype=_INT64)
_EMPTY_VALUE = torch.empty(0, dtype=torch.int32)


class RadixTreeNode:
    """One edge of the radix tree: a run of tokens and the slots holding their KV.

    ``children`` maps the first token of each child (the first *page* of tokens,
    as a tuple, when ``page_size > 1``) to the child. ``ref_count`` is the
    number of locks held on this node; ``timestamp`` is the logical time of its
    last use, for LRU eviction.
    """

    __slots__ = ("_key", "_length", "_parent", "_value", "children", "ref_count", "timestamp", "uid")

    def __init__(self, timestamp: int = 0) -> None:
        self.children: dict[ChildKey, RadixTreeNode] = {}
        self._parent: RadixTreeNode | None = None
        self.ref_count: int = 0
        self.uid: int = next(_node_ids)
        self.timestamp: int = timestamp
        self._key: np.ndarray = _EMPTY_KEY
        self._value: torch.Tensor = _EMPTY_VALUE
        self._length: int = 0

    @property
    def key(self) -> torch.Tensor:
        """The token ids of this edge (CPU, int64; shares the node's memory).

        Kept as a NumPy array inside: the walk compares keys there, and a tensor
        per node would cost more than the comparison.
        """
        return torch.from_numpy(self._key)

    @property
    def value(self) -> torch.Tensor:
        """The slot indices holding those tokens' KV (int32, on the manager's device)."""
        return self._value

    @property
    def length(self) -> int:
        return self._length

    @property
    def parent(self) -> RadixTreeNode | None:
        """The node above this one; ``None`` for the root and for an evicted node."""
        return None if self._parent is _EVICTED else self._parent

    def set_key_value(self, key: torch.Tensor | np.ndarray, value: torch.Tensor) -> None:
        key = key if isinstance(key, np.ndarray) else key.numpy()
        length = len(key)
        if length != value.shape[0]:  # (len() of a tensor costs four times shape[0]; this runs on every insert)
            raise ArgumentError(f"key has {length} tokens but value has {value.shape[0]} slots")
        self._key = key if key.dtype == _INT64 else key.astype(_INT64)  # the walk compares int64 bytes
        self._value = value
        self._length = length

    def set_parent(self, parent: RadixTreeNode, page_size: int = 1) -> None:
        self._parent = parent
        parent.children[child_key(self._key, page_size)] = self

    def is_root(self) -> bool:
        return self._parent is None

    def is_evicted(self) -> bool:
        """True once ``evict`` removed this node (or, after ``reset``, for the nodes that were at the top).

        Below the top of a reset tree a node does not know it was dropped; its handles are
        stale all the same, and ``lock_handle`` refuses them (it walks up to the root).
        """
        return self._parent is _EVICTED

    def is_leaf(self) -> bool:
        return not self.children

    def get_match_len(self, input_ids: np.ndarray) -> int:
        """How many leading tokens of ``input_ids`` equal this node's key."""
        return match_len(self._key, input_ids)

    def _split_at(self, pos: int, page_size: int = 1) -> RadixTreeNode:
        """Cut this node after ``pos`` tokens; return the new upper node.

        The upper node takes the first ``pos`` tokens and slots and this node's
        place under the parent; this node keeps the rest and hangs below it.
        ``ref_count`` and ``timestamp`` are copied: every lock and every use of
        this node covered both halves. Handles that point at this node stay
        valid, since it still ends where it ended.
        """
        if not 0 < pos < self._length:
            raise ArgumentError(f"pos must be in (0, {self._length}), got {pos}")
        parent = self._parent
        assert parent is not None, "the root is never split"
        upper = RadixTreeNode(self.timestamp)
        upper.set_key_value(self._key[:pos], self._value[:pos])
        upper.ref_count = self.ref_count
        upper.set_parent(parent, page_size)  # replaces self in parent.children
        self.set_key_value(self._key[pos:], self._value[pos:])
        self.set_parent(upper, page_size)
        return upper

    def __repr__(self) -> str:
        if self.is_root():
            return "RadixTreeNode(root)"
        shown = self._key[:6].tolist()
        more = "..." if self._length > 6 else ""
        state = "evicted, " if self.is_evicted() else ""
        return f"RadixTreeNode({state}key={shown}{more}, len={self._length}, ref={self.ref_count}, t={self.timestamp})"


# The parent of every evicted node: a node that is in no tree, so walking up from an
# evicted node can never reach a root.
_EVICTED = RadixTreeNode()


def child_key(key: np.ndarray, page_size: int, start: int = 0) -> ChildKey:
    """The dict key a node is filed under in its parent: first token, or first page (of ``key[start:]``)."""
    if page_size == 1:
        return int(key[start])
    return tuple(key[start : start + page_size].tolist())


def match_len(key: np.ndarray, input_ids: np.ndarray) -> int:
    """Length of the common prefix of two token arrays, without a Python loop per token."""
    n = min(len(key), len(input_ids))
    if n == 0:
        return 0
    if key[:n].tobytes() == input_ids[:n].tobytes():
        return n
    return int(np.argmin(key[:n] == input_ids[:n]))


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    """A matched prefix: its length and the deepest node it reaches."""

    node: RadixTreeNode


class RadixCacheManager(BaseCacheManager):
    """Prefix cache as a radix tree over token ids, with LRU eviction of unlocked leaves."""

    def __init__(self, device: torch.device | str = "cpu", page_size: int = 1) -> None:
        self.device = canonical_device(device)
        self.page_size = as_positive(page_size, "page_size")
        self.empty_tensor = torch.empty(0, dtype=torch.int32, device=self.device)
        self._on_cpu = self.device.type == "cpu"
        self._page_offsets = np.arange(self.page_size, dtype=np.int32)
        self.root_node = RadixTreeNode()
        self.root_node.ref_count = 1  # the root is always protected and never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0
        # Min-heap of (timestamp, uid, node) over evictable leaves. Entries go
        # stale when a node is used, locked, gains a child or is evicted; stale
        # entries are skipped when popped and purged when they pile up.
        self._evictable_leaves: list[tuple[int, int, RadixTreeNode]] = []
        self._num_nodes = 0

    # -- walking the tree -------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _walk(self, input_ids: np.ndarray) -> tuple[RadixTreeNode, int]:
        """Descend from the root along ``input_ids``; return the deepest node reached and the matched length.

        A match that ends inside a node splits it so that the match ends on a
        node boundary. Every node on the matched path gets the current time.
        With ``page_size > 1`` matching goes a whole page at a time.
        """
        page_size = self.page_size
        now = self._tick()
        node = self.root_node
        prefix_len = 0
        total = len(input_ids) - len(input_ids) % page_size
        # One copy of the tokens as bytes: each node's key is then compared in place
        # (a memcmp), and only a key that differs is compared token by token.
        input_bytes = input_ids[:total].tobytes()
        while prefix_len < total:
            child = node.children.get(child_key(input_ids, page_size, prefix_len))
            if child is None:
                break
            node = child
            if input_bytes.startswith(node._key, prefix_len * 8):
                # The whole key matched (the common case): stamp the node and go on below it.
                prefix_len += node._length
                self._touch(node, now)
                continue
            # The match ends inside this node: split it there, and the upper half is where it ends.
            matched = node.get_match_len(input_ids[prefix_len:total])
            matched -= matched % page_size
            prefix_len += matched
            node = node._split_at(matched, page_size)
            self._num_nodes += 1
            node.timestamp = now
            break
        return node, prefix_len

    def _touch(self, node: RadixTreeNode, now: int) -> None:
        node.timestamp = now
        if node.ref_count == 0 and not node.children:
            self._push_evictable(node)  # a used leaf moves to the back of the LRU queue

    def _push_evictable(self, node: RadixTreeNode) -> None:
        """Queue an evictable leaf under its current timestamp (older entries for it go stale)."""
        heap = self._evictable_leaves
        heapq.heappush(heap, (node.timestamp, node.uid, node))
        if len(heap) > 2 * self._num_nodes + 64:
            self._compact()

    # -- the public interface ----------------------------------------------

    def match_prefix(self, input_ids: torch.Tensor | Sequence[int]) -> tuple[RadixCacheHandle, torch.Tensor]:
        node, prefix_len = self._walk(as_token_ids(input_ids))
        if prefix_len == 0:
            return RadixCacheHandle(0, node), self.empty_tensor
        return RadixCacheHandle(prefix_len, node), torch.cat(_values_from_root(node))

    def insert_prefix(self, input_ids: torch.Tensor | Sequence[int], indices: torch.Tensor | Sequence[int]) -> int:
        ids = as_token_ids(input_ids)
        slots = as_slot_array(indices, self.device)
        if len(ids) != len(slots):
            raise ArgumentError(f"input_ids has {len(ids)} tokens but indices has {len(slots)} slots")
        insert_len = len(ids) - len(ids) % self.page_size
        node, prefix_len = self._walk(ids[:insert_len])
        if prefix_len < insert_len:
            leaf = RadixTreeNode(self._clock)
            # Copies: the caller may reuse its page-table row (mini-sglang bug 94fe255).
            leaf.set_key_value(ids[prefix_len:insert_len].copy(), self._new_slots(slots[prefix_len:insert_len]))
            leaf.set_parent(node, self.page_size)
            self._num_nodes += 1
            self.evictable_size += leaf._length
            # The parent's heap entry, if it had one, is now stale: it has a child.
            self._push_evictable(leaf)
        return prefix_len

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        path = self._path_of(handle)
        if unlock:
            for n in path:
                if n.ref_count <= 0:
                    raise LockError(f"handle: cannot unlock, {n!r} on its path is not locked")
            for n in path:
                n.ref_count -= 1
                if n.ref_count == 0:
                    self.protected_size -= n._length
                    self.evictable_size += n._length
                    if not n.children:
                        self._push_evictable(n)
        else:
            for n in path:
                if n.ref_count == 0:
                    self.evictable_size -= n._length
                    self.protected_size += n._length
                n.ref_count += 1

    def evict(self, size: int) -> torch.Tensor:
        size = as_count(size, "size")
        if size == 0:
            return self.empty_tensor
        if size > self.evictable_size:
            raise EvictionError(f"size: asked to evict {size} slots but only {self.evictable_size} are evictable")
        evicted: list[torch.Tensor] = []
        evicted_size = 0
        heap = self._evictable_leaves
        while evicted_size < size:
            timestamp, _, node = heapq.heappop(heap)
            if not self._is_evictable_leaf(node, timestamp):
                continue
            parent = node._parent
            assert parent is not None
            del parent.children[child_key(node._key, self.page_size)]
            node._parent = _EVICTED
            self._num_nodes -= 1
            self.evictable_size -= node._length
            evicted_size += node._length
            evicted.append(node._value)
            if parent is not self.root_node and not parent.children and parent.ref_count == 0:
                heapq.heappush(
                    heap, (parent.timestamp, parent.uid, parent)
                )  # evict never grows the heap: no compaction
        return torch.cat(evicted)

    def reset(self) -> torch.Tensor:
        if self.protected_size:
            raise LockError(f"reset: {self.protected_size} slots are locked; unlock every handle first")
        held = [n._value for n in self._nodes()]
        for top in self.root_node.children.values():
            top._parent = _EVICTED  # every handle into the old tree is now stale
        self.root_node.children.clear()
        self.evictable_size = 0
        self._evictable_leaves.clear()
        self._num_nodes = 0
        return torch.cat(held) if held else self.empty_tensor

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size)

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, root excluded."""
        return self._num_nodes

    def check_integrity(self) -> None:
        root = self.root_node
        if root.ref_count != 1 or root.length != 0 or root._parent is not None:
            raise IntegrityError("root", "the root must have ref_count 1, no tokens and no parent", root)
        evictable = protected = count = 0
        seen_slots: list[torch.Tensor] = []
        heap_entries = {(t, uid) for t, uid, _ in self._evictable_leaves}
        stack = [root]
        while stack:
            parent = stack.pop()
            for key, node in parent.children.items():
                count += 1
                self._check_node(node, parent, key, heap_entries)
                if node.ref_count == 0:
                    evictable += node.length
                else:
                    protected += node.length
                seen_slots.append(node._value)
                stack.append(node)
        if count != self._num_nodes:
            raise IntegrityError("node count", f"counter says {self._num_nodes} nodes, the tree has {count}")
        if evictable != self.evictable_size:
            raise IntegrityError("evictable_size", f"counter is {self.evictable_size}, unlocked nodes hold {evictable}")
        if protected != self.protected_size:
            raise IntegrityError("protected_size", f"counter is {self.protected_size}, locked nodes hold {protected}")
        if seen_slots:
            all_slots = torch.cat(seen_slots)
            unique = torch.unique(all_slots)
            if len(unique) != len(all_slots):
                counts = torch.bincount(all_slots.long().cpu())
                dup = int(torch.argmax(counts))
                owners = [n for n in self._nodes() if bool((n._value == dup).any())]
                raise IntegrityError("slot held twice", f"slot {dup} is held by {len(owners)} nodes", owners[0])

    def _check_node(
        self, node: RadixTreeNode, parent: RadixTreeNode, key: ChildKey, heap_entries: set[tuple[int, int]]
    ) -> None:
        ps = self.page_size
        if node._parent is not parent:
            raise IntegrityError("parent link", f"listed under {parent!r} but its parent is {node._parent!r}", node)
        if node.length == 0:
            raise IntegrityError("empty node", "a non-root node must hold at least one token", node)
        if len(node._key) != node.length or len(node._value) != node.length:
            raise IntegrityError(
                "key/value length", f"length {node.length}, key {len(node._key)}, value {len(node._value)}", node
            )
        if child_key(node._key, ps) != key:
            raise IntegrityError(
                "child key", f"filed under {key!r}, but its key starts {child_key(node._key, ps)!r}", node
            )
        if node.ref_count < 0:
            raise IntegrityError("ref_count", f"negative ref_count {node.ref_count}", node)
        if parent is not self.root_node and node.ref_count > parent.ref_count:
            raise IntegrityError("lock covers path", f"ref_count {node.ref_count} > parent's {parent.ref_count}", node)
        if parent is not self.root_node and node.timestamp > parent.timestamp:
            raise IntegrityError(
                "LRU order", f"used at t={node.timestamp}, after its parent (t={parent.timestamp})", node
            )
        if node._value.dtype != torch.int32 or node._value.device != self.device:
            raise IntegrityError("value tensor", f"value must be int32 on {self.device}", node)
        if bool((node._value < 0).any()):
            raise IntegrityError("slot range", "negative slot index", node)
        if ps > 1:
            if node.length % ps:
                raise IntegrityError(
                    "page alignment", f"length {node.length} is not a multiple of page_size {ps}", node
                )
            pages = node._value.view(-1, ps).long()
            offsets = torch.arange(ps, device=self.device)
            if bool((pages[:, 0] % ps != 0).any()) or not torch.equal(pages - pages[:, :1], offsets.expand_as(pages)):
                raise IntegrityError("page alignment", "slots do not form whole pages", node)
        if node.ref_count == 0 and not node.children and (node.timestamp, node.uid) not in heap_entries:
            raise IntegrityError("evictable leaves", "an evictable leaf is missing from the eviction heap", node)

    # -- helpers ------------------------------------------------------------

    def _new_slots(self, slots: np.ndarray) -> torch.Tensor:
        """A private copy of the new leaf's ``slots`` as a tensor, refused if no leaf could own them.

        Refused: a slot listed twice, or (paged) slots that are not whole pages.
        Runs after the walk, so a refused insert may have split a node on its way, which changes
        no cached token (exactly as a match does).
        """
        # Slots from a fresh pool ascend, which proves them distinct without a sort.
        if np.count_nonzero(slots[1:] <= slots[:-1]):
            ordered = np.sort(slots)  # (np.unique would sort too, at three times the cost)
            if np.count_nonzero(ordered[1:] == ordered[:-1]):
                raise ArgumentError("indices: the same slot is listed twice among the tokens to insert")
        ps = self.page_size
        if ps > 1:
            firsts = slots[::ps]
            whole_pages = (firsts[:, None] + self._page_offsets).reshape(-1)
            if np.count_nonzero(firsts % ps) or whole_pages.tobytes() != slots.tobytes():
                raise ArgumentError(
                    f"indices: with page_size {ps}, each page of tokens must get one whole page of slots"
                )
        value = torch.from_numpy(slots.copy())
        return value if self._on_cpu else value.to(self.device)

    def _path_of(self, handle: BaseCacheHandle) -> list[RadixTreeNode]:
        """The handle's node and its ancestors, root excluded; refuses a handle whose node left this tree."""
        if not isinstance(handle, RadixCacheHandle):
            raise ArgumentTypeError(f"handle must be a RadixCacheHandle, got {type(handle).__name__}")
        node = handle.node
        path = []
        while node._parent is not None:
            path.append(node)
            node = node._parent
        if node is not self.root_node:
            # Evicted nodes, and the top of a reset tree, hang under _EVICTED.
            why = "was evicted or reset away" if node is _EVICTED else "belongs to another manager's tree"
            raise StaleHandleError(f"handle: its node {handle.node!r} {why}")
        return path

    def _is_evictable_leaf(self, node: RadixTreeNode, timestamp: int) -> bool:
        return (
            node.timestamp == timestamp
            and node.ref_count == 0
            and not node.children
            and node._parent is not None
            and not node.is_evicted()
        )

    def _compact(self) -> None:
        """Drop the stale entries of the eviction heap, once they outnumber the nodes two to one."""
        self._evictable_leaves = [e for e in self._evictable_leaves if self._is_evictable_leaf(e[2], e[0])]
        heapq.heapify(self._evictable_leaves)

    def _nodes(self) -> Iterator[RadixTreeNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _values_from_root(node: RadixTreeNode) -> list[torch.Tensor]:
    """The slot tensors of ``node``'s path, root first (the root holds none)."""
    values = []
    while node._parent is not None:
        values.append(node._value)
        node = node._parent
    values.reverse()
    return values
