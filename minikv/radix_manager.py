"""``RadixCacheManager``: share KV slots between requests whose prompts share a prefix.

Read this file beside chapter 5. The order is the order of the chapter:
the node (``RadixTreeNode``, ``get_match_len``, ``split_at``) and the key comparisons
(``child_key``, ``match_len``, ``key_matches_at``), the handle (``RadixCacheHandle``),
then the manager: its clock (``clock``, ``tick``), the walk (``walk``, made of ``find``,
which looks, and ``commit``, which splits and stamps), ``match_prefix``, ``insert_prefix``,
``lock_handle``, ``evict``, ``size_info``, ``check_integrity``, ``reset``; the readers
the chapter uses along the way (``nodes``, ``path_of``, ``evictable_leaves``,
``held_slot_mask``); last, the bookkeeping the methods share.

Two concerns live elsewhere, each in one place: the argument checks in ``minikv._validate``,
and the invariants ``check_integrity`` checks, one function each, in :mod:`minikv.integrity`.

Where this differs from the code the notes study (mini-sglang's old
``radix_manager.py``), it is on purpose:

* stored keys and values are copies, never views of the caller's tensors;
* time is a logical clock, so runs are reproducible;
* evict keeps a heap of evictable leaves up to date instead of scanning the
  whole tree on every call;
* every call checks its arguments before it changes anything (a refused call changes
  nothing, not even the clock), and ``check_integrity`` really checks;
* locks count per node, so an unlock at a node that holds no lock of its own is refused;
* ``insert_prefix`` may continue from the handle of the request's own locked match
  instead of walking the cached prefix again.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from . import integrity
from ._validate import (
    INT64,
    as_count,
    as_device,
    as_positive,
    as_slot_array,
    as_token_ids,
    check_cached_len,
    check_new_slots,
)
from .base import BaseCacheHandle, BaseCacheManager, SizeInfo, TokenIds
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    EvictionError,
    IntegrityError,
    LockError,
    StaleHandleError,
)
from .language import tr

ChildKey = int | tuple[int, ...]

_node_ids = itertools.count()
# Shared by every node until set_key_value gives it its own: never written to.
_NO_TOKENS = np.empty(0, dtype=INT64)
_NO_SLOTS = torch.empty(0, dtype=torch.int32)


class RadixTreeNode:
    """One edge of the radix tree: a run of tokens and the slots holding their KV.

    ``children`` maps the first token of each child (the first *page* of tokens,
    as a tuple, when ``page_size > 1``) to the child. ``ref_count`` is the
    number of locks whose path passes through this node; ``timestamp`` is the
    logical time of its last use, for LRU eviction. ``key`` (the token ids, a
    NumPy ``int64`` array), ``value`` (their slots, an ``int32`` tensor on the
    manager's device) and ``length`` are set together by :meth:`set_key_value`.
    ``parent`` is ``None`` for the root and for a node that left the tree.
    """

    __slots__ = ("_own_locks", "children", "key", "length", "parent", "ref_count", "timestamp", "uid", "value")

    def __init__(self, timestamp: int = 0) -> None:
        self.children: dict[ChildKey, RadixTreeNode] = {}
        self.parent: RadixTreeNode | None = None
        self.ref_count: int = 0
        self.uid: int = next(_node_ids)
        self.timestamp: int = timestamp
        self.key: np.ndarray = _NO_TOKENS
        self.value: torch.Tensor = _NO_SLOTS
        self.length: int = 0
        # The locks of handles that end at this node; ref_count adds the locks that pass
        # through it to the nodes below: ref_count == _own_locks + sum of children's ref_count.
        self._own_locks: int = 0

    def set_key_value(self, key: torch.Tensor | np.ndarray, value: torch.Tensor) -> None:
        """Give the node its tokens and their slots (one slot per token)."""
        length = key.shape[0]
        if length != value.shape[0]:
            raise ArgumentError(f"key has {length} tokens but value has {value.shape[0]} slots")
        key = key.numpy() if isinstance(key, torch.Tensor) else key
        self.key = key.astype(INT64, copy=False)  # the walk compares int64 ids
        self.value = value
        self.length = length

    def set_parent(self, parent: RadixTreeNode, page_size: int = 1) -> None:
        """Hang this node under ``parent``, filed under its first token (first page)."""
        self.parent = parent
        parent.children[child_key(self.key, page_size)] = self

    def is_root(self) -> bool:
        """The root: no parent and no tokens."""
        return self.parent is None and self.length == 0

    def is_evicted(self) -> bool:
        """True once this node left its tree: ``evict`` removed it, or ``reset`` dropped the tree below it.

        Below the top of a reset tree a node does not know it was dropped; its handles are
        stale all the same, and ``lock_handle`` refuses them (it walks up to the root).
        """
        return self.parent is None and self.length > 0

    def is_leaf(self) -> bool:
        return not self.children

    def get_match_len(self, input_ids: np.ndarray) -> int:
        """How many leading tokens of ``input_ids`` equal this node's key."""
        return match_len(self.key, input_ids)

    def split_at(self, pos: int, page_size: int = 1) -> RadixTreeNode:
        """Cut this node after ``pos`` tokens; return the new upper node.

        The upper node takes the first ``pos`` tokens and slots and this node's
        place under the parent; this node keeps the rest and hangs below it.
        ``ref_count`` and ``timestamp`` are copied: every lock and every use of
        this node covered both halves. Handles that point at this node stay
        valid, since it still ends where it ended (and so do its own locks).
        """
        if not 0 < pos < self.length:
            raise ArgumentError(f"pos must be in (0, {self.length}), got {pos}")
        parent = self.parent
        if parent is None:
            raise ArgumentError("split_at: this node is in no tree (the root is never split)")
        upper = RadixTreeNode(self.timestamp)
        upper.set_key_value(self.key[:pos], self.value[:pos])
        upper.ref_count = self.ref_count
        upper.set_parent(parent, page_size)  # replaces self in parent.children
        self.set_key_value(self.key[pos:], self.value[pos:])
        self.set_parent(upper, page_size)
        return upper

    def __repr__(self) -> str:
        if self.is_root():
            return "RadixTreeNode(root)"
        try:
            shown = str(list(self.key[:6].tolist())) + ("..." if len(self.key) > 6 else "")
        except (TypeError, AttributeError):  # a corrupted key must not hide the error that names it
            shown = f"<{type(self.key).__name__}>"
        state = "evicted, " if self.is_evicted() else ""
        return f"RadixTreeNode({state}key={shown}, len={self.length}, ref={self.ref_count}, t={self.timestamp})"


Cut = tuple[RadixTreeNode, int] | None
"""Where a match ends inside a node: ``(node, tokens of it matched)``; ``None`` when it ends on a boundary."""


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


def key_matches_at(tokens: bytes, key: np.ndarray, start: int) -> bool:
    """Whether the token ids in ``tokens`` (int64 ids as bytes), from position ``start`` on, begin with ``key``.

    One comparison in place (a ``memcmp``), with no copy of either side: the walk
    turns the request's tokens into bytes once and tests each node's key this way.
    """
    return tokens.startswith(key.data, start * INT64.itemsize)


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    """A matched prefix: its length and the deepest node it reaches."""

    node: RadixTreeNode

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.node, RadixTreeNode):
            raise ArgumentTypeError(f"node must be a RadixTreeNode, got {type(self.node).__name__}")


