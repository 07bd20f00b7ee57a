"""Checks for chapter 5: the radix tree's pieces, one function at a time.

Every case builds two identical trees from a recipe; the learner's function
changes one, :class:`~minikv.RadixCacheManager`'s own method (``split_at``,
``walk``, ``lock_handle``, ``evict``, ``check_integrity``, ``insert_prefix``)
changes the other, and the snapshots must agree. While the learner's function
runs, the method it re-writes is switched off, so it cannot just call it.
"""

# ruff: noqa: E501  (the case tables keep one case per line)
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .. import radix_manager as _radix_module
from ..errors import EvictionError, IntegrityError, LockError
from ..radix_manager import RadixCacheHandle, RadixCacheManager, RadixTreeNode
from . import _trees
from ._core import Case, Mismatch, call, exercise, expect_int, outcome, raised
from ._trees import Recipe, insert, lock, match, random_recipe, recipe

_F = Callable[..., object]


def _arr(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(list(ids), dtype=np.int64)


# -- radix.match_len --------------------------------------------------------------


@exercise(
    "radix.match_len",
    "how many leading tokens two arrays share",
    forbid=((_radix_module, "match_len"), (RadixTreeNode, "get_match_len")),
)
def _match_len_cases() -> list[Case]:
    long = list(range(1000))
    pairs = [
        ("an empty key", [], [1, 2]),
        ("empty input_ids", [1, 2], []),
        ("both empty", [], []),
        ("a full match of equal length", [4, 5, 6], [4, 5, 6]),
        ("input_ids longer than the key: the whole key matches", [4, 5], [4, 5, 6, 7]),
        ("the key longer than input_ids: all of input_ids matches", [4, 5, 6, 7], [4, 5]),
        ("the first tokens differ", [1, 2, 3], [9, 2, 3]),
        ("the last token differs", [1, 2, 3], [1, 2, 9]),
        ("a difference in the middle, and a later equal token", [1, 2, 3, 4, 5], [1, 2, 0, 4, 5]),
        ("1000 tokens that differ only at the end", long, [*long[:-1], -1]),
        ("1000 equal tokens", long, list(long)),
    ]

    def make(desc: str, key: list[int], ids: list[int]) -> Case:
        def run(fn: _F) -> None:
            expected = _radix_module.match_len(_arr(key), _arr(ids))
            got = expect_int("match_len's result", call(fn, _arr(key), _arr(ids)))
            if got != expected:
                raise Mismatch(f"match_len({_short(key)}, {_short(ids)}) is wrong.", str(expected), str(got))

        return Case(desc, max(len(key), len(ids)), run)

    return [make(*p) for p in pairs]


def _expect_refusal(
    tree: RadixCacheManager,
    wanted: type[BaseException],
    why: str,
    fn: Callable[..., object],
    *args: object,
    **kwargs: object,
) -> None:
    """The learner's ``fn(*args, **kwargs)`` must raise ``wanted`` and leave ``tree`` exactly as it was."""
    before = _trees.snapshot(tree)
    _, error = raised(fn, *args, **kwargs)
    if not isinstance(error, wanted):
        raise Mismatch(why, wanted.__name__, outcome(error, returned="returned normally"))
    _trees.compare(before, _trees.snapshot(tree))


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 8 else f"[{ids[0]}, {ids[1]}, … {len(ids)} tokens …, {ids[-1]}]"


# -- radix.split_at -----------------------------------------------------------------


def _split_case(desc: str, tree: Recipe, splits: list[tuple[tuple[int, ...], int]]) -> Case:
    def run(fn: _F) -> None:
        mine, _ = tree.build()
        ref, _ = tree.build()
        ps = tree.page_size
        for path, pos in splits:
            node, ref_node = _trees.find_node(mine, path), _trees.find_node(ref, path)
            assert node.parent is not None  # the recipes split nodes of the tree only
            parent_path = _trees.path_of(node.parent)
            if not 0 < pos < node.length:
                _expect_refusal(
                    mine, ValueError,
                    f"split_at(node {list(node.key.tolist())}, {pos}) cannot make two non-empty halves: raise ValueError.",
                    fn, node, pos, *(() if ps == 1 else (ps,)),
                )  # fmt: skip
                continue
            upper = call(fn, node, pos) if ps == 1 else call(fn, node, pos, ps)
            ref_node.split_at(pos, ps)
            what = f"split_at(the node {list(path[len(parent_path) :])}, {pos})"
            if not isinstance(upper, RadixTreeNode):
                raise Mismatch(f"{what} must return the new upper node.", "a RadixTreeNode", repr(upper))
            if upper is node:
                raise Mismatch(
                    f"{what} returned the node it was given. That node must stay the *lower* half, because handles "
                    "point at it and must still name the same prefix; a new node becomes the upper half."
                )
            if node.parent is not upper:
                raise Mismatch(
                    f"after {what}, the lower half's parent must be the upper node you returned: "
                    "link it with node.set_parent(upper, page_size), which sets the parent and files it in upper.children."
                )
            if _trees.path_of(node) != list(path):
                raise Mismatch(
                    f"after {what}, the node object you were given must be the *lower* half: handles point at it, "
                    "and they must still name the same prefix.",
                    f"a handle on it names {list(path)}",
                    f"it names {_trees.path_of(node)}",
                )
            if _trees.path_of(upper) != list(path[: len(parent_path) + pos]):
                raise Mismatch(
                    f"{what} must return the upper half, which ends after {pos} tokens.",
                    str(list(path[: len(parent_path) + pos])),
                    str(_trees.path_of(upper)),
                )
            _trees.compare(_trees.snapshot(ref), _trees.snapshot(mine))

    size = tree.num_tokens
    return Case(desc, size, run)


def _random_splits(seed: int, tree: Recipe, count: int) -> list[tuple[tuple[int, ...], int]]:
    """Split points in a random tree, replayed on a scratch copy so later ones see earlier splits."""
    rng = random.Random(seed)
    scratch, _ = tree.build()
    ps = tree.page_size
    splits = []
    for _ in range(count):
        nodes = sorted(
            (tuple(_trees.path_of(n)) for n in _iter_nodes(scratch) if n.length >= 2 * ps),
            key=lambda p: (len(p), p),
        )
        if not nodes:
            break
        path = rng.choice(nodes)
        node = _trees.find_node(scratch, path)
        pos = ps * rng.randint(1, node.length // ps - 1)
        node.split_at(pos, ps)
        splits.append((path, pos))
    return splits


def _iter_nodes(manager: RadixCacheManager) -> list[RadixTreeNode]:
    out, stack = [], list(manager.root_node.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


@exercise("radix.split_at", "cut a node in two and return the upper half", forbid=((RadixTreeNode, "split_at"),))
def _split_cases() -> list[Case]:
    one = recipe(insert(1, 2, 3, 4))
    with_child = recipe(insert(1, 2, 3, 4, 5), insert(1, 2, 3, 4, 5, 6, 7))
    deep = recipe(insert(1, 2, 3), insert(1, 2, 9), insert(1, 2, 3, 4, 5, 6))
    locked = recipe(insert(1, 2, 3, 4, 5), lock(1, 2, 3, 4, 5), lock(1, 2, 3, 4, 5))
    rnd = random_recipe(7, 10)
    rnd_paged = random_recipe(8, 10, page_size=2, max_len=16)
    big = random_recipe(9, 60, vocab=5, max_len=24)
    return [
        _split_case("split [1, 2, 3, 4] at 1", one, [((1, 2, 3, 4), 1)]),
        _split_case("split [1, 2, 3, 4] at 3 (length - 1)", one, [((1, 2, 3, 4), 3)]),
        _split_case(
            "pos 0 or pos == length cannot split: raise ValueError and change nothing",
            one,
            [((1, 2, 3, 4), 0), ((1, 2, 3, 4), 4)],
        ),
        _split_case("a node with a child: the child stays under the lower half", with_child, [((1, 2, 3, 4, 5), 2)]),
        _split_case("a node deep in the tree, whose parent has other children", deep, [((1, 2, 3, 4, 5, 6), 1)]),
        _split_case("a node locked twice: both halves keep ref_count 2", locked, [((1, 2, 3, 4, 5), 3)]),
        _split_case("split the same node twice", one, [((1, 2, 3, 4), 3), ((1, 2, 3, 4), 2)]),
        _split_case(
            "page_size 2: split a 6-token node after its first page",
            recipe(insert(*range(6)), page_size=2),
            [(tuple(range(6)), 2)],
        ),
        _split_case(
            "page_size 4: split a 12-token node after 8 tokens",
            recipe(insert(*range(12)), page_size=4),
            [(tuple(range(12)), 8)],
        ),
        _split_case(rnd.describe() + ", split 6 times", rnd, _random_splits(1, rnd, 6)),
        _split_case(rnd_paged.describe() + ", split 6 times", rnd_paged, _random_splits(2, rnd_paged, 6)),
        _split_case(big.describe() + ", split 20 times", big, _random_splits(3, big, 20)),
    ]


# -- radix.walk ---------------------------------------------------------------------


def _walk_case(desc: str, tree: Recipe, inputs: list[tuple[int, ...]]) -> Case:
    def run(fn: _F) -> None:
        mine, _ = tree.build()
        ref, _ = tree.build()
        for ids in inputs:
            ref_node, ref_len = ref.walk(_arr(ids))
            result = call(fn, mine, _arr(ids))
            what = f"walk({_short(list(ids))})"
            if not (isinstance(result, tuple) and len(result) == 2):
                raise Mismatch(f"{what} must return a pair (node, prefix_len).", "(node, prefix_len)", repr(result))
            node, prefix_len = result
            prefix_len = expect_int("prefix_len", prefix_len)
            if prefix_len != ref_len:
                raise Mismatch(f"{what}: the matched length is wrong.", str(ref_len), str(prefix_len))
            if not isinstance(node, RadixTreeNode):
                raise Mismatch(f"{what} must return the deepest matched node.", "a RadixTreeNode", repr(node))
            expected_path = _trees.path_of(ref_node)
            if _trees.path_of(node) != expected_path:
                raise Mismatch(
                    f"{what} must return the node where the match ends"
                    + (
                        " (the root, for an empty match)."
                        if not expected_path
                        else "; split the node the match ends inside."
                    ),
                    f"the node ending at {_short(expected_path)}" if expected_path else "the root",
                    f"the node ending at {_short(_trees.path_of(node))}" if node.parent is not None else "the root",
                )
            if node.parent is None and node is not mine.root_node:
                raise Mismatch(f"{what} returned a node that is not in the tree.")
            _trees.compare(_trees.snapshot(ref), _trees.snapshot(mine))

    return Case(desc, tree.num_tokens + sum(len(i) for i in inputs), run)


@exercise(
    "radix.walk",
    "descend along the input, splitting where the match ends inside a node",
    forbid=((RadixCacheManager, "walk"), (RadixCacheManager, "match_prefix"), (RadixCacheManager, "insert_prefix")),
)
def _walk_cases() -> list[Case]:
    two = recipe(insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6), insert(7, 8))
    rnd = random_recipe(11, 12)
    rnd_paged = random_recipe(12, 12, page_size=2, max_len=14)
    big = random_recipe(13, 60, vocab=5, max_len=20)
    rng = random.Random(5)
    return [
        _walk_case("an empty tree: nothing matches", recipe(), [(1, 2, 3)]),
        _walk_case("empty input_ids", two, [()]),
        _walk_case("no child starts with the first token", two, [(9, 9)]),
        _walk_case("the input ends exactly at a node", two, [(1, 2, 3, 4)]),
        _walk_case("the match ends inside a node: split it at 1", two, [(1, 9)]),
        _walk_case("the match ends inside a node: split it at length - 1", two, [(1, 2, 3, 9)]),
        _walk_case("the match runs through one node and ends inside the next", two, [(1, 2, 3, 4, 5, 0)]),
        _walk_case("input_ids longer than anything cached", two, [(1, 2, 3, 4, 5, 6, 7, 8, 9)]),
        _walk_case(
            "the matched path gets the time of this walk; the others keep theirs",
            two,
            [(7, 8), (1, 2), (1, 2, 3, 4, 5, 6)],
        ),
        _walk_case(
            "page_size 2: only whole pages match (5 tokens match at most 4)",
            recipe(insert(*range(8)), page_size=2),
            [(0, 1, 2, 3, 4)],
        ),
        _walk_case(
            "page_size 4: the first page differs in its last token, so nothing matches",
            recipe(insert(*range(8)), page_size=4),
            [(0, 1, 2, 9)],
        ),
        _walk_case(
            "page_size 2: the match ends inside a node, at a page border",
            recipe(insert(*range(8)), insert(0, 1, 2, 3, 7, 7), page_size=2),
            [(0, 1, 2, 3, 4, 9, 9, 9)],
        ),
        _walk_case(
            rnd.describe() + ", 8 walks",
            rnd,
            [tuple(rng.randrange(4) for _ in range(rng.randint(0, 10))) for _ in range(8)],
        ),
        _walk_case(
            rnd_paged.describe() + ", 8 walks",
            rnd_paged,
            [tuple(rng.randrange(4) for _ in range(rng.randint(0, 12))) for _ in range(8)],
        ),
        _walk_case(
            big.describe() + ", 30 walks",
            big,
            [tuple(rng.randrange(5) for _ in range(rng.randint(0, 24))) for _ in range(30)],
        ),
    ]


# -- radix.lock_handle ------------------------------------------------------------------


def _lock_case(desc: str, tree: Recipe, steps: list[tuple[str, tuple[int, ...]]]) -> Case:
    """``steps``: ("lock", ids) with a fresh match; ("unlock", ids) with that lock's handle;
    ("unlock_unlocked", ids) with a fresh match that was never locked (must raise);
    ("match", ids) by the reference on both trees (it may split a locked node)."""

    def run(fn: _F) -> None:
        mine, _ = tree.build()
        ref, _ = tree.build()
        handles: dict[tuple[int, ...], tuple[RadixCacheHandle, RadixCacheHandle]] = {}
        for kind, ids in steps:
            if kind == "match":
                mine.match_prefix(list(ids))
                ref.match_prefix(list(ids))
                continue
            if kind == "lock":
                pair = (mine.match_prefix(list(ids))[0], ref.match_prefix(list(ids))[0])
                handles[ids] = pair
                call(fn, mine, pair[0])
                ref.lock_handle(pair[1])
                when = f"after locking the match of {list(ids)}"
            elif kind == "unlock":
                pair = handles[ids]
                call(fn, mine, pair[0], unlock=True)
                ref.lock_handle(pair[1], unlock=True)
                when = f"after unlocking the match of {list(ids)}"
            else:
                handle = mine.match_prefix(list(ids))[0]
                ref.match_prefix(list(ids))
                _expect_refusal(
                    mine, LockError,
                    f"unlocking the match of {list(ids)}, which nobody locked, must raise LockError and change nothing.",
                    fn, mine, handle, unlock=True,
                )  # fmt: skip
                continue
            problem = _trees.first_difference(_trees.snapshot(ref), _trees.snapshot(mine))
            if problem is not None:
                raise Mismatch(
                    f"{when}: {problem}", _trees.render(_trees.snapshot(ref)), _trees.render(_trees.snapshot(mine))
                )

    return Case(desc, tree.num_tokens, run)


def _random_lock_steps(seed: int, tree: Recipe, count: int) -> list[tuple[str, tuple[int, ...]]]:
    rng = random.Random(seed)
    prompts = sorted({op.ids for op in tree.ops if op.kind == "insert"})
    steps: list[tuple[str, tuple[int, ...]]] = []
    locked: list[tuple[int, ...]] = []
    for _ in range(count):
        if locked and rng.random() < 0.4:
            steps.append(("unlock", locked.pop(rng.randrange(len(locked)))))
        else:
            prompt = rng.choice(prompts)
            ids = prompt[: rng.randint(1, len(prompt))]
            if ids in locked:
                continue
            steps.append(("lock", ids))
            locked.append(ids)
    steps.extend(("unlock", ids) for ids in locked)
    return steps


@exercise(
    "radix.lock_handle",
    "lock or unlock the path from a handle's node to the root",
    forbid=((RadixCacheManager, "lock_handle"),),
)
def _lock_cases() -> list[Case]:
    single = recipe(insert(1, 2, 3))
    chain = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6))
    branches = recipe(insert(1, 2, 3), insert(1, 2, 9))
    rnd = random_recipe(21, 10)
    rnd_paged = random_recipe(22, 10, page_size=2, max_len=14)
    big = random_recipe(23, 60, vocab=5, max_len=20)
    return [
        _lock_case("lock a prefix that is one node", single, [("lock", (1, 2, 3))]),
        _lock_case("lock and unlock a prefix that is one node", single, [("lock", (1, 2, 3)), ("unlock", (1, 2, 3))]),
        _lock_case("lock a deep node: every node up to the root is locked, the root is not", chain, [("lock", (1, 2, 3, 4, 5, 6))]),
        _lock_case("lock the same prefix twice and unlock it once: it stays locked", chain, [("lock", (1, 2, 3, 4)), ("lock", (1, 2, 3, 4)), ("unlock", (1, 2, 3, 4))]),
        _lock_case("lock two branches that share a parent: the parent's ref_count is 2", branches, [("lock", (1, 2, 3)), ("lock", (1, 2, 9)), ("unlock", (1, 2, 3))]),
        _lock_case("the handle of an empty match (the root) locks nothing", single, [("lock", (7, 7)), ("unlock", (7, 7))]),
        _lock_case("unlock what nobody locked: raise LockError, change nothing", chain, [("unlock_unlocked", (1, 2, 3, 4))]),
        _lock_case("unlock a leaf whose parent another handle locked: LockError, nothing changes", chain, [("lock", (1, 2)), ("unlock_unlocked", (1, 2, 3, 4))]),
        _lock_case("a later match splits the locked node; unlocking still releases both halves", single, [("lock", (1, 2, 3)), ("match", (1, 9)), ("unlock", (1, 2, 3))]),
        _lock_case("page_size 2: lock and unlock", recipe(insert(*range(6)), insert(0, 1, 7, 7), page_size=2), [("lock", (0, 1, 2, 3, 4, 5)), ("lock", (0, 1, 7, 7)), ("unlock", (0, 1, 2, 3, 4, 5))]),
        _lock_case(rnd.describe() + ", 12 locks and unlocks", rnd, _random_lock_steps(3, rnd, 12)),
        _lock_case(rnd_paged.describe() + ", 12 locks and unlocks", rnd_paged, _random_lock_steps(4, rnd_paged, 12)),
        _lock_case(big.describe() + ", 40 locks and unlocks", big, _random_lock_steps(5, big, 40)),
    ]  # fmt: skip


