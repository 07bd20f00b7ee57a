"""How close the store path comes to the memory bandwidth it cannot beat.

Writing K/V for ``n`` new tokens into their slots moves ``2 x n x heads x head_dim``
elements; no store can be faster than copying that many bytes between two
contiguous buffers. Side by side, on one realistic shape (8 KV heads x 128 dims,
bf16, i.e. 2 KiB per token for K and as much for V), scattered into a cache of
32k slots (128k on CUDA), at two kinds of slots: ``random`` unique slots (the worst case: every
row lands somewhere else) and ``pool`` slots (four ascending runs, as a page pool hands them out
after some churn -- what a server really passes):

* ``memcpy``: ``dst.copy_(src)`` of the same bytes into a contiguous part of the cache -- the bandwidth bound;
* ``index_copy_``: the bare scatter torch offers, no checks;
* ``store_cache[torch]``: :func:`minikv.store_cache` with ``backend="torch"``, validation included;
* ``validate only``: the checks ``store_cache`` runs before writing (what it adds to ``index_copy_``);
* ``store_cache[triton]`` and ``triton kernel only`` (the launch without the checks): compiled on
  CUDA; on a CPU, Triton's *interpreter* runs them, shown at small sizes for reference only;
* on CPU, two *candidates* that are not in minikv, to show what a faster CPU path could reach:
  ``candidate: index_copy_ 8-byte view`` (the same scatter on the rows seen as float64, 4x fewer
  elements) and ``candidate: numpy row scatter`` (each 2 KiB row one NumPy void element, copied whole).

Ratios are against ``memcpy`` (1.0 = at the bandwidth bound). Each figure is the
median of several timed rounds after warm-up (the minimum is recorded too); on CUDA
each round times a burst of calls between two synchronisations. On CPU torch runs
one thread by default (``--threads``): the development machine has two shared cores,
where a second thread mostly measures the neighbours.

Run: ``.venv/bin/python benchmarks/store.py [--device cpu|cuda]`` (default: CUDA when available).
Writes ``benchmarks/results/store.json`` (CPU) or ``benchmarks/results/store_cuda.json`` (CUDA).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _common import table, write_results

from minikv import INTERPRETED, store_cache
from minikv.kernels import store as store_module

HEADS, HEAD_DIM, DTYPE = 8, 128, torch.bfloat16
CPU_SIZES = (1_024, 4_096, 16_384)
CUDA_SIZES = (1_024, 4_096, 16_384, 65_536, 262_144)
INTERPRETER_SIZES = (256, 1_024)


SLOT_LAYOUTS = ("random", "pool")


def make_slots(layout: str, num_tokens: int, num_slots: int, generator: torch.Generator) -> torch.Tensor:
    if layout == "random":
        return torch.randperm(num_slots, generator=generator)[:num_tokens]
    # Four ascending runs in four disjoint quarters of the cache.
    quarter, run = num_slots // 4, -(-num_tokens // 4)
    pieces, left = [], num_tokens
    for q in range(4):
        length = min(run, left)
        offset = int(torch.randint(0, quarter - length + 1, (1,), generator=generator))
        pieces.append(torch.arange(q * quarter + offset, q * quarter + offset + length))
        left -= length
    return torch.cat(pieces)


def setup(num_tokens: int, num_slots: int, device: torch.device, layout: str = "random") -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_tokens)
    k_cache = torch.zeros(num_slots, HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    v_cache = torch.zeros_like(k_cache)
    slots = make_slots(layout, num_tokens, num_slots, generator)
    k = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator).to(device, DTYPE)
    v = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator).to(device, DTYPE)
    return {
        "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v,
        "idx32": slots.to(device, torch.int32), "idx64": slots.to(device, torch.int64),
    }  # fmt: skip


def variants(device: torch.device, num_tokens: int) -> dict[str, Callable[[dict[str, torch.Tensor]], None]]:
    def memcpy(t: dict[str, torch.Tensor]) -> None:
        t["k_cache"][:num_tokens].copy_(t["k"])
        t["v_cache"][:num_tokens].copy_(t["v"])

    def index_copy(t: dict[str, torch.Tensor]) -> None:
        t["k_cache"].index_copy_(0, t["idx64"], t["k"])
        t["v_cache"].index_copy_(0, t["idx64"], t["v"])

    def store_torch(t: dict[str, torch.Tensor]) -> None:
        store_cache(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"], backend="torch")

    def validate_only(t: dict[str, torch.Tensor]) -> None:
        store_module._validate(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"], "torch")

    def store_triton(t: dict[str, torch.Tensor]) -> None:
        store_cache(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"], backend="triton")

    def triton_kernel(t: dict[str, torch.Tensor]) -> None:
        k4, v4 = t["k_cache"].unsqueeze(1), t["v_cache"].unsqueeze(1)
        store_module._launch(k4, v4, t["idx32"], t["k"], t["v"])

    def index_copy_wide(t: dict[str, torch.Tensor]) -> None:
        rows = t["k_cache"].shape[0]
        for cache, src in ((t["k_cache"], t["k"]), (t["v_cache"], t["v"])):
            cache.view(rows, -1).view(torch.float64).index_copy_(
                0, t["idx64"], src.reshape(num_tokens, -1).view(torch.float64)
            )

    def numpy_rows(t: dict[str, torch.Tensor]) -> None:
        row = np.dtype((np.void, HEADS * HEAD_DIM * 2))
        index = t["idx64"].numpy()
        for cache, src in ((t["k_cache"], t["k"]), (t["v_cache"], t["v"])):
            rows_of_cache = cache.view(torch.int16).view(cache.shape[0], -1).numpy().view(row)[:, 0]
            rows_of_cache[index] = src.view(torch.int16).reshape(num_tokens, -1).numpy().view(row)[:, 0]

    chosen: dict[str, Callable[[dict[str, torch.Tensor]], None]] = {
        "memcpy": memcpy,
        "index_copy_": index_copy,
        "store_cache[torch]": store_torch,
        "validate only": validate_only,
    }
    if device.type == "cpu":
        chosen["candidate: index_copy_ 8-byte view"] = index_copy_wide
        chosen["candidate: numpy row scatter"] = numpy_rows
    if device.type == "cuda" or num_tokens in INTERPRETER_SIZES:
        chosen["store_cache[triton]"] = store_triton
        chosen["triton kernel only"] = triton_kernel
    return chosen


def seconds_per_call(fn: Callable[[], None], device: torch.device, slow: bool) -> tuple[float, list[float]]:
    """Median seconds per call over timed rounds (bursts of calls on CUDA, where launches are asynchronous)."""
    rounds, burst, warmup = (3, 1, 1) if slow else ((15, 20, 3) if device.type == "cuda" else (21, 1, 3))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(burst):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / burst)
    return statistics.median(samples), samples


def check_written(t: dict[str, torch.Tensor]) -> None:
    """The benchmark measures real work: every token's K and V landed in its slot."""
    assert torch.equal(t["k_cache"][t["idx64"]], t["k"]) and torch.equal(t["v_cache"][t["idx64"]], t["v"])


