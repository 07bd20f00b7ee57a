"""Checks for the scheduling exercises: the cached prefix, longest-prefix-first, and aging.

Two kinds of case. *Queue* cases build a radix tree by serving a few prompts
(:func:`minikv.lifecycle.serve`), put requests in a waiting queue (some with
generated tokens, as a preempted request has), and compare the learner's order
with minikv's policy (:class:`~minikv.scheduling.LongestPrefixMatch`,
:class:`~minikv.scheduling.Aging`); the tree must be exactly as it was, clocks
included. *Engine* cases plug the learner's function into the real engine
(``make_engine(policy=...)``) on drawn course workloads
(:mod:`minikv.course.workloads`), with arrivals spread over the first steps and
a pool small enough to evict: every output must equal :func:`~minikv.engine.recompute`,
and the prompt tokens computed, the preemptions and the order of admissions must
be those of minikv's policy on the same workload.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..base import BaseCacheManager
from ..course import workloads
from ..engine import EngineRequest, make_engine, recompute
from ..language import tr
from ..lifecycle import serve
from ..page_pool import PagePool
from ..radix_manager import RadixCacheManager
from ..scheduling import Aging, LongestPrefixMatch, SchedulingPolicy, cached_prefix_len
from ..snapshot import TreeSnapshot
from ..tiny_model import TinyDecoder
from ._core import (
    Case,
    Draw,
    Invalid,
    Mismatch,
    call,
    exercise,
    expect_int,
    random_case,
    shrink_int,
    shrink_tuple,
)
from ._report import diff

_F = Callable[..., object]
Prompt = tuple[int, ...]
VOCAB = 32
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
"""The model of the engine cases: tiny, so that a whole workload runs in a fraction of a second."""


# -- queues: a tree, and requests waiting for it ------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """A waiting request: its prompt, the tokens it generated before a preemption, the steps it waited."""

    prompt: Prompt
    output: Prompt = ()
    waited: int = 0


@dataclass(frozen=True)
class Queue:
    """A tree made by serving ``served`` (in order), and the waiting queue, front first."""

    page_size: int
    served: tuple[Prompt, ...]
    waiting: tuple[Waiting, ...]
    tokens_per_step: float = 1.0


def _build(queue: Queue) -> tuple[RadixCacheManager, list[EngineRequest]]:
    cache = RadixCacheManager(page_size=queue.page_size)
    pool = PagePool(1 + sum(len(p) for p in queue.served) // queue.page_size + len(queue.served), queue.page_size)
    for prompt in queue.served:
        serve(cache, pool, list(prompt))
    # A preempted request (one with generated tokens) went back to the front of the queue, but it
    # arrived before the others: arrival numbers (uid) are not queue positions.
    arrival = sorted(range(len(queue.waiting)), key=lambda i: (not queue.waiting[i].output, i))
    requests = []
    for position, w in enumerate(queue.waiting):
        request = EngineRequest(list(w.prompt), len(w.output) + 1)
        request.output = list(w.output)
        request.uid, request.waited_steps = arrival.index(position), w.waited
        requests.append(request)
    return cache, requests


def _label(request: EngineRequest, cache: BaseCacheManager, queue: Queue, aging: bool) -> str:
    matched = cached_prefix_len(cache, request.token_ids)
    if aging:
        return tr(
            "request {uid} (match {matched}, waited {waited})",
            uid=request.uid,
            matched=matched,
            waited=request.waited_steps,
        )
    return tr("request {uid} (match {matched})", uid=request.uid, matched=matched)


def _check_order(fn: _F, queue: Queue, aging: bool) -> None:
    cache, requests = _build(queue)
    if aging:
        expected = Aging(queue.tokens_per_step).order(list(requests), cache)
    else:
        expected = LongestPrefixMatch().order(list(requests), cache)
    waiting = list(requests)
    before = TreeSnapshot.of(cache)
    extra = (queue.tokens_per_step,) if aging else ()
    got = call(fn, waiting, cache, *extra)
    _expect_same_tree(before, cache)
    if [id(r) for r in waiting] != [id(r) for r in requests]:
        raise Mismatch(
            tr(
                "your function reordered the list `waiting` it was given; return a new list "
                "(`sorted(waiting, ...)`) and leave the caller's queue as it was."
            ),
            tr("the queue as it was given"),
            tr("the queue reordered"),
        )
    _expect_the_same_requests(got, requests)
    assert isinstance(got, list)
    if [id(r) for r in got] != [id(r) for r in expected]:
        exp = [_label(r, cache, queue, aging) for r in expected]
        mine = [_label(r, cache, queue, aging) for r in got]
        where, exp_text, got_text = diff(exp, mine)
        if aging:
            problem = tr(
                "the order is wrong ({where}): the highest priority first, and requests with equal "
                "priority keep their order in `waiting`.",
                where=where,
            )
        else:
            problem = tr(
                "the order is wrong ({where}): the longest cached prefix first, and requests with equal "
                "matches keep their order in `waiting`.",
                where=where,
            )
        raise Mismatch(problem, exp_text, got_text)


def _expect_the_same_requests(got: object, requests: Sequence[EngineRequest]) -> None:
    if not isinstance(got, list):
        raise Mismatch(
            tr("return a list of the waiting requests."), tr("a list"), f"{type(got).__name__}: {got!r}"[:200]
        )
    if sorted(map(id, got)) != sorted(map(id, requests)):
        raise Mismatch(
            tr(
                "return the waiting requests themselves, each exactly once, reordered (no copies, none "
                "left out, none added)."
            ),
            tr(
                "{n} requests: {requests}",
                n=len(requests),
                requests=", ".join(tr("request {uid}", uid=r.uid) for r in requests),
            ),
            tr("{n} items: {items}", n=len(got), items=", ".join(_what(item, requests) for item in got)),
        )


def _what(item: object, requests: Sequence[EngineRequest]) -> str:
    if any(item is r for r in requests):
        return tr("request {uid}", uid=getattr(item, "uid", "?"))
    return tr("a {type} that is not one of them", type=type(item).__name__)


def _expect_same_tree(before: TreeSnapshot, cache: RadixCacheManager) -> None:
    after = TreeSnapshot.of(cache)
    if after != before:
        raise Mismatch(
            tr(
                "your function changed the tree: asking how much of a prompt is cached must change nothing. "
                "`match_prefix` stamps the matched path with the current time (so eviction order changes) "
                "and splits a node where the match ends inside it; `cache.find` only reads."
            ),
            tr("the tree as it was"),
            tr("a tree with other timestamps or nodes"),
        )


# -- drawing queues ------------------------------------------------------------------------------


def _draw_queue(rng: random.Random, size: int) -> Queue:
    """A few shared prefixes over a tiny vocabulary (so ties and partial matches are common)."""
    page_size = rng.choice((1, 1, 2, 4))
    vocab = rng.randint(2, 5)

    def tokens(n: int) -> Prompt:
        return tuple(rng.randrange(vocab) for _ in range(n))

    bases = [tokens(rng.randint(1, 3 + size // 2)) for _ in range(rng.randint(1, 3))]
    served = tuple(rng.choice(bases) + tokens(rng.randint(0, 4)) for _ in range(rng.randint(0, 1 + size // 3)))
    waiting: list[Waiting] = []
    for _ in range(rng.randint(0, 2 + size // 2)):
        kind = rng.random()
        if kind < 0.2 and served:
            prompt = rng.choice(served)  # its whole prompt is cached: only ids[:-1] can match
        elif kind < 0.35:
            prompt = tokens(rng.randint(1, 6)) if rng.random() < 0.5 else (vocab + rng.randrange(50),)
        else:
            prompt = rng.choice(bases) + tokens(rng.randint(1, 4))
        output = tokens(rng.randint(1, 3)) if rng.random() < (0.4 if not waiting else 0.15) else ()
        waiting.append(Waiting(prompt, output, rng.randint(0, 6)))
    return Queue(page_size, served, tuple(waiting), rng.choice((1.0, 1.0, 0.5, 2.0, 3.0)))


def _shrink_queue(queue: Queue) -> list[Queue]:
    r = dataclasses.replace
    out = [r(queue, waiting=w) for w in shrink_tuple(queue.waiting)]
    out += [r(queue, served=s) for s in shrink_tuple(queue.served)]
    out += [r(queue, page_size=p) for p in (1, 2) if p < queue.page_size]
    for i, w in enumerate(queue.waiting):
        if w.output:
            out.append(r(queue, waiting=(*queue.waiting[:i], r(w, output=()), *queue.waiting[i + 1 :])))
        out += [
            r(queue, waiting=(*queue.waiting[:i], r(w, waited=x), *queue.waiting[i + 1 :]))
            for x in shrink_int(w.waited)
        ]
    return out


def _show_queue(queue: Queue, aging: bool = False) -> str:
    def one(uid: int, w: Waiting) -> str:
        text = tr("request {uid}: prompt {prompt}", uid=uid, prompt=list(w.prompt))
        text += tr(" + generated {output}", output=list(w.output)) if w.output else ""
        return text + (tr(", waited {steps} steps", steps=w.waited) if aging else "")

    lines = [
        tr(
            "page_size {page_size}; the tree holds what serving {served} left",
            page_size=queue.page_size,
            served=[list(p) for p in queue.served],
        )
    ]
    if aging:
        lines[0] += f"; tokens_per_step {queue.tokens_per_step:g}"
    lines += [one(uid, w) for uid, w in enumerate(queue.waiting)] or [tr("the waiting queue is empty")]
    return "\n".join(lines)


# -- engine workloads ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Requests (prompt, max_new_tokens, arrival step) and the engine they are served by."""

    description: str
    requests: tuple[tuple[Prompt, int, int], ...]
    page_size: int = 1
    num_pages: int = 24
    max_running: int = 2
    tokens_per_step: float = 1.0