# -- radix.evict -------------------------------------------------------------------------


def _evict_case(desc: str, tree: Recipe, sizes: list[int]) -> Case:
    def run(fn: _F) -> None:
        mine, _ = tree.build()
        ref, _ = tree.build()
        for size in sizes:
            what = f"evict({size})"
            if size < 0 or size > ref.size_info.evictable_size:
                wanted = ValueError if size < 0 else EvictionError
                reason = (
                    "a negative size is a mistake"
                    if size < 0
                    else f"only {mine.size_info.evictable_size} slots are evictable"
                )
                _expect_refusal(
                    mine,
                    wanted,
                    f"{what}: {reason}, so raise {wanted.__name__} before changing anything.",
                    fn,
                    mine,
                    size,
                )
                continue
            expected = ref.evict(size)
            got = call(fn, mine, size)
            if not isinstance(got, torch.Tensor) or got.dtype != torch.int32 or got.dim() != 1:
                raise Mismatch(
                    f"{what} must return a 1-D int32 tensor of the freed slots.",
                    "a 1-D int32 tensor",
                    repr(got) if not isinstance(got, torch.Tensor) else f"dtype {got.dtype}, shape {tuple(got.shape)}",
                )
            if sorted(got.tolist()) != sorted(expected.tolist()):
                raise Mismatch(
                    f"{what} freed the wrong slots. Least recently used unlocked leaves go first, whole nodes at a time, "
                    "and a parent whose last child went may be next.",
                    str(sorted(expected.tolist())),
                    str(sorted(got.tolist())),
                )
            problem = _trees.first_difference(_trees.snapshot(ref), _trees.snapshot(mine))
            if problem is not None:
                raise Mismatch(
                    f"after {what}: {problem}",
                    _trees.render(_trees.snapshot(ref)),
                    _trees.render(_trees.snapshot(mine)),
                )

    return Case(desc, tree.num_tokens, run)


