"""``LifecycleEngine``: the serving engine, admitting and releasing requests with two functions of your own.

:class:`~minikv.engine.Engine` reserves a request's memory in ``Engine._reserve``
(match ``ids[:-1]``, lock, allocate) and gives it back in ``Engine._release``
(insert, free what the tree did not take, unlock): the steps of
:mod:`minikv.lifecycle`, written out inline. This engine calls two functions for
them instead, in the signatures of exercise 2, so the course can run chapter 6's
engine on the learner's own code::

    admit(manager, pool, input_ids) -> (handle, indices)          # steps 1-3
    finish(manager, pool, input_ids, handle, indices) -> int      # steps 4, 5, 7

``input_ids`` is a 1-D ``int64`` tensor; ``indices`` holds one slot per token,
the matched prefix's first. The defaults, :func:`lifecycle_admit` and
:func:`lifecycle_finish`, are minikv's own :func:`~minikv.lifecycle.admit` and
:func:`~minikv.lifecycle.finish` in those signatures.

What stays the engine's:

* **whether** a request fits. Before calling ``admit`` the engine matches,
  locks and checks the room exactly as ``Engine._reserve`` does (the admission
  policy's room for decode included), then unlocks: ``admit`` is called only
  when its allocation fits, so it never needs to fail.
* **whole pages.** With ``page_size > 1`` ``admit`` allocates slots for the
  prompt's tokens; the pool hands out whole pages, so the engine adds the rest
  of the last page to the request's row, for its decode steps to fill.
* **the tokens whose K/V exist.** ``finish`` gets the tokens computed so far
  (prompt and generated, up to the last one fed to the model) and their slots;
  whole pages reserved and never written are the engine's to free.
* everything else: the rows of ``req_to_token``, decode pages, preemption (which
  releases through ``finish`` too), chunked prefill and sharing a prompt's pages
  after its prefill (``Engine._insert_unfinished``, which moves the request's lock to
  a longer match: ``finish`` then gets that handle).

What ``admit`` returns is checked (a handle, and one slot per token with the
last token left to compute); a wrong one is refused with an error naming
``admit``. What the two functions do to the cache and the pool is not checked
as they run: :meth:`~minikv.engine.Engine.check` finds a slot lost or held twice.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from . import lifecycle
from .base import BaseCacheHandle, BaseCacheManager
from .engine import Engine, EngineRequest
from .errors import ArgumentError, ArgumentTypeError
from .language import tr
from .page_pool import PagePool

__all__ = ["AdmitFunction", "FinishFunction", "LifecycleEngine", "as_lifecycle", "lifecycle_admit", "lifecycle_finish"]


class AdmitFunction(Protocol):
    """``admit(manager, pool, input_ids) -> (handle, indices)``: match ``input_ids[:-1]``, lock, allocate."""

    def __call__(
        self, manager: BaseCacheManager, pool: PagePool, input_ids: torch.Tensor, /
    ) -> tuple[BaseCacheHandle, torch.Tensor]: ...


class FinishFunction(Protocol):
    """``finish(manager, pool, input_ids, handle, indices) -> already_cached``: insert, free, unlock."""

    def __call__(
        self, manager: BaseCacheManager, pool: PagePool, input_ids: torch.Tensor, handle: BaseCacheHandle,
        indices: torch.Tensor, /,
    ) -> int: ...  # fmt: skip


def lifecycle_admit(
    manager: BaseCacheManager, pool: PagePool, input_ids: torch.Tensor
) -> tuple[BaseCacheHandle, torch.Tensor]:
    """:func:`minikv.lifecycle.admit` in exercise 2's signature: the locked handle and the request's slots."""
    request = lifecycle.admit(manager, pool, input_ids)
    return request.handle, request.indices


def lifecycle_finish(
    manager: BaseCacheManager, pool: PagePool, input_ids: torch.Tensor, handle: BaseCacheHandle, indices: torch.Tensor
) -> int:
    """:func:`minikv.lifecycle.finish` in exercise 2's signature; returns what ``insert_prefix`` returned."""
    request = lifecycle.Request(input_ids.cpu().numpy(), handle, indices, manager=manager, pool=pool)
    return lifecycle.finish(manager, pool, request)


def as_lifecycle(admit: object, finish: object) -> tuple[AdmitFunction, FinishFunction]:
    """The two functions (None: minikv's own), each refused by name unless it is callable."""
    for name, function in (("admit", admit), ("finish", finish)):
        if function is not None and not callable(function):
            raise ArgumentTypeError(
                tr("{name} must be None or a function, got {type}", name=name, type=type(function).__name__)
            )
    chosen_admit = lifecycle_admit if admit is None else admit
    chosen_finish = lifecycle_finish if finish is None else finish
    return chosen_admit, chosen_finish  # type: ignore[return-value]


