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

Step 1 matches ``input_ids[:-1]``, not the whole prompt, as mini-sglang's
``match_req``, vLLM and nano-vllm do: the model must compute at least the last
token, because its output (the logits) is what the request is for. A prompt
that is cached whole still gets one new slot for its last token (with
``page_size > 1``, the match stops at the last whole page before that token).
``admit(..., whole_prompt=True)`` matches the whole prompt, as the notes do, to
show the difference.

A request that cannot finish (its forward pass failed, or a scheduler drops it)
is given back with :func:`abort`: its own slots go back to the pool and its
prefix is unlocked, and nothing is inserted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ._validate import as_token_ids, check_fits_int64
from .base import BaseCacheHandle, BaseCacheManager, BaseKVCache
from .errors import ArgumentError, ArgumentTypeError, LockError
from .page_pool import PagePool

KVFunction = Callable[[int, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
"""``kv_fn(layer, input_ids, start) -> (k, v)`` for tokens ``input_ids[start:]``, shaped ``(n, heads, head_dim)``."""


class Step(NamedTuple):
    """One line of a request's trace: the notes' step number, the call, and what it did."""

    number: int
    name: str
    detail: str


@dataclass
class Request:
    """A request between admission and finish: what it matched and which slots it holds.

    ``input_ids`` is the request's own read-only copy of the prompt, and
    ``indices`` its own copy of the slots, so the caller may reuse its buffers at once.
    """

    input_ids: np.ndarray
    handle: BaseCacheHandle
    indices: torch.Tensor
    """One slot per prompt token. The matched prefix's slots come first (the tree owns them), then the request's own."""
    evicted: int = 0
    """Slots evicted from the cache to make room for this request."""
    already_cached: int | None = None
    """What ``insert_prefix`` returned at finish (``None`` until then)."""
    aborted: bool = False
    """Given back with :func:`abort`: its slots were freed and nothing was inserted."""
    trace: list[Step] = field(default_factory=list, kw_only=True)
    """The steps taken so far, in the order they ran, for the book's timeline."""
    manager: BaseCacheManager | None = field(default=None, kw_only=True, repr=False)
    """The manager that admitted it; :func:`store`, :func:`finish` and :func:`abort` refuse another one."""
    pool: PagePool | None = field(default=None, kw_only=True, repr=False)
    """The pool its slots came from."""

    def __post_init__(self) -> None:
        self.input_ids = _own_copy(self.input_ids)
        if not isinstance(self.indices, torch.Tensor):
            raise ArgumentTypeError(f"indices must be a tensor of slots, got {type(self.indices).__name__}")
        self.indices = self.indices.clone()

    @property
    def cached_len(self) -> int:
        return self.handle.cached_len

    @property
    def finished(self) -> bool:
        return self.already_cached is not None

    @property
    def running(self) -> bool:
        """Admitted and neither finished nor aborted: it holds its own slots and a lock."""
        return not self.finished and not self.aborted

    def own_slots(self) -> torch.Tensor:
        """The slots this request allocated itself (it must free or hand them over)."""
        return self.indices[self.cached_len :]


def admit(
    manager: BaseCacheManager,
    pool: PagePool,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    *,
    whole_prompt: bool = False,
) -> Request:
    """Steps 1-3: match, lock, allocate (evicting unlocked prefixes if the pool is short).

    The match covers ``input_ids[:-1]``, so at least the last token is computed;
    ``whole_prompt=True`` matches every token, as the notes do.

    If allocation fails the lock is released and the error propagates: the
    cache and the pool are as they were, except that the match may have split
    a node and refreshed LRU times, which changes no cached token.
    """
    _check_manager_and_pool(manager, pool)
    if not isinstance(whole_prompt, bool):
        raise ArgumentTypeError(f"whole_prompt must be a bool, got {type(whole_prompt).__name__}")
    ids = _own_copy(input_ids)
    total = len(ids)
    trace: list[Step] = []

    handle, matched = manager.match_prefix(ids if whole_prompt else ids[:-1])
    cached = handle.cached_len
    trace.append(Step(1, "match_prefix", f"{cached} of {total} tokens cached"))

    manager.lock_handle(handle)
    trace.append(Step(2, "lock_handle", f"protected {cached} cached tokens"))

    evicted_before = pool.num_evicted_slots
    try:
        new_slots = pool.allocate(total - cached, evict_from=manager)
    except BaseException:
        manager.lock_handle(handle, unlock=True)
        raise
    evicted = pool.num_evicted_slots - evicted_before
    after_evicting = f", after evicting {evicted}" if evicted else ""
    trace.append(Step(3, "allocate", f"{total - cached} new slots{after_evicting}"))

    indices = torch.cat([matched, new_slots]) if cached else new_slots
    return Request(ids, handle, indices, evicted, trace=trace, manager=manager, pool=pool)


def store(request: Request, kv_cache: BaseKVCache, kv_fn: KVFunction) -> None:
    """Step 6: write K/V of the uncached tokens into the request's own slots, layer by layer.

    Refuses a request that is finished or aborted: its slots belong to the tree
    or to the pool by then, and writing there would overwrite someone else's K/V.
    If ``kv_fn`` or ``store_kv`` fails, the request still holds its slots and
    its lock; give it back with :func:`abort` (:func:`serve` does).
    """
    _check_running(request)
    _check_store_arguments(kv_cache, kv_fn)
    start = request.cached_len
    layers = kv_cache.num_layers
    if start == len(request.input_ids):
        request.trace.append(Step(6, "store_kv", "nothing to store: every token was cached"))
        return
    ids = torch.tensor(request.input_ids)
    out_loc = request.own_slots()
    for layer in range(layers):
        k, v = kv_fn(layer, ids, start)
        kv_cache.store_kv(k, v, out_loc, layer)
    request.trace.append(Step(6, "store_kv", f"{out_loc.numel()} tokens x {layers} layers"))


def finish(manager: BaseCacheManager, pool: PagePool, request: Request) -> int:
    """Steps 4, 5, 7: insert, free what the tree did not take, unlock. Returns ``already_cached``.

    Every argument is checked before anything changes: a finished or aborted
    request, or a manager or pool other than the ones that admitted it, is refused.
    """
    _check_running(request)
    _check_manager_and_pool(manager, pool)
    _check_owner(request, manager, pool)

    # From the request's own locked match: the walk goes on below it instead of starting at the root.
    already = manager.insert_prefix(request.input_ids, request.indices, handle=request.handle)
    request.already_cached = already  # from here on the tree owns what it took
    request.trace.append(Step(4, "insert_prefix", f"{already} tokens were already cached"))

    cached, total = request.cached_len, len(request.input_ids)
    pool.free(slots_to_free(request.indices, cached, already, manager.page_size))
    num_duplicates = max(already - cached, 0)
    tail_start = max(total - total % manager.page_size, cached)
    partial = f" and a {total - tail_start}-token partial page" if tail_start < total else ""
    request.trace.append(Step(5, "free", f"freed {num_duplicates} duplicate slots{partial}"))

    manager.lock_handle(request.handle, unlock=True)
    request.trace.append(Step(7, "unlock", f"released {cached} cached tokens"))
    return already


def slots_to_free(indices: torch.Tensor, cached_len: int, already: int, page_size: int) -> torch.Tensor:
    """Step 5's rule: the slots a request gives back after ``insert_prefix(ids, indices)``.

    The first ``cached_len`` slots were the tree's before (the request's locked
    match), so they are never freed. The tree did not take:

    - ``indices[cached_len:already]``: duplicates. Another request inserted these
      tokens meanwhile; the tree keeps its own slots for them, so ours hold a
      second copy of the same K/V that nobody will read.
    - the partial last page: insertion is page-aligned, so the tokens after the
      last whole page stay out of the tree, and their page must go back whole.

    Everything in between now belongs to the tree. The result is whole pages in
    order (the last one maybe cut short), as :meth:`PagePool.free
    <minikv.PagePool.free>` takes them. :func:`finish` and the engine
    (:class:`~minikv.engine.Engine`) both free what this returns.
    """
    total = len(indices)
    duplicates_end = min(max(already, cached_len), total)
    tail_start = max(total - total % page_size, duplicates_end)
    if tail_start == total:
        return indices[cached_len:duplicates_end]
    return torch.cat([indices[cached_len:duplicates_end], indices[tail_start:]])


def abort(manager: BaseCacheManager, pool: PagePool, request: Request) -> None:
    """Give back a request that will not finish: free its own slots, unlock its prefix, insert nothing.

    What a server does when a forward pass fails, or when it preempts a request
    and will recompute it later. Checked like :func:`finish` before anything changes.
    """
    _check_running(request)
    _check_manager_and_pool(manager, pool)
    _check_owner(request, manager, pool)
    own = request.own_slots()
    pool.free(own)
    request.aborted = True
    request.trace.append(Step(5, "free", f"freed its {own.numel()} own slots: aborted, nothing inserted"))
    manager.lock_handle(request.handle, unlock=True)
    request.trace.append(Step(7, "unlock", f"released {request.cached_len} cached tokens"))


def serve(
    manager: BaseCacheManager,
    pool: PagePool,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    kv_cache: BaseKVCache | None = None,
    kv_fn: KVFunction | None = None,
    *,
    whole_prompt: bool = False,
) -> Request:
    """Run one request start to finish: admit, store (when a KV cache is given), finish.

    If the store step fails (``kv_fn`` raises or returns rows of the wrong
    shape), the request is aborted -- its new slots freed, its prefix unlocked --
    and the error propagates.
    """
    # Checked before admit: afterwards the request would hold slots and a lock.
    if kv_cache is not None:
        if kv_fn is None:
            raise ArgumentError("kv_fn: required when kv_cache is given")
        _check_store_arguments(kv_cache, kv_fn)
    request = admit(manager, pool, input_ids, whole_prompt=whole_prompt)
    try:
        if kv_cache is not None:
            assert kv_fn is not None
            store(request, kv_cache, kv_fn)
        finish(manager, pool, request)
    except BaseException:
        if request.running:
            abort(manager, pool, request)
        raise
    return request


# -- argument checks ------------------------------------------------------------------


def _own_copy(input_ids: object) -> np.ndarray:
    """The token ids as a fresh, read-only int64 array that no caller holds a reference to.

    An int64 array that owns its memory and is read-only is such a copy already
    (admit's own), and is kept as it is.
    """
    if (
        isinstance(input_ids, np.ndarray)
        and input_ids.flags.owndata
        and not input_ids.flags.writeable
        and input_ids.dtype == np.int64
        and input_ids.ndim == 1
    ):
        return input_ids
    if isinstance(input_ids, np.ndarray):
        check_fits_int64(input_ids, "input_ids")
    ids = np.array(as_token_ids(input_ids), dtype=np.int64)  # type: ignore[arg-type]
    ids.setflags(write=False)
    return ids


_MANAGER_METHODS = ("match_prefix", "lock_handle", "insert_prefix", "evict", "page_size")
_POOL_METHODS = ("allocate", "free", "page_size", "num_evicted_slots")


def _check_manager_and_pool(manager: BaseCacheManager, pool: PagePool) -> None:
    # What the steps call, not the class: a proxy that forwards them (a recorder, a timer) will do.
    if not all(hasattr(manager, name) for name in _MANAGER_METHODS):
        raise ArgumentTypeError(f"manager must be a cache manager, got {type(manager).__name__}")
    if not all(hasattr(pool, name) for name in _POOL_METHODS):
        raise ArgumentTypeError(f"pool must be a PagePool, got {type(pool).__name__}")
    if manager.page_size != pool.page_size:
        raise ArgumentError(f"pool: page_size {pool.page_size} differs from the manager's {manager.page_size}")


def _check_running(request: object) -> None:
    if not isinstance(request, Request):
        raise ArgumentTypeError(f"request must be a minikv.lifecycle.Request, got {type(request).__name__}")
    if request.finished:
        raise LockError("request: already finished; its slots belong to the tree or the pool now")
    if request.aborted:
        raise LockError("request: aborted; its slots were given back")


def _check_owner(request: Request, manager: BaseCacheManager, pool: PagePool) -> None:
    if request.manager is not None and manager is not request.manager:
        raise ArgumentError("manager: not the manager that admitted this request")
    if request.pool is not None and pool is not request.pool:
        raise ArgumentError("pool: not the pool this request's slots came from")


def _check_store_arguments(kv_cache: object, kv_fn: object) -> None:
    if not isinstance(kv_cache, BaseKVCache):
        raise ArgumentTypeError(f"kv_cache must be a BaseKVCache, got {type(kv_cache).__name__}")
    if not callable(kv_fn):
        raise ArgumentTypeError(f"kv_fn must be callable, got {type(kv_fn).__name__}")
