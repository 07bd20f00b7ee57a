"""Random histories for a radix cache: requests admitted, finished and aborted, matches, evictions, resets.

A *history* is a tuple of :class:`Op` values. :func:`run_history` plays it on two
worlds at once -- the cache under test and minikv's own
:class:`~minikv.RadixCacheManager`, each with its own :class:`~minikv.PagePool`,
driven through :mod:`minikv.lifecycle` -- and after every operation checks that

* both worlds saw the same outcome (match lengths and slots, what ``finish``
  returned, which slots ``evict`` freed, which calls were refused);
* the two trees are the same (keys, slots, ref counts, order of last use, counters);
* the world under test keeps the rules a prefix cache must keep whatever its code:
  every slot is in exactly one place (free, in the tree, or owned by one running
  request), each node's ``ref_count`` is the number of running requests whose
  match covers it, the counters add up, and each match found the longest prefix
  the tree held, in whole pages (the *model*: it knows pages, not nodes);
* the cache's own ``check_integrity`` accepts its tree.

:func:`shrink` cuts a failing history down (drops operations, shortens prompts) while it
still fails, so a report can show the smallest one. minikv's own manager passes every
history; the exercise ``radix.cache`` runs a learner's class through the same function.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import EvictionError, LockError, OutOfSlotsError
from ..language import tr
from ..lifecycle import Request, abort, admit, finish
from ..page_pool import PagePool
from ..radix_manager import RadixCacheManager
from ..snapshot import TreeSnapshot
from . import _trees
from ._core import LearnerRaised, Mismatch
from ._core import shrink as _core_shrink

__all__ = [
    "Failure",
    "History",
    "Op",
    "describe_history",
    "fork_history",
    "longest_cached_prefix",
    "random_history",
    "run_history",
    "shrink",
]

Caller = Callable[..., Any]
"""How the cache under test is called: ``call(fn, *args, **kwargs)`` (the exercises pass a guarded call)."""


@dataclass(frozen=True)
class Op:
    """One step of a history."""

    kind: str
    """``admit``, ``finish`` or ``abort`` (request ``name``), ``match`` (``ids``), ``evict`` (``size``), ``reset``,
    or ``unlock`` (``ids``): match ``ids`` and unlock that handle, which no running request locked (a cache
    whose ``lock_handle`` refuses such unlocks must refuse it; for one that does not, the step is skipped)."""
    name: str = ""
    ids: tuple[int, ...] = ()
    size: int = 0

    def describe(self) -> str:
        if self.kind == "admit":
            return tr("admit request {name} with prompt {ids}", name=self.name, ids=list(self.ids))
        if self.kind == "finish":
            return tr("finish request {name}", name=self.name)
        if self.kind == "abort":
            return tr("abort request {name}", name=self.name)
        if self.kind == "match":
            return f"match_prefix({list(self.ids)})"
        if self.kind == "evict":
            return f"evict({self.size})"
        if self.kind == "unlock":
            return tr(
                "match_prefix({ids}), then lock_handle(its handle, unlock=True), a lock nobody took",
                ids=list(self.ids),
            )
        return "reset()"


History = tuple[Op, ...]


def describe_history(history: Sequence[Op], page_size: int, failed_at: int | None = None) -> str:
    """The history as numbered lines (``page_size`` first), the failing step marked."""
    lines = [
        tr(
            "a cache with page_size {page_size} and a pool of {pages} pages, then:",
            page_size=page_size,
            pages=pool_pages(page_size),
        )
    ]
    for i, op in enumerate(history):
        mark = tr("   <- fails here") if i == failed_at else ""
        lines.append(f"  {i + 1}. {op.describe()}{mark}")
    return "\n".join(lines)


def pool_pages(page_size: int) -> int:
    return 12 if page_size == 1 else 10


def random_history(seed: int, page_size: int, num_ops: int = 30) -> History:
    """A seeded random history: prompts over a tiny vocabulary (plus one large token id), so they share
    prefixes, split each other's nodes, end mid-page, fill the pool and force evictions."""
    rng = random.Random(seed)
    big = rng.choice([1000, 65_537, 2**31 + 7, 2**40 + 3])
    vocab = [0, 1, 2, big]
    pages = [tuple(rng.choice(vocab) for _ in range(page_size)) for _ in range(3)]
    max_pages = 4 if page_size > 1 else 6
    prompts: list[tuple[int, ...]] = []
    running: list[str] = []
    ops: list[Op] = []
    count = 0

    def fresh() -> tuple[int, ...]:
        body = [t for _ in range(rng.randint(0, max_pages)) for t in rng.choice(pages)]
        tail = [rng.choice(vocab) for _ in range(rng.randint(0, page_size - 1))] if page_size > 1 else []
        return tuple(body + tail) or (rng.choice(vocab),)

    def prompt() -> tuple[int, ...]:
        roll = rng.random()
        if not prompts or roll < 0.35:
            ids = fresh()
        elif roll < 0.6:
            ids = rng.choice(prompts)
        else:
            base = rng.choice(prompts)
            ids = (base[: rng.randint(0, len(base))] + fresh())[: (max_pages + 1) * page_size]
        prompts.append(ids)
        return ids

    while len(ops) < num_ops:
        roll = rng.random()
        if roll < 0.38 or (roll < 0.6 and not running):
            count += 1
            name = f"R{count}"
            ops.append(Op("admit", name, prompt()))
            running.append(name)
        elif roll < 0.6:
            ops.append(Op("finish", running.pop(rng.randrange(len(running)))))
        elif roll < 0.64 and running:
            ops.append(Op("abort", running.pop(rng.randrange(len(running)))))
        elif roll < 0.8:
            ops.append(Op("match", ids=prompt()))
        elif roll < 0.92:
            ops.append(Op("evict", size=rng.choice([0, 1, page_size, 2 * page_size + 1, 3, 7, 40, -1])))
        elif roll < 0.97 and prompts:
            base = rng.choice(prompts)
            ops.append(Op("unlock", ids=base[: page_size * rng.randint(1, max(1, len(base) // page_size))]))
        else:
            ops.append(Op("reset"))
    return tuple(ops)


def fork_history(page_size: int) -> History:
    """A history written for one class that random ones reach only by chance: a node whose ref_count is the
    *sum* of two locked children's, unlocked by nobody (a hardened cache refuses), then locked and unlocked
    by a request of its own while both children stay locked."""
    ps = page_size
    base = tuple(range(1, 2 * ps + 1))
    x, y, pad = (7,) * ps, (8,) * ps, (9,)
    return (
        Op("admit", "A", base + x + pad),
        Op("finish", "A"),
        Op("admit", "B", base + y + pad),
        Op("finish", "B"),
        Op("admit", "C", base + x + pad),
        Op("admit", "D", base + y + pad),
        Op("unlock", ids=base),
        Op("admit", "E", (*base, 6)),
        Op("unlock", ids=base),
        Op("finish", "E"),
        Op("unlock", ids=base),
        Op("evict", size=ps),
        Op("finish", "C"),
        Op("unlock", ids=base + x),
        Op("finish", "D"),
        Op("evict", size=3 * ps),
        Op("reset"),
    )


# -- the two worlds ------------------------------------------------------------------------


class _SortedEvict:
    """A cache seen through its public methods, with ``evict``'s slots sorted: the contract leaves their
    order open, and the pool's next allocations must not depend on it, or the two worlds drift apart."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def evict(self, size: int) -> Any:
        freed = self.cache.evict(size)
        return torch.sort(freed).values if isinstance(freed, torch.Tensor) and freed.dim() == 1 else freed

    def __getattr__(self, name: str) -> Any:
        if name == "cache":
            raise AttributeError(name)
        return getattr(self.cache, name)


@dataclass
class _World:
    cache: Any
    view: _SortedEvict
    pool: PagePool
    running: dict[str, Request]


def _direct(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _attempt(call: Caller, fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None, str]:
    """``(result, error, how it was raised)``; a stub's NotImplementedError passes through."""
    try:
        return call(fn, *args), None, ""
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            raise
        return None, learner.error, learner.describe()
    except (Mismatch, NotImplementedError):
        raise
    except Exception as error:
        return None, error, tr("raised {error_type}: {error}", error_type=type(error).__name__, error=error)


def _refusal(error: BaseException) -> str:
    for kind in (OutOfSlotsError, EvictionError, LockError, ValueError):
        if isinstance(error, kind):
            return kind.__name__
    return type(error).__name__


def _apply(world: _World, op: Op, call: Caller, hardened: bool = True) -> tuple[Any, ...] | None:
    """Play ``op``; its outcome as plain values, or None if the op does not apply (skipped in both worlds).

    ``hardened``: play ``unlock`` ops (a cache whose lock_handle does not refuse them skips them)."""
    if op.kind == "admit":
        if op.name in world.running or not op.ids:
            return None
        request, error, how = _attempt(call, admit, world.view, world.pool, list(op.ids))
        if error is not None:
            return ("refused", _refusal(error), how)
        world.running[op.name] = request
        matched = request.indices[: request.cached_len].tolist()
        return ("admitted", request.cached_len, tuple(matched), request.evicted)
    if op.kind in ("finish", "abort"):
        request = world.running.pop(op.name, None)
        if request is None:
            return None
        result, error, how = _attempt(call, finish if op.kind == "finish" else abort, world.view, world.pool, request)
        if error is not None:
            return ("refused", _refusal(error), how)
        return ("finished", int(result)) if op.kind == "finish" else ("aborted",)
    if op.kind == "unlock" and not hardened:
        return None
    if op.kind in ("match", "unlock"):
        result, error, how = _attempt(call, world.view.match_prefix, list(op.ids))
        if error is not None:
            return ("refused", _refusal(error), how)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], torch.Tensor)):
            return ("returned", repr(result)[:80])
        handle, indices = result
        matched = ("matched", int(getattr(handle, "cached_len", -1)), tuple(indices.tolist()), str(indices.dtype))
        node = getattr(handle, "node", None)
        if (
            op.kind == "match"
            or not matched[1]
            or any(getattr(r.handle, "node", None) is node for r in world.running.values())
        ):
            return matched  # a request's own lock, or the root: not a lock nobody took
        _, error, how = _attempt(call, world.view.lock_handle, handle, True)
        return (*matched, tr("refused with LockError") if isinstance(error, LockError) else how or tr("unlocked"))
    if op.kind in ("evict", "reset"):
        fn = world.view.evict if op.kind == "evict" else world.view.reset
        freed, error, how = _attempt(call, fn, *((op.size,) if op.kind == "evict" else ()))
        if error is not None:
            return ("refused", _refusal(error), how)
        if not isinstance(freed, torch.Tensor) or freed.dtype != torch.int32 or freed.dim() != 1:
            return ("returned", f"{type(freed).__name__} {getattr(freed, 'dtype', '')}".strip())
        slots = sorted(freed.tolist())
        try:
            world.pool.free(torch.tensor(slots, dtype=torch.int32))
        except Exception as error:
            return ("freed badly", tuple(slots), f"{type(error).__name__}: {error}")
        return ("freed", tuple(slots))
    raise ValueError(f"unknown op kind {op.kind!r}")  # pragma: no cover - histories are made here


def _key(outcome: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """What must agree between the worlds: for a refusal, the kind of error, not its wording."""
    return outcome[:2] if outcome is not None and outcome[0] == "refused" else outcome


def _tokens(n: int) -> str:
    return tr("{count} token", count=n) if n == 1 else tr("{count} tokens", count=n)


def _slots(n: int) -> str:
    return tr("{count} slot", count=n) if n == 1 else tr("{count} slots", count=n)


def _say(outcome: tuple[Any, ...] | None) -> str:
    if outcome is None:
        return tr("nothing to do")
    kind = outcome[0]
    if kind == "refused":
        return tr("refused: {how}", how=outcome[2]) if outcome[2] else tr("refused with {error}", error=outcome[1])
    if kind == "admitted":
        evicted = tr(", after evicting {count} slots", count=outcome[3]) if outcome[3] else ""
        return tr(
            "admitted it, {tokens} cached in slots {slots}{evicted}",
            tokens=_tokens(outcome[1]),
            slots=list(outcome[2]),
            evicted=evicted,
        )
    if kind == "finished":
        return tr("finish: insert_prefix returned {count} (already cached)", count=outcome[1])
    if kind == "aborted":
        return tr("aborted")
    if kind == "matched":
        unlocked = tr(", then the unlock {how}", how=outcome[4]) if len(outcome) > 4 else ""
        return tr(
            "matched {tokens} in slots {slots} ({dtype}){unlocked}",
            tokens=_tokens(outcome[1]),
            slots=list(outcome[2]),
            dtype=outcome[3],
            unlocked=unlocked,
        )
    if kind == "freed":
        return tr("freed {slots} {listed}", slots=_slots(len(outcome[1])), listed=list(outcome[1]))
    if kind == "freed badly":
        return tr(
            "returned slots {slots}, which the pool refused to take back ({error})",
            slots=list(outcome[1]),
            error=outcome[2],
        )
    return tr("returned {value}", value=outcome[1])


# -- the rules every world keeps (the model) ----------------------------------------------


def longest_cached_prefix(tree: TreeSnapshot, ids: Sequence[int]) -> tuple[int, list[int]]:
    """How many leading tokens of ``ids`` the tree holds in whole pages, and their slots: the model's match."""
    ps = tree.page_size
    held: dict[tuple[int, ...], tuple[int, ...]] = {}
    for view in tree.views():
        for end in range(view.start + ps, len(view.path) + 1, ps):
            held[view.path[:end]] = view.slots[end - ps - view.start : end - view.start]
    ids = [int(t) for t in ids]
    length, slots = 0, list[int]()
    while length + ps <= len(ids) and tuple(ids[: length + ps]) in held:
        slots.extend(held[tuple(ids[: length + ps])])
        length += ps
    return length, slots


def _rules_broken(world: _World, tree: TreeSnapshot) -> str | None:
    """Whether the world under test breaks a rule that holds whatever the tree's shape."""
    pool, ps = world.pool, world.pool.page_size
    owners: dict[int, list[str]] = {}  # page -> where it is; a page is the unit the pool hands out

    def put(slots: Sequence[int], where: str) -> None:
        for page in sorted({int(slot) // ps for slot in slots}):
            owners.setdefault(page, []).append(where)

    put(pool.free_slots().tolist(), tr("free in the pool"))
    for view in tree.views():
        put(view.slots, tr("in the node {tokens}", tokens=list(view.tokens)))
    for name, request in world.running.items():
        put(request.own_slots().tolist(), tr("owned by request {name}", name=name))
    for page in range(pool.num_pages):
        places = owners.get(page, [])
        if len(places) != 1:
            where = (
                tr(" and ").join(places) if places else tr("nowhere: free in no pool, in no node, owned by no request")
            )
            if ps == 1:
                return tr("slot {slot} is {where}. Every slot must be in exactly one place.", slot=page, where=where)
            return tr(
                "page {page} (slots {first}..{last}) is {where}. Every page must be in exactly one place.",
                page=page,
                first=page * ps,
                last=page * ps + ps - 1,
                where=where,
            )
    stray = sorted(page for page in owners if not 0 <= page < pool.num_pages)
    if stray:
        return tr("the tree holds slot {slot}, which is not a slot of the pool.", slot=stray[0] * ps)
    for view in tree.views():
        covering = sum(
            1
            for request in world.running.values()
            if request.cached_len >= len(view.path)
            and tuple(int(t) for t in request.input_ids[: len(view.path)]) == view.path
        )
        if view.ref_count != covering:
            return tr(
                "the node {tokens} has ref_count {ref_count}, but {covering} running requests "
                "have locked a match that covers it.",
                tokens=list(view.tokens),
                ref_count=view.ref_count,
                covering=covering,
            )
    protected = sum(len(v.tokens) for v in tree.views() if v.ref_count > 0)
    evictable = sum(len(v.tokens) for v in tree.views() if v.ref_count == 0)
    if tuple(tree.size_info) != (evictable, protected):
        return tr(
            "size_info is {size_info}, but the tree holds {evictable} slots in unlocked nodes and "
            "{protected} in locked ones.",
            size_info=tuple(tree.size_info),
            evictable=evictable,
            protected=protected,
        )
    return None


def _root_problem(cache: Any, root: Any) -> str | None:
    """What ``reset`` did wrong to the root, in words (the handle of an empty match names the root, so a
    running request may hold it across a reset), or None."""
    now = getattr(cache, "root_node", None)
    if now is not root:
        return tr(
            "your reset replaced root_node with a new node. Keep the root: running requests whose match was "
            "empty hold a handle on it. Empty its children instead."
        )
    if getattr(now, "ref_count", None) != 1 or getattr(now, "parent", None) is not None:
        return tr(
            "your reset left the root with ref_count {ref_count}: the root keeps "
            "ref_count 1 and no parent, as __init__ made it.",
            ref_count=getattr(now, "ref_count", None),
        )
    return None


@dataclass(frozen=True)
class Failure:
    """Where a history went wrong: the step (0-based; -1 before the first), what, and the two trees."""

    step: int
    problem: str
    expected: str = ""
    got: str = ""


def run_history(
    make_cache: Callable[[], Any],
    history: Sequence[Op],
    page_size: int,
    *,
    call: Caller = _direct,
    integrity: bool = True,
    hardened: bool = True,
) -> Failure | None:
    """Play ``history`` on ``make_cache()`` and on minikv's own manager; the first difference, or None.

    ``call`` runs every call into the cache under test (its ``make_cache`` included).
    ``integrity``: also run the cache's own ``check_integrity`` after every step.
    ``hardened``: the cache refuses to unlock a node that holds no lock of its own, as minikv's does: play
    the ``unlock`` steps (False: skip them, in both worlds).
    """
    try:
        cache = call(make_cache)
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            raise
        return Failure(-1, tr("making the cache: {how}.", how=learner.describe()))
    mine = _World(cache, _SortedEvict(cache), PagePool(pool_pages(page_size), page_size), {})
    ref_cache = RadixCacheManager("cpu", page_size)
    ref = _World(ref_cache, _SortedEvict(ref_cache), PagePool(pool_pages(page_size), page_size), {})
    for step, op in enumerate(history):
        try:
            before = TreeSnapshot.of(ref.cache)
            root = getattr(mine.cache, "root_node", None)
            expected = _apply(ref, op, _direct, hardened)
            got = _apply(mine, op, call, hardened)
            if op.kind == "reset":
                problem = _root_problem(mine.cache, root)
                if problem is not None:
                    return Failure(step, tr("after {what}: {problem}", what=op.describe(), problem=problem))
            exp_state = _trees.snapshot(ref.cache)
            got_state = _trees.snapshot(mine.cache)
        except Mismatch as mismatch:
            return Failure(step, mismatch.problem, mismatch.expected, mismatch.got)
        if _key(expected) != _key(got):
            same = tr("the trees are the same after this step: only the outcome named above differs")
            drawings = _trees.tree_mismatch("", exp_state, got_state, same=same)
            return Failure(
                step,
                tr(
                    "{what}: minikv's cache {expected}; yours {got}.",
                    what=op.describe(),
                    expected=_say(expected),
                    got=_say(got),
                ),
                drawings.expected,
                drawings.got,
            )
        drawings = _trees.tree_mismatch("", exp_state, got_state)
        if op.kind in ("admit", "match") and expected is not None and expected[0] in ("admitted", "matched"):
            ids = op.ids[:-1] if op.kind == "admit" else op.ids
            length, slots = longest_cached_prefix(before, ids)
            if (expected[1], list(expected[2])) != (length, slots):  # pragma: no cover - minikv's own bug
                return Failure(
                    step,
                    tr(
                        "{what}: the match should find {length} tokens in slots {slots}.",
                        what=op.describe(),
                        length=length,
                        slots=slots,
                    ),
                )
        difference = _trees.first_difference(exp_state, got_state)
        if difference is not None:
            return Failure(
                step,
                tr("after {what}: {problem}", what=op.describe(), problem=difference),
                drawings.expected,
                drawings.got,
            )
        broken = _rules_broken(mine, got_state)
        if broken is not None:
            return Failure(
                step, tr("after {what}: {problem}", what=op.describe(), problem=broken), drawings.expected, drawings.got
            )
        if integrity:
            try:
                _, error, how = _attempt(call, mine.cache.check_integrity)
            except Mismatch as mismatch:
                return Failure(step, mismatch.problem, mismatch.expected, mismatch.got)
            if error is not None:
                return Failure(
                    step,
                    tr(
                        "after {what}, your check_integrity {how}, but the tree is healthy "
                        "(it is the same as minikv's).",
                        what=op.describe(),
                        how=how,
                    ),
                    _trees.render(got_state),
                )
    return None


def shrink(
    history: Sequence[Op], fails: Callable[[History], Failure | None], budget: int = 400
) -> tuple[History, Failure | None]:
    """The smallest history found that still fails (:func:`minikv.exercises._core.shrink` with
    smaller histories: cut after the failing step, runs of operations dropped, then prompts shortened).

    ``fails(history)`` runs one candidate. At most ``budget`` candidates are tried.
    """
    current = tuple(history)
    failure = fails(current)
    if failure is None:
        return current, None

    def smaller(history: History, failure: Failure) -> Iterator[History]:
        if failure.step + 1 < len(history):
            yield history[: failure.step + 1]
        chunk = len(history) // 2
        while chunk >= 1:
            for start in range(0, len(history) - chunk + 1, chunk):
                yield history[:start] + history[start + chunk :]
            chunk //= 2
        for i, op in enumerate(history):
            if op.ids:
                yield (*history[:i], replace(op, ids=op.ids[:-1]), *history[i + 1 :])

    return _core_shrink(current, failure, lambda h: fails(h) if h else None, smaller, tries=budget)
