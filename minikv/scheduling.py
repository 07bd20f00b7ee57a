"""Scheduling policies: which waiting request the :class:`~minikv.engine.Engine` admits first.

At the start of every step the engine hands its waiting queue to its policy and
admits from the front of the order it gets back, until a request does not fit
(the requests behind it wait too: admission never skips ahead). A policy only
*orders*; it never admits, allocates or touches the tree.

* :class:`FCFS` -- first come, first served: the queue as it is (the default).
* :class:`LongestPrefixMatch` -- SGLang's ``lpm``: the request with the longest
  cached prefix first, so a prefix still in the tree is used before eviction
  takes it; it can starve a request that matches nothing.
* :class:`DFSWeight` -- SGLang's ``dfs-weight``, simplified: requests grouped by
  the tree node where their match ends, groups visited depth-first, the heaviest
  subtree (most waiting requests) first, so requests that share a path go together.
* :class:`Aging` -- longest prefix first, but every step spent waiting counts as
  cached tokens, so a request that matches nothing is admitted in the end.

Measuring the match must not change the tree: a match stamps the path (LRU
order) and splits a node where it ends inside one, so a policy that called
``match_prefix`` on every waiting request at every step would reorder eviction.
:func:`cached_prefix_len` uses the read-only half of the walk,
:meth:`RadixCacheManager.find <minikv.RadixCacheManager.find>`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._validate import as_named_choice
from .base import BaseCacheManager
from .errors import ArgumentError, ArgumentTypeError
from .radix_manager import RadixCacheManager, RadixTreeNode

if TYPE_CHECKING:
    from .engine import EngineRequest


class SchedulingPolicy(ABC):
    """Orders the waiting queue before admission. Subclass it and implement :meth:`order`."""

    name: str = ""
    """The short name :func:`as_policy` accepts for it."""

    @abstractmethod
    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        """The same requests, in the order to try admitting them. Must not change ``cache``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FCFS(SchedulingPolicy):
    """First come, first served: arrival order (a preempted request goes back to the front)."""

    name = "fcfs"

    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        return list(waiting)


class LongestPrefixMatch(SchedulingPolicy):
    """Longest cached prefix first (SGLang's ``lpm``); ties keep arrival order.

    It admits requests while their prefix is in the tree, instead of letting an
    older request's allocation evict it first. A request that matches nothing
    waits as long as requests that match keep arriving: see :class:`Aging`.
    """

    name = "lpm"

    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        return sorted(waiting, key=lambda r: -cached_prefix_len(cache, r.token_ids))


class DFSWeight(SchedulingPolicy):
    """SGLang's ``dfs-weight``, simplified: waiting requests in depth-first order over the tree.

    Each request is filed under the node its match ends at (the child it ends
    inside, if it stops partway through one; the root if it matches nothing). A
    node's weight is the number of requests filed at it or below it. The order is
    a depth-first walk from the root, as SGLang's ``_get_dfs_priority`` does it:
    a node's children, heaviest first (ties: the one holding the earliest arrival),
    then the node's own requests in arrival order. Requests that share a path go
    together, a popular branch is admitted while it is in the tree, and requests
    that match nothing (filed at the root) come last. Unlike SGLang, filing a
    request does not split the tree.
    """

    name = "dfs-weight"

    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        if not isinstance(cache, RadixCacheManager):
            return list(waiting)  # no tree to walk: every request sits at the root
        at: dict[int, list[EngineRequest]] = {}
        weight: dict[int, int] = {}
        first: dict[int, int] = {}  # node uid -> the earliest arrival at it or below
        for request in waiting:
            node = _match_node(cache, request.token_ids)
            at.setdefault(node.uid, []).append(request)
            walker: RadixTreeNode | None = node
            while walker is not None:
                weight[walker.uid] = weight.get(walker.uid, 0) + 1
                first[walker.uid] = min(first.get(walker.uid, request.uid), request.uid)
                walker = walker.parent
        ordered: list[EngineRequest] = []
        stack: list[tuple[RadixTreeNode, bool]] = [(cache.root_node, False)]
        while stack:  # depth first, a node's own requests after its subtree's
            node, visited = stack.pop()
            if visited:
                ordered.extend(at.get(node.uid, []))
                continue
            stack.append((node, True))
            children = [c for c in node.children.values() if c.uid in weight]
            children.sort(key=lambda c: (-weight[c.uid], first[c.uid]))
            stack.extend((c, False) for c in reversed(children))  # the heaviest child is popped first
        return ordered


class Aging(SchedulingPolicy):
    """Longest prefix first, but each step a request has waited counts as ``tokens_per_step`` cached tokens.

    Priority is ``cached prefix + tokens_per_step * waited steps``
    (``EngineRequest.waited_steps``).
    A request that has waited ``L / tokens_per_step`` steps longer than a newcomer
    outranks it whatever their matches (``L``: the longest prompt), so only requests
    that arrived before it, finitely many, can still go first: its wait is bounded.
    """

    name = "aging"

    def __init__(self, tokens_per_step: float = 1.0) -> None:
        if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, (int, float, np.integer, np.floating)):
            raise ArgumentTypeError(f"tokens_per_step must be a number, got {type(tokens_per_step).__name__}")
        if not tokens_per_step > 0 or not np.isfinite(tokens_per_step):
            raise ArgumentError(f"tokens_per_step must be positive and finite, got {tokens_per_step}")
        self.tokens_per_step = float(tokens_per_step)

    def order(self, waiting: Sequence[EngineRequest], cache: BaseCacheManager) -> list[EngineRequest]:
        def priority(request: EngineRequest) -> float:
            return cached_prefix_len(cache, request.token_ids) + self.tokens_per_step * request.waited_steps

        return sorted(waiting, key=lambda r: -priority(r))

    def __repr__(self) -> str:
        return f"Aging(tokens_per_step={self.tokens_per_step:g})"


POLICIES: dict[str, type[SchedulingPolicy]] = {p.name: p for p in (FCFS, LongestPrefixMatch, DFSWeight, Aging)}
"""The policies by the short name :func:`as_policy` accepts."""


def as_policy(policy: object) -> SchedulingPolicy:
    """A policy object, or a fresh one for its name (``"fcfs"``, ``"lpm"``, ``"dfs-weight"``, ``"aging"``).

    Anything else is refused with an error that names ``policy``.
    """
    return as_named_choice(policy, SchedulingPolicy, POLICIES, "policy")


def cached_prefix_len(cache: BaseCacheManager, ids: np.ndarray) -> int:
    """How many tokens of ``ids[:-1]`` admission would match now (page-aligned), without changing the tree.

    ``ids[:-1]``, as admission matches: the last token is always computed. Only a
    :class:`~minikv.RadixCacheManager` can be asked without a change
    (its :meth:`~minikv.RadixCacheManager.find`); for any other
    manager this is 0, and the prefix-aware policies fall back to arrival order.
    """
    if not isinstance(cache, RadixCacheManager):
        return 0
    return cache.find(ids[:-1])[1]


def _match_node(cache: RadixCacheManager, ids: np.ndarray) -> RadixTreeNode:
    """The node a match of ``ids[:-1]`` ends at: the child it stops inside, if any."""
    node, _, cut = cache.find(ids[:-1])
    return cut[0] if cut is not None else node
