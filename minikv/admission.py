"""Admission policies: how much room the :class:`~minikv.engine.Engine` keeps for decode when it admits.

A request's prompt is known at admission; how many tokens it will generate is
not (a stop token may end it early). Before admitting a request, the engine
asks its policy how many slots must stay available, free or evictable, beyond
the request's uncached prompt (:meth:`AdmissionPolicy.reserve`). The policies
trade admitting many requests at once against preempting some later:

* :class:`Optimistic` -- nano-vllm: the prompt must fit, plus one page held back
  per running request; when decode runs dry the newest request is preempted (the default).
* :class:`FullReservation` -- mini-sglang: every request's whole output budget is
  reserved at admission, so decode never runs dry and nothing is preempted.
* :class:`Retraction` -- SGLang: each running request's remaining budget counts
  at a ratio below one that falls step by step while decode keeps fitting and
  jumps back up after a retraction (a preemption).

A policy only answers how much to hold back (and hears about each decode step);
it never admits, allocates or preempts: the engine does.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._validate import as_named_choice
from .errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from .engine import EngineRequest


class AdmissionPolicy(ABC):
    """How many slots to hold back when admitting. Subclass it and implement :meth:`reserve`."""

    name: str = ""
    """The short name :func:`as_admission` accepts for it."""

    @abstractmethod
    def reserve(self, running: Sequence[EngineRequest], request: EngineRequest, page_size: int) -> int:
        """Slots that must stay available, beyond ``request``'s uncached prompt, to admit it beside ``running``."""

    def decoded(self, retracted: int) -> None:
        """Called after each decode batch is scheduled, with the number of requests preempted to make room.

        Most policies keep no state and ignore it (:class:`Retraction` moves its ratio).
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Optimistic(AdmissionPolicy):
    """Admit when the prompt fits with one page held back per running request; preempt when decode runs dry.

    nano-vllm's scheduler admits a request when the block manager can allocate
    its prompt, and when a decode step cannot get a block it preempts the
    newest running request, freeing its blocks for a full recompute later.
    minikv does the same, and also keeps one page per running request free for
    its next decode step, so admitting newcomers never forces the requests
    already running into preemption at once. Many requests run together; the
    price is the preemptions when their outputs grow.
    """

    name = "optimistic"

    def reserve(self, running: Sequence[EngineRequest], request: EngineRequest, page_size: int) -> int:
        return page_size * len(running)


class FullReservation(AdmissionPolicy):
    """Admit only when the uncached prompt and the request's whole output budget fit; never preempt.

    mini-sglang's prefill adder counts, for each request, its input plus its
    ``max_new_tokens`` against the memory left, and keeps counting the running
    requests' unused budgets as taken: a request is admitted only if the cache
    can hold everything it may still write. Decode then always finds a slot,
    so mini-sglang has no preemption at all. The price: room reserved for
    tokens that a stop token may never produce, so fewer requests run at once.

    Here each running request holds back the slots it has not yet got up to its
    longest length (prompt + ``max_new_tokens`` - 1: the last token is never fed
    back), in whole pages, and so does the request being admitted.
    """

    name = "full"

    def reserve(self, running: Sequence[EngineRequest], request: EngineRequest, page_size: int) -> int:
        return sum(_slots_to_come(r, page_size) for r in running) + _slots_to_come(request, page_size)


class Retraction(AdmissionPolicy):
    """Count each request's remaining budget at a ratio that decays while decode fits and rises after a retraction.

    SGLang admits against an *estimate* of the decode tokens still to come:
    each running request's remaining ``max_new_tokens`` times
    ``new_token_ratio``. The ratio starts at ``init_new_token_ratio`` (0.7 by
    default there), falls by ``new_token_ratio_decay`` after every decode step,
    never below ``min_new_token_ratio``, so a server whose requests keep
    stopping early admits more and more. When a decode step finds no room,
    SGLang *retracts* running requests (frees their memory and requeues them),
    and raises the ratio again (to an estimate from the batch it kept) so the
    next admissions are careful.

    Here a retraction is the engine's ordinary preemption (the newest request
    goes back to the front of the queue), and after one the ratio is reset to
    ``init_new_token_ratio``. Every running request and the one being admitted
    count ``ceil(ratio * s)`` slots, ``s`` being what :class:`FullReservation`
    would hold back for it (so a ratio of 1 is full reservation, and a request
    alone always fits). The object keeps the ratio: give each engine its own.
    """

    name = "retraction"

    def __init__(
        self,
        init_new_token_ratio: float = 0.7,
        min_new_token_ratio: float = 0.1,
        new_token_ratio_decay: float = 0.01,
    ) -> None:
        init = _as_ratio(init_new_token_ratio, "init_new_token_ratio")
        least = _as_ratio(min_new_token_ratio, "min_new_token_ratio")
        decay = _as_number(new_token_ratio_decay, "new_token_ratio_decay")
        if least > init:
            raise ArgumentError(f"min_new_token_ratio ({least:g}) must not exceed init_new_token_ratio ({init:g})")
        if not 0 <= decay <= 1:
            raise ArgumentError(f"new_token_ratio_decay must be in [0, 1], got {decay:g}")
        self.init_new_token_ratio, self.min_new_token_ratio, self.new_token_ratio_decay = init, least, decay
        self.new_token_ratio = init
        """The ratio now: what fraction of each remaining budget admission counts."""

    def reserve(self, running: Sequence[EngineRequest], request: EngineRequest, page_size: int) -> int:
        return sum(self._estimate(r, page_size) for r in running) + self._estimate(request, page_size)

    def _estimate(self, request: EngineRequest, page_size: int) -> int:
        return math.ceil(self.new_token_ratio * _slots_to_come(request, page_size))

    def decoded(self, retracted: int) -> None:
        if retracted:
            self.new_token_ratio = self.init_new_token_ratio
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)

    def __repr__(self) -> str:
        return (
            f"Retraction(init_new_token_ratio={self.init_new_token_ratio:g}, "
            f"min_new_token_ratio={self.min_new_token_ratio:g}, new_token_ratio_decay={self.new_token_ratio_decay:g})"
        )


ADMISSIONS: dict[str, type[AdmissionPolicy]] = {p.name: p for p in (Optimistic, FullReservation, Retraction)}
"""The admission policies by the short name :func:`as_admission` accepts."""


def as_admission(admission: object) -> AdmissionPolicy:
    """A policy object, or a fresh one for its name (``"optimistic"``, ``"full"``, ``"retraction"``).

    Anything else is refused with an error that names ``admission``.
    """
    return as_named_choice(admission, AdmissionPolicy, ADMISSIONS, "admission")


def _slots_to_come(request: EngineRequest, page_size: int) -> int:
    """Slots the request will still allocate, at most, before it finishes (whole pages).

    Its row ends at ``pages(longest)`` pages; it holds ``num_slots`` when running,
    and ``pages(len(token_ids))`` pages once admitted (a match is page-aligned).
    """
    longest = len(request.prompt) + request.max_new_tokens - 1
    held = request.num_slots if request.row >= 0 else -(-len(request.token_ids) // page_size) * page_size
    return max(0, -(-longest // page_size) * page_size - held)


def _as_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{name} must be a number, got {type(value).__name__}")
    if not np.isfinite(value):
        raise ArgumentError(f"{name} must be finite, got {value}")
    return float(value)


def _as_ratio(value: object, name: str) -> float:
    ratio = _as_number(value, name)
    if not 0 < ratio <= 1:
        raise ArgumentError(f"{name} must be in (0, 1], got {ratio:g}")
    return ratio
