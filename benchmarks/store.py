"""How close the store path comes to the memory bandwidth it cannot beat, and what a call costs the host.

Writing K/V for ``n`` new tokens into their slots moves ``2 x n x heads x head_dim``
elements; no store can be faster than copying that many bytes between two
contiguous buffers. Side by side, bf16, 8 KV heads x 128 dims (2 KiB per token for K
and as much for V; on CUDA also 32 x 128), scattered into a cache of 32k slots (on
CUDA at least twice the tokens), at two kinds of slots: ``random`` unique slots (the
worst case: every row lands somewhere else) and ``pool`` slots (four ascending runs,
as a page pool hands them out after some churn -- what a server really passes):

* ``memcpy``: ``dst.copy_(src)`` of the same bytes into a contiguous part of the cache
  (a device-to-device copy on CUDA) -- the bandwidth bound;
* ``index_copy_``: the bare scatter torch offers, no checks;
* ``store_cache[torch]``: :func:`minikv.store_cache` with ``backend="torch"``, checks included;
* ``checks only``: the checks ``store_cache`` runs before writing (metadata and slots);
* ``store_cache[triton]`` (host slot check), ``store_kv`` (the engine path:
  :meth:`MHAKVCache.store_kv`, with the slot check in the kernel on CUDA) and
  ``triton kernel only`` (:func:`launch_store_kernel`, no checks): compiled on CUDA;
  on a CPU, Triton's *interpreter* runs the first and the last, at small sizes only;
* on CPU, two *candidates* that are not in minikv, to show what a faster CPU path could reach.

Ratios are against ``memcpy`` (1.0 = at the bandwidth bound). On CPU each figure is the
median of several timed rounds after warm-up (the minimum is recorded too); on CUDA it is
``triton.testing.do_bench``'s median (and 5th percentile), which synchronises around each
measured batch. On CPU torch runs one thread by default (``--threads``).

A second table, ``overhead``, is the host's cost per call for a decode-sized store (1 and
16 tokens), where the GPU's work is tiny and the host's checks and launch are what a
server pays per layer per step: ``store_kv`` against the bare launch (on CPU: against
the plain copy without checks), as wall time per call over a burst of calls.

Run: ``.venv/bin/python benchmarks/store.py [--device cpu|cuda] [--quick]`` (default: CUDA when available).
Writes ``benchmarks/results/store.json`` (CPU) or ``benchmarks/results/store_cuda.json`` (CUDA),
in ``MINIKV_BENCH_RESULTS`` when that is set.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from _common import table, write_results

from minikv import KVCacheLayout, MHAKVCache, store_cache
from minikv.kernels import check_slots, check_store_arguments, interpreted, launch_store_kernel
from minikv.kernels.cpu_copy import copy_rows

DTYPE = torch.bfloat16
CPU_SHAPES = ((8, 128),)
CUDA_SHAPES = ((8, 128), (32, 128))
CPU_SIZES = (1_024, 4_096, 16_384)
CUDA_SIZES = (1_024, 4_096, 16_384, 65_536, 262_144)
INTERPRETER_SIZES = (256, 1_024)
OVERHEAD_TOKENS = (1, 16)
SLOT_LAYOUTS = ("random", "pool")

Tensors = dict[str, Any]


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


def setup(num_tokens: int, num_slots: int, device: torch.device, heads: int, head_dim: int, layout: str) -> Tensors:
    generator = torch.Generator().manual_seed(num_tokens)
    cache = MHAKVCache(heads, 1, head_dim, num_slots, DTYPE, KVCacheLayout.LayerFirst, device)
    slots = make_slots(layout, num_tokens, num_slots, generator)
    k = torch.randn(num_tokens, heads, head_dim, generator=generator).to(device, DTYPE)
    v = torch.randn(num_tokens, heads, head_dim, generator=generator).to(device, DTYPE)
    return {
        "cache": cache, "k_cache": cache.k_cache(0)[:, 0], "v_cache": cache.v_cache(0)[:, 0], "k": k, "v": v,
        "idx32": slots.to(device, torch.int32), "idx64": slots.to(device, torch.int64),
    }  # fmt: skip


def variants(device: torch.device, num_tokens: int) -> dict[str, Callable[[Tensors], None]]:
    def memcpy(t: Tensors) -> None:
        t["k_cache"][:num_tokens].copy_(t["k"])
        t["v_cache"][:num_tokens].copy_(t["v"])

    def index_copy(t: Tensors) -> None:
        t["k_cache"].index_copy_(0, t["idx64"], t["k"])
        t["v_cache"].index_copy_(0, t["idx64"], t["v"])

    def store_torch(t: Tensors) -> None:
        store_cache(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"], backend="torch")

    def checks_only(t: Tensors) -> None:
        check_store_arguments(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"])
        check_slots(t["idx32"], t["k_cache"].shape[0])

    def store_triton(t: Tensors) -> None:
        store_cache(t["k_cache"], t["v_cache"], t["idx32"], t["k"], t["v"], backend="triton")

    def store_kv(t: Tensors) -> None:
        t["cache"].store_kv(t["k"], t["v"], t["idx32"], 0)

    def triton_kernel(t: Tensors) -> None:
        k4, v4 = t["k_cache"].unsqueeze(1), t["v_cache"].unsqueeze(1)
        launch_store_kernel(k4, v4, t["idx32"], t["k"], t["v"])

    def index_copy_wide(t: Tensors) -> None:
        rows = t["k_cache"].shape[0]
        for cache, src in ((t["k_cache"], t["k"]), (t["v_cache"], t["v"])):
            cache.view(rows, -1).view(torch.float64).index_copy_(
                0, t["idx64"], src.reshape(num_tokens, -1).view(torch.float64)
            )

    def numpy_rows(t: Tensors) -> None:
        row = np.dtype((np.void, t["k"][0].numel() * 2))
        index = t["idx64"].numpy()
        for cache, src in ((t["k_cache"], t["k"]), (t["v_cache"], t["v"])):
            rows_of_cache = cache.view(torch.int16).view(cache.shape[0], -1).numpy().view(row)[:, 0]
            rows_of_cache[index] = src.view(torch.int16).reshape(num_tokens, -1).numpy().view(row)[:, 0]

    chosen: dict[str, Callable[[Tensors], None]] = {
        "memcpy": memcpy,
        "index_copy_": index_copy,
        "store_cache[torch]": store_torch,
        "checks only": checks_only,
    }
    if device.type == "cpu":
        chosen["store_kv"] = store_kv  # on CPU: host checks, then the torch copy
        chosen["candidate: index_copy_ 8-byte view"] = index_copy_wide
        chosen["candidate: numpy row scatter"] = numpy_rows
    if device.type == "cuda" or num_tokens in INTERPRETER_SIZES:
        chosen["store_cache[triton]"] = store_triton
        chosen["triton kernel only"] = triton_kernel
    if device.type == "cuda":
        chosen["store_kv"] = store_kv  # on CUDA: the slot check in the kernel, no transfer
    return chosen


def seconds_per_call(fn: Callable[[], None], device: torch.device, slow: bool) -> tuple[float, float, list[float]]:
    """Median and low seconds per call, and the samples (``do_bench`` on CUDA)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        median_ms, low_ms = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.05])
        return median_ms / 1e3, low_ms / 1e3, [median_ms * 1e3, low_ms * 1e3]
    rounds, warmup = (3, 1) if slow else (21, 3)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples), samples


