"""``NaiveCacheManager``: the baseline that caches nothing.

It satisfies the manager interface so the rest of the server runs unchanged,
which makes it the control group: every prompt token is recomputed, nothing is
ever kept, so there is nothing to lock and nothing to evict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._validate import as_count, as_device, as_slot_array, as_token_ids
from .base import BaseCacheHandle, BaseCacheManager, SizeInfo, TokenIds
from .errors import ArgumentTypeError, EvictionUnsupportedError
from .language import tr


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    """The only handle this manager hands out has ``cached_len == 0``."""


class NaiveCacheManager(BaseCacheManager):
    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = as_device(device)
        self.page_size = 1
        # Created once on the right device with the right dtype, as the notes teach. Every empty
        # result is a new tensor made from it: one shared result could be resized by one caller,
        # and every later "empty" result would then hold that caller's slots.
        self.empty_tensor = torch.empty(0, dtype=torch.int32, device=self.device)

    def match_prefix(self, input_ids: TokenIds) -> tuple[NaiveCacheHandle, torch.Tensor]:
        as_token_ids(input_ids)
        return NaiveCacheHandle(0), self._no_slots()

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        self._check_handle(handle)

    def insert_prefix(self, input_ids: TokenIds, indices: TokenIds, *, handle: BaseCacheHandle | None = None) -> int:
        ids = as_token_ids(input_ids)
        slots = as_slot_array(indices, self.device, length=len(ids))
        if handle is not None:
            self._check_handle(handle)
        # "Everything is already cached": the caller frees indices[0:len], i.e. all of them.
        return len(slots)

    def evict(self, size: int) -> torch.Tensor:
        if as_count(size, "size") == 0:
            return self._no_slots()
        raise EvictionUnsupportedError(
            tr(
                "size: asked to evict {size} slots, but NaiveCacheManager caches nothing, so it has nothing to evict",
                size=size,
            )
        )

    def reset(self) -> torch.Tensor:
        return self._no_slots()

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=0, protected_size=0)

    def check_integrity(self) -> None:
        """Nothing is stored, so nothing can be inconsistent."""

    def _check_handle(self, handle: BaseCacheHandle) -> None:
        if not isinstance(handle, NaiveCacheHandle):
            raise ArgumentTypeError(f"handle must be a NaiveCacheHandle, got {type(handle).__name__}")

    def _no_slots(self) -> torch.Tensor:
        return self.empty_tensor.new_empty(0)
