"""Checks for chapter 5: the learner's own radix cache, one class built method by method.

The learner writes ``class MyRadixCache(BaseCacheManager)`` (exercise 5 gives the
skeleton: ``__init__``, the clock, ``size_info`` and ``reset``) and fills in its
methods in order. Each check takes the class itself::

    check("radix.walk", MyRadixCache)

and grades one method alone: the checker builds the trees that method works on
(copies of trees minikv's own manager built), so the other methods may still be
stubs. When the graded method calls another method that is still a stub, the
report names that method. ``radix.page_aligned_insert`` grades the page-aware
subclass (``page_size > 1``), and ``radix.cache`` runs the whole class through
random histories of requests (:mod:`minikv.exercises.radix_history`) next to
minikv's own manager, and shows the smallest failing history.

A class that inherits from :class:`~minikv.RadixCacheManager` runs minikv's own
answers: ``check`` says so in one sentence instead of grading it.
"""

# ruff: noqa: E501  (the case tables keep one case per line)
from __future__ import annotations

import contextlib
import inspect
import random
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np
import torch

from .. import radix_manager as _radix_module
from ..errors import EvictionError, IntegrityError, LockError
from ..language import tr
from ..radix_manager import RadixCacheHandle, RadixCacheManager, RadixTreeNode, child_key
from ..snapshot import TreeSnapshot
from . import _trees
from ._core import (
    Case,
    LearnerRaised,
    Mismatch,
    call,
    exercise,
    expect_int,
    expect_slot_tensor,
    is_learner_file,
    outcome,
)
from ._trees import Recipe, insert, lock, match, random_recipe, recipe
from .radix_history import describe_history, fork_history, random_history, run_history, shrink

__all__ = ["TASKS", "explain_errors", "is_stub", "refuses_foreign_unlocks"]

_F = Callable[..., object]

TASKS = {
    "match_len": "5.1",
    "split_at": "5.2",
    "walk": "5.3",
    "match_prefix": "5.4",
    "insert_prefix": "5.5",
    "lock_handle": "5.6",
    "evict": "5.7",
    "check_integrity": "5.8",
    "reset": "5.10",
}
"""Each method the learner writes, and the task of exercise 5 that asks for it."""


def is_stub(fn: object) -> bool:
    """Whether ``fn`` is still an exercise stub: its body does nothing but ``raise NotImplementedError``."""
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    return isinstance(code, CodeType) and set(code.co_names) == {"NotImplementedError"}


# -- the learner's class --------------------------------------------------------------------


@dataclass
class Subject:
    """The class under test, and the methods this check grades (``own``)."""

    cls: Any
    own: tuple[str, ...]

    @property
    def name(self) -> str:
        name = getattr(self.cls, "__name__", None)
        return tr("your class") if name is None else name

    # -- before anything runs --

    def precheck(self) -> None:
        """Report a missing method as missing and an unwritten one as unwritten."""
        cls = self.cls
        if not isinstance(cls, type):
            return  # a function: calling it as the constructor will say what it is
        missing = [name for name in self.own if not callable(getattr(cls, name, None))]
        if missing:
            raise Mismatch(
                tr("{cls} has no method {method}: keep the skeleton's methods.", cls=self.name, method=missing[0])
            )
        stubs = [name for name in self.own if is_stub(getattr(cls, name))]
        if stubs and (len(self.own) <= 3 or len(stubs) == len(self.own)):
            raise LearnerRaised(NotImplementedError(), "")
        if stubs:
            listed = ", ".join(tr("{method} (Task {task})", method=name, task=TASKS[name]) for name in stubs)
            raise Mismatch(
                tr("these methods of {cls} are still stubs: {listed}. Write them first.", cls=self.name, listed=listed)
            )

    def make(self, page_size: int = 1) -> Any:
        """A fresh cache of the learner's class, checked to start as the skeleton's ``__init__`` makes it."""
        cache = self.call(self.cls, "cpu", page_size=page_size)
        made = f"{self.name}('cpu', page_size={page_size})"
        root = getattr(cache, "root_node", None)
        if not isinstance(root, RadixTreeNode):
            raise Mismatch(
                tr(
                    "{made} must build a cache whose root_node is a RadixTreeNode: keep the skeleton's __init__.",
                    made=made,
                ),
                tr("a cache with root_node"),
                f"{type(cache).__name__}: {cache!r}"[:120],
            )
        state = (
            root.children == {},
            root.ref_count,
            getattr(cache, "page_size", None),
            getattr(cache, "evictable_size", None),
            getattr(cache, "protected_size", None),
            getattr(cache, "clock", None),
        )
        info = getattr(type(cache), "size_info", None)
        if callable(info):
            raise Mismatch(
                tr(
                    "{cls}.size_info is a method: it must be a property, so that callers read cache.size_info "
                    "without calling it. Keep the skeleton's @property line above def size_info.",
                    cls=self.name,
                ),
                tr("cache.size_info is a SizeInfo"),
                tr("cache.size_info is a bound method"),
            )
        if state != (True, 1, page_size, 0, 0, 0) or not callable(getattr(cache, "tick", None)):
            raise Mismatch(
                tr(
                    "{made} must start as the skeleton's __init__ makes it: an empty root with ref_count 1, "
                    "page_size {page_size}, both counters 0, clock 0 and a tick() method.",
                    made=made,
                    page_size=page_size,
                ),
                tr("(empty root, ref_count 1, page_size {page_size}, 0, 0, clock 0)", page_size=page_size),
                tr(
                    "(empty root: {empty}, ref_count {ref_count}, page_size {page_size}, {evictable}, {protected}, clock {clock})",
                    empty=state[0],
                    ref_count=state[1],
                    page_size=state[2],
                    evictable=state[3],
                    protected=state[4],
                    clock=state[5],
                ),
            )
        return cache

    # -- while the learner's code runs --

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the learner's code; a method that is still the stub is named."""
        try:
            return call(fn, *args, **kwargs)
        except LearnerRaised as learner:
            self._name_the_stub(learner)
            raise

    def _name_the_stub(self, learner: LearnerRaised) -> None:
        """A NotImplementedError from another method than the graded ones: say which one is still the stub."""
        if type(learner.error) is not NotImplementedError or not isinstance(self.cls, type):
            return
        methods: dict[CodeType, str] = {}
        for klass in reversed(self.cls.__mro__):
            for name, value in vars(klass).items():
                code = getattr(value, "__code__", None)
                if isinstance(code, CodeType):
                    methods[code] = name
        frames = [frame for frame, _ in traceback.walk_tb(learner.error.__traceback__)]
        names = [methods[f.f_code] for f in frames if f.f_code in methods]
        if not names or names[-1] in self.own:
            return
        stub = names[-1]
        caller = next((n for n in reversed(names[:-1]) if n != stub), None)
        via = (
            tr("your {caller} calls self.{stub}", caller=caller, stub=stub)
            if caller
            else tr("this case needs self.{stub}", stub=stub)
        )
        task = tr(" (Task {task})", task=TASKS[stub]) if stub in TASKS else ""
        raise Mismatch(tr("{via}, which is still the stub{task}: write it first.", via=via, task=task)) from None


_OWN_OVERRIDE: list[tuple[str, ...]] = []


@contextlib.contextmanager
def _own_override(own: tuple[str, ...]) -> Iterator[None]:
    _OWN_OVERRIDE.append(own)
    try:
        yield
    finally:
        _OWN_OVERRIDE.pop()


def _grade(own: tuple[str, ...], body: Callable[[Subject], None]) -> Callable[[_F], None]:
    """A case's run function: the prechecks, then ``body`` with the learner's class."""

    def run(fn: _F) -> None:
        subject = Subject(fn, _OWN_OVERRIDE[-1] if _OWN_OVERRIDE else own)
        subject.precheck()
        body(subject)

    return run


# -- small helpers --------------------------------------------------------------------


def _arr(ids: Sequence[int], writeable: bool = False) -> np.ndarray:
    array = np.asarray(list(ids), dtype=np.int64)
    array.setflags(write=writeable)
    return array


def _short(ids: Sequence[int]) -> str:
    ids = list(ids)
    if len(ids) <= 8:
        return str(ids)
    return tr(
        "[{first}, {second}, … {count} tokens …, {last}]", first=ids[0], second=ids[1], count=len(ids), last=ids[-1]
    )


def _pair(
    subject: Subject, tree: Recipe
) -> tuple[Any, RadixCacheManager, dict[int, RadixTreeNode], dict[tuple[int, ...], RadixCacheHandle]]:
    """The learner's cache holding a copy of ``tree``, minikv's manager holding ``tree``, the node map, the lock handles."""
    cache = subject.make(tree.page_size)
    ref, handles = tree.build()
    copies = _trees.clone_into(cache, ref)
    return cache, ref, copies, handles


_SHAPES = [(1, 4, 12), (2, 3, 16), (3, 3, 18), (4, 3, 24), (8, 2, 32), (16, 2, 48)]
"""The random trees the checks draw: page size, vocabulary, longest prompt (every page size a task allows
a learner to meet: 1, and powers of two and an odd size for the page-aware code)."""


