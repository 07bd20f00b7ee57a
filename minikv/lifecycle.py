"""The life of one request through the cache: the notes' seven steps, done right.

======  =================  ===============================================
step    what               why
======  =================  ===============================================
1       match_prefix       find the slots that already hold this prompt's prefix
2       lock_handle        so step 3's eviction cannot take them away
3       allocate           slots for the tokens that were not cached
6       store              the forward pass writes K/V for those tokens
4       insert_prefix      the finished request's tokens join the tree
5       free duplicates    slots ``[cached_len : already_cached]`` only
7       unlock             the prefix may be evicted again
======  =================  ===============================================

Step 6 runs before step 4 here, as in a real server: the forward pass stores
K/V long before the request finishes. Doing it after step 5 (the notes' order)
would write into slots that step 5 may just have freed.
Step 5 frees ``indices[cached_len:already_cached]``, never
``indices[:already_cached]``: the first ``cached_len`` slots belong to the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ._validate import as_token_ids
from .base import BaseCacheHandle, BaseCacheManager, BaseKVCache
from .errors import ArgumentError, LockError
from .page_pool import PagePool

KVFunction = Callable[[int, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""``kv_fn(layer, input_ids, start) -> (k, v)`` for tokens ``input_ids[start:]``, shaped ``(n, heads, head_dim)``."""


@dataclass(frozen=True)
class Step:
    """One line of a request's trace, for the book's timeline."""

    number: int
    name: str
    detail: str


@dataclass
class Request:
    """A request between admission and finish: what it matched and which slots it holds."""

    input_ids: np.ndarray
    handle: BaseCacheHandle
    indices: torch.Tensor
    """One slot per prompt token. The matched prefix's slots come first (the tree owns them), then the request's own."""
    evicted: int = 0
    """Slots evicted from the cache to make room for this request."""
    already_cached: int | None = None
    """What ``insert_prefix`` returned at finish (``None`` while running)."""
    _events: list[tuple[int, ...]] = field(default_factory=list, repr=False)
    """``(step number, numbers...)`` per step taken; :attr:`trace` words them only when asked."""

    @property
    def cached_len(self) -> int:
        return self.handle.cached_len

    @property
    def finished(self) -> bool:
        return self.already_cached is not None

    @property
    def trace(self) -> list[Step]:
        """The steps taken so far, in order, for the book's timeline.

        Recorded as bare numbers and put into words here: formatting six
        sentences per request would cost more than the bookkeeping they describe.
        """
        return [Step(event[0], *_WORDING[event[0]](*event[1:])) for event in self._events]

    def own_slots(self) -> torch.Tensor:
        """The slots this request allocated itself (it must free or hand them over)."""
        return self.indices[self.cached_len :]


def _freed(duplicates: int, tail: int) -> tuple[str, str]:
    partial = f" and a {tail}-token partial page" if tail else ""
    return "free", f"freed {duplicates} duplicate slots{partial}"


_WORDING: dict[int, Callable[..., tuple[str, str]]] = {
    1: lambda cached, total: ("match_prefix", f"{cached} of {total} tokens cached"),
    2: lambda cached: ("lock_handle", f"protected {cached} cached tokens"),
    3: lambda new, evicted: ("allocate", f"{new} new slots" + (f", after evicting {evicted}" if evicted else "")),
    6: lambda tokens, layers: (
        ("store_kv", f"{tokens} tokens x {layers} layers")
        if tokens
        else ("store_kv", "nothing to store: every token was cached")
    ),
    4: lambda already: ("insert_prefix", f"{already} tokens were already cached"),
    5: _freed,
    7: lambda cached: ("unlock", f"released {cached} cached tokens"),
}


def admit(manager: BaseCacheManager, pool: PagePool, input_ids: torch.Tensor | Sequence[int]) -> Request:
    """Steps 1-3: match, lock, allocate (evicting unlocked prefixes if the pool is short).

    If allocation fails the lock is released and the error propagates: the
    cache and the pool are as they were, except that the match may have split
    a node and refreshed LRU times, which changes no cached token.
    """
    if manager.page_size != pool.page_size:
        raise ArgumentError(f"pool: page_size {pool.page_size} differs from the manager's {manager.page_size}")
    ids = as_token_ids(input_ids)
    handle, matched = manager.match_prefix(ids)
    cached = handle.cached_len
    manager.lock_handle(handle)
    evicted_before = pool.num_evicted_slots
    try:
        new_slots = pool.allocate(len(ids) - cached, evict_from=manager)
    except BaseException:
        manager.lock_handle(handle, unlock=True)
        raise
    evicted = pool.num_evicted_slots - evicted_before
    indices = torch.cat([matched, new_slots]) if cached else new_slots
    events = [(1, cached, len(ids)), (2, cached), (3, len(ids) - cached, evicted)]
    return Request(ids, handle, indices, evicted, None, events)


def store(request: Request, kv_cache: BaseKVCache, kv_fn: KVFunction) -> None:
    """Step 6: write K/V of the uncached tokens into the request's own slots, layer by layer."""
    start = request.cached_len
    if start == len(request.input_ids):
        request._events.append((6, 0, kv_cache.num_layers))
        return
    ids = torch.from_numpy(request.input_ids)
    out_loc = request.own_slots()
    for layer in range(kv_cache.num_layers):
        k, v = kv_fn(layer, ids, start)
        kv_cache.store_kv(k, v, out_loc, layer)
    request._events.append((6, len(out_loc), kv_cache.num_layers))


def finish(manager: BaseCacheManager, pool: PagePool, request: Request) -> int:
    """Steps 4, 5, 7: insert, free what the tree did not take, unlock. Returns ``already_cached``."""
    if request.finished:
        raise LockError("request: already finished")
    already = manager.insert_prefix(request.input_ids, request.indices)
    cached, total = request.cached_len, len(request.input_ids)
    # Slots the tree did not take: duplicates of what another request inserted
    # meanwhile, and the partial last page that page-aligned insertion leaves out.
    duplicates = max(already - cached, 0)
    if duplicates:
        pool.free(request.indices[cached:already])
    tail_start = max(total - total % manager.page_size, cached)
    if tail_start < total:
        pool.free(request.indices[tail_start:])
    manager.lock_handle(request.handle, unlock=True)
    request._events += [(4, already), (5, duplicates, total - tail_start), (7, cached)]
    request.already_cached = already
    return already


def serve(
    manager: BaseCacheManager,
    pool: PagePool,
    input_ids: torch.Tensor | Sequence[int],
    kv_cache: BaseKVCache | None = None,
    kv_fn: KVFunction | None = None,
) -> Request:
    """Run one request start to finish: admit, store (when a KV cache is given), finish."""
    if kv_cache is not None and kv_fn is None:
        # Checked before admit: afterwards the request would hold slots and a lock.
        raise ArgumentError("kv_fn: required when kv_cache is given")
    request = admit(manager, pool, input_ids)
    if kv_cache is not None:
        store(request, kv_cache, kv_fn)
    finish(manager, pool, request)
    return request
