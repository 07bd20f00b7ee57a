"""Shared helpers for the minikv core tests: tree views, full-state snapshots, slot accounting.

The tests compare what a manager *holds* with what a plain model says it should
hold. These helpers turn a radix tree into plain data (a dict from page prefix
to slots) and take snapshots of every piece of state a failed call must leave alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, settings

from minikv import MHAKVCache, PagePool, RadixCacheManager, RadixTreeNode
from minikv.base import BaseCacheManager

# Derandomized: CI sees the same examples on every run; no example database is written.
REPRODUCIBLE = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PageKey = tuple[int, ...]
"""The token ids from the start of a sequence up to the end of one page (one token when page_size is 1)."""


@dataclass(frozen=True)
class Entry:
    """One cached page as the tree holds it: its slots and the node that holds it."""

    slots: tuple[int, ...]
    timestamp: int
    ref_count: int


def nodes_with_prefix(manager: RadixCacheManager) -> list[tuple[tuple[int, ...], RadixTreeNode]]:
    """Every non-root node with the token ids from the root up to (not including) the node."""
    found: list[tuple[tuple[int, ...], RadixTreeNode]] = []
    stack: list[tuple[tuple[int, ...], RadixTreeNode]] = [((), manager.root_node)]
    while stack:
        prefix, node = stack.pop()
        for child in node.children.values():
            found.append((prefix, child))
            stack.append((prefix + tuple(child.key.tolist()), child))
    return found


def tree_entries(manager: RadixCacheManager) -> dict[PageKey, Entry]:
    """The tree as plain data: page key -> (slots, timestamp, ref_count) of the node holding that page."""
    ps = manager.page_size
    entries: dict[PageKey, Entry] = {}
    for prefix, node in nodes_with_prefix(manager):
        key = tuple(node.key.tolist())
        value = tuple(node.value.tolist())
        for start in range(0, len(key), ps):
            page_key = prefix + key[: start + ps]
            assert page_key not in entries, f"page {page_key} appears twice in the tree"
            entries[page_key] = Entry(value[start : start + ps], node.timestamp, node.ref_count)
    return entries


def tree_slots(manager: RadixCacheManager) -> list[int]:
    return [s for _, node in nodes_with_prefix(manager) for s in node.value.tolist()]


def manager_snapshot(manager: BaseCacheManager) -> object:
    """Everything observable about a manager: tree shape, keys, slots, locks, times, sizes."""
    if not isinstance(manager, RadixCacheManager):
        return (type(manager).__name__, manager.size_info, manager.page_size)
    nodes = tuple(
        sorted(
            (
                prefix,
                tuple(node.key.tolist()),
                tuple(node.value.tolist()),
                str(node.value.dtype),
                node.ref_count,
                node.timestamp,
                node.uid,
                node.parent.uid if node.parent is not None else None,
                tuple(sorted(map(repr, node.children))),
            )
            for prefix, node in nodes_with_prefix(manager)
        )
    )
    root = manager.root_node
    return (nodes, root.ref_count, manager.size_info, manager.num_nodes, manager.clock)


def pool_snapshot(pool: PagePool) -> object:
    """Free pages *in the order they will be handed out*, and the eviction counter."""
    order = tuple(pool.allocation_order())
    return (pool.num_free_pages, tuple(pool.free_slots().tolist()), order, pool.num_evicted_slots)


def cache_snapshot(cache: MHAKVCache) -> torch.Tensor:
    return cache.kv_buffer.detach().clone()


def pages_of(slots: Iterable[int], page_size: int) -> list[int]:
    """Page numbers of slots, one per page touched (slots of one page counted once)."""
    seen: list[int] = []
    for s in slots:
        page = s // page_size
        if not seen or seen[-1] != page:
            seen.append(page)
    return seen


def assert_pages_accounted(pool: PagePool, holders: dict[str, Iterable[int]]) -> None:
    """Every page is in exactly one place: free in the pool, or held by one named holder.

    ``holders`` maps a name ("tree", "request 3", ...) to the slots it holds.
    """
    ps = pool.page_size
    owner_of: dict[int, str] = {}
    for page in pages_of(pool.free_slots().tolist(), ps):
        owner_of[page] = "free"
    for name, slots in holders.items():
        for page in {s // ps for s in slots}:
            assert page not in owner_of, f"page {page} is held by {name} and by {owner_of[page]}"
            owner_of[page] = name
    missing = sorted(set(range(pool.num_pages)) - set(owner_of))
    assert not missing, f"pages leaked (neither free nor held): {missing}"


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit for bit (so -0.0 differs from 0.0 and every NaN payload counts)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    as_int = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[actual.dtype]
    a = actual.contiguous().view(as_int)
    b = expected.contiguous().view(as_int)
    if not torch.equal(a, b):
        where = (a != b).nonzero()[:5].tolist()
        raise AssertionError(f"tensors differ bitwise at {where}")


def smollm2_or_skip() -> None:
    """Skip where SmolLM2's weights are not installed, naming the install command; in CI (which installs them), fail."""
    from minikv.models import ModelFileError, smollm2_path

    try:
        smollm2_path()
    except ModelFileError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
