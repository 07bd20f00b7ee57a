"""``TreeRecorder``: a manager that records a frame of the tree after every operation.

How it observes the manager: it is a *proxy*. It stands in front of a real
:class:`~minikv.RadixCacheManager`, forwards each call unchanged (same
arguments, same return value, same exception), and around the call it takes a
content-only snapshot of the tree before and after. The manager's code is not
edited, patched or subclassed, so recording cannot change what the manager does;
it only costs a walk over the tree per call.

Because the proxy is itself a :class:`~minikv.BaseCacheManager`, it can be
passed wherever a manager is expected -- :func:`minikv.lifecycle.admit`,
:func:`~minikv.lifecycle.finish`, :meth:`minikv.PagePool.allocate`'s
``evict_from`` -- and every call those make is recorded too::

    rec = TreeRecorder(RadixCacheManager(), vocab, pool=pool)
    request = admit(rec, pool, ids)      # frames: match, lock (and evict, if the pool was short)
    finish(rec, pool, request)           # frames: insert, unlock
    rec.player()                         # step through them
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import torch

from ..base import BaseCacheHandle, BaseCacheManager, SizeInfo
from ..errors import ArgumentError, ArgumentTypeError
from ..snapshot import (
    SlotOwnership,
    TreeChanges,
    TreeSnapshot,
    VocabLike,
    diff_snapshots,
    node_path,
    token_namer,
    words,
)
from .labels import join, text
from .player import FramePlayer, PlayerFrame
from .tree import TreeDrawing, draw_snapshot

Described = tuple[str, Sequence[int]]
"""A caption, and the token prefix the operation matched (its nodes are drawn as the walked path)."""

R = TypeVar("R")

CAPTION_TOKENS = 12
"""Captions show at most this many tokens of a sequence, then "… (+N)"."""


@dataclass(frozen=True, eq=False)
class Frame:
    """The tree right after one operation, with a caption in words and what the operation changed."""

    index: int
    operation: str
    """``start``, ``match``, ``insert``, ``lock``, ``unlock``, ``evict``, ``reset`` or ``note``."""
    caption: str
    snapshot: TreeSnapshot
    changes: TreeChanges
    free_slots: int | None = None
    """Free slots in the page pool, when the recorder was given one."""
    error: str | None = None
    """The exception the operation raised (the frame then shows the unchanged tree)."""
    vocab: VocabLike = field(default=None, repr=False)
    max_columns: int = field(default=8, repr=False)
    slots: SlotOwnership | None = field(default=None, repr=False)
    """Who owns each slot of the pool (when the recorder was given one): drawn as a strip above the tree."""

    @property
    def size_info(self) -> SizeInfo:
        return self.snapshot.size_info

    @cached_property
    def drawing(self) -> TreeDrawing:
        """The tree, with this operation's changes highlighted (built on first use)."""
        return draw_snapshot(
            self.snapshot, self.vocab, changes=self.changes, max_columns=self.max_columns, slots=self.slots
        )

    @property
    def dot(self) -> str:
        """The DOT source of :attr:`drawing`."""
        return str(self.drawing.source)

    def svg(self) -> str:
        return self.drawing.svg()

    @property
    def sizes_text(self) -> str:
        """The frame's slot counts in words, as the player shows them."""
        info = self.size_info
        sizes = text("rec.sizes", total=info.total_size, protected=info.protected_size, evictable=info.evictable_size)
        if self.free_slots is not None:
            sizes = text("rec.sizes_free", sizes=sizes, free=self.free_slots)
        return sizes

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **_: Any) -> dict[str, str]:
        return {"image/svg+xml": self.svg(), "text/plain": repr(self)}

    def __repr__(self) -> str:
        return f"<Frame {self.index}: {self.caption}>"