def _random_evictions(seed: int, tree: Recipe) -> list[int]:
    manager, _ = tree.build()
    rng = random.Random(seed)
    sizes = []
    while manager.size_info.evictable_size:
        size = rng.randint(1, max(1, manager.size_info.evictable_size // 2))
        manager.evict(size)
        sizes.append(size)
    return sizes


@exercise(
    "radix.evict",
    "free the least recently used unlocked leaves",
    forbid=((RadixCacheManager, "evict"), (RadixCacheManager, "reset")),
)
def _evict_cases() -> list[Case]:
    leaf = recipe(insert(1, 2, 3, 4))
    two = recipe(insert(1, 2, 3), insert(7, 8, 9, 10), match(1, 2, 3))  # [7..10] is now older
    locked_old = recipe(insert(1, 2, 3), lock(1, 2, 3), insert(7, 8), insert(5, 5, 5))
    family = recipe(insert(1, 2, 3, 4), insert(1, 2, 5, 6), insert(7, 8, 9))  # [1,2] -> {[3,4], [5,6]}, then [7,8,9]
    chain = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6))
    partly_locked = recipe(insert(1, 2, 3, 4), insert(1, 2, 5, 6), lock(1, 2, 5, 6), insert(9, 9))
    rnd = random_recipe(31, 14, lock_every=4)
    rnd_paged = random_recipe(32, 14, page_size=2, max_len=14, lock_every=5)
    big = random_recipe(33, 60, vocab=5, max_len=20, lock_every=6)
    return [
        _evict_case("evict(0) frees nothing and returns an empty int32 tensor", leaf, [0]),
        _evict_case("one leaf: evict(1) frees the whole leaf (4 slots)", leaf, [1]),
        _evict_case("two leaves: the least recently used goes first", two, [1]),
        _evict_case("the oldest leaf is locked: skip it", locked_old, [2]),
        _evict_case("evict(5) must free two leaves", two, [5]),
        _evict_case(
            "two leaves go, their parent becomes a leaf, and it is older than [7, 8, 9]: it goes next", family, [4, 1]
        ),
        _evict_case("a chain: freeing everything takes the leaf, then its parent, then the root's child", chain, [6]),
        _evict_case("a parent with a locked child never becomes a leaf", partly_locked, [3, 2]),
        _evict_case("more than is evictable: raise EvictionError, change nothing", locked_old, [6]),
        _evict_case("a negative size: raise ValueError, change nothing", leaf, [-1]),
        _evict_case(
            "page_size 2: whole nodes of whole pages",
            recipe(insert(*range(6)), insert(0, 1, 7, 7), page_size=2),
            [1, 2],
        ),
        _evict_case(
            rnd.describe() + ", some prompts locked, evicted until nothing is left", rnd, _random_evictions(1, rnd)
        ),
        _evict_case(
            rnd_paged.describe() + ", evicted until nothing is left", rnd_paged, _random_evictions(2, rnd_paged)
        ),
        _evict_case(
            big.describe() + ", some prompts locked, evicted until nothing is left", big, _random_evictions(3, big)
        ),
    ]


