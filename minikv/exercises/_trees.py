"""Radix trees for the checks: build identical twins, take snapshots, say how two differ.

A case never shares a manager between the learner and the reference: it builds
two from the same *recipe* (inserts, matches, locks, in order), lets the
learner's function change one and minikv's own code change the other, then
compares snapshots. The tree is read once, by :meth:`minikv.snapshot.TreeSnapshot.of`
(the same snapshot the drawings and the tests use); :class:`TreeSnapshot` keeps the
part a learner's code is responsible for (keys, slots, ref counts, the order of
last use, parent links, the size counters) and leaves out minikv's private
bookkeeping (its eviction heap and node counter), which a learner's function has
no reason to know about.
"""

from __future__ import annotations

import difflib
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import IntegrityError
from ..language import tr
from ..radix_manager import RadixCacheHandle, RadixCacheManager, RadixTreeNode, child_key
from ..snapshot import NodeView, TreeSnapshot, node_path, outline
from ._core import Mismatch

MAX_NODES = 10_000
"""A snapshot stops here: a learner's bug (a node listed as its own child) must not hang the checker."""


# -- recipes ------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    kind: str  # "insert" | "match" | "lock" | "unlock"
    ids: tuple[int, ...]

    def describe(self) -> str:
        ids = list(self.ids)
        if self.kind == "insert":
            return tr("insert {ids}", ids=ids)
        if self.kind == "match":
            return tr("match {ids}", ids=ids)
        if self.kind == "lock":
            return tr("lock the match of {ids}", ids=ids)
        return tr("unlock the match of {ids}", ids=ids)


def insert(*ids: int) -> Op:
    return Op("insert", ids)


def match(*ids: int) -> Op:
    return Op("match", ids)


def lock(*ids: int) -> Op:
    return Op("lock", ids)


def unlock(*ids: int) -> Op:
    return Op("unlock", ids)


