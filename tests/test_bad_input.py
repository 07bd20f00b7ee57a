"""Bad input across the public API: the right minikv error, naming the argument, and no change at all.

One table, one test. Every case runs against the same small "world" -- a radix
tree with a locked prefix and a running request, its page pool, a KV cache with
data in it, a naive manager -- and the whole world is snapshotted before and
after the call: a refused call must not split a node, tick a clock, move a
lock, free a page or write a byte.
"""

# ruff: noqa: E501  (the CASES table keeps one case per line, so that it reads as a table)
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from helpers import cache_snapshot, manager_snapshot, pool_snapshot, tree_entries

from minikv import (
    KVCacheLayout,
    MHAKVCache,
    NaiveCacheHandle,
    NaiveCacheManager,
    PagePool,
    RadixCacheHandle,
    RadixCacheManager,
    Request,
    admit,
    finish,
    kv_bytes_per_token,
    serve,
    store_cache,
    tokens_that_fit,
)
from minikv.capacity import dtype_size, mla_bytes_per_token
from minikv.errors import (
    ArgumentError,
    ArgumentTypeError,
    DeviceMismatchError,
    DoubleFreeError,
    EvictionError,
    LockError,
    OutOfSlotsError,
    SlotIndexError,
    StaleHandleError,
)
from minikv.lifecycle import abort, store

HEADS, HEAD_DIM, LAYERS, PAGES = 2, 4, 2, 16


@dataclass
class World:
    radix: RadixCacheManager
    pool: PagePool
    cache: MHAKVCache
    naive: NaiveCacheManager
    running: Request
    """Admitted, matched [1, 2, 3] (so that prefix is locked), not finished."""
    finished: Request
    stale: RadixCacheHandle
    """The handle of a prefix that has since been evicted."""
    unlocked: RadixCacheHandle
    """The handle of a cached prefix nobody locked."""
    through: RadixCacheHandle
    """The handle of [1, 2]: unlocked itself, but the running request's lock on [1, 2, 3] passes through it."""

    def snapshot(self) -> tuple[object, ...]:
        def request_state(r: Request) -> object:
            return (r.indices.tolist(), r.cached_len, r.already_cached, r.aborted, list(r.trace), r.evicted)

        return (
            manager_snapshot(self.radix),
            pool_snapshot(self.pool),
            cache_snapshot(self.cache),
            manager_snapshot(self.naive),
            request_state(self.running),
            request_state(self.finished),
        )