# -- radix.check_integrity -------------------------------------------------------------------


def _healthy_case(desc: str, tree: Recipe) -> Case:
    def run(fn: _F) -> None:
        manager, _ = tree.build()
        before = _trees.snapshot(manager)
        _, error = raised(fn, manager)
        if error is not None:
            raise Mismatch(
                f"this tree is healthy, but your check_integrity {outcome(error)}.",
                _trees.render(before),
                "(the same tree)",
            )
        _trees.compare(before, _trees.snapshot(manager))

    return Case(f"a healthy tree passes: {desc}", tree.num_tokens, run)


def _corrupt_case(desc: str, tree: Recipe, corrupt: Callable[[RadixCacheManager], None]) -> Case:
    def run(fn: _F) -> None:
        manager, _ = tree.build()
        corrupt(manager)
        shown = _trees.render(_trees.snapshot(manager))
        _, error = raised(fn, manager)
        if not isinstance(error, IntegrityError):
            raise Mismatch(
                f"the tree is corrupted ({desc}), so check_integrity must raise IntegrityError.",
                f"IntegrityError, for this tree:\n{shown}",
                outcome(error, returned="returned normally: the corruption was missed"),
            )

    return Case(f"catch: {desc}", tree.num_tokens, run)


def _leaf(manager: RadixCacheManager, path: Sequence[int]) -> RadixTreeNode:
    return _trees.find_node(manager, path)