def check_written(t: Tensors) -> None:
    """The benchmark measures real work: every token's K and V landed in its slot."""
    assert torch.equal(t["k_cache"][t["idx64"]], t["k"]) and torch.equal(t["v_cache"][t["idx64"]], t["v"])
    t["cache"].check_stores()


def run(device: torch.device, quick: bool = False) -> list[dict[str, Any]]:
    sizes = CUDA_SIZES if device.type == "cuda" else tuple(sorted(set(CPU_SIZES) | set(INTERPRETER_SIZES)))
    shapes = CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES
    if quick:
        sizes, shapes = sizes[:1], shapes[:1]
    num_slots = max(131_072 if device.type == "cuda" else 32_768, 2 * max(sizes))
    rows = []
    for (heads, head_dim), layout, n in ((s, lay, n) for s in shapes for lay in SLOT_LAYOUTS for n in sizes):
        payload = 2 * n * heads * head_dim * torch.finfo(DTYPE).bits // 8
        memcpy_s = memcpy_low = None
        for name, variant in variants(device, n).items():
            tensors = setup(n, num_slots, device, heads, head_dim, layout)
            slow = "triton" in name and interpreted(device)
            seconds, low, samples = seconds_per_call(partial(variant, tensors), device, slow=slow)
            if name not in ("memcpy", "checks only"):
                check_written(tensors)
            if name == "memcpy":
                memcpy_s, memcpy_low = seconds, low
            assert memcpy_s is not None and memcpy_low is not None
            writes = name != "checks only"
            rows.append({
                "device": str(device), "heads": f"{heads}x{head_dim}", "slots": layout, "tokens": n,
                "variant": name + (" (interpreted)" if slow else ""),
                "payload_bytes": payload, "us": seconds * 1e6, "us_min": low * 1e6,
                "us_samples": [s * 1e6 for s in samples],
                "gb_per_s": payload / seconds / 1e9 if writes else None,
                "vs_memcpy": memcpy_s / seconds if writes else None,
                "vs_memcpy_min": memcpy_low / low if writes else None,
                "share_of_memcpy_time": seconds / memcpy_s,
            })  # fmt: skip
            shape = f"{heads}x{head_dim}"
            print(f"  {device!s:5s} {shape} {layout:6s} {n:>7} {rows[-1]['variant']:34s} {seconds * 1e6:12.1f} µs")
    return rows