def make_world() -> World:
    radix, pool = RadixCacheManager(), PagePool(PAGES)
    cache = MHAKVCache(HEADS, LAYERS, HEAD_DIM, PAGES, torch.float32, KVCacheLayout.PageFirst, "cpu")
    generator = torch.Generator().manual_seed(0)
    cache.kv_buffer.copy_(torch.randn(cache.kv_buffer.shape, generator=generator))

    def kv_fn(layer: int, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.full((len(ids) - start, HEADS, HEAD_DIM), float(layer))
        return k, k + 1

    finished = serve(radix, pool, [1, 2, 3], cache, kv_fn)
    serve(radix, pool, [7, 8], cache, kv_fn)
    stale, _ = radix.match_prefix([7, 8])
    radix.match_prefix([1, 2, 3])
    assert radix.evict(2).tolist() == [3, 4]  # [7, 8] was the least recently used
    serve(radix, pool, [5, 6], cache, kv_fn)
    unlocked, _ = radix.match_prefix([5, 6])
    running = admit(radix, pool, [1, 2, 3, 4])
    store(running, cache, kv_fn)
    through, _ = radix.match_prefix([1, 2])  # splits the locked [1, 2, 3]
    radix.check_integrity()
    return World(radix, pool, cache, NaiveCacheManager(), running, finished, stale, unlocked, through)


def ones_kv(layer: int, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(len(ids) - start, HEADS, HEAD_DIM), torch.zeros(len(ids) - start, HEADS, HEAD_DIM)


def k_and_v(n: int, heads: int = HEADS, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(n, heads, HEAD_DIM, dtype=dtype), torch.zeros(n, heads, HEAD_DIM, dtype=dtype)


def raw_store(w: World, indices: torch.Tensor, backend: str = "auto", **override: torch.Tensor) -> None:
    k, v = k_and_v(len(indices))
    args = {"k_cache": w.cache.k_cache(0), "v_cache": w.cache.v_cache(0), "indices": indices, "k": k, "v": v}
    args.update(override)
    store_cache(backend=backend, **args)


Call = Callable[[World], object]

# One row per case: (name, call, error, argument the message must name). Kept one row a line, as a table.
CASES: list[tuple[str, Call, type[Exception], str]] = [
    # -- match_prefix / insert_prefix: token ids and slot indices
    ("match float ids", lambda w: w.radix.match_prefix(torch.tensor([1.0, 2.0])), ArgumentTypeError, "input_ids"),
    ("match 2-D ids", lambda w: w.radix.match_prefix(torch.tensor([[1, 2]])), ArgumentError, "input_ids"),
    ("match a string", lambda w: w.radix.match_prefix("12"), ArgumentTypeError, "input_ids"),
    ("match bools in a list", lambda w: w.radix.match_prefix([1, True]), ArgumentTypeError, "input_ids"),
    ("match float numpy ids", lambda w: w.radix.match_prefix(np.array([1.5])), ArgumentTypeError, "input_ids"),
    ("insert: 3 ids, 2 slots", lambda w: w.radix.insert_prefix([1, 2, 9], [0, 1]), ArgumentError, "indices"),
    ("insert: 1 id, 2 slots", lambda w: w.radix.insert_prefix([9], [0, 1]), ArgumentError, "input_ids"),
    ("insert float slots", lambda w: w.radix.insert_prefix([9], torch.tensor([1.0])), ArgumentTypeError, "indices"),
    ("insert 2-D slots", lambda w: w.radix.insert_prefix([9], torch.tensor([[9]])), ArgumentError, "indices"),
    ("insert negative slot", lambda w: w.radix.insert_prefix([9], [-3]), ArgumentError, "indices"),
    (
        "insert slots on another device",
        lambda w: w.radix.insert_prefix([9], torch.tensor([9], device="meta")),
        DeviceMismatchError,
        "indices",
    ),
    ("naive insert: lengths differ", lambda w: w.naive.insert_prefix([1, 2], [0]), ArgumentError, "indices"),
    ("insert float numpy slots", lambda w: w.radix.insert_prefix([9], np.array([1.0])), ArgumentTypeError, "indices"),
    ("match uint64 ids >= 2**63", lambda w: w.radix.match_prefix(np.array([2**63, 1], dtype=np.uint64)), ArgumentError, "input_ids"),
    ("match a meta tensor", lambda w: w.radix.match_prefix(torch.tensor([1, 2], device="meta")), ArgumentError, "input_ids"),
    ("match a sparse tensor", lambda w: w.radix.match_prefix(torch.tensor([1, 2]).to_sparse()), ArgumentTypeError, "input_ids"),
    ("insert a sparse slot tensor", lambda w: w.radix.insert_prefix([9], torch.tensor([3]).to_sparse()), ArgumentTypeError, "indices"),
    # -- insert_prefix: refused before anything changes (no split, no tick, no new LRU times)
    ("insert a repeated new slot", lambda w: w.radix.insert_prefix([1, 2, 9, 9], [0, 1, 14, 14]), ArgumentError, "indices"),
    ("insert a slot another node holds", lambda w: w.radix.insert_prefix([9, 9], [14, int(w.running.indices[0])]), ArgumentError, "indices"),
    ("insert with a stale handle", lambda w: w.radix.insert_prefix([7, 8, 9], [3, 4, 14], handle=w.stale), StaleHandleError, "handle"),
    ("insert with an unlocked handle", lambda w: w.radix.insert_prefix([5, 6, 9], [0, 1, 14], handle=w.unlocked), LockError, "handle"),
    ("insert with the handle of other tokens", lambda w: w.radix.insert_prefix([1, 2, 9, 9], [0, 1, 2, 14], handle=w.running.handle), ArgumentError, "handle"),
    ("insert with a handle longer than the ids", lambda w: w.radix.insert_prefix([1, 2], [0, 1], handle=w.running.handle), ArgumentError, "handle"),
    ("insert with a handle of another tree", lambda w: w.radix.insert_prefix([9], [14], handle=RadixCacheManager().match_prefix([1])[0]), StaleHandleError, "handle"),
    ("insert with a naive handle", lambda w: w.radix.insert_prefix([9], [14], handle=NaiveCacheHandle(0)), ArgumentTypeError, "handle"),
    ("naive insert with a radix handle", lambda w: w.naive.insert_prefix([9], [14], handle=w.unlocked), ArgumentTypeError, "handle"),
    # -- lock_handle
    ("unlock what is not locked", lambda w: w.radix.lock_handle(w.unlocked, unlock=True), LockError, "handle"),
    ("unlock where only a deeper lock passes", lambda w: w.radix.lock_handle(w.through, unlock=True), LockError, "handle"),
    ("a handle of no node", lambda w: RadixCacheHandle(3, None), ArgumentTypeError, "node"),  # type: ignore[arg-type]
    ("a handle of negative length", lambda w: RadixCacheHandle(-1, w.radix.root_node), ArgumentTypeError, "cached_len"),
    ("lock a stale handle", lambda w: w.radix.lock_handle(w.stale), StaleHandleError, "handle"),
    ("unlock a stale handle", lambda w: w.radix.lock_handle(w.stale, unlock=True), StaleHandleError, "handle"),
    ("lock a naive handle", lambda w: w.radix.lock_handle(NaiveCacheHandle(0)), ArgumentTypeError, "handle"),
    ("naive: lock a radix handle", lambda w: w.naive.lock_handle(w.unlocked), ArgumentTypeError, "handle"),
    # -- evict / reset
    ("evict a negative size", lambda w: w.radix.evict(-1), ArgumentError, "size"),
    ("evict a float size", lambda w: w.radix.evict(2.0), ArgumentTypeError, "size"),
    ("evict more than evictable", lambda w: w.radix.evict(w.radix.size_info.evictable_size + 1), EvictionError, "size"),
    ("naive: evict anything", lambda w: w.naive.evict(1), EvictionError, "size"),
    ("reset while locked", lambda w: w.radix.reset(), LockError, "reset"),
    # -- the page pool
    ("free a free page", lambda w: w.pool.free([PAGES - 1]), DoubleFreeError, "slots"),
    ("free a page twice in one call", lambda w: w.pool.free(w.running.own_slots()[:1].repeat(2)), DoubleFreeError, "slots"),
    ("free a slot past the end", lambda w: w.pool.free([PAGES]), SlotIndexError, "slots"),
    ("free a slot past int64", lambda w: w.pool.free([2**63]), SlotIndexError, "slots"),
    ("free float slots", lambda w: w.pool.free(torch.tensor([0.0])), ArgumentTypeError, "slots"),
    ("allocate a negative count", lambda w: w.pool.allocate(-3), ArgumentError, "num_tokens"),
    ("allocate evicting from 3", lambda w: w.pool.allocate(PAGES, evict_from=3), ArgumentTypeError, "evict_from"),
    ("allocate more than fits", lambda w: w.pool.allocate(PAGES, evict_from=w.radix), OutOfSlotsError, "num_tokens"),
    (
        "allocate evicting from a manager of another page size",
        lambda w: w.pool.allocate(1, evict_from=RadixCacheManager(page_size=2)),
        ArgumentError,
        "evict_from",
    ),
    # -- the lifecycle
    ("admit with a pool of another page size", lambda w: admit(w.radix, PagePool(4, 2), [1]), ArgumentError, "pool"),
    ("admit float ids", lambda w: admit(w.radix, w.pool, torch.tensor([1.0])), ArgumentTypeError, "input_ids"),
    ("finish twice", lambda w: finish(w.radix, w.pool, w.finished), LockError, "request"),
    ("admit with no manager", lambda w: admit(None, w.pool, [1]), ArgumentTypeError, "manager"),
    ("admit with no pool", lambda w: admit(w.radix, None, [1]), ArgumentTypeError, "pool"),
    ("admit None as ids", lambda w: admit(w.radix, w.pool, None), ArgumentTypeError, "input_ids"),
    ("admit ids past int64", lambda w: admit(w.radix, w.pool, np.array([2**63], "u8")), ArgumentError, "input_ids"),
    ("store into a finished request", lambda w: store(w.finished, w.cache, ones_kv), LockError, "request"),
    ("store into something not a cache", lambda w: store(w.running, object(), ones_kv), ArgumentTypeError, "kv_cache"),
    ("finish with another pool", lambda w: finish(w.radix, PagePool(PAGES), w.running), ArgumentError, "pool"),
    ("finish with another manager", lambda w: finish(RadixCacheManager(), w.pool, w.running), ArgumentError, "manager"),
    ("abort a finished request", lambda w: abort(w.radix, w.pool, w.finished), LockError, "request"),
    ("abort with another pool", lambda w: abort(w.radix, PagePool(PAGES), w.running), ArgumentError, "pool"),
    ("serve into a non-cache", lambda w: serve(w.radix, w.pool, [2], object(), ones_kv), ArgumentTypeError, "kv_cache"),
    ("serve a cache without kv_fn", lambda w: serve(w.radix, w.pool, [1, 2, 3, 4], w.cache), ArgumentError, "kv_fn"),
    # -- MHAKVCache
    (
        "tp heads not divisible",
        lambda w: MHAKVCache(6, 1, 4, 4, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_size=4),
        ArgumentError,
        "num_kv_heads",
    ),
    (
        "tp_rank out of range",
        lambda w: MHAKVCache(4, 1, 4, 4, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_rank=2, tp_size=2),
        ArgumentError,
        "tp_rank",
    ),
    (
        "integer cache dtype",
        lambda w: MHAKVCache(2, 1, 4, 4, torch.int32, KVCacheLayout.LayerFirst, "cpu"),
        ArgumentTypeError,
        "dtype",
    ),
    ("layout by name", lambda w: MHAKVCache(2, 1, 4, 4, torch.float32, "PageFirst", "cpu"), ArgumentTypeError, "kv_layout"),
    ("zero layers", lambda w: MHAKVCache(2, 0, 4, 4, torch.float32, KVCacheLayout.LayerFirst, "cpu"), ArgumentError, "num_layers"),
    ("k_cache of a layer past the end", lambda w: w.cache.k_cache(LAYERS), SlotIndexError, "index"),
    ("v_cache of a negative layer", lambda w: w.cache.v_cache(-1), SlotIndexError, "index"),
    ("store_kv into layer -1", lambda w: w.cache.store_kv(*k_and_v(1), torch.tensor([9]), -1), SlotIndexError, "layer_id"),
    ("store_kv with a bool layer", lambda w: w.cache.store_kv(*k_and_v(1), torch.tensor([9]), True), ArgumentTypeError, "layer_id"),
    ("store_kv with wrong heads", lambda w: w.cache.store_kv(*k_and_v(1, heads=3), torch.tensor([9]), 0), ArgumentError, "k"),
    (
        "store_kv with fp16 rows",
        lambda w: w.cache.store_kv(*k_and_v(1, dtype=torch.float16), torch.tensor([9]), 0),
        ArgumentTypeError,
        "k",
    ),
    ("store_kv past the last slot", lambda w: w.cache.store_kv(*k_and_v(2), torch.tensor([9, PAGES]), 0), SlotIndexError, "out_loc"),
    ("store_kv into one slot twice", lambda w: w.cache.store_kv(*k_and_v(2), torch.tensor([9, 9]), 0), ArgumentError, "out_loc"),
    # -- store_cache
    ("store a negative slot", lambda w: raw_store(w, torch.tensor([-1, 3])), SlotIndexError, "indices"),
    ("store one slot twice", lambda w: raw_store(w, torch.tensor([3, 3])), ArgumentError, "indices"),
    ("store with int16 indices", lambda w: raw_store(w, torch.tensor([3], dtype=torch.int16)), ArgumentTypeError, "indices"),
    ("store with 2-D indices", lambda w: raw_store(w, torch.tensor([[3]])), ArgumentError, "indices"),
    ("store through an unknown backend", lambda w: raw_store(w, torch.tensor([3]), backend="cuda"), ArgumentError, "backend"),
    ("triton store past the end", lambda w: raw_store(w, torch.tensor([PAGES]), backend="triton"), SlotIndexError, "indices"),
    (
        "store rows from another device",
        lambda w: raw_store(w, torch.tensor([3]), k=torch.ones(1, HEADS, HEAD_DIM, device="meta")),
        DeviceMismatchError,
        "k",
    ),
    ("store V of another length", lambda w: raw_store(w, torch.tensor([3]), v=torch.zeros(2, HEADS, HEAD_DIM)), ArgumentError, "v"),
    ("store from a list of rows", lambda w: raw_store(w, torch.tensor([3]), k=[[0.0] * HEAD_DIM] * HEADS), ArgumentTypeError, "k"),
    (
        "store into caches of two shapes",
        lambda w: raw_store(w, torch.tensor([3]), v_cache=torch.zeros(PAGES + 1, 1, HEADS, HEAD_DIM)),
        ArgumentError,
        "v_cache",
    ),
    (
        "store into an integer cache",
        lambda w: raw_store(
            w,
            torch.tensor([3]),
            k_cache=torch.zeros(PAGES, 1, HEADS, HEAD_DIM, dtype=torch.int32),
            v_cache=torch.zeros(PAGES, 1, HEADS, HEAD_DIM, dtype=torch.int32),
        ),
        ArgumentTypeError,
        "k_cache",
    ),
    ("store_kv with a list of slots", lambda w: w.cache.store_kv(*k_and_v(1), [9], 0), ArgumentTypeError, "out_loc"),
    ("store K into V's memory", lambda w: raw_store(w, torch.tensor([3]), v_cache=w.cache.k_cache(0)), ArgumentError, "v_cache"),
    # -- constructors and capacity arithmetic
    ("radix page_size 0", lambda w: RadixCacheManager(page_size=0), ArgumentError, "page_size"),
    ("radix on a device that does not exist", lambda w: RadixCacheManager(device="gpu"), ArgumentError, "device"),
    ("radix on a CUDA device this machine lacks", lambda w: RadixCacheManager(device="cuda:99"), ArgumentError, "device"),
    ("naive on a CUDA device this machine lacks", lambda w: NaiveCacheManager(device="cuda:99"), ArgumentError, "device"),
    ("pool of no pages", lambda w: PagePool(0), ArgumentError, "num_pages"),
    ("bytes per token, zero layers", lambda w: kv_bytes_per_token(0, 8, 128, torch.bfloat16), ArgumentError, "num_layers"),
    ("MLA with a negative rope dim", lambda w: mla_bytes_per_token(61, 512, -1, torch.bfloat16), ArgumentError, "qk_rope_head_dim"),
    ("tokens that fit in negative memory", lambda w: tokens_that_fit(-1, 10), ArgumentError, "memory_bytes"),
    ("tokens that fit at zero bytes each", lambda w: tokens_that_fit(10, 0), ArgumentError, "bytes_per_token"),
    ("dtype given as a string", lambda w: dtype_size("bfloat16"), ArgumentTypeError, "dtype"),
]  # fmt: skip


def test_every_case_has_its_own_name() -> None:
    assert len({name for name, *_ in CASES}) == len(CASES)


def test_the_world_is_healthy() -> None:
    world = make_world()
    assert world.radix.size_info.protected_size == 3 and world.radix.size_info.evictable_size == 2
    assert tree_entries(world.radix) == tree_entries(make_world().radix)  # building it is deterministic


@pytest.mark.parametrize(("call", "error", "argument"), [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_bad_input_raises_names_the_argument_and_changes_nothing(
    call: Call, error: type[Exception], argument: str
) -> None:
    world = make_world()
    before = world.snapshot()
    with pytest.raises(error) as caught:
        call(world)
    assert argument in str(caught.value), f"message does not name {argument!r}: {caught.value}"
    after = world.snapshot()
    for name, old, new in zip(("radix", "pool", "cache", "naive", "running", "finished"), before, after, strict=True):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old, new), f"{name} changed"
        else:
            assert old == new, f"{name} changed"
    world.radix.check_integrity()