class TreeRecorder(BaseCacheManager):
    """A recording proxy around a radix-tree manager; see the module docstring.

    ``vocab`` turns token ids into words in drawings and captions. ``pool``
    (optional, a :class:`~minikv.PagePool`) adds its free-slot count to each
    frame, and a strip of its slots to each drawing: free, in the tree
    (evictable or locked), evicted (on the way to the pool), or owned by a
    running request. ``frames[0]`` is the starting state; each manager call
    adds one.

    The slots an ``evict`` (or ``reset``) returns are in the caller's hands
    until it frees them into the pool. The recorder shows them as evicted in
    that frame, and in later frames as long as the pool's free list has not
    changed since. Once it changes (slots freed, or handed out again), a slot
    neither free nor in the tree is drawn as a running request's, as before.
    """

    def __init__(self, manager: BaseCacheManager, vocab: VocabLike = None, *, pool: Any = None, max_columns: int = 8):
        if isinstance(manager, TreeRecorder):
            raise ArgumentTypeError("manager: already a TreeRecorder; pass the manager it wraps")
        TreeSnapshot.of(manager)  # raises ArgumentTypeError unless there is a tree to draw
        self._namer = token_namer(vocab)
        if pool is not None and not hasattr(pool, "num_free_slots"):
            raise ArgumentTypeError(f"pool must be a PagePool (with num_free_slots), got {type(pool).__name__}")
        if isinstance(max_columns, bool) or not isinstance(max_columns, int) or max_columns < 1:
            raise ArgumentError(f"max_columns must be a positive int, got {max_columns!r}")
        self.manager = manager
        self.vocab = vocab
        self.pool = pool
        self.max_columns = max_columns
        self.frames: list[Frame] = []
        self._label: str | None = None
        self._leaving: set[int] = set()
        """Slots evict or reset returned that the pool has not taken back (see the class docstring)."""
        self._free_before: frozenset[int] = frozenset()
        """The pool's free slots at the last frame."""
        start = TreeSnapshot.of(manager)
        if start.num_nodes:
            info = start.size_info
            nodes, slots = _plural(start.num_nodes, "node"), _plural(info.total_size, "slot")
            caption = text("rec.start", nodes=nodes, slots=slots, count=start.num_nodes)
        else:
            caption = text("rec.start_empty")
        self._append("start", caption, start, TreeChanges())

    # -- forwarding ------------------------------------------------------------

    @property
    def page_size(self) -> int:  # type: ignore[override]
        return self.manager.page_size

    @property
    def size_info(self) -> SizeInfo:
        return self.manager.size_info

    def check_integrity(self) -> None:
        self.manager.check_integrity()

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes the proxy lacks (root_node, device, num_nodes, ...).
        if name == "manager" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.manager, name)

    # -- recorded operations -----------------------------------------------------

    def match_prefix(self, input_ids: Any) -> tuple[BaseCacheHandle, torch.Tensor]:
        ids = _token_list(input_ids)
        head = text("rec.match", words=self._words(ids))

        def describe(before: TreeSnapshot, after: TreeSnapshot, changes: TreeChanges, result: Any) -> Described:
            cached = result[0].cached_len
            total = len(ids or ())
            hit = text("rec.hit", cached=cached, total=total) if cached else text("rec.miss", total=total)
            return _join(head, [*self._split_words(changes), hit]), (ids or [])[:cached]

        found: tuple[BaseCacheHandle, torch.Tensor] = self._run(
            "match", head, lambda: self.manager.match_prefix(input_ids), describe
        )
        return found

    def insert_prefix(self, input_ids: Any, indices: Any, *, handle: BaseCacheHandle | None = None) -> int:
        """Insert and record it; ``handle`` (the request's own locked match) is passed on when given."""
        ids = _token_list(input_ids)
        head = text("rec.insert", words=self._words(ids))

        def describe(before: TreeSnapshot, after: TreeSnapshot, changes: TreeChanges, already: Any) -> Described:
            parts = self._split_words(changes)
            for path in changes.inserted:
                view = after.nodes[path]
                parts.append(text("rec.added", words=self._words(view.tokens), slots=_plural(len(view.tokens), "slot")))
            if not changes.inserted:
                parts.append(text("rec.nothing_new"))
            parts.append(text("rec.already", tokens=_plural(already, "token")))
            tail = len(ids or ()) % after.page_size
            if tail:
                parts.append(text("rec.partial", tokens=_plural(tail, "token")))
            return _join(head, parts), (ids or [])[:already]

        manager: Any = self.manager  # `handle=` is newer than BaseCacheManager's signature

        def call() -> int:
            if handle is None:
                return int(manager.insert_prefix(input_ids, indices))
            return int(manager.insert_prefix(input_ids, indices, handle=handle))

        already: int = self._run("insert", head, call, describe)
        return already

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        operation = "unlock" if unlock else "lock"
        tokens = _handle_tokens(handle)
        if tokens is None:
            head = text(f"rec.{operation}_not_radix")
        elif not tokens:
            head = text(f"rec.{operation}_empty")
        else:
            head = text(f"rec.{operation}", words=self._words(tokens))

        def describe(before: TreeSnapshot, after: TreeSnapshot, changes: TreeChanges, _: Any) -> Described:
            if not changes.ref_changed:
                return _join(head, [text("rec.root_only")]), ()
            sign = "-1" if unlock else "+1"
            nodes = _plural(len(changes.ref_changed), "node")
            if unlock:
                moved = after.size_info.evictable_size - before.size_info.evictable_size
                effect = (
                    text("rec.evictable_again", slots=_plural(moved, "slot")) if moved else text("rec.still_protected")
                )
            else:
                moved = after.size_info.protected_size - before.size_info.protected_size
                effect = (
                    text("rec.newly_protected", slots=_plural(moved, "slot"))
                    if moved
                    else text("rec.already_protected")
                )
            return _join(head, [text("rec.ref_change", sign=sign, nodes=nodes), effect]), ()

        self._run(operation, head, lambda: self.manager.lock_handle(handle, unlock=unlock), describe)

    def evict(self, size: int) -> torch.Tensor:
        head = text("rec.evict", value=repr(size))

        def describe(before: TreeSnapshot, after: TreeSnapshot, changes: TreeChanges, freed: Any) -> Described:
            if not changes.evicted:
                return _join(head, [text("rec.nothing_to_do")]), ()
            # In the order evict took them: by where each node's slots appear in what it returned.
            position = {slot: i for i, slot in enumerate(freed.tolist())}
            in_order = sorted(changes.evicted, key=lambda v: position.get(v.slots[0], len(position)))
            removed = join(
                [
                    text("rec.removed_item", words=self._words(v.tokens), slots=_plural(len(v.tokens), "slot"))
                    for v in in_order
                ],
                "items",
            )
            parts = [text("rec.removed", items=removed)]
            if len(freed) != size:
                parts.append(text("rec.freed", slots=_plural(len(freed), "slot")))
            return _join(head, parts), ()

        freed: torch.Tensor = self._run("evict", head, lambda: self.manager.evict(size), describe)
        return freed

    def reset(self) -> torch.Tensor:
        def describe(before: TreeSnapshot, after: TreeSnapshot, changes: TreeChanges, freed: Any) -> Described:
            return text("rec.reset", nodes=_plural(before.num_nodes, "node"), slots=_plural(len(freed), "slot")), ()

        freed: torch.Tensor = self._run("reset", text("rec.reset_head"), self.manager.reset, describe)
        return freed

    # -- narration and playback ----------------------------------------------------

    def note(self, caption: str) -> Frame:
        """Add a frame of the tree as it is now, with your own caption (e.g. "request B arrives")."""
        if not isinstance(caption, str) or not caption:
            raise ArgumentTypeError(f"caption must be a non-empty str, got {caption!r}")
        return self._append("note", self._labelled(caption), TreeSnapshot.of(self.manager), TreeChanges())

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[TreeRecorder]:
        """Prefix the captions of the frames recorded inside the ``with`` block, e.g. with a request's name."""
        if not isinstance(label, str) or not label:
            raise ArgumentTypeError(f"label must be a non-empty str, got {label!r}")
        outer, self._label = self._label, label
        try:
            yield self
        finally:
            self._label = outer

    def player(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        title: str | None = None,
        interval_ms: int = 1200,
        open_at: int | None = None,
    ) -> FramePlayer:
        """An HTML player over ``frames[start:stop]`` (renders each frame's SVG with ``dot``).

        Captions carry the frame numbers (``frames[i]`` is shown as ``i.``).
        ``open_at`` is the frame number shown first; by default the first frame
        that shows something: a tree with a node, or a slot that is not free.
        """
        chosen = self.frames[start:stop]
        if not chosen:
            raise ArgumentError(f"start/stop: frames[{start}:{stop}] is empty (there are {len(self.frames)} frames)")
        numbers = [f.index for f in chosen]
        if open_at is None:
            position = next((i for i, f in enumerate(chosen) if _shows_something(f)), 0)
        elif open_at in numbers:
            position = numbers.index(open_at)
        else:
            raise ArgumentError(f"open_at: frame {open_at!r} is not among frames {numbers[0]}..{numbers[-1]}")
        return FramePlayer(
            [PlayerFrame(f.svg(), f.caption, f.sizes_text, number=f.index) for f in chosen],
            title=title,
            interval_ms=interval_ms,
            open_at=position,
        )

    def __repr__(self) -> str:
        return f"<TreeRecorder: {len(self.frames)} frames of {type(self.manager).__name__}>"

    # -- internals -------------------------------------------------------------------

    def _run(
        self,
        operation: str,
        head: str,
        call: Callable[[], R],
        describe: Callable[[TreeSnapshot, TreeSnapshot, TreeChanges, R], Described],
    ) -> R:
        before = TreeSnapshot.of(self.manager)
        try:
            result = call()
        except Exception as exc:
            after = TreeSnapshot.of(self.manager)
            caption = text("rec.refused", head=head, error=f"{type(exc).__name__}: {exc}")
            self._append(operation, self._labelled(caption), after, diff_snapshots(before, after), error=repr(exc))
            raise
        after = TreeSnapshot.of(self.manager)
        changes = diff_snapshots(before, after)
        caption, walked = describe(before, after, changes, result)
        if walked:
            changes = dataclasses.replace(changes, walked=after.path_along(walked))
        left = _ints_of(result) if operation in ("evict", "reset") else ()
        self._append(operation, self._labelled(caption), after, changes, left=left)
        return result

    def _append(
        self,
        operation: str,
        caption: str,
        snapshot: TreeSnapshot,
        changes: TreeChanges,
        error: str | None = None,
        *,
        left: Sequence[int] = (),
    ) -> Frame:
        free = int(self.pool.num_free_slots) if self.pool is not None else None
        slots = None
        if self.pool is not None:
            slots = SlotOwnership.of(snapshot, self.pool, evicted=self._on_the_way(left))
        frame = Frame(
            len(self.frames), operation, caption, snapshot, changes, free, error, self.vocab, self.max_columns, slots
        )
        self.frames.append(frame)
        return frame

    def _on_the_way(self, left: Sequence[int]) -> set[int]:
        """The slots that left the tree and have not reached the pool: ``left`` (returned by this
        frame's call), and those of earlier frames while the pool's free list stays as it was."""
        free_now = frozenset(int(slot) for slot in self.pool.free_slots().tolist())
        if free_now != self._free_before:  # freed into the pool, or handed out again: no longer on the way
            self._leaving = set()
        self._leaving |= set(left)
        self._free_before = free_now
        return self._leaving

    def _labelled(self, caption: str) -> str:
        return text("rec.labelled", label=self._label, caption=caption) if self._label else caption

    def _words(self, tokens: Sequence[int] | None) -> str:
        return "?" if tokens is None else words(tokens, self._namer, limit=CAPTION_TOKENS)

    def _split_words(self, changes: TreeChanges) -> list[str]:
        return [
            text("rec.split", words=self._words(old.tokens), tokens=_plural(len(upper) - old.start, "token"))
            for (upper, _), old in zip(changes.split, changes.split_before, strict=True)
        ]


