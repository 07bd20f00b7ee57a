"""The invariants of a radix cache, one small function each, and the one walk over its tree.

``RadixCacheManager.check_integrity()`` calls :func:`check_radix_cache`, which runs
:func:`check_invariants`: the checks below, in this order. The first rule that fails raises
an :class:`~minikv.errors.IntegrityError` that names it (its ``invariant``, such as
``"lock accounting"``):

1. :func:`check_root`: the root holds nothing, is always locked and has no parent;
2. :func:`check_counters`: the size counters, the node count and the clock are ints;
3. for every node, parents before children (:func:`walk_tree`):
   :func:`check_node_fields` (types), :func:`check_node_contents` (tokens, slots, pages),
   :func:`check_parent_link` (filed under its first token, pointing back at its parent),
   :func:`check_lru_order` (never used after its parent, never after the clock);
4. :func:`check_lock_counts`: each ``ref_count`` is its own locks plus its children's;
5. :func:`check_sizes`: the counters agree with the nodes;
6. :func:`check_slots_disjoint`: no slot held twice, and the record of held slots agrees;
7. :func:`check_evictable_heap`: the eviction heap is a heap, and holds every evictable leaf.

A state so broken that reading it fails (a node whose ``children`` is ``None``) is reported
as ``"readable state"``, never as a raw ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import radix_manager as radix
from ._validate import INT64
from .errors import IntegrityError
from .language import tr

if TYPE_CHECKING:
    from .radix_manager import ChildKey, RadixCacheManager, RadixTreeNode


# -- the one walk ---------------------------------------------------------------------


def walk_tree(root: RadixTreeNode) -> Iterator[tuple[RadixTreeNode, ChildKey, RadixTreeNode]]:
    """Every edge of the tree below ``root`` as ``(parent, key, child)``, parents before children.

    Lazy: a caller that checks each child before asking for the next one never makes the
    walk step into a child that is not a node.
    """
    stack = [root]
    while stack:
        parent = stack.pop()
        for key, child in parent.children.items():
            yield parent, key, child
            stack.append(child)


def tree_nodes(root: RadixTreeNode) -> Iterator[RadixTreeNode]:
    """Every node below ``root`` (``root`` excluded), parents before children."""
    return (child for _, _, child in walk_tree(root))


def tree_slots(cache: object) -> torch.Tensor:
    """Every slot the tree of ``cache`` holds, in no particular order (none for a manager without a tree).

    Reads any manager whose ``root_node`` has nodes with a ``value`` tensor, so a learner's own
    radix cache is read like minikv's.
    """
    root = getattr(cache, "root_node", None)
    values = [] if root is None else [node.value for node in tree_nodes(root)]
    if values:
        return torch.cat(values)
    return torch.empty(0, dtype=torch.int32, device=getattr(cache, "device", "cpu"))


# -- the checks, in the order they run ------------------------------------------------------


def check_radix_cache(cache: RadixCacheManager) -> None:
    """Every invariant of ``cache``; :class:`~minikv.errors.IntegrityError` names the first that fails."""
    try:
        check_invariants(cache)
    except IntegrityError:
        raise
    except Exception as error:  # state so broken that reading it fails
        raise IntegrityError("readable state", f"{type(error).__name__}: {error}") from error


def check_invariants(cache: RadixCacheManager) -> None:
    """The checks below, in order; the first that fails raises."""
    check_root(cache)
    check_counters(cache)
    nodes = []
    for parent, key, node in walk_tree(cache.root_node):
        check_node_fields(cache, node, parent, key)
        check_node_contents(cache, node)
        check_parent_link(cache, node, parent, key)
        check_lru_order(cache, node, parent)
        nodes.append(node)
    for node in nodes:
        check_lock_counts(node)
    check_sizes(cache, nodes)
    check_slots_disjoint(cache, nodes)
    check_evictable_heap(cache, nodes)


def check_root(cache: RadixCacheManager) -> None:
    """The root: a node with ``ref_count`` 1 (it is never evicted), no tokens, no slots and no parent."""
    root = cache.root_node
    if not isinstance(root, radix.RadixTreeNode):
        raise IntegrityError("root", f"root_node is a {type(root).__name__}, not a RadixTreeNode")
    if root.ref_count != 1 or root.parent is not None or root.length != 0 or len(root.key) or len(root.value):
        raise IntegrityError("root", "the root must have ref_count 1, no tokens, no slots and no parent", root)


def check_counters(cache: RadixCacheManager) -> None:
    """The size counters, the node count and the clock are ints."""
    for name in ("evictable_size", "protected_size", "_num_nodes", "_clock"):
        value = getattr(cache, name)
        if not _is_int(value):
            raise IntegrityError("counters", f"{name.lstrip('_')} is {value!r}, not an int")


def check_node_fields(cache: RadixCacheManager, node: object, parent: RadixTreeNode, key: ChildKey) -> None:
    """A node, with int counters, an ``int64`` array of tokens and ``int32`` slots on the manager's device."""
    if not isinstance(node, radix.RadixTreeNode):
        raise IntegrityError("child type", f"child {key!r} is a {type(node).__name__}", parent)
    for name in ("ref_count", "timestamp", "length", "_own_locks"):
        value = getattr(node, name)
        if not _is_int(value):
            raise IntegrityError("field types", f"{name.lstrip('_')} is {value!r}, not an int", node)
    if not isinstance(node.key, np.ndarray) or node.key.dtype != INT64 or node.key.ndim != 1:
        raise IntegrityError("key array", f"key must be a 1-D NumPy int64 array, got {_describe(node.key)}", node)
    value = node.value
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int32 or value.dim() != 1:
        raise IntegrityError("value tensor", f"value must be a 1-D int32 tensor, got {_describe(value)}", node)
    if value.device != cache.device:
        raise IntegrityError("value tensor", f"value is on {value.device}, not on {cache.device}", node)