@lru_cache(maxsize=4096)
def _recompute(prompt: Prompt, max_new_tokens: int) -> tuple[int, ...]:
    return tuple(recompute(MODEL, list(prompt), max_new_tokens))


class _Yours(SchedulingPolicy):
    """The learner's order function as an engine's policy (what ``make_engine(policy=...)`` takes)."""

    name = "yours"

    def __init__(self, fn: _F, extra: tuple[Any, ...]) -> None:
        self.fn, self.extra = fn, extra

    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        before = TreeSnapshot.of(cache) if isinstance(cache, RadixCacheManager) else None
        got = call(self.fn, list(waiting), cache, *self.extra)
        if before is not None and isinstance(cache, RadixCacheManager):
            _expect_same_tree(before, cache)
        _expect_the_same_requests(got, waiting)
        return list(got)  # a list of the waiting requests: checked just above


@dataclass
class _Served:
    outputs: list[tuple[int, ...]]
    computed: int
    preemptions: int
    admitted: list[int]
    steps: int
    longest_wait: int


def _serve(work: Workload, policy: SchedulingPolicy) -> _Served:
    engine = make_engine(MODEL, work.num_pages, work.page_size, max_running=work.max_running, policy=policy)
    arrivals = sorted(enumerate(work.requests), key=lambda item: (item[1][2], item[0]))
    requests: list[EngineRequest] = [EngineRequest([0], 1)] * len(arrivals)
    admitted: list[int] = []
    step = 0
    while arrivals or engine.has_work():
        while arrivals and arrivals[0][1][2] <= step:
            index, (prompt, max_new, _) = arrivals.pop(0)
            requests[index] = engine.submit(EngineRequest(list(prompt), max_new))
        batch = engine.step()
        if batch is not None and batch.kind == "prefill":
            admitted += [requests.index(r) for r in batch.requests]
        step += 1
        if step > 2000:
            raise Mismatch(tr("the engine did not finish the workload within 2000 steps with your order."))
    return _Served(
        [tuple(r.output) for r in requests],
        engine.stats.prefill_tokens,
        engine.stats.preemptions,
        admitted,
        engine.stats.steps,
        max(r.waited_steps for r in requests),
    )