def drawn_trees(
    base: int, count: int, page_sizes: Sequence[int] = (1, 2, 3, 4, 8, 16), prompts: int = 10
) -> list[Recipe]:
    """``count`` random trees, cycling through the page sizes. Every other one has its slots scattered over
    the pool (a healthy node's slots need not count up beyond a page), alternating each round so that
    every page size gets both; two in three have some locks."""
    shapes = [shape for shape in _SHAPES if shape[0] in page_sizes]
    out = []
    for i in range(count):
        ps, vocab, max_len = shapes[i % len(shapes)]
        out.append(
            random_recipe(
                base + i,
                prompts,
                page_size=ps,
                vocab=vocab,
                max_len=max_len,
                lock_every=(3 if i % 3 else 0),
                scatter=(i + i // len(shapes)) % 2 == 1,
            )
        )
    return out


def _times(state: TreeSnapshot) -> list[tuple[tuple[int, ...], int]]:
    """Each node's path from the root and its last-use time."""
    return [(view.path, view.timestamp) for view in state.views()]


def _same_times(
    before: TreeSnapshot, after: TreeSnapshot, clock_before: object, clock_after: object, what: str
) -> None:
    """``what`` must change no node's last-use time and not tick the clock (it is not a use)."""
    if clock_after != clock_before:
        raise Mismatch(
            tr(
                "{what} ticked the clock ({before} → {after}): it is not a use of the prefix, so it must leave the clock alone.",
                what=what,
                before=clock_before,
                after=clock_after,
            )
        )
    old = dict(_times(before))
    for key, t in _times(after):
        if key in old and old[key] != t:
            raise Mismatch(
                tr(
                    "{what} changed the last-use time of the node {node} (t={before} → t={after}): only a walk stamps times.",
                    what=what,
                    node=_short(key),
                    before=old[key],
                    after=t,
                )
            )


def _expect_refusal(
    subject: Subject,
    cache: Any,
    wanted: type[BaseException],
    why: str,
    fn: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> None:
    """``fn(*args)`` must raise ``wanted`` and leave the tree, counters and clock exactly as they were."""
    before, clock = _trees.snapshot(cache), cache.clock
    error: BaseException | None = None
    try:
        subject.call(fn, *args, **kwargs)
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            raise
        error = learner.error
        how = learner.describe()
    if not isinstance(error, wanted):
        raise Mismatch(why, wanted.__name__, how if error is not None else tr("returned normally"))
    _trees.compare(before, _trees.snapshot(cache), when=tr("after the refused call ({error})", error=wanted.__name__))
    if cache.clock != clock:
        raise Mismatch(
            tr(
                "{why} The call was refused, so it must not tick the clock either ({before} → {after}).",
                why=why,
                before=clock,
                after=cache.clock,
            )
        )


# -- radix.match_len ---------------------------------------------------------------------


@exercise("radix.match_len", lambda: tr("MyRadixCache.match_len: how many leading tokens two arrays share"))
def _match_len_cases() -> list[Case]:
    long = list(range(1000))
    pairs: list[tuple[str, list[int], list[int]]] = [
        (tr("an empty key"), [], [1, 2]),
        (tr("empty input_ids"), [1, 2], []),
        (tr("both empty"), [], []),
        (tr("a full match of equal length"), [4, 5, 6], [4, 5, 6]),
        (tr("input_ids longer than the key: the whole key matches"), [4, 5], [4, 5, 6, 7]),
        (tr("the key longer than input_ids: all of input_ids matches"), [4, 5, 6, 7], [4, 5]),
        (tr("the first tokens differ"), [1, 2, 3], [9, 2, 3]),
        (tr("the last token differs"), [1, 2, 3], [1, 2, 9]),
        (tr("a difference in the middle, and a later equal token"), [1, 2, 3, 4, 5], [1, 2, 0, 4, 5]),
        (tr("token ids above 2**31 and below 0"), [2**40, -3, 2**31 + 1], [2**40, -3, 2**31 + 2]),
        (tr("ids that agree in their low 32 bits only"), [2**32 + 7, 1], [7, 1]),
        (tr("ids above 2**53 that differ by one (a float cannot tell them apart)"), [2**60, 2**60 + 1], [2**60, 2**60]),
        (tr("1000 tokens that differ only at the end"), long, [*long[:-1], -1]),
        (tr("1000 equal tokens"), long, list(long)),
    ]
    rng = random.Random(51)
    for i in range(400):
        common = [rng.choice([0, 1, rng.randrange(-(2**62), 2**62)]) for _ in range(rng.randint(0, 30))]
        a = common + [rng.randrange(-(2**62), 2**62) for _ in range(rng.randint(0, 6))]
        b = common + [rng.randrange(-(2**62), 2**62) for _ in range(rng.randint(0, 6))]
        pairs.append((tr("random arrays over the whole int64 range ({number})", number=i + 1), a, b))

    def make(desc: str, key: list[int], ids: list[int], strided: bool) -> Case:
        def body(subject: Subject) -> None:
            cache = subject.make(1)
            if strided:  # views into bigger arrays, as a walk passes them (node.key, input_ids[pos:])
                k = _arr([x for t in key for x in (t, 99)])[::2]
                i = _arr([5, *ids])[1:]
            else:
                k, i = _arr(key), _arr(ids)
            expected = _radix_module.match_len(_arr(key), _arr(ids))
            got = expect_int(tr("match_len's result"), subject.call(cache.match_len, k, i))
            if got != expected:
                raise Mismatch(
                    tr("match_len({key}, {ids}) is wrong.", key=_short(key), ids=_short(ids)), str(expected), str(got)
                )
            if k.tolist() != key or i.tolist() != ids:
                raise Mismatch(tr("match_len changed the arrays it was given: it must only read them."))

        return Case(
            tr("{case} (strided views)", case=desc) if strided else desc,
            max(len(key), len(ids)),
            _grade(("match_len",), body),
        )

    return [make(*p, strided=False) for p in pairs] + [make(*p, strided=True) for p in pairs[3:10:3]]


# -- radix.split_at ---------------------------------------------------------------------------


def _split_case(desc: str, tree: Recipe, splits: list[tuple[tuple[int, ...], int]]) -> Case:
    def body(subject: Subject) -> None:
        cache, ref, _, _ = _pair(subject, tree)
        ps = tree.page_size
        for path, pos in splits:
            node, ref_node = _trees.find_node(cache, path), _trees.find_node(ref, path)
            assert node.parent is not None
            parent_path = _trees.path_of(node.parent)
            what = tr("split_at(the node {node}, {pos})", node=_short(path[len(parent_path) :]), pos=pos)
            if not 0 < pos < node.length:
                _expect_refusal(
                    subject,
                    cache,
                    ValueError,
                    tr(
                        "{what} cannot make two non-empty halves: raise ValueError (ArgumentError is one) and change nothing.",
                        what=what,
                    ),
                    cache.split_at,
                    node,
                    pos,
                )
                continue
            clock = cache.clock
            before = {id(n) for n in _trees.all_nodes(cache)}
            upper = subject.call(cache.split_at, node, pos)
            ref_node.split_at(pos, ps)
            if not isinstance(upper, RadixTreeNode):
                raise Mismatch(
                    tr("{what} must return the new upper node.", what=what), tr("a RadixTreeNode"), repr(upper)[:120]
                )
            if upper is node:
                raise Mismatch(
                    tr(
                        "{what} returned the node it was given. That node must stay the *lower* half, because handles point at it and must still name the same prefix; a new node becomes the upper half.",
                        what=what,
                    )
                )
            if id(upper) in before:
                raise Mismatch(
                    tr(
                        "{what} returned a node that was already in the tree: the upper half must be a new RadixTreeNode, and the node you were given the lower half.",
                        what=what,
                    )
                )
            problem = _trees.shape_problem(cache) or _trees.node_problem(cache)
            if problem is not None:
                raise Mismatch(tr("after {what}: {problem}", what=what, problem=problem))
            if node.parent is not upper:
                raise Mismatch(
                    tr(
                        "after {what}, the lower half's parent must be the upper node you returned: link it with node.set_parent(upper, self.page_size), which sets the parent and files it in upper.children.",
                        what=what,
                    )
                )
            if _trees.path_of(node) != list(path):
                raise Mismatch(
                    tr(
                        "after {what}, the node object you were given must be the *lower* half: handles point at it, and they must still name the same prefix.",
                        what=what,
                    ),
                    tr("a handle on it names {prefix}", prefix=_short(path)),
                    tr("it names {prefix}", prefix=_short(_trees.path_of(node))),
                )
            if _trees.path_of(upper) != list(path[: len(parent_path) + pos]):
                raise Mismatch(
                    tr("{what} must return the upper half, which ends after {pos} tokens.", what=what, pos=pos),
                    str(list(path[: len(parent_path) + pos])),
                    str(_trees.path_of(upper)),
                )
            _trees.compare(_trees.snapshot(ref), _trees.snapshot(cache), when=tr("after {what}", what=what))
            if cache.clock != clock:
                raise Mismatch(
                    tr("{what} ticked the clock: a split is not a use, both halves keep the node's time.", what=what)
                )

    return Case(desc, tree.num_tokens, _grade(("split_at",), body))


def _random_splits(seed: int, tree: Recipe, count: int) -> list[tuple[tuple[int, ...], int]]:
    """Split points in a random tree (interior nodes too), replayed on a scratch copy so later ones see earlier splits."""
    rng = random.Random(seed)
    scratch, _ = tree.build()
    ps = tree.page_size
    splits = []
    for _ in range(count):
        paths = sorted(
            (tuple(_trees.path_of(n)) for n in scratch.nodes() if n.length >= 2 * ps), key=lambda p: (len(p), p)
        )
        if not paths:
            break
        path = rng.choice(paths)
        node = _trees.find_node(scratch, path)
        pos = ps * rng.randint(1, node.length // ps - 1)
        node.split_at(pos, ps)
        splits.append((path, pos))
    return splits


@exercise("radix.split_at", lambda: tr("MyRadixCache.split_at: cut a node in two and return the upper half"))
def _split_cases() -> list[Case]:
    one = recipe(insert(1, 2, 3, 4))
    with_child = recipe(insert(1, 2, 3, 4, 5), insert(1, 2, 3, 4, 5, 6, 7))
    deep = recipe(insert(1, 2, 3), insert(1, 2, 9), insert(1, 2, 3, 4, 5, 6))
    locked = recipe(insert(1, 2, 3, 4, 5), lock(1, 2, 3, 4, 5), lock(1, 2, 3, 4, 5))
    trees = [
        random_recipe(7, 10),
        random_recipe(8, 10, page_size=2, max_len=16, lock_every=3),
        random_recipe(10, 12, page_size=4, max_len=24, lock_every=4),
        random_recipe(9, 60, vocab=5, max_len=24, lock_every=7),
    ]
    return [
        _split_case(tr("split [1, 2, 3, 4] at 1"), one, [((1, 2, 3, 4), 1)]),
        _split_case(tr("split [1, 2, 3, 4] at 3 (length - 1)"), one, [((1, 2, 3, 4), 3)]),
        _split_case(tr("pos 0 or pos == length cannot split: raise ValueError and change nothing"), one, [((1, 2, 3, 4), 0), ((1, 2, 3, 4), 4)]),
        _split_case(tr("a node with children: they stay under the lower half"), with_child, [((1, 2, 3, 4, 5), 2)]),
        _split_case(tr("a node deep in the tree, whose parent has other children"), deep, [((1, 2, 3, 4, 5, 6), 1)]),
        _split_case(tr("a node locked twice: both halves keep ref_count 2"), locked, [((1, 2, 3, 4, 5), 3)]),
        _split_case(tr("split the same node twice"), one, [((1, 2, 3, 4), 3), ((1, 2, 3, 4), 2)]),
        _split_case(tr("page_size 2: split a 6-token node after its first page"), recipe(insert(*range(6)), page_size=2), [(tuple(range(6)), 2)]),
        _split_case(tr("page_size 4: split a 12-token node with a child after 8 tokens"), recipe(insert(*range(12)), insert(*range(16)), page_size=4), [(tuple(range(12)), 8)]),
        *(_split_case(tr("{tree}, split {count} times", tree=t.describe(), count=n), t, _random_splits(s, t, n)) for s, (t, n) in enumerate(zip(trees, (6, 6, 6, 20), strict=True))),
        *(_split_case(tr("{tree}, split {count} times", tree=t.describe(), count=8), t, _random_splits(700 + i, t, 8)) for i, t in enumerate(drawn_trees(700, 48))),
    ]  # fmt: skip


# -- radix.walk ----------------------------------------------------------------------------------


def _check_walk(subject: Subject, cache: Any, ref: RadixCacheManager, ids: tuple[int, ...]) -> None:
    ref_node, ref_len = ref.walk(_arr(ids))
    given, clock = _arr(ids), cache.clock
    result = subject.call(cache.walk, given)
    what = f"walk({_short(ids)})"
    if not isinstance(cache.clock, int) or cache.clock <= clock:
        raise Mismatch(
            tr(
                "{what} did not tick the clock: a walk is a use, and it takes a new time (self.tick(), once).",
                what=what,
            ),
            tr("clock {clock}", clock=clock + 1),
            tr("clock {clock}", clock=cache.clock),
        )
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Mismatch(
            tr("{what} must return a pair (node, prefix_len).", what=what), "(node, prefix_len)", repr(result)[:120]
        )
    node, prefix_len = result
    prefix_len = expect_int("prefix_len", prefix_len)
    if prefix_len != ref_len:
        raise Mismatch(tr("{what}: the matched length is wrong.", what=what), str(ref_len), str(prefix_len))
    if not isinstance(node, RadixTreeNode):
        raise Mismatch(
            tr("{what} must return the deepest matched node.", what=what), tr("a RadixTreeNode"), repr(node)[:120]
        )
    problem = _trees.shape_problem(cache)
    if problem is not None:
        raise Mismatch(tr("after {what}: {problem}", what=what, problem=problem))
    expected_path = _trees.path_of(ref_node)
    if node is not cache.root_node and (node.parent is None or _trees.path_of(node) != expected_path):
        where = _ending_at(_trees.path_of(node)) if node.parent is not None else tr("a node that is not in the tree")
        raise Mismatch(
            tr("{what} must return the node where the match ends (the root, for an empty match).", what=what)
            if not expected_path
            else tr(
                "{what} must return the node where the match ends; split the node the match ends inside.", what=what
            ),
            _ending_at(expected_path) if expected_path else tr("the root"),
            where,
        )
    if node is cache.root_node and expected_path:
        raise Mismatch(
            tr("{what} must return the node where the match ends, not the root.", what=what),
            _ending_at(expected_path),
            tr("the root"),
        )
    _trees.compare(_trees.snapshot(ref), _trees.snapshot(cache), when=tr("after {what}", what=what))


def _ending_at(path: Sequence[int]) -> str:
    return tr("the node ending at {prefix}", prefix=_short(path))


def _walk_case(desc: str, tree: Recipe, inputs: list[tuple[int, ...]], own: tuple[str, ...] = ("walk",)) -> Case:
    def body(subject: Subject) -> None:
        cache, ref, _, _ = _pair(subject, tree)
        for ids in inputs:
            _check_walk(subject, cache, ref, ids)

    return Case(desc, tree.num_tokens + sum(len(i) for i in inputs), _grade(own, body))


def _random_inputs(rng: random.Random, tree: Recipe, count: int, vocab: int, max_len: int) -> list[tuple[int, ...]]:
    """Inputs that follow the tree's prompts for a while and then go their own way (or not at all)."""
    prompts = [op.ids for op in tree.ops if op.kind == "insert"]
    out = []
    for _ in range(count):
        base = rng.choice(prompts) if prompts and rng.random() < 0.7 else ()
        keep = base[: rng.randint(0, len(base))]
        out.append(tuple(keep) + tuple(rng.randrange(vocab) for _ in range(rng.randint(0, max_len // 2))))
    return out


def _walks(tree: Recipe, count: int) -> str:
    return tr("{tree}, {count} walks", tree=tree.describe(), count=count)


@exercise(
    "radix.walk",
    lambda: tr("MyRadixCache.walk: descend along the input, splitting where the match ends inside a node"),
)
def _walk_cases() -> list[Case]:
    two = recipe(insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6), insert(7, 8))
    big_ids = recipe(insert(2**40, 5, 2**31 + 1, 4), insert(2**40, 5, 7))
    locked = recipe(insert(1, 2, 3, 4, 5, 6), lock(1, 2, 3, 4, 5, 6))
    rnd, big = random_recipe(11, 12, lock_every=4), random_recipe(13, 60, vocab=5, max_len=20, lock_every=9)
    rng = random.Random(5)
    return [
        _walk_case(tr("an empty tree: nothing matches"), recipe(), [(1, 2, 3)]),
        _walk_case(tr("empty input_ids"), two, [()]),
        _walk_case(tr("no child starts with the first token"), two, [(9, 9)]),
        _walk_case(tr("the input ends exactly at a node"), two, [(1, 2, 3, 4)]),
        _walk_case(tr("the match ends inside a node: split it at 1"), two, [(1, 9)]),
        _walk_case(tr("the match ends inside a node: split it at length - 1"), two, [(1, 2, 3, 9)]),
        _walk_case(tr("the match runs through one node and ends inside the next"), two, [(1, 2, 3, 4, 5, 0)]),
        _walk_case(tr("input_ids longer than anything cached"), two, [(1, 2, 3, 4, 5, 6, 7, 8, 9)]),
        _walk_case(tr("the matched path gets the time of this walk; the others keep theirs"), two, [(7, 8), (1, 2), (1, 2, 3, 4, 5, 6)]),
        _walk_case(tr("the input ends inside a node (a prefix of it): split there"), two, [(1, 2)]),
        _walk_case(tr("a match inside a locked node splits it; both halves stay locked"), locked, [(1, 2, 3, 9)]),
        _walk_case(tr("token ids above 2**31"), big_ids, [(2**40, 5, 2**31 + 1, 9), (2**40, 5, 8)]),
        _walk_case(_walks(rnd, 10), rnd, _random_inputs(rng, rnd, 10, 4, 12)),
        _walk_case(_walks(big, 30), big, _random_inputs(rng, big, 30, 5, 24)),
        *(_walk_case(_walks(t, 12), t, _random_inputs(rng, t, 12, 4, 16)) for t in drawn_trees(720, 50, (1,))),
    ]  # fmt: skip


# -- radix.match_prefix ---------------------------------------------------------------------------


def _as_kind(ids: tuple[int, ...], kind: int, writeable: bool = False) -> Any:
    """The ids as a list, a NumPy array (read-only unless ``writeable``) or an int64 tensor: every form a
    caller may pass."""
    if kind == 0:
        return list(ids)
    if kind == 1:
        return _arr(ids, writeable)
    return torch.tensor(ids, dtype=torch.int64)


def _shares_memory(a: torch.Tensor, b: Any) -> bool:
    """Whether two tensors (or a tensor and a NumPy array) share any byte of memory."""
    if isinstance(b, np.ndarray):
        if not b.size:
            return False
        b = torch.from_numpy(b) if b.flags.writeable else torch.from_numpy(b.copy())
    if not isinstance(b, torch.Tensor) or a.device != b.device or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        return start, start + (t.numel() - 1) * max(t.stride() or (1,)) * t.element_size() + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _check_match(
    subject: Subject,
    cache: Any,
    ref: RadixCacheManager,
    ids: tuple[int, ...],
    kind: int,
    earlier: list[torch.Tensor] | None = None,
) -> None:
    """One match on both trees; ``earlier``: what the learner's earlier matches returned (the caller owns each)."""
    earlier = [] if earlier is None else earlier
    ref_handle, ref_indices = ref.match_prefix(list(ids))
    given = _as_kind(ids, kind)
    result = subject.call(cache.match_prefix, given)
    what = f"match_prefix({_short(ids)})"
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Mismatch(
            tr("{what} must return a pair (handle, indices).", what=what),
            tr("(RadixCacheHandle, int32 tensor)"),
            repr(result)[:120],
        )
    handle, indices = result
    if not isinstance(handle, RadixCacheHandle):
        raise Mismatch(
            tr("{what} must return a RadixCacheHandle(cached_len, node) first.", what=what),
            "RadixCacheHandle",
            repr(handle)[:120],
        )
    if handle.cached_len != ref_handle.cached_len:
        raise Mismatch(
            tr("{what}: the handle's cached_len is wrong.", what=what),
            str(ref_handle.cached_len),
            str(handle.cached_len),
        )
    expect_slot_tensor(
        tr("{what} must return the matched slots as a 1-D int32 tensor (empty when nothing matched).", what=what),
        indices,
    )
    if indices.tolist() != ref_indices.tolist():
        raise Mismatch(
            tr("{what} returned the wrong slots: the values of the matched path, root first.", what=what),
            str(ref_indices.tolist()),
            str(indices.tolist()),
        )
    for i, old in enumerate(earlier):
        if indices is old or _shares_memory(indices, old):
            raise Mismatch(
                tr(
                    "{what} returned a tensor that shares its memory with what match_prefix returned {calls} call(s) before: each caller owns what it gets and may write into it, so every call must return a new tensor.",
                    what=what,
                    calls=len(earlier) - i,
                )
            )
    if isinstance(given, torch.Tensor) and _shares_memory(indices, given):
        raise Mismatch(
            tr("{what} returned a tensor that shares its memory with the input_ids it was given.", what=what)
        )
    earlier.append(indices)
    expected_path = _trees.path_of(ref_handle.node)
    problem = _trees.shape_problem(cache) or _trees.node_problem(cache)
    if problem is not None:
        raise Mismatch(tr("after {what}: {problem}", what=what, problem=problem))
    if expected_path and not isinstance(handle.node, RadixTreeNode):
        raise Mismatch(
            tr("{what}: the handle must name the node where the match ends.", what=what),
            tr("a RadixTreeNode"),
            repr(handle.node)[:120],
        )
    if (
        expected_path
        and handle.node.parent is not None
        and _trees.path_of(handle.node) == expected_path
        and _trees.find_node(cache, expected_path) is not handle.node
    ):
        raise Mismatch(
            tr(
                "{what}: the handle names a node that is not in your tree, though it spells the same prefix (a copy?). The handle must hold the tree's own node: lock_handle walks up from it.",
                what=what,
            )
        )
    if (handle.node is cache.root_node) != (not expected_path) or (
        expected_path and _trees.path_of(handle.node) != expected_path
    ):
        raise Mismatch(
            tr("{what}: the handle must name the node where the match ends (the root for an empty match).", what=what),
            _ending_at(expected_path) if expected_path else tr("the root"),
            tr("the root") if handle.node is cache.root_node else _ending_at(_trees.path_of(handle.node)),
        )
    read_back = given if isinstance(given, list) else given.tolist()
    if read_back != list(ids):
        raise Mismatch(tr("{what} changed the input_ids it was given: it must only read them.", what=what))
    _trees.compare(_trees.snapshot(ref), _trees.snapshot(cache), when=tr("after {what}", what=what))
    indices.fill_(-7)  # the caller owns what it got back: the tree must not change
    after = _trees.snapshot(cache)
    if any(-7 in n.slots for n in _trees.nodes_of(after)):
        raise Mismatch(
            tr(
                "{what} returned a tensor the tree still uses: the caller wrote -7 into it and the tree shows -7. Return a new tensor (torch.cat makes one; for one node, .clone()).",
                what=what,
            )
        )


def _matches(tree: Recipe, count: int) -> str:
    return tr("{tree}, {count} matches", tree=tree.describe(), count=count)


@exercise(
    "radix.match_prefix",
    lambda: tr("MyRadixCache.match_prefix: the longest cached prefix, its handle and its slots"),
)
def _match_cases() -> list[Case]:
    two = recipe(insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6), insert(7, 8))
    rnd, big = random_recipe(61, 12, lock_every=3), random_recipe(62, 50, vocab=5, max_len=20, lock_every=6)
    rng = random.Random(6)

    def case(desc: str, tree: Recipe, inputs: list[tuple[int, ...]]) -> Case:
        def body(subject: Subject) -> None:
            cache, ref, _, _ = _pair(subject, tree)
            earlier: list[torch.Tensor] = []
            for i, ids in enumerate(inputs):
                _check_match(subject, cache, ref, ids, i % 3, earlier)

        return Case(desc, tree.num_tokens + sum(len(i) for i in inputs), _grade(("match_prefix",), body))

    return [
        case(tr("an empty tree: cached_len 0, an empty int32 tensor, the root's handle"), recipe(), [(1, 2)]),
        case(tr("empty input_ids"), two, [()]),
        case(tr("a match that ends at a node: the slots of the whole path"), two, [(1, 2, 3, 4, 5, 6), (7, 8, 9)]),
        case(tr("a match that ends inside a node splits it"), two, [(1, 2, 9)]),
        case(tr("as a list, a NumPy array and a tensor (every form of input_ids)"), two, [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)]),
        case(tr("the returned indices are the caller's own"), recipe(insert(5, 6, 7)), [(5, 6, 7)]),
        case(_matches(rnd, 12), rnd, _random_inputs(rng, rnd, 12, 4, 12)),
        case(_matches(big, 30), big, _random_inputs(rng, big, 30, 5, 24)),
        case(tr("the same prefix matched three times: three tensors, each the caller's own"), two, [(1, 2, 3, 4, 5, 6)] * 3 + [(7, 8)] * 3),
        *(case(_matches(t, 12), t, _random_inputs(rng, t, 12, 4, 16)) for t in drawn_trees(740, 45, (1,))),
    ]  # fmt: skip


# -- radix.insert_prefix ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Insert:
    ids: tuple[int, ...]
    handle_of: tuple[int, ...] | None = None
    """Pass the handle of the recipe's lock of this prefix (the request's own locked match)."""
    kind: int = 1


def _check_insert(
    subject: Subject,
    cache: Any,
    ref: RadixCacheManager,
    step: _Insert,
    slots: torch.Tensor,
    handles: dict[tuple[int, ...], RadixCacheHandle],
    copies: dict[int, RadixTreeNode],
    trim: bool = False,
) -> None:
    ids = step.ids
    ref_kwargs = {} if step.handle_of is None else {"handle": handles[step.handle_of]}
    mine_kwargs = {} if step.handle_of is None else {"handle": _trees.translate(handles[step.handle_of], copies)}
    expected = ref.insert_prefix(list(ids), slots.clone(), **ref_kwargs)
    given_ids = _as_kind(ids, step.kind, writeable=True)  # the caller's own buffers, which it reuses after the call
    row = torch.full((len(slots) + 2,), 7777, dtype=torch.int32)
    row[1 : len(slots) + 1] = slots
    given = row[1 : len(slots) + 1]  # a view into the caller's page table, as a request's row is
    got = expect_int(tr("insert_prefix's result"), subject.call(cache.insert_prefix, given_ids, given, **mine_kwargs))
    shown_ids, shown_slots = _short(ids), _short(slots.tolist())
    what = (
        tr("insert_prefix({ids}, slots {slots}, handle=its locked match)", ids=shown_ids, slots=shown_slots)
        if mine_kwargs
        else tr("insert_prefix({ids}, slots {slots})", ids=shown_ids, slots=shown_slots)
    )
    if cache.page_size > 1:
        what = tr("{what} with page_size {page_size}", what=what, page_size=cache.page_size)
    if got != expected:
        raise Mismatch(
            tr("{what} must return how many of its tokens were already cached (in whole pages).", what=what)
            if trim
            else tr("{what} must return how many of its tokens were already cached.", what=what),
            str(expected),
            str(got),
        )
    if given.tolist() != slots.tolist():
        raise Mismatch(
            tr(
                "{what} changed the indices it was given: the caller's tensor is a row of its page table, read it only.",
                what=what,
            )
        )
    problem = _trees.shape_problem(cache) or _trees.node_problem(cache)
    if problem is not None:
        raise Mismatch(tr("after {what}: {problem}", what=what, problem=problem))
    row.fill_(-5)  # the caller reuses its page-table row; the tree must have kept a copy
    if isinstance(given_ids, list):
        given_ids[:] = [-9] * len(given_ids)
    else:
        given_ids[:] = -9  # and its token buffer
    mine = _trees.snapshot(cache)
    difference = _trees.first_difference(_trees.snapshot(ref), mine)
    if difference is not None:
        if any(-5 in n.slots for n in _trees.nodes_of(mine)):
            difference += tr(
                " (The tree shows -5: the caller overwrote its indices after the call, and the tree saw it. Store a copy: .clone().)"
            )
        elif any(-9 in n.tokens for n in _trees.nodes_of(mine)):
            difference += tr(
                " (The tree shows token -9: the caller overwrote its input_ids after the call, and the tree saw it. Store a copy of the tokens: .copy().)"
            )
        raise _trees.tree_mismatch(
            tr("after {what}: {problem}", what=what, problem=difference), _trees.snapshot(ref), mine
        )


def _insert_case(
    desc: str,
    tree: Recipe,
    steps: list[_Insert],
    own: tuple[str, ...] = ("insert_prefix",),
    seed: int = 0,
    trim: bool = False,
) -> Case:
    def body(subject: Subject) -> None:
        cache, ref, copies, handles = _pair(subject, tree)
        ps = tree.page_size
        rng = random.Random(seed)
        next_page = 500
        for step in steps:
            pages = -(-len(step.ids) // ps)
            order = list(range(next_page, next_page + pages))
            rng.shuffle(order)  # a page table is not in ascending order
            next_page += pages
            slots = torch.tensor([p * ps + o for p in order for o in range(ps)][: len(step.ids)], dtype=torch.int32)
            _check_insert(subject, cache, ref, step, slots, handles, copies, trim)
        if steps:
            _expect_refusal(
                subject,
                cache,
                ValueError,
                tr(
                    "insert_prefix with 3 tokens but 2 slots must raise ValueError (ArgumentError is one) and change nothing: the caller made a mistake."
                ),
                cache.insert_prefix,
                [1, 2, 3],
                torch.tensor([0, 1], dtype=torch.int32),
            )

    return Case(desc, tree.num_tokens + sum(len(s.ids) for s in steps), _grade(own, body))


def _random_inserts(seed: int, count: int, vocab: int, max_len: int) -> list[_Insert]:
    rng = random.Random(seed)
    prompts: list[tuple[int, ...]] = []
    out = []
    for i in range(count):
        base = rng.choice(prompts) if prompts and rng.random() < 0.6 else ()
        ids = tuple(base[: rng.randint(0, len(base))]) + tuple(
            rng.randrange(vocab) for _ in range(rng.randint(1, max_len))
        )
        prompts.append(ids)
        out.append(_Insert(ids, kind=i % 3))
    return out


@exercise("radix.insert_prefix", lambda: tr("MyRadixCache.insert_prefix: hand a finished request's slots to the tree"))
def _insert_cases() -> list[Case]:
    cached = recipe(insert(1, 2, 3, 4))
    locked = recipe(insert(1, 2, 3, 4), lock(1, 2, 3, 4), lock(1, 2))
    return [
        _insert_case(tr("into an empty tree"), recipe(), [_Insert((1, 2, 3))]),
        _insert_case(tr("a prompt that shares a prefix: split, and a new leaf for the rest"), cached, [_Insert((1, 2, 9, 9))]),
        _insert_case(tr("a prompt that is cached whole: return its length, add nothing"), cached, [_Insert((1, 2, 3, 4))]),
        _insert_case(tr("a prefix of a cached node: split it, add nothing"), cached, [_Insert((1, 2))]),
        _insert_case(tr("a prompt that continues a leaf: a child below it"), cached, [_Insert((1, 2, 3, 4, 5, 6))]),
        _insert_case(tr("under a locked path: the new leaf is unlocked (evictable)"), locked, [_Insert((1, 2, 3, 4, 7)), _Insert((1, 2, 8))]),
        _insert_case(tr("with handle=, the request's own locked match: the same result as a walk from the root"), locked, [_Insert((1, 2, 3, 4, 9, 9), handle_of=(1, 2, 3, 4)), _Insert((1, 2, 5), handle_of=(1, 2))]),
        _insert_case(tr("as a list, a NumPy array and a tensor; the tree keeps copies"), recipe(), [_Insert((4, 5), kind=0), _Insert((4, 6), kind=1), _Insert((4, 7), kind=2)]),
        _insert_case(tr("token ids above 2**31"), recipe(), [_Insert((2**40, 7, 2**31 + 3)), _Insert((2**40, 7, 9))]),
        _insert_case(tr("twelve prompts over a tiny vocabulary"), recipe(), _random_inserts(71, 12, 3, 8), seed=1),
        _insert_case(tr("forty prompts, some locked first"), random_recipe(72, 10, lock_every=3), _random_inserts(73, 40, 3, 12), seed=2),
        *(_insert_case(tr("{tree}, 12 more prompts", tree=t.describe()), t, _random_inserts(760 + i, 12, 4, 12), seed=760 + i) for i, t in enumerate(drawn_trees(760, 40, (1,)))),
    ]  # fmt: skip


# -- radix.lock_handle and radix.harden_lock ---------------------------------------------------------


@dataclass(frozen=True)
class _LockStep:
    """One call of a lock case. ``kind``: "lock" (a fresh match's handle, locked), "unlock" (the handle of
    the lock labelled ``label``), "match" (a match the checker does on both trees: it may split a locked
    node), "refuse" (unlock a fresh match's handle whose node holds no lock of its own: LockError)."""

    kind: str
    ids: tuple[int, ...]
    label: int = 0

    def describe(self) -> str:
        ids = _short(self.ids)
        if self.kind == "lock":
            return tr("lock the match of {ids} (lock #{label})", ids=ids, label=self.label)
        if self.kind == "unlock":
            return tr("unlock lock #{label} (the match of {ids})", ids=ids, label=self.label)
        if self.kind == "match":
            return tr("match {ids} (the checker's own walk, on both trees)", ids=ids)
        return tr("unlock the match of {ids}, which holds no lock of its own (must be refused)", ids=ids)


def _steps(*calls: tuple[str, tuple[int, ...]]) -> list[_LockStep]:
    """Written steps: each ("unlock", ids) undoes the latest lock of ``ids`` not yet undone."""
    out, open_locks = [], dict[tuple[int, ...], list[int]]()
    for i, (kind, ids) in enumerate(calls):
        label = 0
        if kind == "lock":
            label = i + 1
            open_locks.setdefault(ids, []).append(label)
        elif kind == "unlock":
            label = open_locks[ids].pop()
        out.append(_LockStep(kind, ids, label))
    return out


class _StepFailed(Exception):
    def __init__(self, index: int, mismatch: Mismatch) -> None:
        self.index, self.mismatch = index, mismatch


def _play_locks(subject: Subject, tree: Recipe, steps: Sequence[_LockStep]) -> None:
    """Play ``steps`` on the learner's copy of ``tree`` and on minikv's; :class:`_StepFailed` at the first
    difference."""
    cache, ref, _, _ = _pair(subject, tree)
    handles: dict[int, tuple[RadixCacheHandle, RadixCacheHandle]] = {}
    for index, step in enumerate(steps):
        try:
            _play_lock_step(subject, cache, ref, handles, step)
        except Mismatch as mismatch:
            raise _StepFailed(index, mismatch) from None


def _play_lock_step(
    subject: Subject,
    cache: Any,
    ref: RadixCacheManager,
    handles: dict[int, tuple[RadixCacheHandle, RadixCacheHandle]],
    step: _LockStep,
) -> None:
    ids = step.ids
    if step.kind in ("match", "lock", "refuse"):
        ref_handle = ref.match_prefix(list(ids))[0]
        _trees.checker_walk(cache, ids)
        node = _trees.find_node(cache, _trees.path_of(ref_handle.node)) if ref_handle.cached_len else cache.root_node
        pair = (RadixCacheHandle(ref_handle.cached_len, node), ref_handle)
        if step.kind == "match":
            return
    before, clock = _trees.snapshot(cache), cache.clock
    if step.kind == "refuse":
        _expect_refusal(
            subject,
            cache,
            LockError,
            tr(
                "unlocking the match of {ids}, whose node holds no lock of its own, must raise LockError and change nothing (a lock belongs to the node its handle ends at).",
                ids=_short(ids),
            ),
            cache.lock_handle,
            pair[0],
            unlock=True,
        )
        return
    if step.kind == "lock":
        handles[step.label] = pair
        subject.call(cache.lock_handle, pair[0])
        ref.lock_handle(pair[1])
        what = tr("locking the match of {ids}", ids=_short(ids))
    else:
        pair = handles.pop(step.label)
        subject.call(cache.lock_handle, pair[0], unlock=True)
        ref.lock_handle(pair[1], unlock=True)
        what = tr("unlocking the match of {ids}", ids=_short(ids))
    _trees.compare(_trees.snapshot(ref), _trees.snapshot(cache), when=tr("after {what}", what=what))
    _same_times(before, _trees.snapshot(cache), clock, cache.clock, what)


def _without(steps: tuple[_LockStep, ...], i: int) -> tuple[_LockStep, ...]:
    """``steps`` without step ``i`` (and, for a lock, without the unlock that undoes it)."""
    gone = steps[i]
    return tuple(
        s
        for j, s in enumerate(steps)
        if j != i and not (gone.kind == "lock" and s.kind == "unlock" and s.label == gone.label)
    )


def _shortest_failing(
    subject: Subject, tree: Recipe, steps: tuple[_LockStep, ...], failed: _StepFailed, budget: int = 60
) -> tuple[tuple[_LockStep, ...], _StepFailed]:
    """Cut a failing sequence down: up to the failing call, then drop calls one by one while it still fails."""

    def fails(candidate: tuple[_LockStep, ...]) -> _StepFailed | None:
        try:
            _play_locks(subject, tree, candidate)
        except _StepFailed as failure:
            return failure
        except (Mismatch, LearnerRaised):
            return None  # a different kind of failure: keep the sequence we had
        return None

    steps = steps[: failed.index + 1]
    progress = True
    while progress and budget > 0:
        progress = False
        for i in range(len(steps) - 1, -1, -1):
            if budget <= 0 or i >= len(steps):
                continue
            candidate = _without(steps, i)
            if not candidate:
                continue
            budget -= 1
            failure = fails(candidate)
            if failure is not None:
                steps, failed, progress = candidate[: failure.index + 1], failure, True
    return steps, failed


def _listing(tree: Recipe, steps: Sequence[_LockStep], failed_at: int) -> str:
    start, _ = tree.build()
    lines = [tr("on {tree}:", tree=tree.describe()), _trees.render(TreeSnapshot.of(start)), tr("the calls:")]
    for i, step in enumerate(steps):
        lines.append(f"  {i + 1}. {step.describe()}" + (tr("   <- fails here") if i == failed_at else ""))
    return "\n".join(lines)


def _lock_case(desc: str, tree: Recipe, steps: list[_LockStep], drawn: bool = False) -> Case:
    """A sequence of lock calls. A failure names the calls; a ``drawn`` (random) one first shrinks them to the
    shortest sequence that still fails."""

    def body(subject: Subject) -> None:
        try:
            _play_locks(subject, tree, steps)
        except _StepFailed as failed:
            shown, found = tuple(steps), failed
            if drawn:
                shown, found = _shortest_failing(subject, tree, shown, failed)
            count, at, why = len(shown), found.index + 1, found.mismatch.problem
            problem = (
                tr(
                    "the shortest sequence of calls found that fails has {count}; at call {call}: {problem}",
                    count=count,
                    call=at,
                    problem=why,
                )
                if drawn
                else tr("the calls has {count}; at call {call}: {problem}", count=count, call=at, problem=why)
            )
            listing = _listing(tree, shown, found.index)
            expected = listing + ("\n\n" + found.mismatch.expected if found.mismatch.expected else "")
            raise Mismatch(problem, expected, found.mismatch.got or tr("(see above)"), size=len(shown)) from None

    return Case(desc, tree.num_tokens + len(steps), _grade(("lock_handle",), body))


def _random_lock_steps(seed: int, tree: Recipe, count: int, refusals: bool = False) -> list[_LockStep]:
    """Random calls on ``tree``, simulated on a scratch copy of minikv's manager so every call is valid.

    Drawn per class, so that none is left to chance: every round picks a node with two or more children
    (when the tree has one), locks two of its children's paths (sometimes the node itself too), and
    unlocks the node: its own lock (with locks below it that its count must keep) or, with ``refusals``,
    a node that holds no lock of its own but whose count is the sum of its children's. Between rounds,
    plain random locks, unlocks, and matches that split locked nodes.
    """
    rng = random.Random(seed)
    scratch, _ = tree.build()
    ps = tree.page_size
    prompts = sorted({op.ids for op in tree.ops if op.kind == "insert"})
    steps: list[_LockStep] = []
    held: list[tuple[int, tuple[int, ...], RadixCacheHandle]] = []
    label = 0

    def lock(ids: tuple[int, ...]) -> None:
        nonlocal label
        handle = scratch.match_prefix(list(ids))[0]
        if not handle.cached_len:
            return
        label += 1
        scratch.lock_handle(handle)
        held.append((label, ids, handle))
        steps.append(_LockStep("lock", ids, label))

    def unlock(i: int) -> None:
        got, ids, handle = held.pop(i)
        scratch.lock_handle(handle, unlock=True)
        steps.append(_LockStep("unlock", ids, got))

    def own_locks(node: RadixTreeNode) -> int:
        return node.ref_count - sum(child.ref_count for child in node.children.values())

    for _ in range(count):
        roll = rng.random()
        forks = [n for n in scratch.nodes() if len(n.children) >= 2]
        if forks and roll < 0.35:
            fork = rng.choice(sorted(forks, key=lambda n: _trees.path_of(n)))
            fork_path = tuple(_trees.path_of(fork))
            children = sorted(fork.children.values(), key=lambda n: n.key.tolist())
            for child in rng.sample(children, 2):
                lock(tuple(_trees.path_of(child)))
            if rng.random() < 0.5 or not refusals:
                lock(fork_path)
            handle = scratch.match_prefix(list(fork_path))[0]
            mine = [i for i, (_, ids, _) in enumerate(held) if ids == fork_path]
            if own_locks(handle.node) > 0:
                if mine:
                    unlock(mine[-1])
            else:
                steps.append(_LockStep("refuse", fork_path))
        elif held and roll < 0.6:
            unlock(rng.randrange(len(held)))
        elif roll < 0.7:
            prompt = rng.choice(prompts)
            ids = prompt[: rng.randint(1, len(prompt))]
            scratch.match_prefix(list(ids))
            steps.append(_LockStep("match", ids))
        elif refusals and roll < 0.8:
            prompt = rng.choice(prompts)
            ids = prompt[: ps * rng.randint(1, max(1, len(prompt) // ps))]
            handle = scratch.match_prefix(list(ids))[0]
            if handle.cached_len and own_locks(handle.node) <= 0:
                steps.append(_LockStep("refuse", ids))
            else:
                steps.append(_LockStep("match", ids))
        else:
            prompt = rng.choice(prompts)
            lock(prompt[: ps * rng.randint(1, max(1, len(prompt) // ps))])
    while held:
        unlock(len(held) - 1)
    return steps


_LOCK_TREES = [
    (1, 10, 4, 8),
    (2, 10, 3, 12),
    (3, 8, 3, 9),
    (4, 8, 3, 16),
    (8, 6, 2, 24),
    (1, 40, 4, 16),
]
"""The random trees of the lock checks: page size, prompts, vocabulary, longest prompt."""


def _drawn_lock_cases(base: int, per_tree: int, refusals: bool) -> list[Case]:
    cases = []
    for t, (ps, prompts, vocab, max_len) in enumerate(_LOCK_TREES):
        for d in range(per_tree):
            seed = base + 10 * t + d
            tree = random_recipe(seed, prompts, page_size=ps, vocab=vocab, max_len=max_len, scatter=d % 2 == 1)
            steps = _random_lock_steps(seed, tree, 14, refusals)
            desc = tr("{tree}, {count} calls drawn at random", tree=tree.describe(), count=len(steps))
            cases.append(_lock_case(desc, tree, steps, drawn=True))
    return cases


@exercise(
    "radix.lock_handle",
    lambda: tr("MyRadixCache.lock_handle: lock or unlock the path from a handle's node to the root"),
)
def _lock_cases() -> list[Case]:
    single = recipe(insert(1, 2, 3))
    chain = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6))
    branches = recipe(insert(1, 2, 3), insert(1, 2, 9))
    fork = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 5, 6))
    return [
        _lock_case(tr("lock a prefix that is one node"), single, _steps(("lock", (1, 2, 3)))),
        _lock_case(tr("lock and unlock a prefix that is one node"), single, _steps(("lock", (1, 2, 3)), ("unlock", (1, 2, 3)))),
        _lock_case(tr("lock a deep node: every node up to the root is locked, the root is not"), chain, _steps(("lock", (1, 2, 3, 4, 5, 6)))),
        _lock_case(tr("lock the same prefix twice and unlock it once: it stays locked"), chain, _steps(("lock", (1, 2, 3, 4)), ("lock", (1, 2, 3, 4)), ("unlock", (1, 2, 3, 4)))),
        _lock_case(tr("lock two branches that share a parent: the parent's ref_count is 2"), branches, _steps(("lock", (1, 2, 3)), ("lock", (1, 2, 9)), ("unlock", (1, 2, 3)))),
        _lock_case(tr("a node locked itself and through two locked children: unlock it, then the children"), fork, _steps(("lock", (1, 2, 3, 4)), ("lock", (1, 2, 5, 6)), ("lock", (1, 2)), ("unlock", (1, 2)), ("unlock", (1, 2, 5, 6)), ("unlock", (1, 2, 3, 4)))),
        _lock_case(tr("the handle of an empty match (the root) locks nothing"), single, _steps(("lock", (7, 7)), ("unlock", (7, 7)))),
        _lock_case(tr("a later match splits the locked node; unlocking still releases both halves"), single, _steps(("lock", (1, 2, 3)), ("match", (1, 9)), ("unlock", (1, 2, 3)))),
        _lock_case(tr("page_size 2: lock and unlock"), recipe(insert(*range(6)), insert(0, 1, 7, 7), page_size=2), _steps(("lock", (0, 1, 2, 3, 4, 5)), ("lock", (0, 1, 7, 7)), ("unlock", (0, 1, 2, 3, 4, 5)))),
        _lock_case(tr("page_size 4, slots scattered over the pool: lock, lock a branch, unlock"), recipe(insert(*range(12)), insert(0, 1, 2, 3, 9, 9, 9, 9), page_size=4, scatter=5), _steps(("lock", tuple(range(12))), ("lock", (0, 1, 2, 3, 9, 9, 9, 9)), ("unlock", tuple(range(12))), ("unlock", (0, 1, 2, 3, 9, 9, 9, 9)))),
        *_drawn_lock_cases(300, 4, refusals=False),
    ]  # fmt: skip


@exercise(
    "radix.harden_lock",
    lambda: tr("optional: MyRadixCache.lock_handle refuses to unlock a node that holds no lock of its own"),
)
def _harden_cases() -> list[Case]:
    chain = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 3, 4, 5, 6))
    fork = recipe(insert(1, 2), insert(1, 2, 3, 4), insert(1, 2, 5, 6))
    return [
        _lock_case(tr("unlock what nobody locked: raise LockError, change nothing"), chain, _steps(("refuse", (1, 2, 3, 4)))),
        _lock_case(tr("unlock a leaf whose parent another handle locked: LockError, nothing changes"), chain, _steps(("lock", (1, 2)), ("refuse", (1, 2, 3, 4)), ("unlock", (1, 2)))),
        _lock_case(tr("unlock a node that only a deeper lock passes through: LockError, nothing changes"), chain, _steps(("lock", (1, 2, 3, 4, 5, 6)), ("refuse", (1, 2)), ("unlock", (1, 2, 3, 4, 5, 6)))),
        _lock_case(tr("unlock a node whose count comes from two locked children (the sum, not the largest): LockError"), fork, _steps(("lock", (1, 2, 3, 4)), ("lock", (1, 2, 5, 6)), ("refuse", (1, 2)), ("unlock", (1, 2, 3, 4)), ("unlock", (1, 2, 5, 6)))),
        _lock_case(tr("a node locked itself and through two locked children may be unlocked once, then no more"), fork, _steps(("lock", (1, 2, 3, 4)), ("lock", (1, 2, 5, 6)), ("lock", (1, 2)), ("unlock", (1, 2)), ("refuse", (1, 2)), ("unlock", (1, 2, 5, 6)), ("unlock", (1, 2, 3, 4)))),
        _lock_case(tr("unlock twice what was locked once: the second unlock is refused"), fork, _steps(("lock", (1, 2, 3, 4)), ("unlock", (1, 2, 3, 4)), ("refuse", (1, 2, 3, 4)))),
        _lock_case(tr("a lock survives a later split: the upper half holds no lock of its own"), recipe(insert(1, 2, 3, 4)), _steps(("lock", (1, 2, 3, 4)), ("match", (1, 2, 9)), ("refuse", (1, 2)), ("unlock", (1, 2, 3, 4)))),
        *_drawn_lock_cases(500, 5, refusals=True),
    ]  # fmt: skip


# -- radix.evict ----------------------------------------------------------------------------------


def _evict_case(desc: str, tree: Recipe, sizes: list[int]) -> Case:
    def body(subject: Subject) -> None:
        cache, ref, _, _ = _pair(subject, tree)
        for size in sizes:
            what = f"evict({size})"
            if size < 0 or size > ref.size_info.evictable_size:
                wanted = ValueError if size < 0 else EvictionError
                reason = (
                    tr("a negative size is a mistake")
                    if size < 0
                    else tr("only {count} slots are evictable", count=ref.size_info.evictable_size)
                )
                _expect_refusal(
                    subject,
                    cache,
                    wanted,
                    tr(
                        "{what}: {reason}, so raise {error} before changing anything.",
                        what=what,
                        reason=reason,
                        error=wanted.__name__,
                    ),
                    cache.evict,
                    size,
                )
                continue
            before, clock = _trees.snapshot(cache), cache.clock
            expected = ref.evict(size)
            got = subject.call(cache.evict, size)
            expect_slot_tensor(tr("{what} must return a 1-D int32 tensor of the freed slots.", what=what), got)
            problem = _trees.shape_problem(cache)
            if problem is not None:
                raise Mismatch(tr("after {what}: {problem}", what=what, problem=problem))
            freed, wanted_slots = sorted(got.tolist()), sorted(expected.tolist())
            before_call = "\n\n" + tr("the tree before the call:") + "\n" + _trees.render(before)
            if len(freed) > len(wanted_slots) and set(wanted_slots) < set(freed):
                raise Mismatch(
                    tr(
                        "{what} evicted {freed} slots, but {needed} were needed: stop as soon as at least {size} slots are freed (a whole node may take you past {size}, but no node more).",
                        what=what,
                        freed=len(freed),
                        needed=len(wanted_slots),
                        size=size,
                    ),
                    _slots(wanted_slots) + before_call,
                    _slots(freed),
                )
            if len(freed) < size:
                raise Mismatch(
                    tr(
                        "{what} evicted {freed} slots, but {size} were asked for: free whole nodes until at least {size} are freed.",
                        what=what,
                        freed=len(freed),
                        size=size,
                    ),
                    _slots(wanted_slots),
                    _slots(freed),
                )
            if freed != wanted_slots:
                raise Mismatch(
                    tr(
                        "{what} freed the wrong slots. Least recently used unlocked leaves go first, whole nodes at a time, and a parent whose last child went may be next.",
                        what=what,
                    ),
                    str(sorted(expected.tolist())) + before_call,
                    str(sorted(got.tolist())),
                )
            _trees.compare(_trees.snapshot(ref), _trees.snapshot(cache), when=tr("after {what}", what=what))
            _same_times(before, _trees.snapshot(cache), clock, cache.clock, what)

    return Case(desc, tree.num_tokens, _grade(("evict",), body))


def _slots(slots: list[int]) -> str:
    return tr("{count} slots: {slots}", count=len(slots), slots=slots)


def _random_evictions(seed: int, tree: Recipe) -> list[int]:
    manager, _ = tree.build()
    rng = random.Random(seed)
    sizes = []
    while manager.size_info.evictable_size:
        size = rng.randint(1, max(1, manager.size_info.evictable_size // 2))
        manager.evict(size)
        sizes.append(size)
    return sizes


@exercise("radix.evict", lambda: tr("MyRadixCache.evict: free the least recently used unlocked leaves"))
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
        _evict_case(tr("evict(0) frees nothing and returns an empty int32 tensor"), leaf, [0]),
        _evict_case(tr("one leaf: evict(1) frees the whole leaf (4 slots)"), leaf, [1]),
        _evict_case(tr("two leaves: the least recently used goes first"), two, [1]),
        _evict_case(tr("the oldest leaf is locked: skip it"), locked_old, [2]),
        _evict_case(tr("evict(5) must free two leaves"), two, [5]),
        _evict_case(tr("two leaves go, their parent becomes a leaf, and it is older than [7, 8, 9]: it goes next"), family, [4, 1]),
        _evict_case(tr("a chain: freeing everything takes the leaf, then its parent, then the root's child"), chain, [6]),
        _evict_case(tr("a parent with a locked child never becomes a leaf"), partly_locked, [3, 2]),
        _evict_case(tr("more than is evictable: raise EvictionError, change nothing"), locked_old, [6]),
        _evict_case(tr("a negative size: raise ValueError, change nothing"), leaf, [-1]),
        _evict_case(tr("page_size 2: whole nodes of whole pages"), recipe(insert(*range(6)), insert(0, 1, 7, 7), page_size=2), [1, 2]),
        _evict_case(tr("{tree}, some prompts locked, evicted until nothing is left", tree=rnd.describe()), rnd, _random_evictions(1, rnd)),
        _evict_case(tr("{tree}, evicted until nothing is left", tree=rnd_paged.describe()), rnd_paged, _random_evictions(2, rnd_paged)),
        _evict_case(tr("{tree}, some prompts locked, evicted until nothing is left", tree=big.describe()), big, _random_evictions(3, big)),
        *(_evict_case(tr("{tree}, evicted until nothing is left", tree=t.describe()), t, _random_evictions(780 + i, t)) for i, t in enumerate(drawn_trees(780, 80))),
    ]  # fmt: skip


# -- radix.check_integrity -------------------------------------------------------------------------


def _healthy_case(desc: str, tree: Recipe) -> Case:
    def body(subject: Subject) -> None:
        cache, _, _, _ = _pair(subject, tree)
        before = _trees.snapshot(cache)
        try:
            subject.call(cache.check_integrity)
        except LearnerRaised as learner:
            if type(learner.error) is NotImplementedError:
                raise
            raise Mismatch(
                tr(
                    "this tree is healthy, but your check_integrity {outcome}.",
                    outcome=outcome(learner.error),
                ),
                _trees.render(before),
                tr("(the same tree)"),
            ) from None
        _trees.compare(before, _trees.snapshot(cache), when=tr("check_integrity must only read the tree"))

    return Case(tr("a healthy tree passes: {tree}", tree=desc), tree.num_tokens, _grade(("check_integrity",), body))


Corruption = Callable[[Any, random.Random], str]
"""Breaks one rule of a cache's tree (chosen with the random generator); returns where, in words."""


def _nodes(cache: Any) -> list[Any]:
    """Every node but the root, in an order that depends on the tree's content only (parents first)."""
    out: list[Any] = []
    stack = sorted(cache.root_node.children.values(), key=lambda n: n.key.tolist(), reverse=True)
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(sorted(node.children.values(), key=lambda n: n.key.tolist(), reverse=True))
    return out


def _pick(cache: Any, rng: random.Random, ok: Callable[[Any], bool]) -> Any:
    """A node (interior ones first, when there are some) for which ``ok`` holds."""
    nodes = [n for n in _nodes(cache) if ok(n)]
    inner = [n for n in nodes if n.children]
    return rng.choice(inner if inner and rng.random() < 0.7 else nodes)


def _where(node: RadixTreeNode) -> str:
    key = _short(node.key.tolist())
    return tr("an interior node, {key}", key=key) if node.children else tr("a leaf, {key}", key=key)


def _negative_ref(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: n.ref_count == 0)
    node.ref_count = -1
    return _where(node)


def _child_locked_more(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: n.parent is not cache.root_node)
    parent = node.parent
    if node.ref_count == 0:
        cache.evictable_size -= node.length
        cache.protected_size += node.length
    node.ref_count = parent.ref_count + 1  # the counters still add up
    return _where(node)


def _wrong_parent(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    others = [n for n in _nodes(cache) if n is not node.parent and n is not node]
    node.parent = rng.choice(others) if others else None
    return _where(node)


def _wrong_key(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    parent, ps = node.parent, cache.page_size
    key = child_key(node.key, ps)
    wrong: object = 10**6 if ps == 1 else tuple(t + 1 for t in key)  # type: ignore[union-attr]
    del parent.children[key]
    parent.children[wrong] = node
    return _where(node)


def _short_value(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    node.value = node.value[: -cache.page_size].clone()
    return _where(node)


def _empty_node(cache: Any, rng: random.Random) -> str:
    parent = rng.choice([cache.root_node, *_nodes(cache)])
    empty = RadixTreeNode(parent.timestamp)
    empty.parent = parent
    parent.children[10**6 if cache.page_size == 1 else (10**6,) * cache.page_size] = empty
    return tr("under the root") if parent is cache.root_node else tr("under {node}", node=_where(parent))


def _shared_slot(cache: Any, rng: random.Random) -> str:
    a = _pick(cache, rng, lambda n: True)
    b = rng.choice([n for n in _nodes(cache) if n is not a])
    ps = cache.page_size
    value = b.value.clone()
    value[:ps] = a.value[:ps]  # a whole page, so that the page rules still hold
    b.value = value
    return _where(b)


def _newer_child(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: n.parent is not cache.root_node)
    node.timestamp = node.parent.timestamp + 1
    return _where(node)


def _root_locked_twice(cache: Any, rng: random.Random) -> str:
    cache.root_node.ref_count = 2
    return tr("the root")


def _evictable_high(cache: Any, rng: random.Random) -> str:
    cache.evictable_size += 1
    return tr("the counter")


def _protected_low(cache: Any, rng: random.Random) -> str:
    cache.protected_size -= 1
    return tr("the counter")


def _cycle(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: n.parent is not cache.root_node)
    ancestor = node.parent
    while ancestor.parent is not cache.root_node:
        ancestor = ancestor.parent
    node.children[10**6 if cache.page_size == 1 else (10**6,) * cache.page_size] = ancestor
    return _where(node)


def _unaligned(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    node.set_key_value(node.key[:-1].copy(), node.value[:-1].clone())
    cache.evictable_size -= 1 if node.ref_count == 0 else 0
    cache.protected_size -= 1 if node.ref_count > 0 else 0
    return _where(node)


def _scrambled_page(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    node.value = node.value[[1, 0, *range(2, node.length)]].clone()
    return _where(node)


def _shifted_page(cache: Any, rng: random.Random) -> str:
    node = _pick(cache, rng, lambda n: True)
    node.value = (node.value + 1).clone()  # each page still counts up by one, but starts off a page border
    return _where(node)


CORRUPTIONS: dict[str, tuple[Corruption, int]] = {
    "a negative ref_count": (_negative_ref, 1),
    "a child locked more often than its parent": (_child_locked_more, 1),
    "a node whose parent link points elsewhere": (_wrong_parent, 1),
    "a child filed under the wrong key": (_wrong_key, 1),
    "a node with fewer slots than tokens": (_short_value, 1),
    "an empty node": (_empty_node, 1),
    "two nodes hold the same slot": (_shared_slot, 1),
    "a child used more recently than its parent": (_newer_child, 1),
    "the root is locked twice": (_root_locked_twice, 1),
    "evictable_size is one too high": (_evictable_high, 1),
    "protected_size is one too low": (_protected_low, 1),
    "a node listed below itself (a cycle)": (_cycle, 1),
    "a node that is not whole pages": (_unaligned, 2),
    "slots that do not count up within a page": (_scrambled_page, 2),
    "pages that do not start at a page border": (_shifted_page, 2),
}
"""Each way the checks break a tree, and the smallest page size it applies to (page rules need pages)."""


def corruption_name(name: str) -> str:
    """The name of a corruption (a key of :data:`CORRUPTIONS`) in the learner's language."""
    names = {
        "a negative ref_count": tr("a negative ref_count"),
        "a child locked more often than its parent": tr("a child locked more often than its parent"),
        "a node whose parent link points elsewhere": tr("a node whose parent link points elsewhere"),
        "a child filed under the wrong key": tr("a child filed under the wrong key"),
        "a node with fewer slots than tokens": tr("a node with fewer slots than tokens"),
        "an empty node": tr("an empty node"),
        "two nodes hold the same slot": tr("two nodes hold the same slot"),
        "a child used more recently than its parent": tr("a child used more recently than its parent"),
        "the root is locked twice": tr("the root is locked twice"),
        "evictable_size is one too high": tr("evictable_size is one too high"),
        "protected_size is one too low": tr("protected_size is one too low"),
        "a node listed below itself (a cycle)": tr("a node listed below itself (a cycle)"),
        "a node that is not whole pages": tr("a node that is not whole pages"),
        "slots that do not count up within a page": tr("slots that do not count up within a page"),
        "pages that do not start at a page border": tr("pages that do not start at a page border"),
    }
    return names.get(name, name)


def _corrupt_case(name: str, corrupt: Corruption, tree: Recipe, seed: int) -> Case:
    def body(subject: Subject) -> None:
        cache, _, _, _ = _pair(subject, tree)
        where = corrupt(cache, random.Random(seed))
        shape = _trees.shape_problem(cache, yours=False)  # the checker broke this tree: describe it, blame no one
        shown = shape if shape is not None else _trees.render(_trees.snapshot(cache, strict=False))
        error: BaseException | None = None
        try:
            subject.call(cache.check_integrity)
        except LearnerRaised as learner:
            if type(learner.error) is NotImplementedError:
                raise
            error, how = learner.error, learner.describe()
        if not isinstance(error, IntegrityError):
            raise Mismatch(
                tr(
                    "the tree is corrupted ({corruption}: {where}), so check_integrity must raise IntegrityError.",
                    corruption=corruption_name(name),
                    where=where,
                ),
                tr("IntegrityError, for this tree:") + "\n" + shown,
                how if error is not None else tr("returned normally: the corruption was missed"),
            )

    shown_name = corruption_name(name)
    desc = (
        tr(
            "catch: {corruption} (seed {seed}, page_size {page_size})",
            corruption=shown_name,
            seed=seed,
            page_size=tree.page_size,
        )
        if tree.page_size > 1
        else tr("catch: {corruption} (seed {seed})", corruption=shown_name, seed=seed)
    )
    return Case(desc, tree.num_tokens, _grade(("check_integrity",), body))


def corruption_cases() -> list[tuple[str, Corruption, Recipe, int]]:
    """Every corruption the check_integrity check shows, with its tree and seed (the tests replay them on minikv)."""
    out = []
    for name, (corrupt, min_ps) in CORRUPTIONS.items():
        for seed, ps in enumerate(p for p in (1, 2, 3, 4, 8) if p >= min_ps):
            for prompts in (6, 10, 16, 30):  # the smallest tree that has a node of the kind it breaks
                tree = random_recipe(81 + seed, prompts, page_size=ps, vocab=3, max_len=4 * ps, lock_every=3)
                scratch, _ = tree.build()
                try:
                    corrupt(scratch, random.Random(seed))
                except (IndexError, ValueError):
                    continue
                out.append((name, corrupt, tree, seed))
                break
    return out


@exercise(
    "radix.check_integrity", lambda: tr("MyRadixCache.check_integrity: find every broken invariant of a radix tree")
)
def _integrity_cases() -> list[Case]:
    family = recipe(insert(1, 2, 3, 4), insert(1, 2, 5, 6), insert(7, 8, 9), lock(1, 2, 5, 6))
    return [
        _healthy_case(tr("an empty tree"), recipe()),
        _healthy_case(tr("a split node and a lock"), family),
        _healthy_case("page_size 2", recipe(insert(*range(6)), insert(0, 1, 9, 9), page_size=2)),
        _healthy_case(tr("a random tree with locks"), random_recipe(41, 14, lock_every=3)),
        _healthy_case(tr("a random tree, page_size 4"), random_recipe(42, 14, page_size=4, max_len=20, lock_every=4)),
        _healthy_case(tr("a random tree of 80 prompts with locks"), random_recipe(43, 80, vocab=5, max_len=24, lock_every=5)),
        _healthy_case(tr("slots scattered over the pool: a node's slots need not count up"), recipe(insert(1, 2, 3, 4), insert(1, 2, 5, 6), scatter=3)),
        _healthy_case(tr("page_size 2, slots scattered: whole pages, anywhere in the pool"), recipe(insert(*range(8)), insert(0, 1, 9, 9), page_size=2, scatter=4)),
        *(_healthy_case(t.describe(), t) for t in drawn_trees(800, 60)),
        *(_corrupt_case(*c) for c in corruption_cases()),
    ]  # fmt: skip


# -- radix.page_aligned_insert ------------------------------------------------------------------------


def _paged_own(fn: _F) -> tuple[str, ...]:
    """The methods the page-aware class writes itself (at least insert_prefix)."""
    own = tuple(n for n in ("match_len", "walk", "insert_prefix") if isinstance(fn, type) and n in vars(fn))
    return own or ("insert_prefix",)


@exercise("radix.page_aligned_insert", lambda: tr("a page-aware cache (page_size > 1): whole pages only"))
def _page_cases() -> list[Case]:
    rng = random.Random(91)
    eight2, eight4 = recipe(insert(*range(8)), page_size=2), recipe(insert(*range(8)), page_size=4)
    rnd2, rnd4 = (
        random_recipe(92, 12, page_size=2, max_len=14, lock_every=3),
        random_recipe(93, 12, page_size=4, max_len=24, lock_every=4),
    )
    paged_walks = [
        _walk_case(
            tr("page_size 2: only whole pages match (5 tokens match at most 4)"),
            eight2,
            [(0, 1, 2, 3, 4)],
            ("walk", "match_len"),
        ),
        _walk_case(
            tr("page_size 4: the first page differs in its last token, so nothing matches"),
            eight4,
            [(0, 1, 2, 9)],
            ("walk", "match_len"),
        ),
        _walk_case(
            tr("page_size 2: the match ends inside a node, at a page border"),
            recipe(insert(*range(8)), insert(0, 1, 2, 3, 7, 7), page_size=2),
            [(0, 1, 2, 3, 4, 9, 9, 9)],
            ("walk", "match_len"),
        ),
        _walk_case(
            tr("page_size 4: the match ends mid-page after the first page: round down to 4"),
            recipe(insert(*range(12)), page_size=4),
            [(0, 1, 2, 3, 4, 5, 9, 9, 9)],
            ("walk", "match_len"),
        ),
        _walk_case(_walks(rnd2, 10), rnd2, _random_inputs(rng, rnd2, 10, 4, 14), ("walk", "match_len")),
        _walk_case(_walks(rnd4, 10), rnd4, _random_inputs(rng, rnd4, 10, 4, 24), ("walk", "match_len")),
        *(
            _walk_case(_walks(t, 10), t, _random_inputs(rng, t, 10, 3, 8 * t.page_size), ("walk", "match_len"))
            for t in drawn_trees(820, 30, (2, 3, 4, 8, 16))
        ),
    ]
    many = [_Insert(s.ids, kind=s.kind) for s in _random_inserts(94, 30, 3, 20)]
    inserts = [
        _insert_case(
            tr("8 tokens into an empty tree with page_size 4: two pages"),
            recipe(page_size=4),
            [_Insert(tuple(range(8)))],
            trim=True,
        ),
        _insert_case(
            tr("10 tokens with page_size 4: the last 2 are not inserted"),
            recipe(page_size=4),
            [_Insert(tuple(range(10)))],
            trim=True,
        ),
        _insert_case(
            tr("3 tokens with page_size 4: nothing is inserted, return 0"),
            recipe(page_size=4),
            [_Insert((1, 2, 3))],
            trim=True,
        ),
        _insert_case(
            tr("the first page is cached: return 4 and insert the rest"),
            eight4,
            [_Insert((0, 1, 2, 3, 9, 9, 9, 9))],
            trim=True,
        ),
        _insert_case(
            tr("every whole page is cached already: nothing is added"), eight4, [_Insert((*range(8), 5))], trim=True
        ),
        _insert_case(
            tr("the new leaf hangs under a node split at a page border"),
            eight4,
            [_Insert((0, 1, 2, 3, 4, 5, 9, 9))],
            trim=True,
        ),
        _insert_case(
            tr("page_size 2, under a locked path, with handle="),
            recipe(insert(*range(6)), lock(*range(4)), page_size=2),
            [_Insert((0, 1, 2, 3, 8, 8, 9), handle_of=(0, 1, 2, 3))],
            trim=True,
        ),
        _insert_case(
            tr("page_size 2: twelve prompts, pages of slots in any order"),
            recipe(page_size=2),
            _random_inserts(95, 12, 3, 13),
            seed=3,
            trim=True,
        ),
        _insert_case(
            tr("page_size 4: thirty prompts over a tiny vocabulary"), recipe(page_size=4), many, seed=4, trim=True
        ),
        *(
            _insert_case(
                tr("{tree}: 12 more prompts", tree=t.describe()),
                t,
                _random_inserts(840 + i, 12, 2, 5 * t.page_size),
                seed=840 + i,
                trim=True,
            )
            for i, t in enumerate(drawn_trees(840, 30, (2, 3, 4, 8, 16)))
        ),
    ]
    matches = []
    match_inputs: list[tuple[str, Recipe, list[tuple[int, ...]]]] = [
        (tr("page_size 2: match_prefix returns whole pages only"), eight2, [(0, 1, 2, 3, 4), (0, 1, 2)]),
        (tr("page_size 4: a tail shorter than a page matches nothing more"), eight4, [(0, 1, 2, 3, 4, 5, 6)]),
    ]
    match_inputs += [
        (_matches(t, 10), t, _random_inputs(rng, t, 10, 3, 8 * t.page_size))
        for t in drawn_trees(860, 20, (2, 3, 4, 8, 16))
    ]
    for desc, tree, inputs in match_inputs:

        def body(subject: Subject, tree: Recipe = tree, inputs: list[tuple[int, ...]] = inputs) -> None:
            cache, ref, _, _ = _pair(subject, tree)
            earlier: list[torch.Tensor] = []
            for i, ids in enumerate(inputs):
                _check_match(subject, cache, ref, ids, i % 3, earlier)

        matches.append(Case(desc, tree.num_tokens, _grade(("insert_prefix",), body)))
    return [_with_own(c) for c in [*paged_walks, *matches, *inserts]]


def _with_own(case: Case) -> Case:
    """Grade ``case`` with the methods the page-aware class defines itself as the ones it writes."""

    def run(fn: _F) -> None:
        with _own_override(_paged_own(fn)):
            case.run(fn)

    return Case(case.description, case.size, run)


# -- radix.cache -----------------------------------------------------------------------------------------

HISTORIES = {1: range(50), 2: range(100, 130), 3: range(300, 320), 4: range(200, 230), 8: range(400, 415)}
"""The seeds of the random histories ``radix.cache`` plays, by page size (each page size also plays
:func:`~minikv.exercises.radix_history.fork_history`, written for a class random ones reach by chance)."""


def refuses_foreign_unlocks(subject: Subject) -> bool:
    """Whether the learner's lock_handle refuses to unlock a node that holds no lock of its own (the optional
    task ``radix.harden_lock``): through the class's own methods, insert [1, 2] and [1, 2, 3, 4], lock the
    match of [1, 2, 3, 4], and unlock the match of [1, 2]. Any other failure says no: the histories show it."""
    try:
        cache = subject.call(subject.cls, "cpu", page_size=1)
        subject.call(cache.insert_prefix, [1, 2], torch.tensor([0, 1], dtype=torch.int32))
        subject.call(cache.insert_prefix, [1, 2, 3, 4], torch.tensor([0, 1, 2, 3], dtype=torch.int32))
        subject.call(cache.lock_handle, subject.call(cache.match_prefix, [1, 2, 3, 4])[0])
        handle = subject.call(cache.match_prefix, [1, 2])[0]
        subject.call(cache.lock_handle, handle, unlock=True)
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            raise
        return isinstance(learner.error, LockError)
    except Exception:  # what the class returned was not a pair: the histories report it
        return False
    return False


def _history_case(page_size: int, seeds: range) -> Case:
    def body(subject: Subject) -> None:
        hardened = refuses_foreign_unlocks(subject)

        def fails(history: tuple[Any, ...]) -> Any:
            return run_history(
                lambda: subject.cls("cpu", page_size=page_size),
                history,
                page_size,
                call=subject.call,
                hardened=hardened,
            )

        histories = [(tr("the fork history"), fork_history(page_size))]
        histories += [(tr("history {seed}", seed=seed), random_history(seed, page_size)) for seed in seeds]
        for name, history in histories:
            failure = fails(history)
            if failure is None:
                continue
            small, found = shrink(history, fails, budget=250)
            if found is None:  # pragma: no cover - a flaky learner: report the first failure as it was
                small, found = history, failure
            listing = describe_history(small, page_size, found.step)
            raise Mismatch(
                tr(
                    "{history} (page_size {page_size}) fails; the smallest history that still fails has "
                    "{count} steps. At step {step}: {problem}",
                    history=name,
                    page_size=page_size,
                    count=len(small),
                    step=found.step + 1,
                    problem=found.problem,
                ),
                listing + ("\n\n" + found.expected if found.expected else ""),
                found.got or tr("(see above)"),
            )

    return Case(
        tr(
            "{count} histories of requests, matches, evictions and resets, page_size {page_size}",
            count=len(seeds) + 1,
            page_size=page_size,
        ),
        30,
        _grade(tuple(TASKS), body),
    )


@exercise("radix.cache", lambda: tr("the whole cache: random histories, next to minikv's own manager"))
def _cache_cases() -> list[Case]:
    return [_history_case(ps, seeds) for ps, seeds in HISTORIES.items()]


# -- for the notebook: running a partial class -------------------------------------------------------


@contextlib.contextmanager
def explain_errors() -> Iterator[None]:
    """Run a notebook cell's code; if it fails, print one sentence saying why instead of a traceback.

    For a class that is not finished yet: a ``NotImplementedError`` names the method that is still the stub.
    """
    try:
        yield
    except Exception as error:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if is_learner_file(f.filename)]
        last = frames[-1] if frames else None
        if type(error) is NotImplementedError and last is not None:
            task = tr(" (Task {task})", task=TASKS[last.name]) if last.name in TASKS else ""
            print(
                tr(
                    "✗ {method} is still the stub{task}: write it, then run this cell again.",
                    method=last.name,
                    task=task,
                )
            )
        else:
            where = (
                tr(" (in {function}, at `{line}`)", function=last.name, line=(last.line or "").strip())
                if last is not None
                else ""
            )
            print(
                tr(
                    "✗ this cell stopped: {error_type}: {error}{where}.",
                    error_type=type(error).__name__,
                    error=error,
                    where=where,
                )
            )
