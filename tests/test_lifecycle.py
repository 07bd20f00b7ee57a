"""The request lifecycle (``admit``, ``store``, ``finish``, ``serve``): the notes' seven steps, done right.

The two properties that matter: every slot is always in exactly one place (free,
in the tree, or held by a running request), and a request frees only the
duplicates ``indices[cached_len:already_cached]`` -- never the tree's own slots.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_pages_accounted, cache_snapshot, manager_snapshot, pool_snapshot, tree_entries, tree_slots

from minikv import (
    KVCacheLayout,
    MHAKVCache,
    NaiveCacheManager,
    PagePool,
    RadixCacheManager,
    Request,
    SizeInfo,
    admit,
    finish,
    serve,
)
from minikv.base import BaseCacheManager
from minikv.errors import ArgumentError, ArgumentTypeError, LockError, OutOfSlotsError
from minikv.lifecycle import Step, abort, slots_to_free, store

HEADS, HEAD_DIM, LAYERS = 2, 3, 2


def accounted(manager: BaseCacheManager, pool: PagePool, running: list[Request]) -> None:
    manager.check_integrity()
    holders = {"tree": tree_slots(manager) if isinstance(manager, RadixCacheManager) else []}
    holders.update({f"request {i}": r.own_slots().tolist() for i, r in enumerate(running)})
    assert_pages_accounted(pool, holders)


def kv_rows(tag: float):
    """A kv_fn whose rows encode (tag, layer, token id, position), so a stored row says who wrote it."""

    def kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, len(input_ids), dtype=torch.float32)
        base = tag * 1000 + layer * 100 + input_ids[start:].float() + positions / 100
        k = base[:, None, None].expand(-1, HEADS, HEAD_DIM).clone()
        return k, -k

    return kv_fn


def small_cache(num_pages: int, page_size: int = 1) -> MHAKVCache:
    return MHAKVCache(HEADS, LAYERS, HEAD_DIM, num_pages, torch.float32, KVCacheLayout.LayerFirst, "cpu", page_size)


def row(cache: MHAKVCache, layer: int, slot: int) -> float:
    ps = cache.page_size
    return float(cache.k_cache(layer)[slot // ps, slot % ps, 0, 0])


# -- admit ----------------------------------------------------------------------


def test_admit_matches_locks_and_allocates() -> None:
    manager, pool = RadixCacheManager(), PagePool(8)
    serve(manager, pool, [1, 2, 3])
    request = admit(manager, pool, [1, 2, 3, 4, 5])
    assert request.cached_len == 3 and not request.finished and request.already_cached is None
    assert request.indices.tolist() == [0, 1, 2, 3, 4]
    assert request.own_slots().tolist() == [3, 4]
    assert request.input_ids.tolist() == [1, 2, 3, 4, 5]
    assert manager.size_info == SizeInfo(evictable_size=0, protected_size=3)
    assert [(s.number, s.name) for s in request.trace] == [(1, "match_prefix"), (2, "lock_handle"), (3, "allocate")]
    assert request.trace[0].detail == "3 of 5 tokens cached"
    assert request.evicted == 0
    accounted(manager, pool, [request])


def test_admit_evicts_unlocked_prefixes_when_the_pool_runs_short() -> None:
    manager, pool = RadixCacheManager(), PagePool(5)
    serve(manager, pool, [1, 2])
    serve(manager, pool, [3, 4])
    request = admit(manager, pool, [3, 4, 5, 6, 7])  # matches [3, 4] and needs 3 slots; 1 is free
    assert request.cached_len == 2 and request.evicted == 2
    assert "after evicting 2" in request.trace[2].detail
    assert manager.match_prefix([1, 2])[0].cached_len == 0
    accounted(manager, pool, [request])


def test_admit_that_cannot_allocate_releases_its_lock_and_keeps_the_cache() -> None:
    manager, pool = RadixCacheManager(), PagePool(4)
    serve(manager, pool, [1, 2, 3])
    entries_before = {k: e.slots for k, e in tree_entries(manager).items()}
    pool_before, sizes_before = pool_snapshot(pool), manager.size_info
    with pytest.raises(OutOfSlotsError):
        admit(manager, pool, [1, 2, 3, 4, 5, 6, 7, 8])  # 5 new slots needed; 1 free, the rest locked by the match
    assert manager.size_info == sizes_before  # the match's lock was released
    assert {k: e.slots for k, e in tree_entries(manager).items()} == entries_before
    assert pool_snapshot(pool) == pool_before
    accounted(manager, pool, [])


def test_admit_refuses_a_pool_with_another_page_size() -> None:
    manager, pool = RadixCacheManager(page_size=2), PagePool(4, page_size=1)
    before = (manager_snapshot(manager), pool_snapshot(pool))
    with pytest.raises(ArgumentError, match="pool"):
        admit(manager, pool, [1, 2])
    assert (manager_snapshot(manager), pool_snapshot(pool)) == before


# -- store ----------------------------------------------------------------------


def test_store_writes_only_the_requests_own_slots_in_every_layer() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    first = serve(manager, pool, [5, 6, 7], cache, kv_rows(tag=1))
    second = admit(manager, pool, [5, 6, 7, 8])
    store(second, cache, kv_rows(tag=2))
    for layer in range(LAYERS):
        # The shared prefix keeps what request 1 wrote; only token 8 was written by request 2.
        for pos, slot in enumerate(first.indices.tolist()):
            assert row(cache, layer, slot) == pytest.approx(1000 + layer * 100 + [5, 6, 7][pos] + pos / 100)
        assert row(cache, layer, second.indices[3].item()) == pytest.approx(2000 + layer * 100 + 8 + 3 / 100)
        slot = second.indices[3].item()
        assert torch.equal(cache.v_cache(layer)[slot], -cache.k_cache(layer)[slot])
    assert second.trace[-1].detail == f"1 tokens x {LAYERS} layers"
    finish(manager, pool, second)


def test_store_with_the_whole_prompt_matched_writes_nothing() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [5, 6], cache, kv_rows(tag=1))
    request = admit(manager, pool, [5, 6], whole_prompt=True)  # the notes' match: every token
    before = cache_snapshot(cache)
    store(request, cache, kv_rows(tag=2))
    assert torch.equal(cache.kv_buffer, before)
    assert request.trace[-1].detail == "nothing to store: every token was cached"
    finish(manager, pool, request)


def test_store_into_a_paged_cache() -> None:
    manager, pool, cache = RadixCacheManager(page_size=2), PagePool(4, page_size=2), small_cache(4, page_size=2)
    request = serve(manager, pool, [5, 6, 7], cache, kv_rows(tag=3))
    for pos, slot in enumerate(request.indices.tolist()):
        assert row(cache, 1, slot) == pytest.approx(3000 + 100 + [5, 6, 7][pos] + pos / 100)


# -- finish ---------------------------------------------------------------------


def test_finish_inserts_frees_duplicates_and_unlocks() -> None:
    manager, pool = RadixCacheManager(), PagePool(8)
    request = admit(manager, pool, [1, 2, 3])
    assert finish(manager, pool, request) == 0
    assert request.finished and request.already_cached == 0
    assert [s.number for s in request.trace] == [1, 2, 3, 4, 5, 7]
    assert manager.size_info == SizeInfo(3, 0)
    assert manager.match_prefix([1, 2, 3])[1].tolist() == request.indices.tolist()
    accounted(manager, pool, [])


def test_concurrent_identical_requests_keep_one_copy() -> None:
    manager, pool = RadixCacheManager(), PagePool(8)
    a = admit(manager, pool, [1, 2, 3])
    b = admit(manager, pool, [1, 2, 3])  # scheduled before a finished: no hit, its own slots
    assert b.cached_len == 0 and set(a.indices.tolist()).isdisjoint(b.indices.tolist())
    finish(manager, pool, a)
    assert finish(manager, pool, b) == 3  # all of b's slots were duplicates and are freed
    assert pool.num_free_pages == 5
    assert sorted(tree_slots(manager)) == sorted(a.indices.tolist())
    accounted(manager, pool, [])


def test_finish_frees_from_cached_len_not_from_zero() -> None:
    # The notes free indices[:already_cached]; that would free the tree's own slots [0, 1].
    manager, pool = RadixCacheManager(), PagePool(16)
    serve(manager, pool, [1, 2])
    a = admit(manager, pool, [1, 2, 3, 4])
    b = admit(manager, pool, [1, 2, 3, 4, 5])
    assert a.cached_len == b.cached_len == 2
    finish(manager, pool, a)
    free_before = pool.num_free_pages
    assert finish(manager, pool, b) == 4  # b's slots for [3, 4] are duplicates now
    assert pool.num_free_pages == free_before + 2
    assert manager.match_prefix([1, 2, 3, 4, 5])[1].tolist() == [*a.indices.tolist(), b.indices[4].item()]
    accounted(manager, pool, [])


def test_paged_finish_frees_the_partial_last_page() -> None:
    manager, pool = RadixCacheManager(page_size=4), PagePool(4, page_size=4)
    request = admit(manager, pool, list(range(6)))
    assert pool.num_free_pages == 2
    assert finish(manager, pool, request) == 0
    assert manager.size_info == SizeInfo(4, 0)  # one whole page cached
    assert pool.num_free_pages == 3  # the half-used page came back
    assert "2-token partial page" in request.trace[4].detail
    accounted(manager, pool, [])


def test_finishing_twice_is_refused_and_changes_nothing() -> None:
    manager, pool = RadixCacheManager(), PagePool(8)
    request = serve(manager, pool, [1, 2])
    before = (manager_snapshot(manager), pool_snapshot(pool), len(request.trace))
    with pytest.raises(LockError, match="request"):
        finish(manager, pool, request)
    assert (manager_snapshot(manager), pool_snapshot(pool), len(request.trace)) == before


def test_requests_finish_in_any_order() -> None:
    manager, pool = RadixCacheManager(), PagePool(32)
    prompts = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3, 6], [7]]
    running = [admit(manager, pool, p) for p in prompts]
    for index in (3, 0, 4, 1, 2):
        request = running[index]
        finish(manager, pool, request)
        accounted(manager, pool, [r for r in running if not r.finished])
    assert manager.size_info.protected_size == 0
    for prompt in prompts:
        assert manager.match_prefix(prompt)[0].cached_len == len(prompt)


# -- serve ----------------------------------------------------------------------


def test_serve_runs_the_steps_in_server_order() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    request = serve(manager, pool, [1, 2, 3], cache, kv_rows(tag=1))
    assert [s.number for s in request.trace] == [1, 2, 3, 6, 4, 5, 7]
    assert request.finished


def test_serve_with_the_naive_manager_returns_every_slot() -> None:
    manager, pool = NaiveCacheManager(), PagePool(4)
    for _ in range(3):
        request = serve(manager, pool, [1, 2, 3])
        assert request.cached_len == 0 and request.already_cached == 3
        assert pool.num_free_pages == 4
    assert manager.size_info == SizeInfo(0, 0)


def test_serve_refuses_a_cache_without_kv_fn_before_admitting() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [1, 2])
    before = (manager_snapshot(manager), pool_snapshot(pool), cache_snapshot(cache))
    with pytest.raises(ArgumentError, match="kv_fn"):
        serve(manager, pool, [1, 2, 3], cache)
    after = (manager_snapshot(manager), pool_snapshot(pool), cache_snapshot(cache))
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_a_device_named_two_ways_is_one_device() -> None:
    # "cpu:0" and "cpu" (like "cuda" and "cuda:0" on a GPU) must not trip the managers' device checks.
    manager, pool = RadixCacheManager(device="cpu:0"), PagePool(8, device="cpu")
    serve(manager, pool, [1, 2, 3])
    request = serve(manager, pool, [1, 2, 4])
    assert request.cached_len == 2
    naive_pool = PagePool(4, device="cpu:0")
    serve(NaiveCacheManager(device="cpu"), naive_pool, [1, 2])
    assert naive_pool.num_free_pages == 4
    accounted(manager, pool, [])


# -- a server computes at least one token -------------------------------------------


def test_admit_matches_all_but_the_last_token() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    first = serve(manager, pool, [1, 2, 3], cache, kv_rows(tag=1))
    request = admit(manager, pool, [1, 2, 3])  # cached whole, yet the last token is computed
    assert request.cached_len == 2 and request.trace[0].detail == "2 of 3 tokens cached"
    assert request.indices[:2].tolist() == first.indices[:2].tolist() and len(request.own_slots()) == 1
    store(request, cache, kv_rows(tag=2))
    assert request.trace[-1].detail == f"1 tokens x {LAYERS} layers"
    assert finish(manager, pool, request) == 3  # its slot for token 3 was a duplicate...
    assert pool.num_free_pages == 5  # ...and went back to the pool
    assert "freed 1 duplicate slots" in request.trace[5].detail
    accounted(manager, pool, [])


def test_whole_prompt_matches_every_cached_token_as_the_notes_do() -> None:
    manager, pool = RadixCacheManager(), PagePool(8)
    serve(manager, pool, [1, 2, 3])
    request = admit(manager, pool, [1, 2, 3], whole_prompt=True)
    assert request.cached_len == 3 and len(request.own_slots()) == 0
    assert finish(manager, pool, request) == 3
    assert serve(manager, pool, [1, 2, 3], whole_prompt=True).cached_len == 3
    accounted(manager, pool, [])


@pytest.mark.parametrize(("prompt_len", "server", "whole"), [(8, 4, 8), (9, 8, 8), (5, 4, 4), (4, 0, 4)])
def test_the_server_match_stops_at_the_last_whole_page_before_the_last_token(
    prompt_len: int, server: int, whole: int
) -> None:
    manager, pool = RadixCacheManager(page_size=4), PagePool(8, page_size=4)
    serve(manager, pool, list(range(prompt_len)))
    assert admit(manager, pool, list(range(prompt_len))).cached_len == server
    assert admit(manager, pool, list(range(prompt_len)), whole_prompt=True).cached_len == whole


def test_an_empty_prompt_matches_nothing_and_holds_nothing() -> None:
    manager, pool = RadixCacheManager(), PagePool(4)
    serve(manager, pool, [1, 2])
    request = admit(manager, pool, [])
    assert request.cached_len == 0 and request.indices.numel() == 0
    assert finish(manager, pool, request) == 0
    accounted(manager, pool, [])


# -- the trace ----------------------------------------------------------------------


def test_the_trace_is_recorded_as_each_step_happens() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    request = admit(manager, pool, [1, 2, 3])
    assert all(isinstance(step, Step) for step in request.trace) and len(request.trace) == 3
    store(request, cache, kv_rows(tag=1))
    assert [s.number for s in request.trace] == [1, 2, 3, 6]
    finish(manager, pool, request)
    assert [(s.number, s.name) for s in request.trace] == [
        (1, "match_prefix"), (2, "lock_handle"), (3, "allocate"), (6, "store_kv"),
        (4, "insert_prefix"), (5, "free"), (7, "unlock"),
    ]  # fmt: skip


# -- the request owns its prompt ------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_refilling_the_callers_buffer_before_finish_changes_nothing(kind: str) -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    buffer = np.array([1, 2, 3], dtype=np.int64)
    ids = buffer if kind == "numpy" else torch.from_numpy(buffer)
    request = admit(manager, pool, ids)
    buffer[:] = [7, 8, 9]  # the caller reuses its buffer for the next prompt
    store(request, cache, kv_rows(tag=1))
    finish(manager, pool, request)
    assert request.input_ids.tolist() == [1, 2, 3]
    assert manager.match_prefix([1, 2, 3])[0].cached_len == 3
    assert manager.match_prefix([7, 8, 9])[0].cached_len == 0
    for pos, slot in enumerate(request.indices.tolist()):  # the K/V of tokens 1, 2, 3, not 7, 8, 9
        assert row(cache, 0, slot) == pytest.approx(1000 + [1, 2, 3][pos] + pos / 100)
    with pytest.raises(ValueError, match="read-only"):
        request.input_ids[0] = 5


def test_uint64_ids_that_do_not_fit_int64_are_refused() -> None:
    manager, pool = RadixCacheManager(), PagePool(4)
    before = (manager_snapshot(manager), pool_snapshot(pool))
    with pytest.raises(ArgumentError, match="input_ids"):
        admit(manager, pool, np.array([2**63, 1], dtype=np.uint64))
    assert (manager_snapshot(manager), pool_snapshot(pool)) == before
    assert admit(manager, pool, np.array([2**63 - 1], dtype=np.uint64)).input_ids.tolist() == [2**63 - 1]


# -- refused calls change nothing -----------------------------------------------------


def world_state(manager: RadixCacheManager, pool: PagePool, cache: MHAKVCache, *requests: Request) -> object:
    return (
        manager_snapshot(manager),
        pool_snapshot(pool),
        cache_snapshot(cache).tolist(),
        [(r.indices.tolist(), r.already_cached, r.aborted, list(r.trace)) for r in requests],
    )


def test_store_refuses_a_finished_or_aborted_request() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    done = serve(manager, pool, [1, 2, 3], cache, kv_rows(tag=1))
    dropped = admit(manager, pool, [4, 5])
    abort(manager, pool, dropped)
    other = serve(manager, pool, [6, 7], cache, kv_rows(tag=2))  # now holds the slots dropped gave back
    assert set(other.indices.tolist()) & set(dropped.own_slots().tolist())
    before = world_state(manager, pool, cache, done, dropped)
    for request, reason in ((done, "finished"), (dropped, "aborted")):
        with pytest.raises(LockError, match=f"request: {'already ' if reason == 'finished' else ''}{reason}"):
            store(request, cache, kv_rows(tag=3))
        assert world_state(manager, pool, cache, done, dropped) == before


def test_finish_with_another_manager_or_pool_is_refused_before_anything_changes() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [1, 2], cache, kv_rows(tag=1))
    request = admit(manager, pool, [1, 2, 3, 4])
    wrong_manager, wrong_pool = RadixCacheManager(), PagePool(8)
    wrong_pool.allocate(4)
    others = (manager_snapshot(wrong_manager), pool_snapshot(wrong_pool))
    before = world_state(manager, pool, cache, request)
    for call, name in (
        (lambda: finish(wrong_manager, pool, request), "manager"),
        (lambda: finish(manager, wrong_pool, request), "pool"),
        (lambda: abort(manager, wrong_pool, request), "pool"),
        (lambda: finish(manager, PagePool(8, page_size=2), request), "pool"),
        (lambda: finish(manager, pool, "request"), "request"),  # type: ignore[arg-type]
    ):
        with pytest.raises((ArgumentError, ArgumentTypeError), match=name):
            call()
        assert world_state(manager, pool, cache, request) == before
        assert (manager_snapshot(wrong_manager), pool_snapshot(wrong_pool)) == others
    assert request.running
    assert finish(manager, pool, request) == 2  # the right pair still works
    accounted(manager, pool, [])


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda m, p: admit(None, p, [1]), ArgumentTypeError, "manager"),  # type: ignore[arg-type]
        (lambda m, p: admit(m, None, [1]), ArgumentTypeError, "pool"),  # type: ignore[arg-type]
        (lambda m, p: admit(m, p, None), ArgumentTypeError, "input_ids"),  # type: ignore[arg-type]
        (lambda m, p: admit(m, p, [1], whole_prompt=1), ArgumentTypeError, "whole_prompt"),  # type: ignore[arg-type]
        (lambda m, p: serve(m, p, [1], kv_cache=object(), kv_fn=kv_rows(1)), ArgumentTypeError, "kv_cache"),  # type: ignore[arg-type]
        (lambda m, p: serve(m, p, [1], kv_cache=small_cache(4), kv_fn=3), ArgumentTypeError, "kv_fn"),  # type: ignore[arg-type]
    ],
)
def test_bad_lifecycle_arguments_name_themselves_and_change_nothing(call, error: type, name: str) -> None:  # type: ignore[no-untyped-def]
    manager, pool = RadixCacheManager(), PagePool(4)
    serve(manager, pool, [1, 2])
    before = (manager_snapshot(manager), pool_snapshot(pool))
    with pytest.raises(error, match=name):
        call(manager, pool)
    assert (manager_snapshot(manager), pool_snapshot(pool)) == before


# -- failures half-way: nothing leaks -------------------------------------------------


def failing_kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    if layer == 1:
        raise RuntimeError("the forward pass failed")
    return kv_rows(tag=9)(layer, input_ids, start)


def wrong_shape_kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv_rows(tag=9)(layer, input_ids, start)
    return k[:, :1], v[:, :1]


@pytest.mark.parametrize(("kv_fn", "error"), [(failing_kv_fn, RuntimeError), (wrong_shape_kv_fn, ArgumentError)])
def test_serve_failing_in_the_store_step_gives_back_its_slots_and_its_lock(kv_fn, error: type) -> None:  # type: ignore[no-untyped-def]
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [1, 2], cache, kv_rows(tag=1))
    entries = {k: e.slots for k, e in tree_entries(manager).items()}
    free_before = pool.num_free_pages
    with pytest.raises(error):
        serve(manager, pool, [1, 2, 3, 4], cache, kv_fn)
    assert manager.size_info == SizeInfo(evictable_size=2, protected_size=0)  # unlocked
    assert pool.num_free_pages == free_before  # its two new slots came back
    assert {k: e.slots for k, e in tree_entries(manager).items()} == entries  # nothing inserted
    accounted(manager, pool, [])
    manager.reset()  # possible only because nothing is locked


def test_a_failed_store_leaves_the_request_running_for_abort() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [1, 2], cache, kv_rows(tag=1))
    request = admit(manager, pool, [1, 2, 3, 4])
    with pytest.raises(RuntimeError):
        store(request, cache, failing_kv_fn)
    assert request.running and [s.number for s in request.trace] == [1, 2, 3]
    accounted(manager, pool, [request])
    abort(manager, pool, request)
    assert request.aborted and not request.running and not request.finished
    assert [(s.number, s.name) for s in request.trace[3:]] == [(5, "free"), (7, "unlock")]
    assert "freed its 2 own slots" in request.trace[3].detail
    assert manager.size_info == SizeInfo(2, 0) and pool.num_free_pages == 6
    accounted(manager, pool, [])
    before = (manager_snapshot(manager), pool_snapshot(pool))
    for again in (abort, finish):
        with pytest.raises(LockError, match="aborted"):
            again(manager, pool, request)
        assert (manager_snapshot(manager), pool_snapshot(pool)) == before


# -- the one rule for what a request frees ---------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "cached", "already", "page_size", "freed"),
    [
        (5, 2, 2, 1, []),  # nothing duplicated, no partial page
        (5, 2, 4, 1, [2, 3]),  # two duplicates, from cached_len (never the tree's first two)
        (5, 0, 5, 1, [0, 1, 2, 3, 4]),  # the naive manager: "everything was cached", all go back
        (10, 4, 4, 4, [8, 9]),  # the partial last page
        (10, 4, 8, 4, [4, 5, 6, 7, 8, 9]),  # a duplicated page and the partial page
        (8, 4, 8, 4, [4, 5, 6, 7]),  # whole pages only
        (3, 0, 0, 4, [0, 1, 2]),  # shorter than a page: the tree takes nothing
    ],
)
def test_slots_to_free_gives_back_what_the_tree_did_not_take(
    total: int, cached: int, already: int, page_size: int, freed: list[int]
) -> None:
    indices = torch.arange(total, dtype=torch.int32)
    assert slots_to_free(indices, cached, already, page_size).tolist() == freed


def test_slots_to_free_returns_pages_the_pool_takes_back() -> None:
    """Over every length, match and insert result: the tree's part, its own part and the freed part
    cover the request's slots once, and the pool takes the freed part back whole."""
    for page_size in (1, 2, 3, 4):
        for total in range(1, 13):
            for cached in range(0, total // page_size * page_size + 1, page_size):
                aligned = total - total % page_size
                for already in range(cached, aligned + 1, page_size):
                    pool = PagePool(16, page_size)
                    indices = pool.allocate(total)
                    freed = slots_to_free(indices, cached, already, page_size)
                    kept = indices[already:aligned]  # what the tree took
                    parts = [*indices[:cached].tolist(), *freed.tolist(), *kept.tolist()]
                    assert sorted(parts) == sorted(indices.tolist())
                    pool.free(freed)  # whole pages, in order (the last maybe cut short)
                    assert pool.num_free_slots == 16 * page_size - (cached + len(kept))


def test_finish_and_the_engine_free_by_the_one_rule() -> None:
    import inspect

    import minikv.engine as engine_module
    import minikv.lifecycle as lifecycle_module

    assert "slots_to_free(" in inspect.getsource(lifecycle_module.finish)
    assert inspect.getsource(engine_module).count("slots_to_free(") == 2  # _release and _insert_unfinished
