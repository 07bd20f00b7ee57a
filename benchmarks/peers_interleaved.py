"""minikv against the peers, the peers taking turns in one process.

``../shared/bench/radix_peers.py`` runs every (peer, workload, pool) cell in a
fresh process, one after the other, and times wall clock. On a machine shared
with other jobs, the load changes between one peer's cell and the next, so the
ratio of two cells measured seconds apart carries that change: the same
shared_prompt/large cell of minikv read 48.6 µs and 99.4 µs per request one
minute apart. This script replays the same traffic through the same adapters
and the same replay loop (the harness's own ``replay_radix``, imported from
it), but in rounds: in each round every peer replays the whole workload once,
in turn, the order reversed every other round. Peers in one round see much
the same load, so the ratio *within a round* is the figure to read; the
script reports its median and its range over the rounds.

What differs from the harness: the peers share one process (and so one heap;
the harness's per-cell memory figure is not measured here), and there is no
warm-up run per cell, only one warm-up round.

Run from the repository root, with the peers' source where the harness finds it
(``../shared/bench/README.md``, "Getting the peers")::

    .venv/bin/python benchmarks/peers_interleaved.py [--rounds 7] [--workloads shared_prompt] [--pools large]

Writes ``benchmarks/results/peers_interleaved.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import table, write_results

REPO = Path(__file__).resolve().parent.parent
HARNESS = Path(os.environ.get("MINIKV_PEERS_BENCH") or REPO.parent / "shared" / "bench")


def cache_us_per_request(result: dict[str, Any], requests: int) -> float:
    """The harness's figure: the peer's own calls (every phase but the slot pool), µs per request."""
    return sum(ns for phase, ns in result["phase_ns"].items() if phase != "pool") / 1e3 / requests


def run_cell(peers: dict[str, Any], workload: str, pool: str, rounds: int) -> dict[str, Any]:
    import radix_peers
    import workloads

    traffic = workloads.make(workload, 1.0)
    pool_tokens = radix_peers.pool_sizes(traffic, 1, 0.2)[pool]["tokens"]
    lengths = [len(r) for r in traffic.requests]
    samples: dict[str, list[float]] = {name: [] for name in peers}
    hits: dict[str, set[int]] = {name: set() for name in peers}
    for round_no in range(rounds + 1):  # round 0 is the warm-up
        order = list(peers) if round_no % 2 else list(peers)[::-1]
        for name in order:
            adapter = peers[name]
            prepared = [adapter.prepare(ids) for ids in traffic.requests]
            slot_pool = radix_peers.setup_radix(adapter, pool_tokens)
            result = radix_peers.replay_radix(adapter, slot_pool, prepared, lengths, pool_tokens, 1, "finish")
            assert result["conservation_ok"], f"{name}: slots were not conserved"
            hits[name].add(int(sum(result["cached"])))
            if round_no:
                samples[name].append(cache_us_per_request(result, len(lengths)))
            del prepared, slot_pool
            adapter.c = None
            gc.collect()
    assert all(len(per_peer) == 1 for per_peer in hits.values()), f"a peer's hits changed between rounds: {hits}"
    if pool == "large":  # with eviction the peers' LRU tie-breaks differ (the harness's README says how)
        assert len({h for per_peer in hits.values() for h in per_peer}) == 1, f"peers disagree on hits: {hits}"
    others = [name for name in peers if name != "minikv"]
    best_peer = [min(samples[name][i] for name in others) for i in range(rounds)]
    ratios = [mine / best for mine, best in zip(samples["minikv"], best_peer, strict=True)]
    print(f"{workload}/{pool}: minikv / best peer per round", [round(r, 2) for r in ratios], flush=True)
    return {
        "workload": workload,
        "pool": pool,
        "rounds": rounds,
        "us_per_request": samples,
        "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios),
        "ratio_max": max(ratios),
        "ratio_min": min(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default="sglang,minisgl-old", help="the peers beside minikv")
    parser.add_argument("--workloads", default="shared_prompt")
    parser.add_argument("--pools", default="large")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not (HARNESS / "radix_peers.py").exists():
        sys.exit(f"the side-by-side harness is not at {HARNESS} (set MINIKV_PEERS_BENCH)")
    sys.path.insert(0, str(HARNESS))
    os.environ["MINIKV_PATH"] = str(REPO)
    import adapters

    peers = {}
    for name in [*args.peers.split(","), "minikv"]:
        adapter = adapters.ADAPTERS[name]({"fast_compare": "numpy", "block_size": 16})
        adapter.load()  # raises SkipPeer, with the reason, when a peer's source is missing
        peers[name] = adapter
    cells = [
        run_cell(peers, workload, pool, args.rounds)
        for workload in args.workloads.split(",")
        for pool in args.pools.split(",")
    ]
    rows = []
    for cell in cells:
        row = {"workload": cell["workload"], "pool": cell["pool"]}
        for name, values in cell["us_per_request"].items():
            row[name] = statistics.median(values)
        row.update(ratio=cell["ratio_median"], lowest=cell["ratio_min"], highest=cell["ratio_max"])
        rows.append(row)
    columns = ["workload", "pool", *peers, "ratio", "lowest", "highest"]
    print(f"cache µs/request, median of {args.rounds} rounds; ratio = minikv / best peer within each round")
    print(table(rows, columns, {**dict.fromkeys(peers, ".1f"), "ratio": ".2f", "lowest": ".2f", "highest": ".2f"}))
    write_results("peers_interleaved", {"peers": list(peers), "cells": cells})


if __name__ == "__main__":
    main()
