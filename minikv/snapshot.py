"""A radix tree at one moment, as plain immutable values: the one snapshot everything else reads.

:meth:`TreeSnapshot.of` walks a manager's tree once, through public attributes
only (``root_node``, each node's ``children``, ``key``, ``value``,
``ref_count``, ``timestamp``, ``parent``), and changes nothing. What it
returns is what the drawings (``minikv.viz``), the recorder, the exercise
checks, the tests and the book all look at:

* a node is named by its *token path*, every token from the root to the end of
  the node; that name comes from content only, so the same operations always
  give the same names (no ``uid`` or memory address);
* children are listed in a fixed order (by the key they are filed under), so
  two snapshots of equal trees are equal, and print and draw alike;
* a broken tree (a learner's, in the exercises) is recorded as it is: a child
  filed under the wrong key, or whose ``parent`` link points elsewhere, or with
  no tokens at all, keeps its place, and the flags say what is wrong.

:func:`diff_snapshots` says what one operation changed between two snapshots,
and :func:`outline` prints a snapshot as indented text::

    >>> manager = RadixCacheManager()
    >>> manager.insert_prefix([1, 2, 3], [0, 1, 2])
    0
    >>> print(outline(TreeSnapshot.of(manager)))
    root (ref_count 1)
    └─ [1, 2, 3] · slots [0, 1, 2] · ref 0 · t=1
    evictable_size 3, protected_size 0
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from numbers import Real
from types import MappingProxyType
from typing import Any

from .base import SizeInfo
from .errors import ArgumentError, ArgumentTypeError, IntegrityError

__all__ = [
    "SLOT_STATES",
    "NodeView",
    "Path",
    "SlotOwnership",
    "TreeChanges",
    "TreeSnapshot",
    "VocabLike",
    "diff_snapshots",
    "node_path",
    "outline",
    "token_namer",
    "words",
]

Path = tuple[int, ...]
"""A node's name: every token id from the root down to the node's last token. The root is ``()``."""

VocabLike = Mapping[int, Any] | Callable[[int], Any] | Sequence[str] | None
"""How token ids become words: a dict ``id -> word``, a callable, a sequence indexed by id, or ``None`` (show ids)."""


# -- token ids -> words -------------------------------------------------------------


def token_namer(vocab: VocabLike) -> Callable[[int], str]:
    """Turn ``vocab`` into a function ``id -> word``; ids it does not know are shown as numbers."""
    if vocab is None:
        return str
    if isinstance(vocab, (str, bytes)):
        raise ArgumentTypeError("vocab must be a dict id->word, a callable or a sequence of words, got a string")
    if isinstance(vocab, Mapping):
        return lambda token: str(vocab[token]) if token in vocab else str(token)
    if callable(vocab):
        return lambda token: str(vocab(token))
    if isinstance(vocab, Sequence):
        return lambda token: str(vocab[token]) if 0 <= token < len(vocab) else str(token)
    raise ArgumentTypeError(
        f"vocab must be a dict id->word, a callable or a sequence of words, got {type(vocab).__name__}"
    )


def words(tokens: Sequence[int], namer: Callable[[int], str], limit: int | None = None) -> str:
    """``Hello world``-style text for captions: words joined by spaces, cut after ``limit`` tokens."""
    shown = list(tokens if limit is None else tokens[:limit])
    text = " ".join(_printable(namer(t)) for t in shown)
    if limit is not None and len(tokens) > limit:
        text += f" … (+{len(tokens) - limit})"
    return text


def _printable(word: str) -> str:
    """Make whitespace-only and control-character words visible."""
    word = word.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return word if word.strip() else "␣" * max(1, len(word))


# -- the snapshot ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NodeView:
    """One node as plain values, frozen at the moment of the snapshot."""

    path: Path
    """Token ids from the root to this node's end: the node's name."""
    start: int
    """How many of ``path``'s tokens belong to the ancestors."""
    slots: tuple[int, ...]
    """The node's ``value``: the slot holding each of its tokens."""
    ref_count: int
    timestamp: int
    children: tuple[NodeView, ...] = ()
    """The children, in the order of the keys they are filed under (for a healthy tree: by token)."""
    filed_under: Hashable = None
    """The key the parent's ``children`` dict files this node under (``None`` for the root)."""
    parent_ok: bool = True
    """The node's ``parent`` is the node whose ``children`` list it (always so in a healthy tree)."""

    @property
    def tokens(self) -> Path:
        """This node's own tokens (its ``key``; its edge label in a drawing)."""
        return self.path[self.start :]

    @property
    def parent(self) -> Path:
        """The path of the node above."""
        return self.path[: self.start]

    @property
    def child_paths(self) -> tuple[Path, ...]:
        return tuple(child.path for child in self.children)

    @property
    def is_root(self) -> bool:
        return self.filed_under is None and not self.path

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def state(self) -> str:
        """``root``, ``protected`` (locked), ``evictable`` (an unlocked leaf) or ``interior`` (unlocked, inner)."""
        if self.is_root:
            return "root"
        if self.ref_count > 0:
            return "protected"
        return "evictable" if self.is_leaf else "interior"

    def _row(self) -> tuple[Any, ...]:
        """Every value of this node, its children by path: what equality compares."""
        return (
            self.path, self.start, self.slots, self.ref_count, self.timestamp,
            self.child_paths, self.filed_under, self.parent_ok,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeView):
            return NotImplemented
        return self._row() == other._row()

    def __hash__(self) -> int:
        return hash(self._row())

    def __repr__(self) -> str:
        return (
            f"NodeView(path={list(self.path)}, slots={list(self.slots)}, ref_count={self.ref_count}, "
            f"timestamp={self.timestamp}, {len(self.children)} children)"
        )