def _bump_lock(manager: RadixCacheManager) -> None:
    node = _leaf(manager, (1, 2, 3, 4))  # unlocked, under the locked [1, 2]
    node.ref_count = 2  # more than its parent's 1; move it to protected so the counters still add up
    manager.evictable_size -= node.length
    manager.protected_size += node.length


def _empty_child(manager: RadixCacheManager) -> None:
    node = RadixTreeNode(manager.root_node.timestamp)
    node.parent = manager.root_node
    manager.root_node.children[42] = node


def _share_slot(manager: RadixCacheManager) -> None:
    a, b = _leaf(manager, (1, 2, 3, 4)), _leaf(manager, (1, 2, 5, 6))
    value = b.value.clone()
    value[0] = a.value[0]
    b.value = value


def _unaligned(manager: RadixCacheManager) -> None:
    node = _leaf(manager, (0, 1, 2, 3, 4, 5))
    node.set_key_value(node.key[:-1], node.value[:-1])
    manager.evictable_size -= 1


def _scrambled_page(manager: RadixCacheManager) -> None:
    node = _leaf(manager, (0, 1, 2, 3, 4, 5))
    node.value = node.value[[1, 0, *range(2, node.length)]].clone()


def _wrong_parent(manager: RadixCacheManager) -> None:
    _leaf(manager, (1, 2, 3, 4)).parent = _leaf(manager, (1, 2, 5, 6))