class RadixCacheManager(BaseCacheManager):
    """Prefix cache as a radix tree over token ids, with LRU eviction of unlocked leaves."""

    def __init__(self, device: torch.device | str = "cpu", page_size: int = 1) -> None:
        self.device = as_device(device)
        self.page_size = as_positive(page_size, "page_size")
        # The notes' pre-created empty result: the template of every empty result (which
        # is a fresh tensor each time, so a caller that resizes its result changes nothing).
        self.empty_tensor = torch.empty(0, dtype=torch.int32, device=self.device)
        self.root_node = RadixTreeNode()
        self.root_node.ref_count = 1  # the root is always protected and never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0
        self._num_nodes = 0
        # Min-heap of (timestamp, uid, node) over evictable leaves. An entry goes stale
        # when its node is used, locked, gains a child or is evicted; stale entries are
        # skipped when popped, and dropped when the heap grows past twice the tree.
        self._heap: list[tuple[int, int, RadixTreeNode]] = []
        # _slot_held[s]: whether a node of this tree holds slot s (grown on demand).
        self._slot_held = np.zeros(0, dtype=bool)

    # -- the clock ----------------------------------------------------------

    @property
    def clock(self) -> int:
        """The logical time now: the time of the last walk (0 before the first)."""
        return self._clock

    def tick(self) -> int:
        """Advance the clock by one and return the new time."""
        self._clock += 1
        return self._clock

    # -- the walk: find (looks), then commit (splits and stamps) ---------------

    def walk(self, input_ids: TokenIds) -> tuple[RadixTreeNode, int]:
        """Descend from the root along ``input_ids``; return the deepest node reached and the matched length.

        A match that ends inside a node splits it so that the match ends on a
        node boundary. Every node on the matched path gets the current time.
        With ``page_size > 1`` matching goes a whole page at a time.

        A walk has two halves: :meth:`find` looks (and changes nothing), :meth:`commit`
        splits and stamps. ``insert_prefix`` checks its slots between the two.
        """
        node, prefix_len, cut = self.find(as_token_ids(input_ids))
        return self.commit(node, cut), prefix_len

    def find(
        self, ids: np.ndarray, node: RadixTreeNode | None = None, prefix_len: int = 0
    ) -> tuple[RadixTreeNode, int, Cut]:
        """The read-only half of a walk: how far the tree matches ``ids``.

        ``ids`` is a 1-D int64 NumPy array (as ``as_token_ids`` makes it).
        The search starts at ``node`` (the root by default), which matched ``ids[:prefix_len]``.
        Returns the deepest node matched whole, the matched length, and the cut:
        ``(child, tokens of it matched)`` when the match goes on inside a child of that
        node, else ``None``. Changes nothing.
        """
        node = self.root_node if node is None else node
        end = len(ids) - len(ids) % self.page_size  # whole pages only
        tokens = ids[:end].tobytes()  # once per walk: each key is compared with it in place
        while prefix_len < end:
            child = node.children.get(child_key(ids, self.page_size, prefix_len))
            if child is None:
                break
            if not key_matches_at(tokens, child.key, prefix_len):
                matched = child.get_match_len(ids[prefix_len:end])
                matched -= matched % self.page_size  # the match ends inside this child, after whole pages
                return node, prefix_len + matched, (child, matched)
            node = child
            prefix_len += node.length
        return node, prefix_len, None

    def commit(self, node: RadixTreeNode, cut: Cut) -> RadixTreeNode:
        """The changing half of a walk: one tick, the cut child split, the matched path stamped.

        Returns the node where the match ends: ``node``, or the upper half of the split.
        It and every node above it get the current time.
        """
        now = self.tick()
        if cut is not None:
            node = cut[0].split_at(cut[1], self.page_size)
            self._num_nodes += 1
        end = node
        while node.parent is not None:
            node.timestamp = now
            if node.ref_count == 0 and not node.children:
                self._push_evictable(node)  # a used leaf moves to the back of the LRU queue
            node = node.parent
        return end

    # -- the public interface ----------------------------------------------

    def match_prefix(self, input_ids: TokenIds) -> tuple[RadixCacheHandle, torch.Tensor]:
        node, prefix_len = self.walk(input_ids)
        if prefix_len == 0:
            return RadixCacheHandle(0, node), self._no_slots()
        return RadixCacheHandle(prefix_len, node), torch.cat(values_from_root(node))

    def insert_prefix(self, input_ids: TokenIds, indices: TokenIds, *, handle: BaseCacheHandle | None = None) -> int:
        ids = as_token_ids(input_ids)
        slots = as_slot_array(indices, self.device, length=len(ids))
        start, start_len = (self.root_node, 0) if handle is None else self._start_at(handle, ids)
        node, prefix_len, cut = self.find(ids, start, start_len)
        end = len(ids) - len(ids) % self.page_size
        new_slots = slots[prefix_len:end]
        check_new_slots(new_slots, self._slot_held, self.page_size)
        # Nothing was changed before this line, so a refused call changed nothing.
        node = self.commit(node, cut)
        if len(new_slots):
            self._add_leaf(node, ids[prefix_len:end], new_slots)
        return prefix_len

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        path = self.path_of(handle)
        if not path:
            return  # the handle of an empty match: nothing to lock
        node = path[0]
        if unlock:
            if node._own_locks <= 0:
                raise LockError(tr("handle: cannot unlock, {node} holds no lock of its own", node=repr(node)))
            node._own_locks -= 1
            for n in path:
                n.ref_count -= 1
                if n.ref_count == 0:
                    self.protected_size -= n.length
                    self.evictable_size += n.length
                    if not n.children:
                        self._push_evictable(n)
        else:
            node._own_locks += 1
            for n in path:
                if n.ref_count == 0:
                    self.evictable_size -= n.length
                    self.protected_size += n.length
                n.ref_count += 1

    def evict(self, size: int) -> torch.Tensor:
        size = as_count(size, "size")
        if size > self.evictable_size:
            raise EvictionError(
                tr(
                    "size: asked to evict {size} slots but only {evictable} are evictable",
                    size=size,
                    evictable=self.evictable_size,
                )
            )
        evicted: list[torch.Tensor] = []
        evicted_size = 0
        while evicted_size < size:
            if not self._heap:
                raise IntegrityError("evictable_size", f"says {self.evictable_size}, but no evictable leaf is left")
            timestamp, _, node = heapq.heappop(self._heap)
            if is_live(timestamp, node):
                evicted.append(self._remove_leaf(node))
                evicted_size += node.length
        if not evicted:
            return self._no_slots()
        freed = torch.cat(evicted)
        self._release(freed)
        return freed

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.evictable_size, self.protected_size)

    def check_integrity(self) -> None:
        """Every invariant of the tree, each checked by a function of :mod:`minikv.integrity`."""
        integrity.check_radix_cache(self)

    def reset(self) -> torch.Tensor:
        if self.protected_size:
            raise LockError(
                tr("reset: {locked} slots are locked; unlock every handle first", locked=self.protected_size)
            )
        held = [n.value for n in self.nodes()]
        for top in self.root_node.children.values():
            top.parent = None  # every handle into the old tree is now stale
        self.root_node.children.clear()
        self.evictable_size = 0
        self._heap.clear()
        self._num_nodes = 0
        self._slot_held = np.zeros_like(self._slot_held)
        return torch.cat(held) if held else self._no_slots()

    # -- reading the tree ---------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, root excluded."""
        return self._num_nodes

    def nodes(self) -> Iterator[RadixTreeNode]:
        """Every node but the root, parents before children."""
        return integrity.tree_nodes(self.root_node)

    def path_of(self, handle: BaseCacheHandle) -> list[RadixTreeNode]:
        """The handle's node and its ancestors, root excluded; refuses a handle whose node left this tree."""
        if not isinstance(handle, RadixCacheHandle):
            raise ArgumentTypeError(tr("handle must be a RadixCacheHandle, got {type}", type=type(handle).__name__))
        node = handle.node
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        if node is not self.root_node:
            if node.length:
                raise StaleHandleError(tr("handle: its node {node} was evicted or reset away", node=repr(handle.node)))
            raise StaleHandleError(
                tr("handle: its node {node} belongs to another manager's tree", node=repr(handle.node))
            )
        return path

    def evictable_leaves(self) -> list[RadixTreeNode]:
        """The leaves ``evict`` may take, least recently used first (the order it takes them in)."""
        return [node for _, _, node in sorted(self._live_entries(), key=lambda entry: entry[:2])]

    def held_slot_mask(self) -> np.ndarray:
        """The record of held slots, read-only: ``mask[s]`` is True when a node of this tree holds slot ``s``.

        Slots past its end are not held. The manager keeps it to refuse a slot that the tree
        holds already; a page pool reads it to check, in one step whatever the size of the
        tree, that the tree holds only slots the pool handed out.
        """
        view: np.ndarray = self._slot_held.view()
        view.flags.writeable = False
        return view

    # -- bookkeeping --------------------------------------------------------

    def _start_at(self, handle: BaseCacheHandle, ids: np.ndarray) -> tuple[RadixTreeNode, int]:
        """Where an insert may start: ``handle``'s node and length, once proven a locked match of ``ids``.

        Walking up from its node proves it is in this tree; comparing each key on the path
        proves its tokens are the first ``cached_len`` of ``ids``. A walk from its node then
        finds exactly what a walk from the root would.
        """
        path = self.path_of(handle)
        if path and path[0].ref_count <= 0:
            raise LockError(f"handle: {path[0]!r} is not locked; pass the handle of your own locked match")
        check_cached_len(handle.cached_len, len(ids), self.page_size)
        tokens, offset = ids[: handle.cached_len].tobytes(), 0
        for node in reversed(path):
            if not key_matches_at(tokens, node.key, offset):
                raise ArgumentError(f"handle: its tokens are not a prefix of input_ids (they differ in {node!r})")
            offset += node.length
        if offset != handle.cached_len:
            raise ArgumentError(f"handle: cached_len is {handle.cached_len}, but its path holds {offset} tokens")
        return self.root_node if not path else path[0], handle.cached_len

    def _add_leaf(self, parent: RadixTreeNode, ids: np.ndarray, slots: np.ndarray) -> None:
        """Hang a new unlocked leaf with these tokens and slots under ``parent`` (copies of both)."""
        leaf = RadixTreeNode(self._clock)
        # Copies: the caller may reuse its page-table row (mini-sglang bug 94fe255).
        leaf.set_key_value(ids.copy(), self._to_device(slots.copy()))
        leaf.set_parent(parent, self.page_size)
        self._num_nodes += 1
        self.evictable_size += leaf.length
        try:
            self._slot_held[slots] = True
        except IndexError:  # a slot past the end of the record: grow it, doubling, so rarely
            grown = np.zeros(max(int(slots.max()) + 1, 2 * len(self._slot_held)), dtype=bool)
            grown[: len(self._slot_held)] = self._slot_held
            self._slot_held = grown
            self._slot_held[slots] = True
        self._push_evictable(leaf)  # the parent's heap entry, if it had one, is stale now: it has a child

    def _remove_leaf(self, node: RadixTreeNode) -> torch.Tensor:
        """Take an evictable leaf out of the tree; return its slots. Its parent may become evictable."""
        parent = node.parent
        assert parent is not None  # a live entry's node is in the tree
        del parent.children[child_key(node.key, self.page_size)]
        node.parent = None  # it left the tree: its handles are stale now
        self._num_nodes -= 1
        self.evictable_size -= node.length
        if parent is not self.root_node and not parent.children and parent.ref_count == 0:
            self._push_evictable(parent)
        return node.value

    def _push_evictable(self, node: RadixTreeNode) -> None:
        """Queue an evictable leaf under its current timestamp (older entries for it go stale)."""
        heapq.heappush(self._heap, (node.timestamp, node.uid, node))
        if len(self._heap) > 2 * self._num_nodes + 64:  # too many stale entries: keep the live ones
            self._heap = self._live_entries()
            heapq.heapify(self._heap)

    def _live_entries(self) -> list[tuple[int, int, RadixTreeNode]]:
        """The heap's entries that still name an evictable leaf, one per leaf."""
        live = {uid: (t, uid, node) for t, uid, node in self._heap if is_live(t, node)}
        return list(live.values())

    def _release(self, freed: torch.Tensor) -> None:
        """Record that the tree no longer holds these slots."""
        on_host = freed if freed.is_cpu else freed.cpu()  # one transfer from a GPU, none on the CPU
        self._slot_held[on_host.numpy()] = False

    def _to_device(self, slots: np.ndarray) -> torch.Tensor:
        value = torch.from_numpy(slots)
        return value if self.device.type == "cpu" else value.to(self.device)

    def _no_slots(self) -> torch.Tensor:
        """An empty result: a new tensor each time, so that no caller can resize another's."""
        return self.empty_tensor.new_empty(0)


def is_live(timestamp: int, node: RadixTreeNode) -> bool:
    """Whether an eviction-heap entry still names an evictable leaf: in the tree, unused since it was queued."""
    return node.timestamp == timestamp and node.ref_count == 0 and not node.children and node.parent is not None


def values_from_root(node: RadixTreeNode) -> list[torch.Tensor]:
    """The slot tensors of ``node``'s path, root first (the root holds none)."""
    values = []
    while node.parent is not None:
        values.append(node.value)
        node = node.parent
    values.reverse()
    return values
