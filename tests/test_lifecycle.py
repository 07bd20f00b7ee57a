"""The request lifecycle (``admit``, ``store``, ``finish``, ``serve``): the notes' seven steps, done right.

The two properties that matter: every slot is always in exactly one place (free,
in the tree, or held by a running request), and a request frees only the
duplicates ``indices[cached_len:already_cached]`` -- never the tree's own slots.
"""

from __future__ import annotations

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
from minikv.errors import ArgumentError, LockError, OutOfSlotsError
from minikv.lifecycle import store

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


def test_store_with_everything_cached_writes_nothing() -> None:
    manager, pool, cache = RadixCacheManager(), PagePool(8), small_cache(8)
    serve(manager, pool, [5, 6], cache, kv_rows(tag=1))
    request = admit(manager, pool, [5, 6])
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
    assert manager.match_prefix([1, 2, 3, 4, 5])[1].tolist() == a.indices.tolist() + [b.indices[4].item()]
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
