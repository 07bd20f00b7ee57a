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
        words = {"insert": "insert", "match": "match", "lock": "lock the match of", "unlock": "unlock the match of"}
        return f"{words[self.kind]} {list(self.ids)}"


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
    """Used instead of listing the operations (for large random recipes)."""
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
        steps = "; ".join(op.describe() for op in self.ops) if self.ops else "an empty tree"
        return steps + (f" (page_size {self.page_size})" if self.page_size > 1 else "")

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
    name = (
        f"a random tree from {num_prompts} prompts (seed {seed}"
        + (f", page_size {page_size}" if page_size > 1 else "")
        + (", slots scattered over the pool" if scatter else "")
        + ")"
    )
    return Recipe(tuple(ops), page_size, name, scatter=seed + 1 if scatter else 0)


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
        raise Mismatch(f"no node of your tree ends at {_tokens(tuple(path))}: the tree lost that prefix.")
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
        return "a node"
    return "the root" if not len(key) and getattr(node, "parent", None) is None else f"the node {_tokens(tuple(key))}"


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
            what = f"a {key.dtype} array" if isinstance(key, np.ndarray) else type(key).__name__
            return f"{name} has a key of type {what}: a key is a 1-D int64 NumPy array."
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int32 or value.dim() != 1:
            what = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            return f"{name} has a value of type {what}: a value is a 1-D int32 tensor of slots."
        if length != len(key) or length != len(value):
            return (
                f"{name} has length {length}, but its key holds {len(key)} tokens and its value {len(value)} "
                "slots: set both with node.set_key_value(key, value), which keeps node.length in step."
            )
        stack.extend(node.children.values())
    return None


