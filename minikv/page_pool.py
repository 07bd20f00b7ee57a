"""``PagePool``: the free list of KV pages, and allocation that evicts on demand.

The manager decides what stays cached; the pool knows which pages nobody holds.
Every slot is, at every moment, in exactly one of three places: free in the
pool, owned by the cache manager's tree, or held by a running request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ._validate import as_count, as_positive, canonical_device
from .base import BaseCacheManager
from .errors import ArgumentError, ArgumentTypeError, DoubleFreeError, OutOfSlotsError, SlotIndexError


class PagePool:
    """A fixed number of pages of ``page_size`` token slots each.

    Slot ``s`` belongs to page ``s // page_size``. Allocation hands out whole
    pages (lowest numbers first on a fresh pool) and returns one slot per token.
    """

    def __init__(self, num_pages: int, page_size: int = 1, device: torch.device | str = "cpu") -> None:
        self.num_pages = as_positive(num_pages, "num_pages")
        self.page_size = as_positive(page_size, "page_size")
        self.device = canonical_device(device)
        self._on_cpu = self.device.type == "cpu"
        # Page numbers are kept as np.intp: NumPy indexes with intp several times
        # faster than with int32, and every free() and allocate() indexes with them.
        # A stack whose top (the end) is the next page to hand out.
        self._free_pages = np.arange(self.num_pages - 1, -1, -1, dtype=np.intp)
        self._num_free = self.num_pages
        self._page_is_free = np.ones(self.num_pages, dtype=bool)
        self._offsets = np.arange(self.page_size, dtype=np.intp)
        # Scratch space to find a page listed twice in one free() in O(n), without sorting.
        self._last_position = np.zeros(self.num_pages, dtype=np.intp)
        self.num_evicted_slots = 0
        """Slots this pool has taken back from a cache manager through eviction."""

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._num_free

    @property
    def num_free_slots(self) -> int:
        return self._num_free * self.page_size

    @property
    def num_used_pages(self) -> int:
        return self.num_pages - self._num_free

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.page_size)

    def free_slots(self) -> torch.Tensor:
        """Every free slot, ascending (for accounting checks and drawings)."""
        pages = np.flatnonzero(self._page_is_free)
        return self._slots_of(pages, len(pages) * self.page_size)

    def allocate(self, num_tokens: int, evict_from: BaseCacheManager | None = None) -> torch.Tensor:
        """Slots for ``num_tokens`` tokens, as ``int32`` on the pool's device.

        When free pages run short and ``evict_from`` is given, the shortfall is
        evicted from that manager first. If even that cannot cover it, raises
        :class:`~minikv.errors.OutOfSlotsError` and changes nothing.
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        if evict_from is not None and evict_from.page_size != self.page_size:
            raise ArgumentError(
                f"evict_from: manager page_size {evict_from.page_size} differs from the pool's {self.page_size}"
            )
        needed = self.pages_for(num_tokens)
        if needed > self._num_free:
            shortfall = (needed - self._num_free) * self.page_size
            evictable = evict_from.size_info.evictable_size if evict_from is not None else 0
            if evictable < shortfall:
                raise OutOfSlotsError(
                    f"num_tokens: {num_tokens} tokens need {needed} pages; {self._num_free} are free "
                    f"and only {evictable} slots are evictable"
                )
            assert evict_from is not None
            evicted = evict_from.evict(shortfall)
            self.free(evicted)
            self.num_evicted_slots += len(evicted)
        if needed == 0:
            return self._slots_of(self._free_pages[:0], 0)
        top = self._num_free
        pages = self._free_pages[top - needed : top][::-1]  # a view: _slots_of copies before the stack changes
        self._num_free = top - needed
        self._page_is_free[pages] = False
        return self._slots_of(pages, num_tokens)

    def free(self, slots: torch.Tensor | Sequence[int]) -> None:
        """Return the pages these slots belong to.

        ``slots`` must be whole pages in order (the last one may be cut short),
        as ``allocate``, ``match_prefix`` and ``evict`` produce them. Freeing a
        page that is already free, or the same page twice, raises
        :class:`~minikv.errors.DoubleFreeError` and frees nothing.
        """
        array = self._as_slot_array(slots)
        num = array.size
        if num == 0:
            return
        ps = self.page_size
        if ps == 1:
            pages = array
        else:
            pages = array[::ps] // ps
            expected = (pages[:, None] * ps + self._offsets).reshape(-1)[:num]
            if expected.tobytes() != array.tobytes():  # one memcmp on the happy path
                if np.any(array[::ps] % ps):
                    raise ArgumentError("slots: each page must start at a multiple of page_size")
                raise ArgumentError("slots: must list whole pages, each page's slots in order")
        positions = np.arange(pages.size, dtype=np.intp)
        last_position = self._last_position
        last_position[pages] = positions  # a repeated page keeps only its last position
        if last_position[pages].tobytes() != positions.tobytes():
            raise DoubleFreeError("slots: the same page is listed twice")
        was_free = self._page_is_free[pages]
        if np.count_nonzero(was_free):  # three times cheaper than .any() at these sizes
            raise DoubleFreeError(f"slots: page {int(pages[was_free][0])} is already free")
        top = self._num_free
        self._free_pages[top : top + pages.size] = pages[::-1]
        self._num_free = top + pages.size
        self._page_is_free[pages] = True

    def _as_slot_array(self, slots: torch.Tensor | Sequence[int]) -> np.ndarray:
        """The slots as a fresh 1-D ``np.intp`` array, each checked to lie in ``[0, num_slots)``."""
        if isinstance(slots, torch.Tensor):
            if slots.dtype not in (torch.int32, torch.int64):
                raise ArgumentTypeError(f"slots must be an int32 or int64 tensor, got {slots.dtype}")
            if slots.dim() != 1:
                raise ArgumentError(f"slots must be 1-D, got shape {tuple(slots.shape)}")
            array = slots.cpu().numpy().astype(np.intp)  # integer tensors never carry autograd history
        elif isinstance(slots, (list, tuple)):
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in slots):
                raise ArgumentTypeError("slots must contain only ints")
            array = np.asarray(slots, dtype=np.intp).reshape(-1)
        else:
            raise ArgumentTypeError(f"slots must be a tensor or a list of ints, got {type(slots).__name__}")
        # Seen as unsigned, a negative slot is huge: one max() checks both ends.
        if array.size and array.view(np.uintp).max() >= self.num_slots:
            bad = int(array[(array < 0) | (array >= self.num_slots)][0])
            raise SlotIndexError(f"slots: slot {bad} is outside [0, {self.num_slots})")
        return array

    def _slots_of(self, pages: np.ndarray, num_tokens: int) -> torch.Tensor:
        if self.page_size == 1:
            slots = pages[:num_tokens]
        else:
            slots = (pages[:, None] * self.page_size + self._offsets).reshape(-1)[:num_tokens]
        tensor = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int32))
        return tensor if self._on_cpu else tensor.to(self.device)

    def __repr__(self) -> str:
        return f"PagePool(num_pages={self.num_pages}, page_size={self.page_size}, free_pages={self._num_free})"