def overhead(device: torch.device, quick: bool = False) -> list[dict[str, Any]]:
    """Host time per call of a decode-sized store: the engine path against the same write without checks."""
    heads, head_dim = CPU_SHAPES[0]
    calls = 20 if quick else 200
    rows = []
    for n in OVERHEAD_TOKENS[:1] if quick else OVERHEAD_TOKENS:
        t = setup(n, 4096, device, heads, head_dim, "random")
        k4, v4 = t["cache"].k_cache(0), t["cache"].v_cache(0)
        if device.type == "cuda":
            bare_name, bare = (
                "launch_store_kernel (no checks)",
                partial(launch_store_kernel, k4, v4, t["idx32"], t["k"], t["v"]),
            )
        else:
            bare_name, bare = "copy_rows (no checks)", partial(copy_rows, k4, v4, t["idx32"], t["k"], t["v"])
        measured = {}
        engine = partial(t["cache"].store_kv, t["k"], t["v"], t["idx32"], 0)
        for name, fn in (("store_kv", engine), (bare_name, bare)):
            samples = []
            for _ in range(3 if quick else 15):
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                samples.append((time.perf_counter() - start) / calls)
            measured[name] = (statistics.median(samples), min(samples))
        check_written(t)
        base, base_low = measured[bare_name]
        for name, (seconds, low) in measured.items():
            rows.append({
                "device": str(device), "tokens": n, "variant": name, "us_per_call": seconds * 1e6,
                "us_per_call_min": low * 1e6, "vs_bare": seconds / base, "vs_bare_min": low / base_low,
            })  # fmt: skip
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
    if device.type == "cuda" and interpreted(device):
        raise SystemExit("TRITON_INTERPRET asks for the interpreter: unset it to benchmark the compiled kernel on CUDA")
    rows = run(device, quick=args.quick)
    costs = overhead(device, quick=args.quick)
    print()
    columns = ["heads", "slots", "tokens", "variant", "us", "us_min", "gb_per_s", "vs_memcpy", "vs_memcpy_min"]
    print(
        table(
            rows, columns, {"us": ".1f", "us_min": ".1f", "gb_per_s": ".2f", "vs_memcpy": ".2f", "vs_memcpy_min": ".2f"}
        )
    )
    print()
    print(table(costs, ["tokens", "variant", "us_per_call", "us_per_call_min", "vs_bare", "vs_bare_min"],
                {"us_per_call": ".1f", "us_per_call_min": ".1f", "vs_bare": ".2f", "vs_bare_min": ".2f"}))  # fmt: skip
    name = "store" if device.type == "cpu" else "store_cuda"
    extra = {"dtype": str(DTYPE), "interpreted_triton": interpreted(device), "quick": args.quick, "overhead": costs}
    print(f"\nwrote {write_results(name, {**extra, 'rows': rows})}")


if __name__ == "__main__":
    main()
