"""Checks for chapter 2: the seven steps of a request, and the slots it must give back.

Each case is a *scenario*: requests admitted, stored and finished in a given
order against a real manager, page pool and KV cache. The learner's function
plays its part in one copy of the world and :mod:`minikv.lifecycle` plays it in
a twin; afterwards the two must agree, and the learner's world must account for
every slot: free in the pool, held by the tree, or held by a running request --
never two of these at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import lifecycle as _lifecycle
from ..base import KVCacheLayout
from ..errors import IntegrityError, OutOfSlotsError
from ..language import tr
from ..lifecycle import Request
from ..mha_pool import MHAKVCache
from ..page_pool import PagePool
from ..radix_manager import RadixCacheHandle, RadixCacheManager, child_key
from . import _trees
from ._core import (
    Case,
    Draw,
    Mismatch,
    call,
    call_watching,
    exercise,
    expect_int,
    expect_unchanged,
    keep,
    outcome,
    raised,
    random_case,
    short,
    shrink_int,
    unexpected,
)
from ._report import diff

_F = Callable[..., object]
HEADS, HEAD_DIM, LAYERS = 2, 4, 2


def kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for a forward pass: K/V of tokens ``input_ids[start:]``, unique per layer, position and token."""
    ids = torch.as_tensor(input_ids)[start:].to(torch.float32)
    pos = torch.arange(start, start + len(ids), dtype=torch.float32)
    base = (layer + 1) * 10_000 + pos * 100 + ids
    k = base[:, None, None] + torch.arange(HEADS * HEAD_DIM, dtype=torch.float32).view(HEADS, HEAD_DIM) / 64
    return k, -k


@dataclass(frozen=True)
class Event:
    kind: str  # "serve" | "admit" | "finish"
    name: str
    ids: tuple[int, ...] = ()


def serve(*ids: int) -> Event:
    return Event("serve", "", ids)


def admit(name: str, *ids: int) -> Event:
    return Event("admit", name, ids)


def finish(name: str) -> Event:
    return Event("finish", name)


@dataclass(frozen=True)
class Scenario:
    description: str
    events: tuple[Event, ...]
    page_size: int = 1
    num_pages: int = 32

    @property
    def size(self) -> int:
        return sum(len(e.ids) for e in self.events)


class World:
    """A manager, a pool and a KV cache, plus the requests that are running."""

    def __init__(self, scenario: Scenario) -> None:
        ps = scenario.page_size
        self.manager = RadixCacheManager("cpu", page_size=ps)
        self.pool = PagePool(scenario.num_pages, ps)
        self.kv_cache = MHAKVCache(
            HEADS, LAYERS, HEAD_DIM, scenario.num_pages, torch.float32, KVCacheLayout.LayerFirst, "cpu", page_size=ps
        )
        self.running: dict[str, Request] = {}

    def admit(self, name: str, ids: tuple[int, ...]) -> Request:
        request = _lifecycle.admit(self.manager, self.pool, list(ids))
        _lifecycle.store(request, self.kv_cache, kv_fn)
        self.running[name] = request
        return request

    def running_pages(self) -> int:
        return sum(self.pool.pages_for(len(r.own_slots())) for r in self.running.values())