@lru_cache(maxsize=256)
def _reference_run(work: Workload, aging: bool) -> _Served:
    return _serve(work, Aging(work.tokens_per_step) if aging else LongestPrefixMatch())


def _check_engine(fn: _F, work: Workload, aging: bool) -> None:
    yours = _Yours(fn, (work.tokens_per_step,) if aging else ())
    expected = _reference_run(work, aging)
    got = _serve(work, yours)
    for index, (prompt, max_new, _) in enumerate(work.requests):
        wanted = _recompute(prompt, max_new)
        if got.outputs[index] != wanted:
            raise Mismatch(
                tr(
                    "request {index}'s output differs from a recompute from scratch: a policy must only reorder "
                    "the queue, never change what a request generates.",
                    index=index,
                ),
                repr(list(wanted)),
                repr(list(got.outputs[index])),
            )
    name = "Aging" if aging else "LongestPrefixMatch"
    if got.admitted != expected.admitted:
        where, exp_text, got_text = diff(expected.admitted, got.admitted)
        raise Mismatch(
            tr(
                "the engine admitted the requests in another order than with minikv's {name} ({where}); "
                "listed: the request numbers, in the order of their admissions (a preempted one comes again).",
                name=name,
                where=where,
            ),
            exp_text,
            got_text,
        )
    if expected.computed != got.computed:
        raise Mismatch(
            tr("the engine's prompt tokens computed differ from minikv's {name} on this workload.", name=name),
            str(expected.computed),
            str(got.computed),
        )
    if expected.preemptions != got.preemptions:
        raise Mismatch(
            tr("the engine's preemptions differ from minikv's {name} on this workload.", name=name),
            str(expected.preemptions),
            str(got.preemptions),
        )