def check_parent_link(cache: RadixCacheManager, node: RadixTreeNode, parent: RadixTreeNode, key: ChildKey) -> None:
    """A child points back at the parent that lists it, under the key its own tokens start with."""
    if node.parent is not parent:
        raise IntegrityError(
            "parent link",
            tr(
                "listed under {parent} but its parent is {its_parent}",
                parent=repr(parent),
                its_parent=repr(node.parent),
            ),
            node,
        )
    if radix.child_key(node.key, cache.page_size) != key:
        starts = radix.child_key(node.key, cache.page_size)
        raise IntegrityError("child key", f"filed under {key!r}, but its key starts {starts!r}", node)


def check_node_contents(cache: RadixCacheManager, node: RadixTreeNode) -> None:
    """At least one token, one slot per token, no negative slot, and whole pages of slots."""
    ps = cache.page_size
    if node.length == 0:
        raise IntegrityError("empty node", "a non-root node must hold at least one token", node)
    if len(node.key) != node.length or len(node.value) != node.length:
        raise IntegrityError(
            "key/value length", f"length {node.length}, key {len(node.key)}, value {len(node.value)}", node
        )
    if ps > 1 and node.length % ps:
        raise IntegrityError("page alignment", f"length {node.length} is not a multiple of page_size {ps}", node)
    if node.ref_count < 0 or node._own_locks < 0:
        raise IntegrityError("ref_count", f"negative ref_count {node.ref_count} (own {node._own_locks})", node)
    if bool((node.value < 0).any()):
        raise IntegrityError("slot range", "negative slot index", node)
    if ps > 1:
        pages = node.value.view(-1, ps).long()
        offsets = torch.arange(ps, device=cache.device)
        if bool((pages[:, 0] % ps != 0).any()) or not torch.equal(pages - pages[:, :1], offsets.expand_as(pages)):
            raise IntegrityError("page alignment", "slots do not form whole pages", node)


def check_lru_order(cache: RadixCacheManager, node: RadixTreeNode, parent: RadixTreeNode) -> None:
    """A node is never used after its parent (so a least recently used node is a leaf), nor after the clock."""
    if parent is not cache.root_node and node.timestamp > parent.timestamp:
        raise IntegrityError("LRU order", f"used at t={node.timestamp}, after its parent (t={parent.timestamp})", node)
    if node.timestamp > cache.clock:
        raise IntegrityError("clock", f"used at t={node.timestamp}, but the clock says {cache.clock}", node)