class LifecycleEngine(Engine):
    """An :class:`~minikv.engine.Engine` whose admission and release call ``admit`` and ``finish``.

    The other arguments are the engine's. ``admit`` and ``finish`` (None: minikv's
    own, :func:`lifecycle_admit` and :func:`lifecycle_finish`) are described in
    the module docstring; ``make_engine(model, ..., admit=..., finish=...)`` builds one.
    """

    def __init__(
        self,
        *args: Any,
        admit: AdmitFunction | None = None,
        finish: FinishFunction | None = None,
        **kwargs: Any,
    ) -> None:
        self.admit_fn, self.finish_fn = as_lifecycle(admit, finish)  # checked before anything is built
        super().__init__(*args, **kwargs)

    def _reserve(self, ids: np.ndarray, reserve: int) -> tuple[BaseCacheHandle, torch.Tensor, torch.Tensor] | None:
        """The engine decides whether the request fits; ``admit`` matches, locks and allocates."""
        if not self._fits(ids, reserve):
            return None
        admitted = self.admit_fn(self.cache, self.pool, torch.from_numpy(ids))
        handle, indices = self._checked_admission(admitted, len(ids))
        cached = handle.cached_len
        return handle, indices[:cached], self._whole_pages(indices[cached:])

    def _fits(self, ids: np.ndarray, reserve: int) -> bool:
        """``Engine._reserve``'s test, holding nothing after it: its match locked, is there room?"""
        handle, _ = self.cache.match_prefix(torch.from_numpy(ids[:-1]))
        needed = self.pool.pages_for(len(ids) - handle.cached_len) * self.page_size  # whole pages
        self.cache.lock_handle(handle)
        fits = needed + reserve <= self._available()  # our own match is not evictable meanwhile
        self.cache.lock_handle(handle, unlock=True)
        return fits

    def _checked_admission(self, admitted: object, num_tokens: int) -> tuple[BaseCacheHandle, torch.Tensor]:
        """``admit``'s answer, if it is ``(handle, indices)`` with one slot per token and the last one to compute."""
        if not (isinstance(admitted, tuple) and len(admitted) == 2 and isinstance(admitted[0], BaseCacheHandle)):
            raise ArgumentTypeError(
                tr("admit must return (handle, indices), got {type}", type=type(admitted).__name__)
            )  # fmt: skip
        handle, indices = admitted
        if not isinstance(indices, torch.Tensor):
            raise ArgumentTypeError(tr("admit: indices must be a tensor, got {type}", type=type(indices).__name__))
        if indices.dim() != 1 or len(indices) != num_tokens:
            raise ArgumentError(
                tr("admit: indices must be 1-D with one slot per token ({count}), got shape {shape}",
                   count=num_tokens, shape=tuple(indices.shape))
            )  # fmt: skip
        if handle.cached_len >= num_tokens:
            raise ArgumentError(
                tr("admit: matched all {count} tokens; match input_ids[:-1], so the last one is computed",
                   count=num_tokens)
            )  # fmt: skip
        return handle, indices.to(device=self.pool.device, dtype=torch.int32)

    def _whole_pages(self, new_slots: torch.Tensor) -> torch.Tensor:
        """The new slots and the rest of their last page: the pool gave the request that whole page."""
        last = int(new_slots[-1])
        short = self.page_size - 1 - last % self.page_size  # slots of its page after the last one
        if short == 0:
            return new_slots
        rest = torch.arange(last + 1, last + 1 + short, dtype=new_slots.dtype, device=new_slots.device)
        return torch.cat([new_slots, rest])

    def _release(self, request: EngineRequest) -> None:
        """``finish`` gives back the tokens whose K/V exist; the engine frees whole pages never written."""
        assert request.handle is not None
        kv = min(request.kv_len, len(request.prompt) + len(request.output))
        slots = self.req_to_token[request.row, : request.num_slots].clone()
        ids = torch.from_numpy(request.token_ids[:kv])
        self.finish_fn(self.cache, self.pool, ids, request.handle, slots[:kv])
        self.pool.free(slots[self.pool.pages_for(kv) * self.page_size :])
        del self._holders[request.row]
        self._free_rows.append(request.row)
        request.handle, request.row, request.num_slots, request.kv_len = None, -1, 0, 0