def _shows_something(frame: Frame) -> bool:
    """A frame worth opening a player on: the tree has a node, or some slot of the pool is taken."""
    if frame.snapshot.num_nodes:
        return True
    return frame.slots is not None and any(state != "free" for state in frame.slots.states)


def _ints_of(slots: Any) -> list[int]:
    """The slot numbers an ``evict`` or ``reset`` returned (a tensor, array or list)."""
    items = slots.tolist() if hasattr(slots, "tolist") else slots
    return [int(slot) for slot in items]


def _join(head: str, parts: Sequence[str]) -> str:
    return text("rec.caption", head=head, parts=join(parts))


def _plural(n: int, noun: str) -> str:
    """``n`` and its noun, in the drawing language: "1 slot", "2 slots", "2 个槽位"."""
    return text(f"count.{noun}", count=n)


def _token_list(value: Any) -> list[int] | None:
    """The token ids of an argument, for captions; ``None`` if they cannot be read (the manager will say why)."""
    try:
        if isinstance(value, torch.Tensor):
            return [int(t) for t in value.detach().reshape(-1).cpu().tolist()]
        if isinstance(value, np.ndarray):
            return [int(t) for t in value.reshape(-1).tolist()]
        if isinstance(value, (list, tuple)):
            return [int(t) for t in value]
    except (TypeError, ValueError):
        return None
    return None


def _handle_tokens(handle: Any) -> tuple[int, ...] | None:
    """Every token from the root to a radix handle's node, read through public attributes only."""
    node = getattr(handle, "node", None)
    if node is None or not hasattr(node, "key"):
        return None
    return node_path(node)
