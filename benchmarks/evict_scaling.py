"""Cost of one eviction as the tree grows: an incremental heap against a full scan.

mini-sglang's old ``RadixCacheManager.evict`` walked the whole tree on every
call to collect the unlocked leaves, heapified them by timestamp, then popped.
That is O(n) per call in the number of nodes, however little is evicted.
minikv keeps a heap of evictable leaves up to date as the tree changes, so a
call costs O(log n) per evicted leaf (plus skipping stale entries).

Both run here in one process on identical trees of ``n`` leaves
(``n`` = 10^2 .. 10^5): :class:`FullScanRadixCacheManager` below differs from
the shipped manager only in rebuilding the heap from a full DFS at the start of
every ``evict``. Each timed call evicts one leaf (the least recently used);
the leaf is put back, untimed, so every call sees the same ``n``.

Run: ``.venv/bin/python benchmarks/evict_scaling.py [--max-n N]``.
Writes ``benchmarks/results/evict_scaling.json``.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import statistics
import time
from typing import Any

import numpy as np
import torch
from _common import table, write_results

from minikv import RadixCacheManager, RadixTreeNode

PREFIXES = 16
PREFIX_LEN = 32
LEAF_LEN = 8


class FullScanRadixCacheManager(RadixCacheManager):
    """The shipped manager, except that every ``evict`` first rebuilds its heap from a DFS of the whole tree.

    That is what mini-sglang's old code did (collect all unlocked leaves, heapify,
    pop). Everything after the rebuild -- popping, unlinking, pushing a parent
    that became a leaf -- is the shipped code, so the two differ only in the scan.
    Relies on one internal of its parent class: the heap ``_heap`` of ``(timestamp, uid, node)``.
    """

    def evict(self, size: int) -> torch.Tensor:
        if isinstance(size, int) and 0 < size <= self.evictable_size:
            leaves: list[tuple[int, int, RadixTreeNode]] = []
            stack = list(self.root_node.children.values())
            while stack:
                node = stack.pop()
                if node.children:
                    stack.extend(node.children.values())
                elif node.ref_count == 0:
                    leaves.append((node.timestamp, node.uid, node))
            heapq.heapify(leaves)
            self._heap = leaves
        return super().evict(size)


def leaf_keys(n: int) -> list[np.ndarray]:
    """``n`` prompts: one of 16 shared 32-token prefixes, then an 8-token tail of their own."""
    rng = np.random.default_rng(n)
    prefixes = [rng.integers(0, 32000, PREFIX_LEN) for _ in range(PREFIXES)]
    keys = []
    for i in range(n):
        # A first token of its own (ids need not fit a vocabulary here) makes every leaf a direct child of its prefix.
        tail = np.array([32000 + i, *rng.integers(0, 32000, LEAF_LEN - 1)], dtype=np.int64)
        keys.append(np.concatenate([prefixes[i % PREFIXES], tail]))
    return keys


def build(manager_cls: type[RadixCacheManager], keys: list[np.ndarray]) -> RadixCacheManager:
    manager = manager_cls()
    next_slot = 0
    for key in keys:
        handle, matched = manager.match_prefix(key)
        new = len(key) - handle.cached_len
        slots = torch.arange(next_slot, next_slot + new, dtype=torch.int32)
        next_slot += new
        manager.insert_prefix(key, torch.cat([matched, slots]))
    return manager


def time_evictions(manager: RadixCacheManager, keys_by_slot: dict[int, np.ndarray], calls: int) -> list[float]:
    """Seconds per ``evict(1)`` call; each evicted leaf is re-inserted (untimed) with the same slots."""
    samples = []
    clock = time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for _ in range(calls):
            start = clock()
            evicted = manager.evict(1)
            samples.append(clock() - start)
            key = keys_by_slot[int(evicted[0])]
            _, matched = manager.match_prefix(key)
            manager.insert_prefix(key, torch.cat([matched, evicted]))
    finally:
        gc.enable()
    return samples


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    x, y = np.asarray(xs), np.asarray(ys)
    return float(np.polyfit(x, y, 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-n", type=int, default=100_000, help="largest number of leaves")
    args = parser.parse_args()
    sizes = [n for n in (100, 300, 1_000, 3_000, 10_000, 30_000, 100_000) if n <= args.max_n]

    rows: list[dict[str, Any]] = []
    for n in sizes:
        keys = leaf_keys(n)
        row: dict[str, Any] = {"leaves": n}
        for label, cls in (("heap", RadixCacheManager), ("full_scan", FullScanRadixCacheManager)):
            manager = build(cls, keys)
            assert manager.num_nodes == n + PREFIXES
            # Each leaf's own slots start right after its prefix; map the first one back to its key.
            keys_by_slot = {int(node.value[0]): keys_of(node) for node in leaves_of(manager)}
            calls = 300 if label == "heap" else max(5, min(100, 300_000 // n))
            samples = time_evictions(manager, keys_by_slot, calls)
            manager.check_integrity()
            assert manager.num_nodes == n + PREFIXES
            row[f"{label}_us"] = statistics.median(samples) * 1e6
            row[f"{label}_calls"] = calls
        row["ratio"] = row["full_scan_us"] / row["heap_us"]
        rows.append(row)
        print(f"  n={n:>7}: heap {row['heap_us']:8.2f} µs, full scan {row['full_scan_us']:10.1f} µs", flush=True)

    logs = [math.log10(r["leaves"]) for r in rows]
    growth = {
        # Slope of log(cost) against log(n): ~1 means linear in n, ~0 means (poly)logarithmic.
        "heap_loglog_slope": slope(logs, [math.log10(r["heap_us"]) for r in rows]),
        "full_scan_loglog_slope": slope(logs, [math.log10(r["full_scan_us"]) for r in rows]),
        # Linear fits: µs per extra leaf (full scan) and µs per doubling of n (heap).
        "full_scan_us_per_leaf": slope([r["leaves"] for r in rows], [r["full_scan_us"] for r in rows]),
        "heap_us_per_doubling": slope([math.log2(r["leaves"]) for r in rows], [r["heap_us"] for r in rows]),
    }
    print()
    print(
        table(
            rows,
            ["leaves", "heap_us", "full_scan_us", "ratio"],
            {"heap_us": ".2f", "full_scan_us": ".1f", "ratio": ".0f"},
        )
    )
    print(
        f"\ngrowth: log-log slope heap {growth['heap_loglog_slope']:.2f}, "
        f"full scan {growth['full_scan_loglog_slope']:.2f}"
        f"; full scan ≈ {growth['full_scan_us_per_leaf'] * 1000:.2f} ns per leaf"
        f"; heap +{growth['heap_us_per_doubling']:.3f} µs per doubling of n"
    )
    path = write_results(
        "evict_scaling",
        {
            "tree": {"prefixes": PREFIXES, "prefix_len": PREFIX_LEN, "leaf_len": LEAF_LEN},
            "rows": rows,
            "growth": growth,
        },
    )
    print(f"wrote {path}")


def leaves_of(manager: RadixCacheManager) -> list[RadixTreeNode]:
    stack, leaves = [manager.root_node], []
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(node.children.values())
        elif node is not manager.root_node:
            leaves.append(node)
    return leaves


def keys_of(node: RadixTreeNode) -> np.ndarray:
    """The full token sequence from the root to ``node``."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return np.concatenate(parts[::-1])


if __name__ == "__main__":
    main()
