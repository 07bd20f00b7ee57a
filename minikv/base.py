"""The two layers of a KV cache: storage (``BaseKVCache``) and management
(``BaseCacheManager``), and the small types that pass between them.

Storage owns the tensors and knows nothing about requests or prefixes.
Management owns the bookkeeping -- which token slots hold which prefix, who is
using them, what may be thrown away -- and never touches the tensors. The two
meet only through *slot indices*: integer tensors naming rows of the storage.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import numpy as np
import torch

from .errors import ArgumentTypeError

TokenIds: TypeAlias = torch.Tensor | np.ndarray | Sequence[int]
"""Token ids or slot indices as the package accepts them: a 1-D integer tensor, a 1-D NumPy
integer array, or a list of ints (the exact rule is in ``minikv._validate``)."""


class KVCacheLayout(enum.Enum):
    """How the K/V buffer is laid out in memory.

    Both layouts are *exposed* layer-first (``k_cache(layer)`` is one tensor per
    layer); they differ only in which elements are adjacent in memory.
    """

    LayerFirst = enum.auto()
    """Memory is ``(2, layers, pages, page_size, heads, head_dim)``: one layer's pages are contiguous."""

    PageFirst = enum.auto()
    """Memory is ``(2, pages, layers, page_size, heads, head_dim)``: one page's layers are contiguous."""


class BaseKVCache(ABC):
    """Storage layer: the physical K and V tensors of every layer.

    Rows are addressed by *slot* index ``s`` in ``[0, num_pages * page_size)``;
    slot ``s`` lives in page ``s // page_size`` at offset ``s % page_size``.
    """

    @abstractmethod
    def k_cache(self, index: int) -> torch.Tensor:
        """The K cache of layer ``index``, shape ``(num_pages, page_size, heads, head_dim)``."""

    @abstractmethod
    def v_cache(self, index: int) -> torch.Tensor:
        """The V cache of layer ``index``, shape ``(num_pages, page_size, heads, head_dim)``."""

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
        """Write token rows ``k[i]``, ``v[i]`` into slot ``out_loc[i]`` of layer ``layer_id``."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the buffers live."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """Element type of K and V."""

    @property
    @abstractmethod
    def num_layers(self) -> int:
        """Number of transformer layers stored."""


@dataclass(frozen=True)
class BaseCacheHandle(ABC):
    """A receipt for a matched prefix: what ``lock_handle`` takes.

    The indices returned by ``match_prefix`` say *where* the prefix's KV rows are;
    the handle says *which cached prefix* they belong to, so the manager can
    protect exactly that prefix from eviction. Frozen: a handle is a value.
    """

    cached_len: int

    def __post_init__(self) -> None:
        if isinstance(self.cached_len, bool) or not isinstance(self.cached_len, int) or self.cached_len < 0:
            raise ArgumentTypeError(f"cached_len must be an int >= 0, got {self.cached_len!r}")


class SizeInfo(NamedTuple):
    """How many cached token slots the manager holds, split by whether they may be evicted."""

    evictable_size: int
    """Slots of prefixes that no running request uses (``evict`` may free them)."""

    protected_size: int
    """Slots of prefixes locked by at least one handle (``evict`` must not free them)."""

    @property
    def total_size(self) -> int:
        """All slots the manager holds."""
        return self.evictable_size + self.protected_size


class BaseCacheManager(ABC):
    """Management layer: which prefixes are cached, who uses them, what to evict.

    Token ids and slot indices are ``TokenIds``: 1-D integer tensors, NumPy
    arrays or lists of ints. Returned indices are ``int32`` on the manager's device,
    and every returned tensor is the caller's own (a fresh tensor, never one the
    manager keeps or hands out again), so resizing or writing it changes nothing else.
    A manager holds no KV data; the caller owns a page pool and frees the slots
    that ``insert_prefix`` and ``evict`` tell it to.
    """

    page_size: int = 1

    @abstractmethod
    def match_prefix(self, input_ids: TokenIds) -> tuple[BaseCacheHandle, torch.Tensor]:
        """Find the longest cached prefix of ``input_ids``.

        Returns ``(handle, indices)`` with ``len(indices) == handle.cached_len``.
        The indices are safe to use only while the handle is locked.

        Not read-only: a match that ends inside a node *splits* that node, and
        the matched path's LRU time is refreshed. The cached tokens and the
        size accounting do not change.
        """

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Protect (or release) the prefix a handle names from eviction.

        Locking covers every node from the handle's node up to the root (root
        excluded). Locks nest: each lock needs its own unlock.

        Locks count per node: a lock belongs to the node its handle ends at, and
        a node holds a lock of its own exactly when its ``ref_count`` exceeds the
        sum of its children's. Unlocking at a node that holds no lock of its own
        (never locked there, or already unlocked) raises
        :class:`~minikv.errors.LockError` and changes nothing, even when a deeper
        lock passes through that node. The handle of an empty match
        (``cached_len == 0``) locks nothing.
        """

    @abstractmethod
    def insert_prefix(self, input_ids: TokenIds, indices: TokenIds, *, handle: BaseCacheHandle | None = None) -> int:
        """Record that ``indices[i]`` holds the KV of token ``input_ids[i]``.

        Returns the length that was *already* cached. ``len(input_ids)`` must
        equal ``len(indices)``; with ``page_size > 1`` only the page-aligned
        part is inserted. The tree keeps copies of the tensors, never views.
        The caller then frees ``indices[m:already_cached]`` (duplicates, where
        ``m`` is its own earlier match length) -- not ``indices[:already_cached]``,
        whose first ``m`` slots the tree owns.

        ``handle`` (optional) is the locked handle of the request's own match of
        a prefix of ``input_ids``: the insert then goes on from the handle's node
        instead of walking the cached prefix again, with the same result. A
        refused call (bad arguments, a slot the tree already holds, a stale or
        foreign handle) changes nothing.
        """

    @abstractmethod
    def evict(self, size: int) -> torch.Tensor:
        """Free at least ``size`` slots and return them (``int32``).

        Least recently used unlocked leaves go first; whole nodes are evicted,
        so more than ``size`` may come back. ``evict(0)`` returns an empty
        tensor. A negative size, or one above ``size_info.evictable_size``,
        raises and evicts nothing.
        """

    @abstractmethod
    def reset(self) -> torch.Tensor:
        """Drop every cached prefix and return the slots they held (refused while anything is locked)."""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo:
        """Evictable and protected slot counts."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Verify every internal invariant; raise :class:`~minikv.errors.IntegrityError` naming the first broken one."""