def _wrong_key(manager: RadixCacheManager) -> None:
    parent = _leaf(manager, (1, 2))
    parent.children[9] = parent.children.pop(3)


@exercise(
    "radix.check_integrity",
    "find every broken invariant of a radix tree",
    forbid=((RadixCacheManager, "check_integrity"),),
)
def _integrity_cases() -> list[Case]:
    family = recipe(insert(1, 2, 3, 4), insert(1, 2, 5, 6), insert(7, 8, 9), lock(1, 2, 5, 6))
    paged = recipe(insert(*range(6)), insert(0, 1, 9, 9), page_size=2)
    return [
        _healthy_case("an empty tree", recipe()),
        _healthy_case("a split node and a lock", family),
        _healthy_case("page_size 2", paged),
        _healthy_case("a random tree with locks", random_recipe(41, 14, lock_every=3)),
        _healthy_case("a random tree, page_size 4", random_recipe(42, 14, page_size=4, max_len=20, lock_every=4)),
        _healthy_case("a random tree of 80 prompts with locks", random_recipe(43, 80, vocab=5, max_len=24, lock_every=5)),
        _corrupt_case("a negative ref_count", family, lambda m: setattr(_leaf(m, (7, 8, 9)), "ref_count", -1)),
        _corrupt_case("a child locked more often than its parent", family, _bump_lock),
        _corrupt_case("evictable_size is one too high", family, lambda m: setattr(m, "evictable_size", m.evictable_size + 1)),
        _corrupt_case("protected_size is one too low", family, lambda m: setattr(m, "protected_size", m.protected_size - 1)),
        _corrupt_case("a node whose parent link points at its sibling", family, _wrong_parent),
        _corrupt_case("a child filed under the wrong first token", family, _wrong_key),
        _corrupt_case("a node with fewer slots than tokens", family, lambda m: setattr(_leaf(m, (7, 8, 9)), "value", _leaf(m, (7, 8, 9)).value[:-1].clone())),
        _corrupt_case("an empty node under the root", family, _empty_child),
        _corrupt_case("two nodes hold the same slot", family, _share_slot),
        _corrupt_case("a child used more recently than its parent", family, lambda m: setattr(_leaf(m, (1, 2, 3, 4)), "timestamp", _leaf(m, (1, 2)).timestamp + 5)),
        _corrupt_case("the root is locked twice", family, lambda m: setattr(m.root_node, "ref_count", 2)),
        _corrupt_case("page_size 2: a node of 5 tokens (not whole pages)", paged, _unaligned),
        _corrupt_case("page_size 2: slots that do not form whole pages", paged, _scrambled_page),
    ]  # fmt: skip