@dataclass(frozen=True)
class Recipe:
    """How to build a tree: operations applied in order to a fresh manager."""

    ops: tuple[Op, ...]
    page_size: int = 1
    name: str = ""
    """Used instead of listing the operations."""
    drawn: tuple[int, int] | None = None
    """``(num_prompts, seed)`` of a large random recipe, described by these instead of its operations."""
    scatter: int = 0
    """0: each prompt gets the next pages of the pool, so a node's slots count up. Otherwise the seed of a
    shuffle of the pool's pages: a node's pages are anywhere (as a real pool hands them out), so a healthy
    node's slots need not be contiguous beyond a page."""

    def build(self) -> tuple[RadixCacheManager, dict[tuple[int, ...], RadixCacheHandle]]:
        """A fresh manager, and the handles of the ``lock`` operations (latest per prefix)."""
        manager = RadixCacheManager("cpu", page_size=self.page_size)
        handles: dict[tuple[int, ...], RadixCacheHandle] = {}
        ps = self.page_size
        total = sum(-(-len(op.ids) // ps) for op in self.ops if op.kind == "insert")
        order = list(range(total))
        if self.scatter:
            random.Random(self.scatter).shuffle(order)
        next_page = 0
        for op in self.ops:
            if op.kind == "insert":
                pages = order[next_page : next_page + -(-len(op.ids) // ps)]
                slots = [page * ps + offset for page in pages for offset in range(ps)][: len(op.ids)]
                next_page += len(pages)
                manager.insert_prefix(list(op.ids), slots)
            elif op.kind == "match":
                manager.match_prefix(list(op.ids))
            elif op.kind == "lock":
                handle, _ = manager.match_prefix(list(op.ids))
                manager.lock_handle(handle)
                handles[op.ids] = handle
            elif op.kind == "unlock":
                manager.lock_handle(handles[op.ids], unlock=True)
            else:  # pragma: no cover - recipes are written in this package
                raise ValueError(op.kind)
        return manager, handles

    def describe(self) -> str:
        if self.name:
            return self.name
        if self.drawn is not None:
            return self._drawn_name(*self.drawn)
        steps = "; ".join(op.describe() for op in self.ops) if self.ops else tr("an empty tree")
        return (
            tr("{steps} (page_size {page_size})", steps=steps, page_size=self.page_size)
            if self.page_size > 1
            else steps
        )

    def _drawn_name(self, num_prompts: int, seed: int) -> str:
        """Said when the report is written, so in the language of the check."""
        scattered = bool(self.scatter)
        if self.page_size > 1 and scattered:
            return tr(
                "a random tree from {n} prompts (seed {seed}, page_size {page_size}, slots scattered over the pool)",
                n=num_prompts,
                seed=seed,
                page_size=self.page_size,
            )
        if self.page_size > 1:
            return tr(
                "a random tree from {n} prompts (seed {seed}, page_size {page_size})",
                n=num_prompts,
                seed=seed,
                page_size=self.page_size,
            )
        if scattered:
            return tr(
                "a random tree from {n} prompts (seed {seed}, slots scattered over the pool)", n=num_prompts, seed=seed
            )
        return tr("a random tree from {n} prompts (seed {seed})", n=num_prompts, seed=seed)

    @property
    def num_tokens(self) -> int:
        return sum(len(op.ids) for op in self.ops if op.kind == "insert")


def recipe(*ops: Op, page_size: int = 1, scatter: int = 0) -> Recipe:
    return Recipe(tuple(ops), page_size, scatter=scatter)


def random_recipe(
    seed: int,
    num_prompts: int,
    page_size: int = 1,
    vocab: int = 4,
    max_len: int = 12,
    lock_every: int = 0,
    scatter: bool = False,
) -> Recipe:
    """Prompts over a tiny vocabulary, so they share prefixes and split each other's nodes.

    Every ``lock_every``-th prompt is locked (0: none); some earlier prompts are
    matched again, so that last-use times are not just insertion order.
    """
    rng = random.Random(seed)
    prompts: list[tuple[int, ...]] = []
    ops: list[Op] = []
    for i in range(num_prompts):
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            keep = rng.randint(0, len(base))
            prompt = base[:keep] + tuple(rng.randrange(vocab) for _ in range(rng.randint(1, max_len // 2)))
        else:
            prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(1, max_len)))
        prompts.append(prompt)
        ops.append(insert(*prompt))
        if lock_every and i % lock_every == lock_every - 1:
            ops.append(lock(*prompt))
        if rng.random() < 0.3:
            ops.append(match(*rng.choice(prompts)))
    return Recipe(tuple(ops), page_size, drawn=(num_prompts, seed), scatter=seed + 1 if scatter else 0)


# -- finding nodes without changing the tree ---------------------------------


def find_node(manager: RadixCacheManager, path: Sequence[int]) -> RadixTreeNode:
    """The node whose path from the root spells exactly ``path`` (no split, no time stamp).

    On a learner's tree, call :func:`node_problem` first: this walk trusts what it reads.
    A path that no node ends at is a :class:`Mismatch` naming it (the learner's tree lost it).
    """
    node = manager.root_node
    pos = 0
    while pos < len(path):
        child = node.children.get(child_key(_np(path[pos:]), manager.page_size))
        if child is None:
            break
        node = child
        pos += len(node.key)
    if pos != len(path) or tuple(path_of(node)) != tuple(path):
        raise Mismatch(tr("no node of your tree ends at {path}: the tree lost that prefix.", path=_tokens(tuple(path))))
    return node


def path_of(node: RadixTreeNode) -> list[int]:
    """The tokens from the root down to ``node`` (what a handle on ``node`` stands for)."""
    return list(node_path(node, limit=MAX_NODES))


def _np(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(list(ids), dtype=np.int64)


def _label(node: object) -> str:
    try:
        key = node.key.tolist()  # type: ignore[attr-defined]
    except Exception:
        return tr("a node")
    if not len(key) and getattr(node, "parent", None) is None:
        return tr("the root")
    return tr("the node {tokens}", tokens=_tokens(tuple(key)))


def node_problem(manager: object) -> str | None:
    """Why a node of the tree (a tree: call :func:`shape_problem` first) is not what the checker can read:
    a key that is not an int64 NumPy array, a value that is not an int32 tensor, or a ``length`` that
    disagrees with them (set by hand instead of with ``set_key_value``). None if every node is fine."""
    stack = list(manager.root_node.children.values())  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        key, value, length = getattr(node, "key", None), getattr(node, "value", None), getattr(node, "length", None)
        name = _label(node)
        if not isinstance(key, np.ndarray) or key.dtype != np.int64 or key.ndim != 1:
            what = tr("a {dtype} array", dtype=key.dtype) if isinstance(key, np.ndarray) else type(key).__name__
            return tr("{name} has a key of type {what}: a key is a 1-D int64 NumPy array.", name=name, what=what)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int32 or value.dim() != 1:
            what = (
                tr("a {dtype} tensor", dtype=value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__
            )
            return tr(
                "{name} has a value of type {what}: a value is a 1-D int32 tensor of slots.", name=name, what=what
            )
        if length != len(key) or length != len(value):
            return tr(
                "{name} has length {length}, but its key holds {tokens} tokens and its value {slots} "
                "slots: set both with node.set_key_value(key, value), which keeps node.length in step.",
                name=name,
                length=length,
                tokens=len(key),
                slots=len(value),
            )
        stack.extend(node.children.values())
    return None


def shape_problem(manager: object, yours: bool = True) -> str | None:
    """Why the tree under ``manager.root_node`` is not a tree (a cycle, a node in two places), or None.

    ``yours``: the learner's code made the tree (the sentence says where to look); False for a tree the
    checker broke on purpose, which is only described."""
    root = getattr(manager, "root_node", None)
    if root is None or not isinstance(getattr(root, "children", None), dict):
        return tr("the cache has no root_node with a children dict: keep the given __init__, which makes them.")
    seen: dict[int, object] = {id(root): None}
    stack: list[tuple[object, tuple[int, ...]]] = [(root, (id(root),))]
    while stack:
        node, on_path = stack.pop()
        children = getattr(node, "children", None)
        if not isinstance(children, dict):
            return tr(
                "{node} has children of type {type}, not a dict.", node=_label(node), type=type(children).__name__
            )
        for child in children.values():
            if id(child) in on_path:
                if not yours:
                    return tr(
                        "a cycle: {child} is listed among the children of {node}, which is below it.",
                        child=_label(child),
                        node=_label(node),
                    )
                return tr(
                    "your tree has a cycle: {child} is listed among the children of {node}, "
                    "which is below it. Look at where your code files a node in a children dict "
                    "(set_parent files the node under its new parent).",
                    child=_label(child),
                    node=_label(node),
                )
            if id(child) in seen:
                return tr(
                    "{child} is listed in two places of your tree (under {node} and under "
                    "{other}): a node has one parent; file it under one only.",
                    child=_label(child),
                    node=_label(node),
                    other=_label(seen[id(child)]),
                )
            seen[id(child)] = node
            if len(seen) > MAX_NODES:
                return tr("the tree has more than {n} nodes.", n=MAX_NODES)
            stack.append((child, (*on_path, id(child))))
    return None


def all_nodes(manager: object) -> list[RadixTreeNode]:
    """Every node under the root (a tree: call :func:`shape_problem` first), parents first."""
    out: list[RadixTreeNode] = []
    stack = list(manager.root_node.children.values())  # type: ignore[attr-defined]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def clone_into(target: object, source: RadixCacheManager) -> dict[int, RadixTreeNode]:
    """Give ``target`` (a learner's empty cache) a copy of ``source``'s tree, counters and clock.

    Returns a map from each ``source`` node's ``uid`` to its copy, so handles can be translated.
    The copies are fresh :class:`RadixTreeNode` objects linked with ``set_parent``.
    """
    ps = source.page_size
    root = target.root_node  # type: ignore[attr-defined]
    copies: dict[int, RadixTreeNode] = {source.root_node.uid: root}
    stack = [source.root_node]
    while stack:
        node = stack.pop()
        for child in sorted(node.children.values(), key=lambda c: c.key.tolist()):
            copy = RadixTreeNode(child.timestamp)
            copy.set_key_value(child.key.copy(), child.value.clone())
            copy.ref_count = child.ref_count
            copy.set_parent(copies[node.uid], ps)
            copies[child.uid] = copy
            stack.append(child)
    target.evictable_size = source.evictable_size  # type: ignore[attr-defined]
    target.protected_size = source.protected_size  # type: ignore[attr-defined]
    target.clock = source.clock  # type: ignore[attr-defined]
    return copies


def translate(handle: RadixCacheHandle, copies: dict[int, RadixTreeNode]) -> RadixCacheHandle:
    """The same handle in the copied tree."""
    return RadixCacheHandle(handle.cached_len, copies[handle.node.uid])


def checker_walk(cache: object, ids: Sequence[int]) -> None:
    """A match done by the checker on a learner's tree (the way minikv's walk does it): one tick, the path
    stamped, the node the match ends inside split. Used between the learner's calls, never graded."""
    ps = cache.page_size  # type: ignore[attr-defined]
    array = _np(ids)
    end = len(array) - len(array) % ps
    now = cache.clock + 1  # type: ignore[attr-defined]
    cache.clock = now  # type: ignore[attr-defined]
    node, pos = cache.root_node, 0  # type: ignore[attr-defined]
    while pos < end:
        child = node.children.get(child_key(array[pos:end], ps))
        if child is None:
            break
        n = 0
        while n < min(child.length, end - pos) and int(child.key[n]) == int(array[pos + n]):
            n += 1
        n -= n % ps
        pos += n
        if n < child.length:
            child = child.split_at(n, ps)
            child.timestamp = now
            break
        node = child
        node.timestamp = now


# -- snapshots ------------------------------------------------------------------


def snapshot(manager: object, strict: bool = True) -> TreeSnapshot:
    """The tree of ``manager`` (minikv's or a learner's), read once; a tree that cannot be read is a Mismatch.

    A cycle (a node listed below itself) or a node listed in two places is reported as such,
    before anything walks the tree, so that no walk runs forever or blames the wrong thing.
    The checker compares these :class:`~minikv.snapshot.TreeSnapshot` values, the same ones the
    chapters draw. ``strict``: also refuse a node whose key, value and length disagree (:func:`node_problem`);
    False only for trees the checker broke on purpose.
    """
    problem = shape_problem(manager)
    if problem is None and strict:
        problem = node_problem(manager)
    if problem is not None:
        raise Mismatch(problem)
    if int(getattr(manager.root_node, "length", 0)) != 0:  # type: ignore[attr-defined]
        raise Mismatch(tr("the root must hold no tokens."))
    try:
        return TreeSnapshot.of(manager, max_nodes=MAX_NODES)
    except IntegrityError:
        raise Mismatch(
            tr("the tree has more than {n} nodes: is a node listed as its own descendant?", n=MAX_NODES)
        ) from None
    except Exception as error:  # a node whose key or value is not an array, say
        raise Mismatch(
            tr(
                "the tree could not be read ({error}: {message}): every node needs a key (a NumPy "
                "int64 array), a value (an int32 tensor), ref_count and timestamp ints, and a children dict; "
                "set key and value with node.set_key_value(key, value).",
                error=type(error).__name__,
                message=error,
            )
        ) from None


def nodes_of(tree: TreeSnapshot) -> list[NodeView]:
    """Every node but the root, depth first, children in the order the tree lists them."""
    out: list[NodeView] = []
    stack = list(reversed(tree.root.children))
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.children))
    return out


def all_slots(tree: TreeSnapshot) -> list[int]:
    return sorted(slot for node in nodes_of(tree) for slot in node.slots)


# -- describing trees and their differences -------------------------------------


def render(tree: TreeSnapshot, values: bool = True, times: bool = True) -> str:
    """The tree as indented text, one node per line, with the size counters (:func:`minikv.snapshot.outline`)."""
    return outline(tree, values=values, times=times)


def _tokens(values: tuple[int, ...], limit: int = 10) -> str:
    if len(values) <= limit:
        return str(list(values))
    return str(list(values[:limit]))[:-1] + tr(", … {n} more]", n=len(values) - limit)


def compare(expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True, when: str = "") -> None:
    """Raise :class:`Mismatch` naming the first difference, with both trees drawn side by side and their diff."""
    problem = first_difference(expected, got, values, times)
    if problem is not None:
        raise tree_mismatch(
            tr("{when}: {problem}", when=when, problem=problem) if when else problem, expected, got, values, times
        )


def tree_mismatch(
    problem: str, expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True, same: str = ""
) -> Mismatch:
    """A Mismatch whose ``expected`` is both trees side by side and whose ``got`` is the lines that differ
    (``same``: what to say when the drawings do not differ, see :func:`line_diff`)."""
    left, right = render(expected, values, times), render(got, values, times)
    return Mismatch(problem, side_by_side(left, right), line_diff(left, right, same))


def side_by_side(left: str, right: str, titles: tuple[str, str] | None = None) -> str:
    """Two drawings in two columns, the expected one on the left (titled "the expected tree", "your tree")."""
    if titles is None:
        titles = (tr("the expected tree"), tr("your tree"))
    a, b = [titles[0], *left.splitlines()], [titles[1], *right.splitlines()]
    width = max(len(line) for line in a)
    rows = [f"{x:<{width}}  │  {y}".rstrip() for x, y in itertools.zip_longest(a, b, fillvalue="")]
    return "\n".join(rows)


def line_diff(left: str, right: str, same: str = "") -> str:
    """The lines of two drawings that differ: ``-`` only in the expected tree, ``+`` only in yours.

    ``same``: what to say when the drawings do not differ (by default: the difference is the one named)."""
    changed = [line for line in difflib.ndiff(left.splitlines(), right.splitlines()) if line.startswith(("- ", "+ "))]
    if not changed:
        return same or tr("the drawings are the same: the difference is the one named above, which they do not show")
    return tr("what differs (- expected, + yours):") + "\n" + "\n".join(changed)


def first_difference(expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True) -> str | None:
    if got.root.ref_count != expected.root.ref_count:
        return tr(
            "the root's ref_count should stay {expected}, but it is {got}: never lock or unlock the root.",
            expected=expected.root.ref_count,
            got=got.root.ref_count,
        )
    problem = _first_node_difference(expected.root.children, got.root.children, tr("the root"), values)
    if problem is not None:
        return problem
    if times:
        problem = _time_order_difference(expected, got)
        if problem is not None:
            return problem
    (exp_evictable, exp_protected), (got_evictable, got_protected) = expected.size_info, got.size_info
    if got_evictable != exp_evictable:
        return tr("evictable_size should be {expected}, but it is {got}.", expected=exp_evictable, got=got_evictable)
    if got_protected != exp_protected:
        return tr("protected_size should be {expected}, but it is {got}.", expected=exp_protected, got=got_protected)
    return None


def _first_node_difference(
    expected: tuple[NodeView, ...], got: tuple[NodeView, ...], where: str, values: bool
) -> str | None:
    exp_by_key = {node.filed_under: node for node in expected}
    got_by_key = {node.filed_under: node for node in got}
    for key, node in exp_by_key.items():
        if key not in got_by_key:
            stray = next((g for g in got if g.tokens[:1] == node.tokens[:1]), None)
            if stray is not None:
                return tr(
                    "under {where}, the child starting {tokens} should be filed under "
                    "the key {key}, but it is filed under {filed}.",
                    where=where,
                    tokens=_tokens(node.tokens[:3]),
                    key=repr(key),
                    filed=repr(stray.filed_under),
                )
            return tr("under {where}, the node {tokens} is missing.", where=where, tokens=_tokens(node.tokens))
    for key, node in got_by_key.items():
        if key not in exp_by_key:
            return tr("under {where}, there should be no node {tokens}.", where=where, tokens=_tokens(node.tokens))
    for key, exp in exp_by_key.items():
        g = got_by_key[key]
        name = tr("the node {tokens}", tokens=_tokens(exp.tokens))
        if g.tokens != exp.tokens:
            return tr(
                "under {where}, the node should hold the tokens {expected}, but it holds {got}.",
                where=where,
                expected=_tokens(exp.tokens),
                got=_tokens(g.tokens),
            )
        if values and g.slots != exp.slots:
            return tr(
                "{name} should hold the slots {expected}, but it holds {got}.",
                name=name,
                expected=_tokens(exp.slots),
                got=_tokens(g.slots),
            )
        if g.ref_count != exp.ref_count:
            return tr(
                "{name} should have ref_count {expected}, but it has {got}.",
                name=name,
                expected=exp.ref_count,
                got=g.ref_count,
            )
        if not g.parent_ok:
            return tr(
                "{name} is listed in the children of {where}, but its parent link points elsewhere.",
                name=name,
                where=where,
            )
        problem = _first_node_difference(exp.children, g.children, name, values)
        if problem is not None:
            return problem
    return None


def _time_order_difference(expected: TreeSnapshot, got: TreeSnapshot) -> str | None:
    """Compare the *order* of last use, not the clock values: the learner may tick the clock differently."""
    exp_nodes, got_nodes = nodes_of(expected), nodes_of(got)
    if _ranks([n.timestamp for n in exp_nodes]) == _ranks([n.timestamp for n in got_nodes]):
        return None
    newest_exp = max((n.timestamp for n in exp_nodes), default=None)
    newest_got = max((n.timestamp for n in got_nodes), default=None)
    for exp, mine in zip(exp_nodes, got_nodes, strict=False):  # first, the usual slip: the time of the last use
        name = tr("the node {tokens}", tokens=_tokens(exp.tokens))
        if exp.timestamp == newest_exp and mine.timestamp != newest_got:
            return tr(
                "{name} was used by the latest walk, so it should carry the newest time in the tree "
                "(t={newest} in yours), but it has t={t}.",
                name=name,
                newest=newest_got,
                t=mine.timestamp,
            )
        if exp.timestamp != newest_exp and mine.timestamp == newest_got:
            return tr(
                "{name} was not used by the latest walk and should keep its older time, "
                "but it has the newest time in your tree (t={t}).",
                name=name,
                t=mine.timestamp,
            )
    for i, (a_exp, a_got) in enumerate(zip(exp_nodes, got_nodes, strict=False)):
        for b_exp, b_got in zip(exp_nodes[i + 1 :], got_nodes[i + 1 :], strict=False):
            want, have = _cmp(a_exp.timestamp, b_exp.timestamp), _cmp(a_got.timestamp, b_got.timestamp)
            if want != have:
                a = tr("the node {tokens}", tokens=_tokens(a_exp.tokens))
                b = tr("the node {tokens}", tokens=_tokens(b_exp.tokens))
                relation = {-1: tr("before"), 0: tr("at the same time as"), 1: tr("after")}
                return tr(
                    "{a} should have been used {want} {b} (t={a_exp} and t={b_exp} in the expected tree), "
                    "but in yours it was used {have} it (t={a_got} and t={b_got}).",
                    a=a,
                    b=b,
                    want=relation[want],
                    have=relation[have],
                    a_exp=a_exp.timestamp,
                    b_exp=b_exp.timestamp,
                    a_got=a_got.timestamp,
                    b_got=b_got.timestamp,
                )
    return None  # pragma: no cover - equal ranks were ruled out above


def _cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _ranks(times: list[int]) -> list[int]:
    order = {t: i for i, t in enumerate(sorted(set(times)))}
    return [order[t] for t in times]