def shape_problem(manager: object, yours: bool = True) -> str | None:
    """Why the tree under ``manager.root_node`` is not a tree (a cycle, a node in two places), or None.

    ``yours``: the learner's code made the tree (the sentence says where to look); False for a tree the
    checker broke on purpose, which is only described."""
    root = getattr(manager, "root_node", None)
    if root is None or not isinstance(getattr(root, "children", None), dict):
        return "the cache has no root_node with a children dict: keep the given __init__, which makes them."
    seen: dict[int, object] = {id(root): None}
    stack: list[tuple[object, tuple[int, ...]]] = [(root, (id(root),))]
    while stack:
        node, on_path = stack.pop()
        children = getattr(node, "children", None)
        if not isinstance(children, dict):
            return f"{_label(node)} has children of type {type(children).__name__}, not a dict."
        for child in children.values():
            if id(child) in on_path:
                if not yours:
                    return (
                        f"a cycle: {_label(child)} is listed among the children of {_label(node)}, which is below it."
                    )
                return (
                    f"your tree has a cycle: {_label(child)} is listed among the children of {_label(node)}, "
                    "which is below it. Look at where your code files a node in a children dict "
                    "(set_parent files the node under its new parent)."
                )
            if id(child) in seen:
                return (
                    f"{_label(child)} is listed in two places of your tree (under {_label(node)} and under "
                    f"{_label(seen[id(child)])}): a node has one parent; file it under one only."
                )
            seen[id(child)] = node
            if len(seen) > MAX_NODES:
                return f"the tree has more than {MAX_NODES} nodes."
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
        raise Mismatch("the root must hold no tokens.")
    try:
        return TreeSnapshot.of(manager, max_nodes=MAX_NODES)
    except IntegrityError:
        raise Mismatch(f"the tree has more than {MAX_NODES} nodes: is a node listed as its own descendant?") from None
    except Exception as error:  # a node whose key or value is not an array, say
        raise Mismatch(
            f"the tree could not be read ({type(error).__name__}: {error}): every node needs a key (a NumPy "
            "int64 array), a value (an int32 tensor), ref_count and timestamp ints, and a children dict; "
            "set key and value with node.set_key_value(key, value)."
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
    return str(list(values[:limit]))[:-1] + f", … {len(values) - limit} more]"


def compare(expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True, when: str = "") -> None:
    """Raise :class:`Mismatch` naming the first difference, with both trees drawn side by side and their diff."""
    problem = first_difference(expected, got, values, times)
    if problem is not None:
        raise tree_mismatch(f"{when}: {problem}" if when else problem, expected, got, values, times)


def tree_mismatch(
    problem: str, expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True, same: str = ""
) -> Mismatch:
    """A Mismatch whose ``expected`` is both trees side by side and whose ``got`` is the lines that differ
    (``same``: what to say when the drawings do not differ, see :func:`line_diff`)."""
    left, right = render(expected, values, times), render(got, values, times)
    return Mismatch(problem, side_by_side(left, right), line_diff(left, right, same))


def side_by_side(left: str, right: str, titles: tuple[str, str] = ("the expected tree", "your tree")) -> str:
    """Two drawings in two columns, the expected one on the left."""
    a, b = [titles[0], *left.splitlines()], [titles[1], *right.splitlines()]
    width = max(len(line) for line in a)
    rows = [f"{x:<{width}}  │  {y}".rstrip() for x, y in itertools.zip_longest(a, b, fillvalue="")]
    return "\n".join(rows)


def line_diff(left: str, right: str, same: str = "") -> str:
    """The lines of two drawings that differ: ``-`` only in the expected tree, ``+`` only in yours.

    ``same``: what to say when the drawings do not differ (by default: the difference is the one named)."""
    changed = [line for line in difflib.ndiff(left.splitlines(), right.splitlines()) if line.startswith(("- ", "+ "))]
    if not changed:
        return same or "the drawings are the same: the difference is the one named above, which they do not show"
    return "what differs (- expected, + yours):\n" + "\n".join(changed)


def first_difference(expected: TreeSnapshot, got: TreeSnapshot, values: bool = True, times: bool = True) -> str | None:
    if got.root.ref_count != expected.root.ref_count:
        return (
            f"the root's ref_count should stay {expected.root.ref_count}, but it is {got.root.ref_count}: "
            "never lock or unlock the root."
        )
    problem = _first_node_difference(expected.root.children, got.root.children, "the root", values)
    if problem is not None:
        return problem
    if times:
        problem = _time_order_difference(expected, got)
        if problem is not None:
            return problem
    (exp_evictable, exp_protected), (got_evictable, got_protected) = expected.size_info, got.size_info
    if got_evictable != exp_evictable:
        return f"evictable_size should be {exp_evictable}, but it is {got_evictable}."
    if got_protected != exp_protected:
        return f"protected_size should be {exp_protected}, but it is {got_protected}."
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
                return (
                    f"under {where}, the child starting {_tokens(node.tokens[:3])} should be filed under "
                    f"the key {key!r}, but it is filed under {stray.filed_under!r}."
                )
            return f"under {where}, the node {_tokens(node.tokens)} is missing."
    for key, node in got_by_key.items():
        if key not in exp_by_key:
            return f"under {where}, there should be no node {_tokens(node.tokens)}."
    for key, exp in exp_by_key.items():
        g = got_by_key[key]
        name = f"the node {_tokens(exp.tokens)}"
        if g.tokens != exp.tokens:
            return (
                f"under {where}, the node should hold the tokens {_tokens(exp.tokens)}, "
                f"but it holds {_tokens(g.tokens)}."
            )
        if values and g.slots != exp.slots:
            return f"{name} should hold the slots {_tokens(exp.slots)}, but it holds {_tokens(g.slots)}."
        if g.ref_count != exp.ref_count:
            return f"{name} should have ref_count {exp.ref_count}, but it has {g.ref_count}."
        if not g.parent_ok:
            return f"{name} is listed in the children of {where}, but its parent link points elsewhere."
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
        name = f"the node {_tokens(exp.tokens)}"
        if exp.timestamp == newest_exp and mine.timestamp != newest_got:
            return (
                f"{name} was used by the latest walk, so it should carry the newest time in the tree "
                f"(t={newest_got} in yours), but it has t={mine.timestamp}."
            )
        if exp.timestamp != newest_exp and mine.timestamp == newest_got:
            return (
                f"{name} was not used by the latest walk and should keep its older time, "
                f"but it has the newest time in your tree (t={mine.timestamp})."
            )
    for i, (a_exp, a_got) in enumerate(zip(exp_nodes, got_nodes, strict=False)):
        for b_exp, b_got in zip(exp_nodes[i + 1 :], got_nodes[i + 1 :], strict=False):
            want, have = _cmp(a_exp.timestamp, b_exp.timestamp), _cmp(a_got.timestamp, b_got.timestamp)
            if want != have:
                a, b = f"the node {_tokens(a_exp.tokens)}", f"the node {_tokens(b_exp.tokens)}"
                relation = {-1: "before", 0: "at the same time as", 1: "after"}
                return (
                    f"{a} should have been used {relation[want]} {b} "
                    f"(t={a_exp.timestamp} and t={b_exp.timestamp} in the expected tree), "
                    f"but in yours it was used {relation[have]} it (t={a_got.timestamp} and t={b_got.timestamp})."
                )
    return None  # pragma: no cover - equal ranks were ruled out above


def _cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _ranks(times: list[int]) -> list[int]:
    order = {t: i for i, t in enumerate(sorted(set(times)))}
    return [order[t] for t in times]
