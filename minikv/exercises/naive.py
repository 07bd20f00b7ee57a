"""Checks for chapter 4's first half: a cache manager that caches nothing.

The learner's class is run through the same seven steps as any manager
(:func:`minikv.lifecycle.serve`), with a real page pool: a manager that lies
the wrong way about what is "already cached" leaks slots, and the pool shows it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from ..base import BaseCacheHandle
from ..errors import OutOfSlotsError
from ..language import tr
from ..lifecycle import serve
from ..page_pool import PagePool
from ._core import (
    Case,
    Draw,
    LearnerRaised,
    Mismatch,
    call,
    call_watching,
    exercise,
    expect_equal,
    expect_int,
    outcome,
    raised,
    random_case,
    short,
    shrink_tuple,
)

_F = Callable[..., object]
NAIVE_DRAWS = 1000
"""How many random request sequences the naive check draws: as many as keep it well under a second."""


def _make(fn: _F) -> Any:
    return call(fn, "cpu")


def _expect_empty_slots(what: str, got: object) -> None:
    if not isinstance(got, torch.Tensor):
        raise Mismatch(tr("{what} must return a tensor.", what=what), tr("an empty int32 tensor"), repr(got))
    if got.dtype != torch.int32 or got.shape != (0,) or got.device.type != "cpu":
        raise Mismatch(
            tr(
                "{what} must return an empty int32 tensor on the manager's device (slot indices are int32 everywhere).",
                what=what,
            ),
            "tensor([], dtype=torch.int32), shape (0,)",
            f"dtype {got.dtype}, shape {tuple(got.shape)}, device {got.device}",
        )


@exercise(
    "naive.manager",
    lambda: tr("NaiveCacheManager: the manager that caches nothing"),
)
def _naive_cases() -> list[Case]:
    def match_case(fn: _F) -> None:
        manager = _make(fn)
        for ids in ([1, 2, 3], [], list(range(50)), [2**40, 7, 2**62]):
            result = call_watching(manager.match_prefix, ("input_ids",), torch.tensor(ids, dtype=torch.int64))
            if not (isinstance(result, tuple) and len(result) == 2):
                raise Mismatch(
                    tr("match_prefix must return a pair (handle, indices)."), "(handle, indices)", repr(result)
                )
            handle, indices = result
            if not isinstance(handle, BaseCacheHandle):
                raise Mismatch(
                    tr("the handle must be a BaseCacheHandle (a NaiveCacheHandle)."),
                    "NaiveCacheHandle(cached_len=0)",
                    repr(handle),
                )
            expect_equal(tr("the handle's cached_len for {ids}", ids=ids), 0, handle.cached_len)
            _expect_empty_slots("match_prefix", indices)

    def lock_case(fn: _F) -> None:
        manager = _make(fn)
        handle, _ = call(manager.match_prefix, torch.tensor([4, 5], dtype=torch.int64))
        call(manager.lock_handle, handle)
        call(manager.lock_handle, handle, unlock=True)
        call(manager.lock_handle, handle, unlock=True)  # nothing was locked, and nothing can go wrong
        expect_equal(tr("size_info after locking"), (0, 0), tuple(call(lambda: manager.size_info)))

    def insert_case(fn: _F) -> None:
        manager = _make(fn)
        for n in (3, 0, 7):
            ids, slots = torch.arange(n) * 2**40, torch.randperm(n + 5)[:n].to(torch.int32)
            got = expect_int(
                tr("insert_prefix's result"), call_watching(manager.insert_prefix, ("input_ids", "indices"), ids, slots)
            )
            if got != n:
                raise Mismatch(
                    tr(
                        "insert_prefix of {n} tokens must return {n}: 'all of it was already cached', "
                        "so the caller frees indices[cached_len:already_cached], i.e. every slot it allocated.",
                        n=n,
                    ),
                    str(n),
                    str(got),
                )

    def insert_mismatch_case(fn: _F) -> None:
        manager = _make(fn)
        got, error = raised(manager.insert_prefix, torch.arange(3), torch.arange(2, dtype=torch.int32))
        if not isinstance(error, ValueError):
            raise Mismatch(
                tr("insert_prefix with 3 tokens but 2 slots must raise ValueError: the caller made a mistake."),
                "ValueError",
                outcome(error, got),
            )

    def evict_case(fn: _F) -> None:
        manager = _make(fn)
        _expect_empty_slots("evict(0)", call(manager.evict, 0))
        try:
            got = call(manager.evict, 1)
        except LearnerRaised:
            return  # any error will do: there is nothing to evict
        raise Mismatch(
            tr("evict(1) must raise: this manager holds nothing, so it cannot free anything."),
            tr("an exception"),
            repr(got),
        )

    def sizes_case(fn: _F) -> None:
        manager = _make(fn)
        info = call(lambda: manager.size_info)
        expect_equal(tr("size_info (evictable_size, protected_size)"), (0, 0), tuple(info))
        _expect_empty_slots("reset()", call(manager.reset))
        call(manager.check_integrity)

    def own_case(fn: _F) -> None:
        manager = _make(fn)
        calls: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("match_prefix", lambda: call(manager.match_prefix, torch.tensor([1, 2], dtype=torch.int64))[1]),
            ("evict(0)", lambda: call(manager.evict, 0)),
            ("reset()", lambda: call(manager.reset)),
        )
        for name, get in calls:
            mine = get()
            _expect_empty_slots(name, mine)
            mine.resize_(3).fill_(7)  # the caller's own tensor: it may grow it and write into it
            for other, get_again in calls:
                again = get_again()
                if not isinstance(again, torch.Tensor) or again.numel() != 0:
                    raise Mismatch(
                        tr(
                            "a caller resized the tensor {name} returned to it and wrote 7s into it; after that, "
                            "{other} returned that caller's values: every tensor a method returns must be the "
                            "caller's own, a new one each time, never one tensor kept and handed out again.",
                            name=name,
                            other=other,
                        ),
                        "tensor([], dtype=torch.int32)",
                        short(again),
                    )

    def device_case(fn: _F) -> None:
        devices: list[Any] = ["cpu", torch.device("cpu"), "cpu:0", torch.device("cpu", 0)]
        if torch.cuda.is_available():
            devices += ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0)]
        for device in devices:
            manager = call(fn, device)
            wanted = torch.device(device).type
            results = (
                ("match_prefix", call(manager.match_prefix, torch.tensor([1, 2], dtype=torch.int64))[1]),
                ("evict(0)", call(manager.evict, 0)),
                ("reset()", call(manager.reset)),
            )
            for name, got in results:
                if not isinstance(got, torch.Tensor) or got.device.type != wanted:
                    raise Mismatch(
                        tr(
                            "a manager made with device={device}: {name} must return its empty tensor on that "
                            "device (the caller concatenates it with slots on that device).",
                            device=repr(device),
                            name=name,
                        ),
                        tr("a tensor on {device}", device=wanted),
                        tr("a tensor on {device}", device=got.device) if isinstance(got, torch.Tensor) else repr(got),
                    )

    def serve_case(prompts: list[list[int]], num_pages: int) -> Callable[[_F], None]:
        def run(fn: _F) -> None:
            manager = _make(fn)
            pool = PagePool(num_pages)
            for number, prompt in enumerate(prompts, 1):
                try:
                    request = call(serve, manager, pool, prompt)
                except LearnerRaised as learner:
                    if isinstance(learner.error, OutOfSlotsError):
                        raise Mismatch(
                            tr(
                                "request {number} found the pool out of slots: "
                                "the earlier requests' slots were never given back.",
                                number=number,
                            ),
                            tr("{n} free pages before each request", n=num_pages),
                            tr("{n} free pages", n=pool.num_free_pages),
                        ) from None
                    raise
                expect_equal(tr("the cached_len of request {number}", number=number), 0, request.cached_len)
                if pool.num_free_pages != num_pages:
                    raise Mismatch(
                        tr(
                            "after request {number} finished, {n} slots were never given back: "
                            "finish frees indices[cached_len:already_cached], "
                            "so insert_prefix must return len(indices).",
                            number=number,
                            n=num_pages - pool.num_free_pages,
                        ),
                        tr("{n} free pages", n=num_pages),
                        tr("{n} free pages", n=pool.num_free_pages),
                    )

        return run

    def draw(rng: random.Random, size: int) -> tuple[tuple[tuple[int, ...], ...], int]:
        prompts = tuple(
            tuple(rng.randrange(2**40) if rng.random() < 0.3 else rng.randrange(3) for _ in range(rng.randint(1, size)))
            for _ in range(rng.randint(1, 2 + size // 2))
        )
        return prompts, max(len(p) for p in prompts) + rng.randint(0, 2)

    def short_pool(rng: random.Random, size: int) -> tuple[tuple[tuple[int, ...], ...], int]:
        """A pool of exactly the pages the longest prompt needs: nothing may stay allocated between requests."""
        prompts, _ = draw(rng, size)
        return prompts, max(len(p) for p in prompts)

    def shrink(value: tuple[tuple[tuple[int, ...], ...], int]) -> list[tuple[tuple[tuple[int, ...], ...], int]]:
        prompts, pages = value
        return [(p, pages) for p in shrink_tuple(prompts, 1)]

    return [
        Case(tr("match_prefix always returns an empty match: cached_len 0 and an empty int32 tensor"), 1, match_case),
        Case(tr("lock_handle and unlocking accept the handle and do nothing"), 1, lock_case),
        Case(tr("insert_prefix claims everything is already cached: it returns len(indices)"), 3, insert_case),
        Case(tr("insert_prefix with 3 tokens and 2 slots raises ValueError"), 3, insert_mismatch_case),
        Case(tr("evict(0) returns an empty int32 tensor; evict(1) raises"), 1, evict_case),
        Case(tr("size_info is (0, 0), reset() returns an empty int32 tensor, check_integrity() passes"), 1, sizes_case),
        Case(tr("every empty tensor returned is the caller's own: resizing one changes no later result"), 1, own_case),
        Case(
            tr("the device given as a string or a torch.device, with or without an index: tensors land on it"),
            1,
            device_case,
        ),
        Case(
            tr("three requests through the seven steps leak no slot"),
            12,
            serve_case([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9]], 16),
        ),
        Case(
            tr("requests that each fill the whole pool still fit, one after another"),
            16,
            serve_case([[1, 2, 3, 4]] * 4, 4),
        ),
        random_case(
            tr(
                "{n} random request sequences through the seven steps, token ids up to 2^40, "
                "pools just large enough (many exactly as large as the longest prompt)",
                n=NAIVE_DRAWS,
            ),
            Draw(
                draw,
                lambda fn, v: serve_case([list(p) for p in v[0]], v[1])(fn),
                lambda v: tr("{pages} pages, prompts {prompts}", pages=v[1], prompts=[list(p) for p in v[0]]),
                shrink,
                lambda v: sum(map(len, v[0])),
                classes=((tr("a pool of exactly the longest prompt's pages"), short_pool),),
            ),
            seed=1600,
            max_size=12,
            count=NAIVE_DRAWS,
        ),
    ]