def _draw_workload(rng: random.Random, size: int) -> Workload:
    """A course workload, shrunk to the tiny model: few shared prefixes, short prompts, spread arrivals."""
    n = rng.randint(2, 3 + size // 2)
    seed = rng.randrange(10**6)
    shape = rng.choice(("system", "few_shot", "chat"))
    if shape == "system":
        prompts = workloads.shared_system_prompt(
            n, rng.randint(1, 3), rng.randint(2, 10), (1, 4), vocab_size=VOCAB, seed=seed
        )
    elif shape == "few_shot":
        prompts = workloads.few_shot(n, rng.randint(1, 2), rng.randint(1, 5), 4, 2, (1, 4), (1, 3), VOCAB, seed)
    else:
        prompts = workloads.multi_turn_chat(max(1, n // 3), 3, rng.randint(1, 6), (1, 3), (1, 3), VOCAB, seed)
    requests = tuple(
        (tuple(int(t) for t in p[:40]), rng.randint(1, 4), rng.choice((0, 0, rng.randint(0, 6)))) for p in prompts
    )
    page_size = rng.choice((1, 1, 2))
    longest = max(len(p) + m for p, m, _ in requests)
    fewest = -(-longest // page_size) + 1
    return Workload(
        "random",
        requests,
        page_size,
        rng.randint(fewest, fewest + 40 // page_size),
        rng.randint(1, 3),
        rng.choice((0.5, 1.0, 2.0)),
    )


def _shrink_workload(work: Workload) -> list[Workload]:
    r = dataclasses.replace
    out = [r(work, requests=reqs) for reqs in shrink_tuple(work.requests, 1)]
    out += [r(work, max_running=m) for m in shrink_int(work.max_running, 1)]
    out += [r(work, page_size=1)] if work.page_size > 1 else []
    for i, (prompt, max_new, arrival) in enumerate(work.requests):
        for m in shrink_int(max_new, 1):
            out.append(r(work, requests=(*work.requests[:i], (prompt, m, arrival), *work.requests[i + 1 :])))
    return out


def _run_workload(fn: _F, work: Workload, aging: bool) -> None:
    longest = max(len(p) + m for p, m, _ in work.requests)
    if work.num_pages * work.page_size < longest + work.page_size:
        raise Invalid
    _check_engine(fn, work, aging)


def _show_workload(work: Workload, aging: bool = False) -> str:
    lines = [
        tr(
            "{n} requests, page_size {page_size}, {num_pages} pages, max_running {max_running}",
            n=len(work.requests),
            page_size=work.page_size,
            num_pages=work.num_pages,
            max_running=work.max_running,
        )
        + (f", tokens_per_step {work.tokens_per_step:g}" if aging else "")
    ]
    lines += [
        tr("request {i}: prompt {prompt}, {m} new tokens, arrives at step {a}", i=i, prompt=list(p), m=m, a=a)
        for i, (p, m, a) in enumerate(work.requests)
    ]
    return "\n".join(lines)


# -- scheduling.cached_prefix_len --------------------------------------------------------------------


@exercise(
    "scheduling.cached_prefix_len", lambda: tr("how much of a request admission would find cached, changing nothing")
)
def _prefix_cases() -> list[Case]:
    def make(desc: str, page_size: int, served: tuple[Prompt, ...], ids: Prompt) -> Case:
        return Case(desc, len(ids), lambda fn: _check_prefix(fn, page_size, served, ids))

    settings = [
        (tr("an empty tree: nothing is cached"), 1, (), (1, 2, 3)),
        (tr("a one-token prompt: there is nothing before its last token"), 1, ((1, 2),), (1,)),
        (tr("the first 3 tokens are cached"), 1, ((1, 2, 3, 9),), (1, 2, 3, 4, 5)),
        (tr("the whole prompt is cached: its last token is computed anyway"), 1, ((1, 2, 3, 4),), (1, 2, 3, 4)),
        (tr("a longer prompt than any cached one"), 1, ((5, 6),), (5, 6, 7, 8)),
        (tr("the match ends inside a node (the tree holds [1, 2, 3, 4, 5])"), 1, ((1, 2, 3, 4, 5),), (1, 2, 9)),
        (tr("two branches: the longer one matches"), 1, ((1, 2, 3), (1, 2, 7, 7, 7)), (1, 2, 7, 7, 8)),
        (tr("page_size 4: only whole pages count (6 shared tokens match 4)"), 4, ((1, 2, 3, 4, 5, 6, 7, 8),),
         (1, 2, 3, 4, 5, 6, 0, 0, 0)),
        (tr("page_size 2: the whole prompt is cached, an odd length"), 2, ((3, 3, 3, 3, 3, 3),), (3, 3, 3, 3, 3)),
    ]  # fmt: skip

    def draw(rng: random.Random, size: int) -> tuple[int, tuple[Prompt, ...], Prompt]:
        queue = _draw_queue(rng, size)
        waiting = queue.waiting or (Waiting((1,)),)
        w = rng.choice(waiting)
        return queue.page_size, queue.served, w.prompt + w.output

    def shrink(value: tuple[int, tuple[Prompt, ...], Prompt]) -> list[tuple[int, tuple[Prompt, ...], Prompt]]:
        ps, served, ids = value
        out = [(ps, s, ids) for s in shrink_tuple(served)]
        out += [(ps, served, ids[:n]) for n in range(1, len(ids))]
        return out + ([(1, served, ids)] if ps > 1 else [])

    def show(value: tuple[int, tuple[Prompt, ...], Prompt]) -> str:
        ps, served, ids = value
        return tr(
            "page_size {page_size}; the tree holds what serving {served} left; ids {ids}",
            page_size=ps,
            served=[list(p) for p in served],
            ids=list(ids),
        )

    return [make(*s) for s in settings] + [
        random_case(
            tr("24 random trees and prompts: partial nodes, whole prompts cached, page sizes 1, 2 and 4"),
            Draw(draw, lambda fn, v: _check_prefix(fn, *v), show, shrink, lambda v: len(v[2])),
            seed=2300,
            max_size=16,
        )
    ]


def _check_prefix(fn: _F, page_size: int, served: tuple[Prompt, ...], ids: Prompt) -> None:
    cache, _ = _build(Queue(page_size, served, ()))
    array = np.array(ids, dtype=np.int64)
    expected = cached_prefix_len(cache, array)
    before = TreeSnapshot.of(cache)
    got = call(fn, cache, array)
    _expect_same_tree(before, cache)
    if not np.array_equal(array, np.array(ids, dtype=np.int64)):
        raise Mismatch(tr("your function changed `ids`; read it without writing to it."))
    got = expect_int(tr("the cached length"), got)
    if got != expected:
        hint = ""
        if got == cache.find(array)[1]:
            hint = tr(
                " (that is the match of all of `ids`: admission matches `ids[:-1]`, the last token is always computed)"
            )
        elif got > expected and got - got % page_size == expected:
            hint = tr(" (only whole pages of {page_size} tokens are matched)", page_size=page_size)
        raise Mismatch(tr("the cached length is wrong{hint}.", hint=hint), str(expected), str(got))


# -- scheduling.lpm_order -----------------------------------------------------------------------------


_TREE = ((1, 2, 3, 4, 5, 6), (1, 2, 3, 7), (8, 8, 8))


def _queue_cases(aging: bool) -> list[Case]:
    W = Waiting
    settings = [
        (tr("an empty queue: return an empty list"), Queue(1, _TREE, ())),
        (tr("one request, nothing cached"), Queue(1, (), (W((1, 2)),))),
        (tr("three requests that match nothing keep their order"), Queue(1, _TREE, (W((9, 1)), W((7,)), W((9, 9, 9))))),
        (tr("matches 0, 5 and 3: the longest first"),
         Queue(1, _TREE, (W((9, 9)), W((1, 2, 3, 4, 5, 9)), W((1, 2, 3, 9, 9))))),
        (tr("ties keep their order in `waiting` (two requests match 3, two match nothing)"),
         Queue(1, _TREE, (W((5, 5)), W((1, 2, 3, 0)), W((6,)), W((1, 2, 3, 9, 9)), W((8, 8, 8, 1))))),
        (tr("a request whose whole prompt is cached matches all but its last token: a tie"),
         Queue(1, _TREE, (W((1, 2, 3, 4, 9)), W((1, 2, 3, 4, 5))))),
        (tr("a preempted request: its prompt and generated tokens are matched"),
         Queue(1, _TREE, (W((1, 2, 3), output=(4, 5, 6, 0)), W((1, 2, 3, 4, 9))))),
        (tr("a preempted request at the front of the queue arrived last: ties keep queue order, not arrival order"),
         Queue(1, _TREE, (W((9,)), W((1, 2, 3, 7, 1), output=(2,)), W((1, 2, 3, 7, 2)), W((7,), output=(7,))))),
        (tr("page_size 4: matches count whole pages, so 5 and 6 cached tokens tie"),
         Queue(4, ((1, 2, 3, 4, 5, 6, 7, 8),),
               (W((1, 2, 3, 4, 5, 0)), W((1, 2, 3, 4, 5, 6, 0)), W((1, 2, 3, 4, 5, 6, 7, 8, 9))))),
    ]  # fmt: skip
    if aging:
        settings += [
            (tr("a request that waited 6 steps outranks a 5-token match (tokens_per_step 1)"),
             Queue(1, _TREE, (W((1, 2, 3, 4, 5, 9)), W((9, 9), waited=6)))),
            (tr("tokens_per_step 0.5: waiting 6 steps is worth 3 cached tokens, a tie with a 3-token match"),
             Queue(1, _TREE, (W((1, 2, 3, 9)), W((9,), waited=6), W((1, 2, 3, 4, 5, 0))), tokens_per_step=0.5)),
        ]  # fmt: skip

    def make(desc: str, queue: Queue) -> Case:
        return Case(desc, len(queue.waiting), lambda fn: _check_order(fn, queue, aging))

    return [make(*s) for s in settings] + [
        random_case(
            tr(
                "24 random queues and trees: ties, no matches, whole prompts cached, preempted requests, page sizes, "
                "waiting times, tokens_per_step"
            )
            if aging
            else tr(
                "24 random queues and trees: ties, no matches, whole prompts cached, preempted requests, page sizes"
            ),
            Draw(
                _draw_queue,
                lambda fn, q: _check_order(fn, q, aging),
                lambda q: _show_queue(q, aging),
                _shrink_queue,
                lambda q: len(q.waiting),
            ),
            seed=2400 if not aging else 2500,
            max_size=14,
        )
    ]


_SYSTEM = tuple(range(1, 9))
_STARVING = (*(((*_SYSTEM, 20 + i), 2, i) for i in range(6)), ((30, 31, 30), 2, 1))
"""Requests sharing a system prompt arrive one per step; one that matches nothing arrives at step 1."""


def _engine_cases(aging: bool) -> list[Case]:
    settings = [
        Workload(tr("in the engine: two system prompts alternate, one request runs at a time"),
                 tuple(((*(_SYSTEM if i % 2 else _SYSTEM[::-1]), 20 + i), 3, 0) for i in range(6)),
                 num_pages=24, max_running=1),
        Workload(tr("in the engine: requests sharing a system prompt keep arriving, one matches nothing"),
                 _STARVING, num_pages=28, max_running=1, tokens_per_step=2.0),
        Workload(tr("in the engine, page_size 2: a pool so small that requests are preempted"),
                 tuple(((*_SYSTEM[: 4 + i % 3], 20 + i), 4, i // 2) for i in range(5)),
                 page_size=2, num_pages=9, max_running=3),
    ]  # fmt: skip

    def make(work: Workload) -> Case:
        return Case(
            work.description, 1000 + sum(len(p) for p, _, _ in work.requests), lambda fn: _check_engine(fn, work, aging)
        )

    return [make(w) for w in settings] + [
        random_case(
            tr(
                "8 random course workloads in the engine (shared system prompts, few-shot, chats): outputs equal "
                "recompute, and the tokens computed equal {policy}'s",
                policy="Aging" if aging else "LongestPrefixMatch",
            ),
            Draw(
                _draw_workload,
                lambda fn, w: _run_workload(fn, w, aging),
                lambda w: _show_workload(w, aging),
                _shrink_workload,
                lambda w: 1000 + sum(len(p) for p, _, _ in w.requests),
            ),
            seed=2600 if not aging else 2700,
            max_size=10,
            count=8,
            weight=2 * 10**6,
        )
    ]


@exercise("scheduling.lpm_order", lambda: tr("longest cached prefix first, ties in queue order, in the real engine"))
def _lpm_cases() -> list[Case]:
    return _queue_cases(aging=False) + _engine_cases(aging=False)


@exercise("scheduling.aging_order", lambda: tr("longest prefix first, with waiting counted as cached tokens"))
def _aging_cases() -> list[Case]:
    return _queue_cases(aging=True) + _engine_cases(aging=True)