# -- radix.page_aligned_insert -----------------------------------------------------------------


def _insert_case(desc: str, tree: Recipe, inserts: list[tuple[int, ...]]) -> Case:
    def run(fn: _F) -> None:
        mine, _ = tree.build()
        ref, _ = tree.build()
        ps = tree.page_size
        next_page = 1000
        for ids in inserts:
            pages = -(-len(ids) // ps)
            slots = torch.arange(next_page * ps, next_page * ps + len(ids), dtype=torch.int32)
            next_page += pages
            expected = ref.insert_prefix(list(ids), slots.clone())
            given = slots.clone()
            got = expect_int("the result", call(fn, mine, _arr(ids), given))
            what = f"page_aligned_insert({_short(list(ids))}) with page_size {ps}"
            if got != expected:
                raise Mismatch(
                    f"{what} must return how many of its tokens were already cached.", str(expected), str(got)
                )
            given.fill_(-5)  # the caller reuses its page-table row; the tree must have kept a copy
            problem = _trees.first_difference(_trees.snapshot(ref), _trees.snapshot(mine))
            if problem is not None:
                if any(-5 in n.value for n in _trees.nodes_of(_trees.snapshot(mine))):
                    problem += " (The tree shows -5: the caller overwrote its indices after the call, and the tree saw it. Store a copy: .clone().)"
                raise Mismatch(
                    f"after {what}: {problem}",
                    _trees.render(_trees.snapshot(ref)),
                    _trees.render(_trees.snapshot(mine)),
                )

    return Case(desc, tree.num_tokens + sum(len(i) for i in inserts), run)


@exercise(
    "radix.page_aligned_insert",
    "insert_prefix with page_size > 1: whole pages only",
    forbid=((RadixCacheManager, "insert_prefix"),),
)
def _insert_cases() -> list[Case]:
    empty4, empty2 = recipe(page_size=4), recipe(page_size=2)
    cached = recipe(insert(*range(8)), page_size=4)
    rng = random.Random(9)
    prompts = [tuple(rng.randrange(3) for _ in range(rng.randint(1, 13))) for _ in range(10)]
    many = [tuple(rng.randrange(3) for _ in range(rng.randint(1, 30))) for _ in range(40)]
    return [
        _insert_case("8 tokens into an empty tree with page_size 4: two pages", empty4, [tuple(range(8))]),
        _insert_case("10 tokens with page_size 4: the last 2 are not inserted", empty4, [tuple(range(10))]),
        _insert_case("3 tokens with page_size 4: nothing is inserted, return 0", empty4, [(1, 2, 3)]),
        _insert_case("the first page is cached: return 4 and insert the rest", cached, [(0, 1, 2, 3, 9, 9, 9, 9)]),
        _insert_case("every whole page is cached already: nothing is added", cached, [(*range(8), 5)]),
        _insert_case("the new leaf hangs under a node split at a page border", cached, [(0, 1, 2, 3, 4, 5, 9, 9)]),
        _insert_case("the tree keeps a copy of the slots, not a view", empty2, [(1, 2, 3, 4)]),
        _insert_case("page_size 2: ten prompts over a tiny vocabulary", empty2, prompts),
        _insert_case("page_size 4: forty prompts over a tiny vocabulary", empty4, many),
    ]
