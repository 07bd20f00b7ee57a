"""``PagePool``: the free list of KV pages, and allocation that evicts on demand.

The manager decides what stays cached; the pool knows which pages nobody holds.
Every slot is, at every moment, in exactly one of three places: free in the
pool, owned by the cache manager's tree, or held by a running request.
"""

from __future__ import annotations

import numpy as np
import torch

from ._validate import IntegerSequence, as_count, as_device, as_positive, as_slot_array
from .base import BaseCacheManager
from .errors import ArgumentError, ArgumentTypeError, DoubleFreeError, OutOfSlotsError
from .language import tr


class PagePool:
    """A fixed number of pages of ``page_size`` token slots each.

    Slot ``s`` belongs to page ``s // page_size``. Allocation hands out whole
    pages (lowest numbers first on a fresh pool, then the most recently freed
    first) and returns one slot per token.
    """

    def __init__(self, num_pages: int, page_size: int = 1, device: torch.device | str = "cpu") -> None:
        self.num_pages = as_positive(num_pages, "num_pages")
        self.page_size = as_positive(page_size, "page_size")
        self.device = as_device(device)
        # The free pages as a stack: entries [0, _num_free) are free, and the
        # last of them, _free_stack[_num_free - 1], is the next to hand out.
        self._free_stack = np.arange(self.num_pages - 1, -1, -1, dtype=np.int64)
        self._num_free = self.num_pages
        self._page_is_free = np.ones(self.num_pages, dtype=bool)
        self._position = np.zeros(self.num_pages, dtype=np.int64)  # scratch space for _has_repeats
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

    def allocation_order(self) -> list[int]:
        """The free pages in the order :meth:`allocate` will hand them out, next first."""
        order: list[int] = self._free_stack[: self._num_free][::-1].tolist()
        return order

    def allocate(self, num_tokens: int, evict_from: BaseCacheManager | None = None) -> torch.Tensor:
        """Slots for ``num_tokens`` tokens, as ``int32`` on the pool's device.

        When free pages run short and ``evict_from`` is given, the shortfall is
        evicted from that manager first. If even that cannot cover it, raises
        :class:`~minikv.errors.OutOfSlotsError` and changes nothing. Before
        evicting, a manager that keeps a record of the slots its tree holds
        (``held_slot_mask()``) is checked to hold only pages this pool handed out:
        evicting anything else would fail after the manager had already dropped it.
        """
        num_tokens = as_count(num_tokens, "num_tokens")
        if evict_from is not None:
            if not all(hasattr(evict_from, name) for name in ("evict", "size_info", "page_size")):
                raise ArgumentTypeError(f"evict_from must be a cache manager, got {type(evict_from).__name__}")
            if evict_from.page_size != self.page_size:
                raise ArgumentError(
                    f"evict_from: manager page_size {evict_from.page_size} differs from the pool's {self.page_size}"
                )
        needed = self.pages_for(num_tokens)
        if needed > self._num_free:
            shortfall = (needed - self._num_free) * self.page_size
            evictable = evict_from.size_info.evictable_size if evict_from is not None else 0
            if evict_from is None or evictable < shortfall:
                raise OutOfSlotsError(
                    tr(
                        "num_tokens: {num_tokens} tokens need {needed} slots in pages of {page_size}; "
                        "{free} slots are free and {evictable} are evictable, {short} short",
                        num_tokens=num_tokens,
                        needed=needed * self.page_size,
                        page_size=self.page_size,
                        free=self._num_free * self.page_size,
                        evictable=evictable,
                        short=shortfall - evictable,
                    )
                )
            self._check_holds_only_used_pages(evict_from)
            evicted = evict_from.evict(shortfall)
            self.free(evicted)
            self.num_evicted_slots += len(evicted)
        top = self._num_free
        pages = self._free_stack[top - needed : top][::-1]
        slots = self._slots_of(pages, num_tokens)  # a copy: later frees overwrite the stack
        self._num_free = top - needed
        self._page_is_free[pages] = False
        return slots

    def free(self, slots: IntegerSequence) -> None:
        """Return the pages these slots belong to.

        ``slots`` must be whole pages, each page's slots in order (the last page
        may be cut short), as ``allocate``, ``match_prefix`` and ``evict`` produce
        them. Freeing a page that is already free, or the same page twice, raises
        :class:`~minikv.errors.DoubleFreeError`; any refused call frees nothing.
        """
        array = as_slot_array(slots, name="slots", below=self.num_slots).astype(np.intp)  # NumPy indexes with intp
        if array.size == 0:
            return
        pages = self._pages_of(array)
        if self._has_repeats(pages):
            raise DoubleFreeError("slots: the same page is listed twice")
        was_free = self._page_is_free[pages]
        if was_free.any():
            raise DoubleFreeError(f"slots: page {int(pages[was_free][0])} is already free")
        top = self._num_free
        self._free_stack[top : top + pages.size] = pages[::-1]
        self._num_free = top + pages.size
        self._page_is_free[pages] = True

    def _has_repeats(self, pages: np.ndarray) -> bool:
        """Whether a page is listed twice, in one pass and without sorting.

        Each page writes its position in the list into a scratch array; a page
        listed twice keeps only its last position, so reading back differs.
        """
        positions = np.arange(pages.size)
        self._position[pages] = positions
        return not np.array_equal(self._position[pages], positions)

    def _pages_of(self, slots: np.ndarray) -> np.ndarray:
        """The page of each whole page in ``slots``; refuses slots that are not whole pages in order."""
        ps = self.page_size
        if ps == 1:
            return slots
        firsts = slots[::ps]
        if np.any(firsts % ps):
            raise ArgumentError("slots: each page must start at a multiple of page_size")
        pages = firsts // ps
        if not np.array_equal(self._slots_of_pages(pages)[: slots.size], slots):
            raise ArgumentError("slots: must list whole pages, each page's slots in order")
        return pages

    def _check_holds_only_used_pages(self, manager: BaseCacheManager) -> None:
        """Refuse to evict from a manager whose tree holds a slot outside this pool, or a free one.

        The radix manager keeps a record of the slots its tree holds (``held_slot_mask``), so this
        is one comparison with the pool's free pages, whatever the size of the tree. A manager
        that keeps no such record is not checked.
        """
        held_slot_mask = getattr(manager, "held_slot_mask", None)
        if held_slot_mask is None:
            return
        held = held_slot_mask()
        outside = np.flatnonzero(held[self.num_slots :])
        if outside.size:
            raise ArgumentError(
                f"evict_from: the manager holds slot {self.num_slots + int(outside[0])}, "
                f"outside this pool's [0, {self.num_slots})"
            )
        # The tree holds whole pages, so the first slot of a page says whether the page is held.
        held_pages = held[: self.num_slots : self.page_size]
        held_and_free = held_pages & self._page_is_free[: len(held_pages)]
        if held_and_free.any():
            slot = int(held_and_free.argmax()) * self.page_size
            raise ArgumentError(f"evict_from: the manager holds slot {slot}, which is free in this pool")

    def _slots_of_pages(self, pages: np.ndarray) -> np.ndarray:
        """Every slot of ``pages``, page by page."""
        if self.page_size == 1:
            return pages
        offsets = np.arange(self.page_size, dtype=np.int64)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def _slots_of(self, pages: np.ndarray, num_tokens: int) -> torch.Tensor:
        """The first ``num_tokens`` slots of ``pages``, as an int32 tensor on the pool's device."""
        slots = self._slots_of_pages(pages)[:num_tokens]
        return torch.from_numpy(slots.astype(np.int32)).to(self.device)

    def __repr__(self) -> str:
        return f"PagePool(num_pages={self.num_pages}, page_size={self.page_size}, free_pages={self._num_free})"