@dataclass(frozen=True, eq=False)
class TreeSnapshot:
    """A manager's tree at one moment, as immutable values (see the module docstring)."""

    page_size: int
    root: NodeView
    size_info: SizeInfo
    clock: int | None = None
    """The manager's logical time when the snapshot was taken (``None`` if it has no clock)."""
    _nodes: Mapping[Path, NodeView] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int):
            raise ArgumentTypeError(f"page_size must be an int, got {type(self.page_size).__name__}")
        if self.page_size < 1:
            raise ArgumentError(f"page_size must be at least 1, got {self.page_size}")
        if not isinstance(self.root, NodeView):
            raise ArgumentTypeError(f"root must be a NodeView, got {type(self.root).__name__}")
        by_path: dict[Path, NodeView] = {}
        for view in self.depth_first():
            by_path.setdefault(view.path, view)
        object.__setattr__(self, "_nodes", MappingProxyType(by_path))

    @classmethod
    def of(cls, manager: Any, *, max_nodes: int | None = None) -> TreeSnapshot:
        """Read ``manager``'s tree without changing it (only public attributes are read).

        Works with :class:`~minikv.RadixCacheManager`, a :class:`~minikv.viz.recorder.TreeRecorder`
        around one, or any object with the same ``root_node`` structure. A broken tree in
        which a node is listed as its own descendant (a cycle) is refused with
        :class:`~minikv.errors.IntegrityError`; a node listed under two parents is recorded
        under both, with its children under the first only (so the walk takes time linear in
        the tree, whatever it shares); ``max_nodes`` also stops the walk of a tree that is
        larger than expected. A field of the wrong type (a ``children`` that is not a
        dict, a ``key`` or ``value`` that is not a list of ints, a ``ref_count`` that is not a
        number) is refused with :class:`~minikv.errors.ArgumentTypeError` naming the field.
        """
        root = getattr(manager, "root_node", None)
        if root is None or not hasattr(root, "children"):
            raise ArgumentTypeError(
                f"manager must be a RadixCacheManager (something with a tree to draw), got {type(manager).__name__}"
            )
        page_size = _int(getattr(manager, "page_size", 1), "page_size")
        if page_size < 1:
            raise ArgumentError(f"manager: page_size must be at least 1, got {page_size}")
        # Walk top down, recording each node with the index of its parent; then build the
        # frozen views bottom up (a child's view must exist before its parent's).
        records: list[tuple[Any, Path, int, Hashable, bool, int]] = [(root, (), 0, None, True, -1)]
        kids_of: list[list[int]] = [[]]
        expanded: set[int] = set()  # a node listed under two parents is drawn twice, its children once
        position = 0
        while position < len(records):
            node, path, _, _, _, _ = records[position]
            if id(node) in expanded:
                position += 1
                continue
            expanded.add(id(node))
            for filed_under, child in _children(node):
                if max_nodes is not None and len(records) > max_nodes:
                    raise IntegrityError(
                        "tree shape",
                        f"the tree has more than {max_nodes} nodes: is a node listed as its own descendant?",
                    )
                if _is_on_path(records, position, child):
                    raise IntegrityError(
                        "tree shape", f"a node below {list(path)} is its own ancestor: the tree has a cycle"
                    )
                child_path = path + _ints(getattr(child, "key", None), "a node's key")
                kids_of[position].append(len(records))
                parent_ok = getattr(child, "parent", None) is node
                records.append((child, child_path, len(path), filed_under, parent_ok, position))
                kids_of.append([])
            position += 1
        views: dict[int, NodeView] = {}
        for index in range(len(records) - 1, -1, -1):
            node, path, start, filed_under, parent_ok, _ = records[index]
            children = sorted((views[k] for k in kids_of[index]), key=_child_order)
            slots = () if index == 0 else _ints(getattr(node, "value", None), "a node's value")
            ref_count = _int(getattr(node, "ref_count", None), "a node's ref_count")
            timestamp = _int(getattr(node, "timestamp", None), "a node's timestamp")
            views[index] = NodeView(path, start, slots, ref_count, timestamp, tuple(children), filed_under, parent_ok)
        top = views[0]
        info = getattr(manager, "size_info", None)
        if not isinstance(info, SizeInfo):
            live = [view for index, view in views.items() if index > 0]
            info = SizeInfo(
                sum(len(v.tokens) for v in live if v.ref_count == 0),
                sum(len(v.tokens) for v in live if v.ref_count > 0),
            )
        return cls(page_size, top, info, _clock_of(manager))

    @property
    def nodes(self) -> Mapping[Path, NodeView]:
        """Every node by path, the root at ``()``. (In a broken tree, two nodes may share a path:
        the first in :meth:`depth_first` order is listed; :meth:`depth_first` yields them all.)"""
        return self._nodes

    @property
    def num_nodes(self) -> int:
        """Nodes, root excluded (as ``RadixCacheManager.num_nodes`` counts them)."""
        return sum(1 for _ in self.depth_first()) - 1

    def depth_first(self) -> Iterator[NodeView]:
        """Every node, root first, children in their fixed order: the order drawings and outlines list them."""
        stack = [self.root]
        while stack:
            view = stack.pop()
            yield view
            stack.extend(reversed(view.children))

    def views(self) -> list[NodeView]:
        """Every node but the root, in :meth:`depth_first` order."""
        return [view for view in self.depth_first() if view is not self.root]

    def slots(self) -> list[int]:
        """Every slot the tree holds, sorted."""
        return sorted(slot for view in self.views() for slot in view.slots)

    def path_along(self, tokens: Sequence[int]) -> tuple[Path, ...]:
        """The nodes (root excluded) that end inside ``tokens``, top down: the path a match of ``tokens`` walks."""
        tokens = tuple(int(t) for t in tokens)
        return tuple(p for p in (tokens[:n] for n in range(1, len(tokens) + 1)) if p in self._nodes)

    def _rows(self) -> tuple[Any, ...]:
        return (self.page_size, tuple(self.size_info), self.clock, tuple(v._row() for v in self.depth_first()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeSnapshot):
            return NotImplemented
        return self._rows() == other._rows()

    def __hash__(self) -> int:
        return hash(self._rows())

    def __repr__(self) -> str:
        info = self.size_info
        return (
            f"<TreeSnapshot: {self.num_nodes} nodes, {info.total_size} slots "
            f"({info.protected_size} protected, {info.evictable_size} evictable)>"
        )

    @cached_property
    def _text(self) -> str:
        return outline(self)

    def __str__(self) -> str:
        return self._text


def _child_order(view: NodeView) -> tuple[Any, ...]:
    """Children by the key they are filed under: an int token, then a tuple (a page), then anything else."""
    key = view.filed_under
    if isinstance(key, tuple) and all(isinstance(t, int) for t in key):
        rank: tuple[Any, ...] = (1, key)
    elif isinstance(key, int):
        rank = (0, (key,))
    else:
        rank = (2, (repr(key),))
    return (rank, view.path)


def _clock_of(manager: Any) -> int | None:
    clock = getattr(manager, "clock", None)
    return None if clock is None else _int(clock, "clock")


# -- reading a node's fields, refusing wrong types with a minikv error ---------------------


def _children(node: Any) -> list[tuple[Hashable, Any]]:
    children = getattr(node, "children", None)
    if not isinstance(children, Mapping):
        raise ArgumentTypeError(f"manager: a node's children must be a dict, got {type(children).__name__}")
    return list(children.items())


def _int(value: Any, field: str) -> int:
    """A number as an int (a float timestamp is read too); anything else is refused naming the field."""
    if hasattr(value, "ndim") and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or array
    if not isinstance(value, Real):
        raise ArgumentTypeError(f"manager: {field} must be a number, got {type(value).__name__}")
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (ValueError, OverflowError):
        raise ArgumentTypeError(f"manager: {field} must be a finite number, got {value!r}") from None


def _ints(value: Any, field: str) -> tuple[int, ...]:
    """A 1-D tensor, array or sequence of ints as a tuple; anything else is refused naming the field."""
    if getattr(value, "ndim", 1) != 1 or isinstance(value, (str, bytes)):
        raise ArgumentTypeError(f"manager: {field} must be a 1-D list of ints, got {type(value).__name__}")
    items = value.tolist() if hasattr(value, "tolist") else value
    try:
        return tuple(_int(item, field) for item in items)
    except ArgumentTypeError:
        raise
    except TypeError:
        raise ArgumentTypeError(f"manager: {field} must be a list of ints, got {type(value).__name__}") from None


def node_path(node: Any, *, limit: int | None = None) -> Path:
    """Every token from the root down to ``node`` (what a handle on ``node`` stands for).

    Reads ``key`` and ``parent`` only. ``limit`` caps the climb (a broken tree may have a loop).
    """
    pieces: list[list[int]] = []
    while node is not None and getattr(node, "parent", None) is not None and (limit is None or len(pieces) < limit):
        pieces.append([int(t) for t in node.key.tolist()])
        node = node.parent
    return tuple(t for piece in reversed(pieces) for t in piece)


# -- who owns each slot of the pool ---------------------------------------------------------

SLOT_STATES: Mapping[str, str] = MappingProxyType(
    {
        "free": "free in the pool",
        "evictable": "in the tree, evictable (ref 0)",
        "locked": "in the tree, locked (ref > 0)",
        "evicted": "evicted, on its way to the pool",
        "request": "owned by a running request",
        "conflict": "free AND in the tree, or in two nodes (a bug)",
    }
)
"""Each state a slot can be in, and its meaning, in the order a strip's legend lists them."""


@dataclass(frozen=True)
class SlotOwnership:
    """Who owns each slot of a page pool at one moment: the pool, the tree, or a running request.

    A slot is ``free`` (in the pool's free list), ``evictable`` or ``locked``
    (held by a node of the tree whose ``ref_count`` is 0, or more),
    ``evicted`` (``evict`` returned it and the pool has not taken it back
    yet: it is in the caller's hands, on its way to the pool), or
    ``request``: none of these, so a running request owns it (it was
    allocated and not yet inserted or freed). ``conflict`` is a slot with two
    owners at once -- free and in the tree, or in two nodes -- which is the
    bug the book's errata show.
    """

    states: tuple[str, ...]
    """One state per slot, slot 0 first."""
    page_size: int = 1

    @classmethod
    def of(cls, snapshot: TreeSnapshot | None, pool: Any, evicted: Any = ()) -> SlotOwnership:
        """Read ``pool`` (a :class:`~minikv.PagePool`) and ``snapshot`` (``None``: no tree, e.g. a naive manager).

        ``evicted``: slots that ``evict`` returned and the caller has not yet
        given back to the pool. Those that are neither free nor in the tree
        are ``evicted``, not ``request``; the pool alone cannot tell them apart.
        """
        if not hasattr(pool, "free_slots") or not hasattr(pool, "num_slots"):
            raise ArgumentTypeError(f"pool must be a PagePool, got {type(pool).__name__}")
        num_slots = int(pool.num_slots)
        leaving = _evicted_slots(evicted, num_slots)
        free = {int(slot) for slot in pool.free_slots().tolist()}
        held: dict[int, list[int]] = {}
        for view in snapshot.views() if snapshot is not None else ():
            for slot in view.slots:
                held.setdefault(slot, []).append(view.ref_count)
        states = []
        for slot in range(num_slots):
            refs = held.get(slot, [])
            if len(refs) > 1 or (refs and slot in free):
                states.append("conflict")
            elif refs:
                states.append("locked" if refs[0] > 0 else "evictable")
            else:
                states.append("free" if slot in free else "evicted" if slot in leaving else "request")
        return cls(tuple(states), int(getattr(pool, "page_size", 1)))

    @property
    def num_slots(self) -> int:
        return len(self.states)

    def slots(self, state: str) -> list[int]:
        """The slots in ``state`` (one of :data:`SLOT_STATES`), in order."""
        if state not in SLOT_STATES:
            raise ArgumentTypeError(f"state must be one of {list(SLOT_STATES)}, got {state!r}")
        return [slot for slot, s in enumerate(self.states) if s == state]

    def counts(self) -> dict[str, int]:
        """How many slots are in each state."""
        return {state: self.states.count(state) for state in SLOT_STATES}

    def __str__(self) -> str:
        """One letter per slot: ``.`` free, ``e`` evictable, ``L`` locked, ``x`` evicted, ``r`` request,
        ``!`` conflict."""
        return "".join(_SLOT_LETTERS[s] for s in self.states)


def _evicted_slots(evicted: Any, num_slots: int) -> set[int]:
    """``SlotOwnership.of``'s ``evicted`` as a set, refused naming the argument when it is not slots of the pool."""
    try:
        slots = set(_ints(evicted, "evicted"))
    except ArgumentTypeError:
        raise ArgumentTypeError(f"evicted must be a 1-D list of slot numbers, got {type(evicted).__name__}") from None
    outside = sorted(slot for slot in slots if not 0 <= slot < num_slots)
    if outside:
        raise ArgumentError(f"evicted: slot {outside[0]} is not in the pool (slots 0..{num_slots - 1})")
    return slots


_SLOT_LETTERS = {"free": ".", "evictable": "e", "locked": "L", "evicted": "x", "request": "r", "conflict": "!"}


# -- what one operation changed ----------------------------------------------------------


@dataclass(frozen=True)
class TreeChanges:
    """What one operation did to the tree, by node path."""

    walked: tuple[Path, ...] = ()
    """Nodes on the path a match (or an insert's match) walked, top down."""
    split: tuple[tuple[Path, Path], ...] = ()
    """``(upper, lower)`` pairs: a node was cut into these two halves."""
    split_before: tuple[NodeView, ...] = ()
    """The nodes as they were before they were split, for captions."""
    inserted: tuple[Path, ...] = ()
    evicted: tuple[NodeView, ...] = ()
    """Removed nodes as they were just before: drawn as ghosts."""
    ref_changed: tuple[Path, ...] = ()
    """Nodes whose ``ref_count`` changed (a lock or an unlock)."""

    def event_of(self, path: Path) -> str | None:
        """The one event a drawing shows for ``path``: inserted, then split, then walked."""
        if path in self.inserted:
            return "inserted"
        if any(path in pair for pair in self.split):
            return "split"
        if path in self.walked:
            return "walked"
        return None

    @property
    def empty(self) -> bool:
        return not (self.walked or self.split or self.inserted or self.evicted or self.ref_changed)


def diff_snapshots(before: TreeSnapshot, after: TreeSnapshot, walked: Sequence[int] = ()) -> TreeChanges:
    """Say what changed between two snapshots of the same tree.

    A node that is new in ``after`` is the upper half of a split when its path
    ends strictly inside a node of ``before`` (that node, which keeps its path,
    is the lower half); otherwise it was inserted. A node missing from ``after``
    was evicted. ``walked`` is the matched token prefix, if the operation matched.
    """
    split: list[tuple[Path, Path]] = []
    split_before: list[NodeView] = []
    inserted: list[Path] = []
    for view in after.depth_first():
        path = view.path
        if path in before.nodes:
            continue
        lower = next(
            (
                old
                for old in before.nodes.values()
                if len(old.path) > len(path) and old.start < len(path) and old.path[: len(path)] == path
            ),
            None,
        )
        if lower is not None:
            split.append((path, lower.path))
            split_before.append(lower)
        else:
            inserted.append(path)
    evicted = tuple(v for v in before.depth_first() if v.path not in after.nodes)
    ref_changed = tuple(
        v.path for v in after.depth_first() if v.path in before.nodes and before.nodes[v.path].ref_count != v.ref_count
    )
    return TreeChanges(
        walked=after.path_along(walked),
        split=tuple(split),
        split_before=tuple(split_before),
        inserted=tuple(inserted),
        evicted=evicted,
        ref_changed=ref_changed,
    )


# -- the tree as text -------------------------------------------------------------------


def outline(snapshot: TreeSnapshot, vocab: VocabLike = None, *, values: bool = True, times: bool = True) -> str:
    """The tree as indented text, one node per line, then the size counters.

    Each line: the node's tokens (as words, through ``vocab``), its slots (with
    ``values``), its ``ref_count`` and its last-use time (with ``times``). The
    exercise checks print trees this way when a tree differs from the expected one.
    """
    if not isinstance(snapshot, TreeSnapshot):
        raise ArgumentTypeError(f"snapshot must be a TreeSnapshot, got {type(snapshot).__name__}")
    namer = None if vocab is None else token_namer(vocab)

    def tokens(ids: tuple[int, ...]) -> str:
        if namer is None:
            return _numbers(ids)
        return "[" + words(ids, namer, limit=10) + "]"

    lines = [f"root (ref_count {snapshot.root.ref_count})"]
    stack: list[tuple[NodeView, str, bool]] = [
        (child, "", i == len(snapshot.root.children) - 1) for i, child in enumerate(snapshot.root.children)
    ][::-1]
    while stack:
        view, prefix, last = stack.pop()
        parts = [tokens(view.tokens)]
        if values:
            parts.append(f"slots {_numbers(view.slots)}")
        parts.append(f"ref {view.ref_count}")
        if times:
            parts.append(f"t={view.timestamp}")
        if not view.parent_ok:
            parts.append("parent link broken")
        lines.append(prefix + ("└─ " if last else "├─ ") + " · ".join(parts))
        inner = prefix + ("   " if last else "│  ")
        kids = view.children
        stack.extend((child, inner, i == len(kids) - 1) for i, child in reversed(list(enumerate(kids))))
    info = snapshot.size_info
    lines.append(f"evictable_size {info.evictable_size}, protected_size {info.protected_size}")
    return "\n".join(lines)


def _numbers(values: tuple[int, ...], limit: int = 10) -> str:
    """``[1, 2, 3]``, or ``[1, ..., 10, … 5 more]`` past ``limit`` values."""
    if len(values) <= limit:
        return str(list(values))
    return str(list(values[:limit]))[:-1] + f", … {len(values) - limit} more]"


def _is_on_path(records: Sequence[tuple[Any, Path, int, Hashable, bool, int]], position: int, node: Any) -> bool:
    """Whether ``node`` is the record at ``position`` or one of its ancestors (a cycle, if it is listed again)."""
    while position >= 0:
        if records[position][0] is node:
            return True
        position = records[position][5]
    return False