def check_lock_counts(node: RadixTreeNode) -> None:
    """A lock covers the path to the root: ``ref_count`` is the node's own locks plus its children's ``ref_count``."""
    below = sum(child.ref_count for child in node.children.values())
    if below > node.ref_count:
        raise IntegrityError(
            "lock covers path",
            tr("ref_count {ref_count} < its children's {below}", ref_count=node.ref_count, below=below),
            node,
        )
    if node.ref_count != node._own_locks + below:
        raise IntegrityError(
            "lock accounting", f"ref_count {node.ref_count}, but {node._own_locks} own locks + {below} from below", node
        )


def check_sizes(cache: RadixCacheManager, nodes: list[RadixTreeNode]) -> None:
    """The node count, ``evictable_size`` (slots of unlocked nodes) and ``protected_size`` (locked) are exact."""
    evictable = sum(node.length for node in nodes if node.ref_count == 0)
    protected = sum(node.length for node in nodes if node.ref_count > 0)
    if len(nodes) != cache.num_nodes:
        raise IntegrityError("node count", f"counter says {cache.num_nodes} nodes, the tree has {len(nodes)}")
    if evictable != cache.evictable_size:
        raise IntegrityError(
            "evictable_size",
            tr("counter is {counter}, unlocked nodes hold {held}", counter=cache.evictable_size, held=evictable),
        )
    if protected != cache.protected_size:
        raise IntegrityError(
            "protected_size",
            tr("counter is {counter}, locked nodes hold {held}", counter=cache.protected_size, held=protected),
        )


def check_slots_disjoint(cache: RadixCacheManager, nodes: list[RadixTreeNode]) -> None:
    """No slot held by two nodes (or twice by one), and the record of held slots says exactly which are held."""
    slots = torch.cat([n.value for n in nodes]).long().cpu() if nodes else torch.empty(0, dtype=torch.long)
    counts = torch.bincount(slots) if len(slots) else slots
    if len(counts) and int(counts.max()) > 1:
        dup = int(torch.argmax(counts))
        owners = [n for n in nodes if bool((n.value == dup).any())]
        raise IntegrityError(
            "slot held twice", tr("slot {slot} is held by {n} nodes", slot=dup, n=len(owners)), owners[0]
        )
    recorded = np.flatnonzero(cache.held_slot_mask())
    if recorded.tobytes() != torch.sort(slots).values.numpy().astype(recorded.dtype).tobytes():
        raise IntegrityError("held slots", "the record of held slots differs from the slots the nodes hold")


def check_evictable_heap(cache: RadixCacheManager, nodes: list[RadixTreeNode]) -> None:
    """The eviction heap: well-formed entries in heap order, none of another tree, and every evictable leaf in it."""
    heap = cache._heap
    in_tree = {node.uid for node in nodes}
    for i, entry in enumerate(heap):
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[2], radix.RadixTreeNode)):
            raise IntegrityError("eviction heap", f"entry {i} is {entry!r}, not (timestamp, uid, node)")
        timestamp, uid, node = entry
        if not isinstance(timestamp, int) or uid != node.uid:
            raise IntegrityError("eviction heap", f"entry {i} ({timestamp!r}, {uid!r}) names another node", node)
        if i and heap[(i - 1) // 2][:2] > entry[:2]:
            raise IntegrityError("eviction heap", f"entry {i} is smaller than its heap parent: not in heap order")
        if radix.is_live(timestamp, node) and uid not in in_tree:
            raise IntegrityError("eviction heap", f"entry {i} holds a node of another tree", node)
    queued = {(t, uid) for t, uid, _ in heap}
    for node in nodes:
        if node.ref_count == 0 and not node.children and (node.timestamp, node.uid) not in queued:
            raise IntegrityError("evictable leaves", "an evictable leaf is missing from the eviction heap", node)


# -- helpers -----------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: object) -> str:
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"{type(value).__name__} of {value.dtype}, shape {tuple(value.shape)}"
    return type(value).__name__