def run(device: torch.device, quick: bool = False) -> list[dict[str, Any]]:
    sizes = CUDA_SIZES if device.type == "cuda" else tuple(sorted(set(CPU_SIZES) | set(INTERPRETER_SIZES)))
    if quick:
        sizes = sizes[:1]
    num_slots = 131_072 if device.type == "cuda" else 32_768
    num_slots = max(num_slots, 2 * max(sizes))
    rows = []
    for layout, n in ((layout, n) for layout in SLOT_LAYOUTS for n in sizes):
        payload = 2 * n * HEADS * HEAD_DIM * torch.finfo(DTYPE).bits // 8
        memcpy_s = memcpy_min = None
        for name, variant in variants(device, n).items():
            tensors = setup(n, num_slots, device, layout)
            interpreted = device.type != "cuda" and "triton" in name
            seconds, samples = seconds_per_call(lambda: variant(tensors), device, slow=interpreted)
            if name not in ("memcpy", "validate only"):
                check_written(tensors)
            if name == "memcpy":
                memcpy_s, memcpy_min = seconds, min(samples)
            assert memcpy_s is not None and memcpy_min is not None
            writes = name != "validate only"
            rows.append({
                "device": str(device), "slots": layout, "tokens": n, "variant": name + (" (interpreted)" if interpreted else ""),
                "payload_bytes": payload, "us": seconds * 1e6, "us_min": min(samples) * 1e6,
                "us_samples": [s * 1e6 for s in samples],
                "gb_per_s": payload / seconds / 1e9 if writes else None,
                "vs_memcpy": memcpy_s / seconds if writes else None,
                "vs_memcpy_min": memcpy_min / min(samples) if writes else None,
                "share_of_memcpy_time": seconds / memcpy_s,
            })  # fmt: skip
            print(
                f"  {device!s:5s} {layout:6s} {n:>7} tokens  {rows[-1]['variant']:32s} {seconds * 1e6:12.1f} µs",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU runs only)")
    parser.add_argument("--quick", action="store_true", help="the smallest size only (a smoke test, not a result)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and INTERPRETED:
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to benchmark the compiled kernel on CUDA")
    rows = run(device, quick=args.quick)
    print()
    print(table(rows, ["slots", "tokens", "variant", "us", "us_min", "gb_per_s", "vs_memcpy", "vs_memcpy_min"],
                {"us": ".1f", "us_min": ".1f", "gb_per_s": ".2f", "vs_memcpy": ".2f", "vs_memcpy_min": ".2f"}))  # fmt: skip
    name = "store" if device.type == "cpu" else "store_cuda"
    extra = {
        "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "dtype": str(DTYPE)},
        "interpreted_triton": INTERPRETED,
        "quick": args.quick,
    }
    print(f"\nwrote {write_results(name, {**extra, 'rows': rows})}")


if __name__ == "__main__":
    main()