def _ids(ids: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


# -- what every learner world must satisfy ---------------------------------------


def check_accounting(world: World, when: str) -> None:
    """Integrity of the tree, and every page in exactly one place."""
    try:
        world.manager.check_integrity()
    except IntegrityError as error:
        raise Mismatch(tr("{when}, the radix tree is corrupted: {error}", when=when, error=error)) from None
    state = _trees.snapshot(world.manager)
    tree_slots = set(_trees.all_slots(state))
    free = set(world.pool.free_slots().tolist())
    shared = sorted(tree_slots & free)
    if shared:
        raise Mismatch(
            tr(
                "{when}, the slots {shared} are free in the pool although the tree still holds them: "
                "the next request would overwrite a cached prefix. Which of the request's slots does the tree "
                "hold once insert_prefix has returned, and which did it never take?",
                when=when,
                shared=shared,
            )
        )
    ps = world.pool.page_size
    tree_pages = state.size_info.evictable_size // ps + state.size_info.protected_size // ps
    accounted = world.pool.num_free_pages + tree_pages + world.running_pages()
    if accounted != world.pool.num_pages:
        lost = world.pool.num_pages - accounted
        raise Mismatch(
            tr(
                "{when}, {lost} page(s) are neither free, nor held by the tree, nor by a running request: they leaked.",
                when=when,
                lost=lost,
            )
            if lost > 0
            else tr("{when}, {twice} page(s) are counted twice (free and in use).", when=when, twice=-lost),
            tr("{pages} pages = free + tree + running", pages=world.pool.num_pages),
            tr(
                "{free} free + {tree} in the tree + {running} running",
                free=world.pool.num_free_pages,
                tree=tree_pages,
                running=world.running_pages(),
            ),
        )


def check_kv(world: World, ids: tuple[int, ...], when: str) -> None:
    """The KV rows the tree points at for ``ids`` are the ones the forward pass produced."""
    slots = _cached_slots(world.manager, ids)
    if not slots:
        return
    index = torch.tensor(slots)
    ps = world.pool.page_size
    for layer in range(LAYERS):
        k, v = kv_fn(layer, _ids(ids), 0)
        for label, cache, src in (("K", world.kv_cache.k_cache(layer), k), ("V", world.kv_cache.v_cache(layer), v)):
            rows = cache[index // ps, index % ps]
            wrong = (rows != src[: len(slots)]).flatten(1).any(dim=1).nonzero().flatten()
            if len(wrong):
                pos = int(wrong[0])
                raise Mismatch(
                    tr(
                        "{when}, the {label} cache of layer {layer} does not hold the KV of token {pos} "
                        "(id {token}) in slot {slot}, the slot the tree points at. "
                        "Which tokens did this request's forward pass compute, and which slots are its own?",
                        when=when,
                        label=label,
                        layer=layer,
                        pos=pos,
                        token=ids[pos],
                        slot=slots[pos],
                    )
                )


def _cached_slots(manager: RadixCacheManager, ids: tuple[int, ...]) -> list[int]:
    """The slots of the longest cached prefix of ``ids``, read without splitting or stamping anything."""
    import numpy as np

    array = np.asarray(ids, dtype=np.int64)
    node, pos, slots = manager.root_node, 0, []
    ps = manager.page_size
    while len(array) - pos >= ps:
        child = node.children.get(child_key(array[pos:], ps))
        if child is None:
            break
        n = child.get_match_len(array[pos:])
        slots.extend(child.value[: n - n % ps].tolist())
        if n < child.length:
            break
        node, pos = child, pos + n
    return slots


def compare_worlds(expected: World, got: World, when: str) -> None:
    _trees.compare(_trees.snapshot(expected.manager), _trees.snapshot(got.manager), values=False, times=False)
    if got.pool.num_free_pages != expected.pool.num_free_pages:
        raise Mismatch(
            tr("{when}, the pool should have {free} free pages.", when=when, free=expected.pool.num_free_pages),
            str(expected.pool.num_free_pages),
            str(got.pool.num_free_pages),
        )


# -- scenarios ------------------------------------------------------------------


def _random_events(seed: int, count: int, vocab: int, max_len: int, concurrent: bool) -> tuple[Event, ...]:
    rng = random.Random(seed)
    prompts: list[tuple[int, ...]] = []
    events: list[Event] = []
    running: list[str] = []
    for i in range(count):
        if prompts and rng.random() < 0.6:
            base = rng.choice(prompts)
            prompt = base[: rng.randint(0, len(base))] + tuple(
                rng.randrange(vocab) for _ in range(rng.randint(1, max_len // 2))
            )
        else:
            prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(1, max_len)))
        prompts.append(prompt)
        if concurrent:
            events.append(admit(f"r{i}", *prompt))
            running.append(f"r{i}")
            if len(running) >= 2 and rng.random() < 0.6:
                events.append(finish(running.pop(rng.randrange(len(running)))))
        else:
            events.append(serve(*prompt))
    events.extend(finish(name) for name in running)
    return tuple(events)


def _serve_scenarios() -> list[Scenario]:
    """The scenarios of ``lifecycle.serve``: requests one after another, in the learner's language."""
    return [
        Scenario(tr("one request on an empty cache"), (serve(1, 2, 3, 4),)),
        Scenario(
            tr("a second request shares a 3-token prefix with the first"), (serve(1, 2, 3, 4), serve(1, 2, 3, 9, 9))
        ),
        Scenario(
            tr("the same prompt twice: the second is served from the cache, all but its last token"),
            (serve(5, 6, 7), serve(5, 6, 7)),
        ),
        Scenario(tr("a prompt that is a prefix of a cached one"), (serve(1, 2, 3, 4, 5), serve(1, 2, 3))),
        Scenario(
            tr("the pool is full: the least recently used prefix is evicted to make room"),
            (serve(1, 2, 3, 4), serve(5, 6, 7, 8), serve(9, 9, 9, 9)),
            num_pages=8,
        ),
        Scenario(
            tr("too little memory even after eviction: raise OutOfSlotsError and leave nothing locked"),
            (serve(1, 2, 3, 4, 5, 6), serve(1, 2, 3, 4, 5, 6, 7, 8, 9)),
            num_pages=8,
        ),
        Scenario(
            tr("page_size 4: a 10-token prompt leaves a 2-token partial page to give back"),
            (serve(*range(1, 11)), serve(*range(1, 13))),
            page_size=4,
            num_pages=8,
        ),
        Scenario(
            tr("page_size 4: a prompt shorter than one page caches nothing"),
            (serve(1, 2, 3), serve(1, 2, 3)),
            page_size=4,
            num_pages=4,
        ),
        Scenario(
            tr("12 requests over a tiny vocabulary with a small pool (page_size 1)"),
            _random_events(1, 12, 3, 8, False),
            num_pages=24,
        ),
        Scenario(
            tr("12 requests with a small pool, page_size 2"),
            _random_events(2, 12, 3, 10, False),
            page_size=2,
            num_pages=16,
        ),
    ]


def _finish_scenarios() -> list[Scenario]:
    """The scenarios of ``lifecycle.finish`` (and ``slots_to_free``): requests that overlap."""
    return [
        Scenario(tr("a request on an empty cache"), (admit("A", 1, 2, 3, 4), finish("A"))),
        Scenario(
            tr("a request whose first token was cached: that slot stays the tree's"),
            (serve(7, 8), admit("A", 7, 9), finish("A")),
        ),
        Scenario(tr("a request whose prefix was cached"), (serve(1, 2, 3), admit("A", 1, 2, 3, 4, 5), finish("A"))),
        Scenario(
            tr("two identical requests run together: all of the second's slots are duplicates"),
            (admit("A", 1, 2, 3, 4), admit("B", 1, 2, 3, 4), finish("A"), finish("B")),
        ),
        Scenario(
            tr("B matched 2 tokens; while it ran, A cached 3 more of B's tokens"),
            (serve(7, 8), admit("A", 7, 8, 1, 2, 3, 9), admit("B", 7, 8, 1, 2, 3, 4), finish("A"), finish("B")),
        ),
        Scenario(
            tr("page_size 4: a 10-token prompt gives back its 2-token partial page"),
            (admit("A", *range(1, 11)), finish("A")),
            page_size=4,
            num_pages=8,
        ),
        Scenario(
            tr("page_size 4: a 3-token prompt is too short to cache"),
            (admit("A", 1, 2, 3), finish("A")),
            page_size=4,
            num_pages=4,
        ),
        Scenario(
            tr("page_size 2: concurrent duplicates and a partial page"),
            (admit("A", *range(1, 8)), admit("B", *range(1, 6)), finish("A"), finish("B")),
            page_size=2,
            num_pages=16,
        ),
        Scenario(
            tr("10 overlapping requests finishing out of order (page_size 1)"),
            _random_events(3, 10, 3, 8, True),
            num_pages=64,
        ),
        Scenario(
            tr("10 overlapping requests finishing out of order (page_size 2)"),
            _random_events(4, 10, 3, 9, True),
            page_size=2,
            num_pages=64,
        ),
    ]


def _admit_scenarios() -> list[Scenario]:
    """The scenarios of ``lifecycle.admit``: a cache state, then the request to admit."""
    return [
        Scenario(tr("an empty cache: nothing matches, every slot is new"), (admit("A", 1, 2, 3, 4),)),
        Scenario(tr("a cached 3-token prefix is matched and locked"), (serve(1, 2, 3), admit("A", 1, 2, 3, 4, 5))),
        Scenario(
            tr("the whole prompt is cached: all but its last token is matched"),
            (serve(1, 2, 3, 4), admit("A", 1, 2, 3, 4)),
        ),
        Scenario(
            tr("the pool is full: another prefix must be evicted, never the one just matched"),
            (serve(1, 2, 3, 4), serve(5, 6, 7, 8), admit("A", 5, 6, 7, 8, 9, 9, 9)),
            num_pages=8,
        ),
        Scenario(
            tr("not enough memory: raise OutOfSlotsError and leave nothing locked"),
            (serve(1, 2, 3, 4, 5, 6), admit("A", 1, 2, 3, 4, 5, 6, 7, 8, 9)),
            num_pages=8,
        ),
        Scenario(
            tr("page_size 4: only whole pages match"),
            (serve(*range(1, 11)), admit("A", *range(1, 11), 50)),
            page_size=4,
            num_pages=8,
        ),
    ]


# -- lifecycle.slots_to_free ---------------------------------------------------------


@exercise("lifecycle.slots_to_free", lambda: tr("the slots a finished request gives back to the pool"))
def _slots_to_free_cases() -> list[Case]:
    def make(scenario: Scenario) -> Case:
        def run(fn: _F) -> None:
            world = World(scenario)
            for event in scenario.events:
                if event.kind == "serve":
                    _lifecycle.serve(world.manager, world.pool, list(event.ids), world.kv_cache, kv_fn)
                elif event.kind == "admit":
                    world.admit(event.name, event.ids)
                else:
                    request = world.running.pop(event.name)
                    free_before = set(world.pool.free_slots().tolist())
                    already = _lifecycle.finish(world.manager, world.pool, request)
                    freed = set(world.pool.free_slots().tolist()) - free_before
                    expected = [s for s in request.indices.tolist() if s in freed]
                    args = (tuple(request.indices.tolist()), request.cached_len, already, scenario.page_size)
                    _check_slots_to_free(fn, args, expected)

        return Case(scenario.description, scenario.size, run)

    return [make(s) for s in _finish_scenarios()] + [
        random_case(
            tr(
                "{count} random requests: any slots in any order, any page size, any page-aligned cached "
                "and duplicate parts, prompts shorter than a page",
                count=FREE_DRAWS,
            ),
            Draw(
                _draw_free,
                lambda fn, a: _check_slots_to_free(fn, a, _reference_slots_to_free(*a)),
                _show_free,
                _shrink_free,
                lambda a: len(a[0]),
                classes=((tr("a prompt shorter than one page"), _draw_short_free),),
            ),
            seed=900,
            max_size=40,
            count=FREE_DRAWS,
        )
    ]


FreeArgs = tuple[tuple[int, ...], int, int, int]


def _reference_slots_to_free(indices: tuple[int, ...], cached: int, already: int, page_size: int) -> list[int]:
    """What :func:`minikv.lifecycle.finish` frees: the duplicates, then the partial last page."""
    total = len(indices)
    return list(indices[cached:already]) + list(indices[max(total - total % page_size, cached) :])


def _draw_free(rng: random.Random, size: int) -> FreeArgs:
    """Arguments the contract allows: ``cached_len``, ``already_cached`` page-aligned, in order, in the prompt."""
    page_size = rng.choice((1, 1, 2, 3, 4, 8, 16))
    n = rng.randint(1, 1 + size)
    whole = (n - n % page_size) // page_size  # whole pages of the prompt
    cached = page_size * rng.randint(0, (n - 1) // page_size)  # match_prefix(input_ids[:-1]) ends on a page
    already = page_size * rng.randint(cached // page_size, whole)
    top = rng.choice((n + 4, 1000, 2**31 - 1))
    return tuple(rng.sample(range(top), n)), cached, already, page_size


def _draw_short_free(rng: random.Random, size: int) -> FreeArgs:
    """A prompt shorter than one page (nothing matched, nothing inserted), or one page and a few tokens."""
    page_size = rng.randint(2, 16)
    n = rng.randint(1, page_size - 1) + rng.choice((0, page_size))
    already = page_size * rng.randint(0, n // page_size)
    return tuple(rng.sample(range(n + 8), n)), 0, already, page_size


def _shrink_free(args: FreeArgs) -> list[FreeArgs]:
    indices, cached, already, ps = args
    out: list[FreeArgs] = []
    if len(indices) > 1 and len(indices) - 1 > cached and (len(indices) - 1) // ps * ps >= already:
        out.append((indices[:-1], cached, already, ps))
    out += [((*indices[:i], x, *indices[i + 1 :]), cached, already, ps) for i in range(len(indices))
            for x in shrink_int(indices[i]) if x not in indices]  # fmt: skip
    return out


def _show_free(args: FreeArgs) -> str:
    indices, cached, already, ps = args
    return (
        f"slots_to_free(indices=tensor({short(list(indices), 40)}, dtype=torch.int32), cached_len={cached}, "
        f"already_cached={already}, page_size={ps})"
    )


def _check_slots_to_free(fn: _F, args: FreeArgs, expected: list[int]) -> None:
    indices, cached, already, page_size = args
    tensor = torch.tensor(indices, dtype=torch.int32)
    got = call_watching(
        fn, ("indices", "cached_len", "already_cached", "page_size"), tensor, cached, already, page_size
    )
    if not isinstance(got, torch.Tensor) or got.dtype.is_floating_point or got.dim() != 1:
        raise Mismatch(tr("return a 1-D integer tensor of slots."), tr("1-D int tensor"), repr(got))
    got_list = got.tolist()
    if got_list != expected:
        where, exp_text, got_text = diff(expected, got_list)
        why, tree_slot = _why_free(indices, cached, already, page_size, expected, got_list)
        raise Mismatch(
            tr(
                "slots_to_free(indices={indices}, cached_len={cached}, already_cached={already}, "
                "page_size={page_size}) is wrong: {where}. {why}",
                indices=short(list(indices), 16),
                cached=cached,
                already=already,
                page_size=page_size,
                where=where,
                why=why,
            ),
            exp_text,
            got_text,
            # freeing a slot the tree holds is the mistake chapter 2 warns about: report it first
            size=0 if tree_slot else None,
        )


def _why_free(
    indices: tuple[int, ...], cached: int, already: int, page_size: int, expected: list[int], got: list[int]
) -> tuple[str, bool]:
    """A hint about the first slot that is wrong, by the part of ``indices`` it lies in; and whether the
    learner freed a slot the tree holds."""
    position = {slot: p for p, slot in enumerate(indices)}
    inserted_end = len(indices) - len(indices) % page_size
    extra = [s for s in got if s not in set(expected)]
    missing = [s for s in expected if s not in set(got)]
    if extra:
        slot = extra[0]
        p = position.get(slot)
        if p is None:
            return tr("Slot {slot} is not in indices at all.", slot=slot), False
        if p < cached:
            return (
                tr(
                    "Your result frees slot {slot}, at position {p} of indices: the request matched that token "
                    "at step 1, so who owned the slot before the request began, and who owns it now?",
                    slot=slot,
                    p=p,
                ),
                True,
            )
        return (
            tr(
                "Your result frees slot {slot}, at position {p} of indices: what did insert_prefix do with "
                "that token (it returned already_cached = {already})?",
                slot=slot,
                p=p,
                already=already,
            ),
            True,
        )
    if missing:
        slot = missing[0]
        p = position[slot]
        if p < already:
            return (
                tr(
                    "Your result keeps slot {slot}, at position {p} of indices: insert_prefix found that token "
                    "already in the tree (already_cached = {already}); does the tree want this request's copy?",
                    slot=slot,
                    p=p,
                    already=already,
                ),
                False,
            )
        return (
            tr(
                "Your result keeps slot {slot}, at position {p} of indices; with page_size {page_size} "
                "the prompt's whole pages end at position {end}: what does insert_prefix do with the rest?",
                slot=slot,
                p=p,
                page_size=page_size,
                end=inserted_end,
            ),
            False,
        )
    return tr("The right slots, in another order: give them in the order they appear in indices."), False


def _scenario_case(scenario: Scenario, run: Callable[[_F, Scenario], None]) -> Case:
    return Case(scenario.description, scenario.size, lambda fn: run(fn, scenario))


# -- lifecycle.admit ---------------------------------------------------------------


# -- random scenarios -------------------------------------------------------------------


def _draw_ids(rng: random.Random, length: int, big: bool) -> tuple[int, ...]:
    """Token ids from a tiny vocabulary (so that prompts share), and with ``big`` also ids up to 2^20."""
    return tuple(rng.randrange(2**20) if big and rng.random() < 0.3 else rng.randrange(3) for _ in range(length))


def _draw_prompt(rng: random.Random, prompts: list[tuple[int, ...]], size: int, big: bool) -> tuple[int, ...]:
    if prompts and rng.random() < 0.6:
        base = rng.choice(prompts)
        return base[: rng.randint(0, len(base))] + _draw_ids(rng, rng.randint(1, 1 + size // 2), big)
    return _draw_ids(rng, rng.randint(1, 2 + size), big)


def _draw_scenario(kind: str) -> Callable[[random.Random, int], Scenario]:
    """Random scenarios for ``kind`` ("serve", "admit" or "finish"): any page size, tight pools, large ids."""

    def draw(rng: random.Random, size: int) -> Scenario:
        page_size = rng.choice((1, 1, 2, 3, 4))
        big = rng.random() < 0.5
        prompts: list[tuple[int, ...]] = []
        events: list[Event] = []
        running: list[str] = []
        for i in range(rng.randint(1, 2 + size // 3)):
            prompt = _draw_prompt(rng, prompts, size, big)
            prompts.append(prompt)
            if kind == "finish" and rng.random() < 0.7:
                events.append(admit(f"r{i}", *prompt))
                running.append(f"r{i}")
                while running and (len(running) > 3 or rng.random() < 0.4):
                    events.append(finish(running.pop(rng.randrange(len(running)))))
            else:
                events.append(serve(*prompt))
        if kind == "admit":
            events.append(admit("A", *_draw_prompt(rng, prompts, size, big)))
        events.extend(finish(name) for name in running)
        pages = sum(-(-len(e.ids) // page_size) for e in events)
        if kind == "finish":  # every admit must fit, unless an earlier finish leaked
            num_pages = pages + rng.randint(0, 4)
        else:  # tight: eviction, and sometimes a request that cannot fit at all
            longest = max(-(-len(e.ids) // page_size) for e in events)
            num_pages = rng.randint(max(1, longest - 1), max(2, longest + pages // 2))
        return Scenario("random", tuple(events), page_size, num_pages)

    return draw


def _shrink_scenario(scenario: Scenario) -> list[Scenario]:
    r = dataclasses.replace
    events = scenario.events
    out = []
    for i, event in enumerate(events):
        if event.kind == "finish":
            continue
        dropped = tuple(e for j, e in enumerate(events) if j != i and not (e.kind == "finish" and e.name == event.name))
        if event.name != "A":  # the admit exercise's last request stays
            out.append(r(scenario, events=dropped))
    for i, event in enumerate(events):
        if len(event.ids) > 1:
            out.append(r(scenario, events=(*events[:i], r(event, ids=event.ids[:-1]), *events[i + 1 :])))
        smaller = tuple(min(t, 3) for t in event.ids)
        if smaller != event.ids:
            out.append(r(scenario, events=(*events[:i], r(event, ids=smaller), *events[i + 1 :])))
    if scenario.page_size > 1:
        out.append(r(scenario, page_size=1))
    return out


def _show_scenario(scenario: Scenario) -> str:
    words = []
    for event in scenario.events:
        if event.kind == "serve":
            words.append(f"serve {list(event.ids)}")
        elif event.kind == "admit":
            words.append(f"admit {event.name} = {list(event.ids)}")
        else:
            words.append(f"finish {event.name}")
    return tr(
        "page_size {page_size}, {pages} pages: {events}",
        page_size=scenario.page_size,
        pages=scenario.num_pages,
        events="; ".join(words),
    )


def _random_scenarios(kind: str, run: Callable[[_F, Scenario], None], seed: int) -> Case:
    plain = _draw_scenario(kind)

    def short_pool(rng: random.Random, size: int) -> Scenario:
        """A pool of exactly the pages the longest request needs, or one page fewer: eviction and refusal."""
        scenario = plain(rng, size)
        ps = scenario.page_size
        longest = max(-(-len(e.ids) // ps) for e in scenario.events if e.ids)
        return dataclasses.replace(scenario, num_pages=max(1, longest + rng.choice((-1, 0, 0, 1))))

    classes = () if kind == "finish" else ((tr("a pool that runs short"), short_pool),)
    what = {
        "serve": tr("{count} random request histories", count=SCENARIO_DRAWS),
        "admit": tr("{count} random cache states", count=SCENARIO_DRAWS),
        "finish": tr("{count} random overlapping requests", count=SCENARIO_DRAWS),
    }[kind]
    return random_case(
        tr(
            "{what}: page sizes 1-4, tight pools (many exactly as large as the longest "
            "request, or a page short), token ids up to 2^20",
            what=what,
        ),
        Draw(plain, run, _show_scenario, _shrink_scenario, lambda s: s.size, classes=classes),
        seed=seed,
        max_size=12,
        count=SCENARIO_DRAWS,
    )


SCENARIO_DRAWS, FREE_DRAWS = 150, 4000
"""How many random inputs the lifecycle checks draw: as many as keep each check under about a second."""


def _no_evict_from(error: BaseException | None) -> None:
    """An OutOfSlotsError where minikv succeeded: most likely ``pool.allocate`` was not given ``evict_from``."""
    if isinstance(error, OutOfSlotsError):
        raise Mismatch(
            tr(
                "your code ran out of slots where minikv's did not: the pool was short of free pages, "
                "but the tree held unlocked prefixes that could be evicted. Call "
                "pool.allocate(n, evict_from=manager): without evict_from the pool cannot evict anything."
            ),
            tr("the request admitted (after evicting)"),
            outcome(error),
        )


# -- lifecycle.admit ---------------------------------------------------------------


@exercise(
    "lifecycle.admit",
    lambda: tr("steps 1-3: match, lock, allocate"),
)
def _admit_cases() -> list[Case]:
    return [_scenario_case(s, _run_admit) for s in _admit_scenarios()] + [
        _random_scenarios("admit", _run_admit, seed=1000)
    ]


def _run_admit(fn: _F, scenario: Scenario) -> None:
    mine, ref = World(scenario), World(scenario)
    for event in scenario.events[:-1]:
        for world in (mine, ref):
            with contextlib.suppress(OutOfSlotsError):  # twins: a request too large for the pool fails in both
                _lifecycle.serve(world.manager, world.pool, list(event.ids), world.kv_cache, kv_fn)
    ids = scenario.events[-1].ids
    try:
        expected: Request | None = _lifecycle.admit(ref.manager, ref.pool, list(ids))
    except OutOfSlotsError:
        expected = None
    given = _ids(ids)
    result, error = raised(fn, mine.manager, mine.pool, given)
    expect_unchanged(("input_ids",), (_ids(ids),), (given,))
    if expected is None:
        if not isinstance(error, OutOfSlotsError):
            what = outcome(error, returned=tr("returned normally"))
            raise Mismatch(
                tr(
                    "the pool cannot supply enough slots even after evicting every unlocked prefix, "
                    "so admit must fail with OutOfSlotsError (as pool.allocate does). "
                    "Did you lock the match before allocating?"
                ),
                "OutOfSlotsError",
                what,
            )
        if mine.manager.size_info.protected_size:
            raise Mismatch(
                tr("after the failed allocation the match is still locked: unlock it before letting the error out."),
                "protected_size 0",
                f"protected_size {mine.manager.size_info.protected_size}",
            )
        compare_worlds(ref, mine, tr("after the failed admit"))
        return
    _no_evict_from(error)
    if error is not None:
        raise unexpected(error)
    handle, indices = _unpack_admit(result)
    if handle.cached_len > expected.cached_len:
        raise Mismatch(
            tr(
                "the handle matched more than a server may: match input_ids[:-1], "
                "so that at least the last token is computed."
            ),
            str(expected.cached_len),
            str(handle.cached_len),
        )
    if handle.cached_len != expected.cached_len:
        raise Mismatch(tr("the handle's cached_len is wrong."), str(expected.cached_len), str(handle.cached_len))
    if indices.tolist()[: expected.cached_len] != expected.indices.tolist()[: expected.cached_len]:
        where, exp_text, got_text = diff(expected.indices.tolist(), indices.tolist())
        raise Mismatch(
            tr("the first cached_len slots must be the matched prefix's slots, in order: {where}.", where=where),
            exp_text,
            got_text,
        )
    if sorted(indices.tolist()[expected.cached_len :]) != sorted(expected.own_slots().tolist()) or len(indices) != len(
        ids
    ):
        where, exp_text, got_text = diff(expected.indices.tolist(), indices.tolist())
        raise Mismatch(
            tr(
                "the request needs {count} new slots "
                "from pool.allocate(..., evict_from=manager), after the matched ones: {where}.",
                count=len(ids) - expected.cached_len,
                where=where,
            ),
            exp_text,
            got_text,
        )
    _trees.compare(_trees.snapshot(ref.manager), _trees.snapshot(mine.manager), values=True, times=True)
    if mine.pool.num_free_pages != ref.pool.num_free_pages:
        raise Mismatch(
            tr(
                "after your admit the pool should have "
                "{free} free pages: allocate exactly the uncached tokens' slots, once.",
                free=ref.pool.num_free_pages,
            ),
            str(ref.pool.num_free_pages),
            str(mine.pool.num_free_pages),
        )
    _admit_again(fn, scenario, indices)
    mine.running["A"] = Request(expected.input_ids, handle, indices)
    check_accounting(mine, tr("after your admit"))
    for world, request in ((mine, mine.running.pop("A")), (ref, expected)):
        _lifecycle.finish(world.manager, world.pool, request)
    if mine.manager.size_info.protected_size:
        raise Mismatch(
            tr(
                "after the request finished (one unlock), part of the tree is still locked: "
                "lock the handle exactly once."
            ),
            "protected_size 0",
            f"protected_size {mine.manager.size_info.protected_size}",
        )


def _admit_again(fn: _F, scenario: Scenario, first: torch.Tensor) -> None:
    """A request keeps the ``indices`` admit gave it until it finishes, so each call must return a tensor of
    its own. Admit the same prompt again, into a twin of the world: its indices must share no memory with
    the first call's, and leave them as they were (a reused buffer gives equal slots here, and other slots,
    written over the first request's, as soon as the next prompt differs)."""
    kept = first.clone()
    twin = World(scenario)
    for event in scenario.events[:-1]:
        with contextlib.suppress(OutOfSlotsError):  # as in the first world: a request too large fails there too
            _lifecycle.serve(twin.manager, twin.pool, list(event.ids), twin.kv_cache, kv_fn)
    result, error = raised(fn, twin.manager, twin.pool, _ids(scenario.events[-1].ids))
    if error is not None:
        raise unexpected(error)
    _, again = _unpack_admit(result)
    if again is first or _overlap(again, first) or not torch.equal(first, kept):
        raise Mismatch(
            tr(
                "a second admit (the same prompt, on a twin of this cache) returned indices that share memory "
                "with the first call's: the first request still runs and holds its indices, so the next admit "
                "would write its slots over the first request's. Return a new tensor from every call "
                "(torch.cat makes one)."
            ),
            tr("a tensor of its own for each request"),
            tr("the two requests' indices in the same memory"),
        )


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share a byte of memory (views of one tensor, by any route, do when they overlap)."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        low = high = t.data_ptr()
        for n, stride in zip(t.shape, t.stride(), strict=True):
            reach = (n - 1) * stride * t.element_size()
            low, high = (low + reach, high) if reach < 0 else (low, high + reach)
        return low, high + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _unpack_admit(result: object) -> tuple[RadixCacheHandle, torch.Tensor]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Mismatch(tr("return a pair (handle, indices)."), "(handle, indices)", repr(result))
    handle, indices = result
    if not isinstance(handle, RadixCacheHandle):
        raise Mismatch(
            tr("the first element must be the handle match_prefix returned."),
            tr("a RadixCacheHandle"),
            type(handle).__name__,
        )
    if not isinstance(indices, torch.Tensor) or indices.dtype.is_floating_point:
        raise Mismatch(tr("the second element must be an integer tensor of slots."), tr("a tensor"), repr(indices))
    return handle, indices


# -- lifecycle.finish ----------------------------------------------------------------


@exercise(
    "lifecycle.finish",
    lambda: tr("steps 4, 5 and 7: insert, free the duplicates, unlock"),
)
def _finish_cases() -> list[Case]:
    return [_scenario_case(s, _run_finish) for s in _finish_scenarios()] + [
        _random_scenarios("finish", _run_finish, seed=1100)
    ]


def _run_finish(fn: _F, scenario: Scenario) -> None:
    mine, ref = World(scenario), World(scenario)
    for event in scenario.events:
        if event.kind == "serve":
            for world in (mine, ref):
                _lifecycle.serve(world.manager, world.pool, list(event.ids), world.kv_cache, kv_fn)
        elif event.kind == "admit":
            ref.admit(event.name, event.ids)
            try:
                mine.admit(event.name, event.ids)
            except OutOfSlotsError:
                raise Mismatch(
                    tr(
                        "request {name} could not get its slots, although minikv's pool had them: "
                        "an earlier finish kept slots that it should have given back.",
                        name=event.name,
                    ),
                    tr("{free} free pages", free=ref.pool.num_free_pages),
                    tr("{free} free pages", free=mine.pool.num_free_pages),
                ) from None
        else:
            when = tr("after your finish of request {name}", name=event.name)
            theirs, request = ref.running.pop(event.name), mine.running.pop(event.name)
            expected = _lifecycle.finish(ref.manager, ref.pool, theirs)
            args = (_ids(request.input_ids.tolist()), request.handle, request.indices)
            before = keep(args[0]), keep(args[2])
            got = expect_int(tr("finish's result"), call(fn, mine.manager, mine.pool, *args))
            expect_unchanged(("input_ids", "indices"), before, (args[0], args[2]))
            if got != expected:
                raise Mismatch(
                    tr("{when}: return what insert_prefix returned (already_cached).", when=when),
                    str(expected),
                    str(got),
                )
            check_accounting(mine, when)
            compare_worlds(ref, mine, when)
            locked = mine.manager.size_info.protected_size - ref.manager.size_info.protected_size
            if locked:
                raise Mismatch(
                    tr(
                        "{when}, {locked} slots are still locked: unlock the request's handle (step 7).",
                        when=when,
                        locked=locked,
                    )
                )


# -- lifecycle.serve -----------------------------------------------------------------


@exercise(
    "lifecycle.serve",
    lambda: tr("all seven steps of one request"),
)
def _serve_cases() -> list[Case]:
    return [_scenario_case(s, _run_serve) for s in _serve_scenarios()] + [
        _random_scenarios("serve", _run_serve, seed=1200)
    ]


class _WatchedCache:
    """A model of slot ownership: records the slots every ``store_kv`` call writes (per layer, and whether
    the pool held them at that moment), the slots ``pool.allocate`` hands out and the manager's evictions,
    then lets each call happen."""

    def __init__(self, kv_cache: MHAKVCache, manager: RadixCacheManager, pool: PagePool) -> None:
        self.kv_cache = kv_cache
        self.written: set[int] = set()
        self.evicted: set[int] = set()
        self.allocated: list[int] = []
        self.by_layer: dict[int, set[int]] = {}
        self.into_the_pool: list[int] = []
        """Slots written while the pool held them (freed already: the next request may get them)."""
        real = kv_cache.store_kv
        real_evict = manager.evict
        real_allocate = pool.allocate

        def evict(size: int) -> torch.Tensor:
            freed = real_evict(size)
            self.evicted.update(freed.tolist())
            return freed

        manager.evict = evict  # type: ignore[method-assign]

        def allocate(*args: object, **kwargs: object) -> torch.Tensor:
            slots = real_allocate(*args, **kwargs)  # type: ignore[arg-type]
            self.allocated.extend(torch.as_tensor(slots).flatten().tolist())
            return slots

        pool.allocate = allocate  # type: ignore[method-assign]

        def store_kv(k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
            slots = torch.as_tensor(out_loc).flatten().tolist()
            self.written.update(slots)
            self.by_layer.setdefault(int(layer_id), set()).update(slots)
            free = set(pool.free_slots().tolist())
            self.into_the_pool.extend(slot for slot in slots if slot in free)
            real(k, v, out_loc, layer_id)

        kv_cache.store_kv = store_kv  # type: ignore[method-assign]

    def clear(self) -> None:
        self.written.clear()
        self.evicted.clear()
        self.allocated.clear()
        self.by_layer.clear()
        self.into_the_pool.clear()

    def rows(self, slots: list[int]) -> list[torch.Tensor]:
        index = torch.tensor(slots, dtype=torch.int64)
        ps = self.kv_cache.page_size
        return [
            cache[index // ps, index % ps].clone()
            for layer in range(LAYERS)
            for cache in (self.kv_cache.k_cache(layer), self.kv_cache.v_cache(layer))
        ]


def _run_serve(fn: _F, scenario: Scenario) -> None:
    mine, ref = World(scenario), World(scenario)
    watched = _WatchedCache(mine.kv_cache, mine.manager, mine.pool)
    for number, event in enumerate(scenario.events, 1):
        prompt = list(event.ids)
        when = tr("after request {number} ({prompt})", number=number, prompt=prompt)
        try:
            expected: int | None = _lifecycle.serve(
                ref.manager, ref.pool, list(event.ids), ref.kv_cache, kv_fn
            ).cached_len
        except OutOfSlotsError:
            expected = None
        tree_before = set(_trees.all_slots(_trees.snapshot(mine.manager)))
        kept = sorted(tree_before)
        rows_before = watched.rows(kept)
        watched.clear()
        given = _ids(event.ids)
        got, error = raised(fn, mine.manager, mine.pool, given, mine.kv_cache, kv_fn)
        expect_unchanged(("input_ids",), (_ids(event.ids),), (given,))
        if watched.into_the_pool:
            slot = watched.into_the_pool[0]
            raise Mismatch(
                tr(
                    "request {number} ({prompt}) wrote K/V into slot {slot} after that slot had gone back "
                    "to the pool: the pool may hand it to the next request, and a free slot's contents mean "
                    "nothing. In what order does a server run the forward pass and the request's end?",
                    number=number,
                    prompt=prompt,
                    slot=slot,
                ),
                tr("every store_kv into a slot the request still holds"),
                tr("store_kv into slot {slot}, which the pool held at that moment", slot=slot),
            )
        unwritten = [
            (layer, slot)
            for layer in range(LAYERS)
            for slot in watched.allocated
            if slot not in watched.by_layer.get(layer, set())
        ]
        if unwritten and error is None:
            layer, slot = unwritten[0]
            raise Mismatch(
                tr(
                    "request {number} ({prompt}) got slot {slot} from pool.allocate, but nothing was "
                    "stored into it in layer {layer}: every new slot must receive its token's K and V in every "
                    "layer before anyone may read it.",
                    number=number,
                    prompt=prompt,
                    slot=slot,
                    layer=layer,
                ),
                tr("a store_kv into slot {slot} in layer {layer}", slot=slot, layer=layer),
                tr(
                    "layers written into slot {slot}: {layers}",
                    slot=slot,
                    layers=[x for x in range(LAYERS) if slot in watched.by_layer.get(x, set())],
                ),
            )
        survived = tree_before - watched.evicted  # cached before, and never handed out again
        overwritten = sorted(watched.written & survived)
        after = watched.rows(kept)
        changed = [
            slot
            for k, slot in enumerate(kept)
            if slot in survived
            and any(bool((new[k] != old[k]).any()) for new, old in zip(after, rows_before, strict=True))
        ]
        if overwritten or changed:
            slot = (overwritten or changed)[0]
            raise Mismatch(
                tr(
                    "request {number} ({prompt}) wrote into slot {slot}, which holds a cached prefix the "
                    "tree keeps: other requests read those slots, so they must stay as they are (even rewritten "
                    "with equal values). Which part of indices did the request match, and which part is its own?",
                    number=number,
                    prompt=prompt,
                    slot=slot,
                ),
                tr("writes only into the request's own new slots"),
                tr("writes into {count} cached slot(s), e.g. {slot}", count=len(overwritten or changed), slot=slot),
            )
        if expected is None:
            if not isinstance(error, OutOfSlotsError):
                what = outcome(error, returned=tr("returned normally"))
                raise Mismatch(
                    tr(
                        "request {number} cannot get enough slots even after evicting every unlocked prefix: "
                        "it must fail with OutOfSlotsError. (Did you lock the match before allocating?)",
                        number=number,
                    ),
                    "OutOfSlotsError",
                    what,
                )
            when = tr("after request {number} failed", number=number)
        else:
            _no_evict_from(error)
            if error is not None:
                raise unexpected(error)
            got = expect_int(tr("serve's result (the number of cached tokens)"), got)
            if got != expected:
                raise Mismatch(
                    tr("request {number}: return how many prompt tokens came from the cache.", number=number),
                    str(expected),
                    str(got),
                )
            check_kv(mine, event.ids, when)
        if mine.manager.size_info.protected_size:
            raise Mismatch(
                tr(
                    "{when}, {locked} slots are still locked: every lock needs its unlock, also when allocation fails.",
                    when=when,
                    locked=mine.manager.size_info.protected_size,
                )
            )
        check_accounting(mine, when)
        compare_worlds(ref, mine, when)
