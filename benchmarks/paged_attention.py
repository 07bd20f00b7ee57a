"""How close decode attention comes to the bandwidth bound when it reads the pages in place.

A decode step reads every cached K and V row of every running request once: for ``n`` cached
tokens, ``2 x n x kv_heads x head_dim`` elements. No attention can be faster than reading that
many bytes. Side by side, bf16, 8 KV heads x 128 dims (32 query heads: GQA groups of 4), a batch
of 8 requests whose ``n`` tokens sit on random pages of 16 tokens (a pool after some churn):

* ``copy``: ``dst.copy_(src)`` of the same bytes between two contiguous buffers, the bound;
* ``gather + attend``: the course's reference read path (``gather_kv`` copies each request's rows
  into a dense tensor, ``causal_attention`` attends), what the models run on a CPU;
* ``paged kernel``: :func:`minikv.kernels.paged_decode_attention`, which reads the rows where they
  are (compiled on CUDA; on a CPU, Triton's interpreter runs it at the smallest size only, as a
  reference, not a speed).

Ratios are effective bandwidth (the K/V bytes divided by the time) over ``copy``'s: 1.0 is at the
bound. Every run checks the kernel's output against the gather path before timing it. On CUDA the
timings are ``triton.testing.do_bench``'s medians; on CPU, medians of a few rounds.

Run: ``.venv/bin/python benchmarks/paged_attention.py [--device cpu|cuda] [--quick]``. Writes
``benchmarks/results/paged_attention.json`` (CPU) or ``paged_attention_cuda.json`` (CUDA).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from _common import machine, median_seconds, table, write_results

from minikv.kernels import paged_decode_attention, paged_decode_attention_reference

DTYPE = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, BATCH = 32, 8, 128, 16, 8
CPU_TOKENS = (1_024, 4_096)
CUDA_TOKENS = (1_024, 4_096, 16_384, 65_536)
INTERPRETER_TOKENS = (256,)


def case(tokens_per_request: int, device: str) -> tuple[torch.Tensor, ...]:
    """A batch whose requests' pages are scattered over a cache twice the size they need."""
    gen = torch.Generator().manual_seed(0)
    pages_each = -(-tokens_per_request // PAGE_SIZE)
    num_pages = 2 * BATCH * pages_each
    k_cache = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(DTYPE).to(device)
    v_cache = torch.randn(num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(DTYPE).to(device)
    q = torch.randn(BATCH, HEADS, HEAD_DIM, generator=gen).to(DTYPE).to(device)
    pages = torch.randperm(num_pages, generator=gen)[: BATCH * pages_each].view(BATCH, pages_each)
    slots = (pages[:, :, None] * PAGE_SIZE + torch.arange(PAGE_SIZE)).reshape(BATCH, -1)[:, :tokens_per_request]
    lens = torch.full((BATCH,), tokens_per_request)
    return q, k_cache, v_cache, slots.to(device), lens.to(device)


def seconds(run: Callable[[], object], device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(run, return_mode="median")) / 1e3
    return median_seconds(run, repeats=5)[0]


def measure(tokens: int, device: str, with_kernel: bool) -> list[dict[str, Any]]:
    q, k_cache, v_cache, table_, lens = case(tokens, device)
    kv_bytes = 2 * BATCH * tokens * KV_HEADS * HEAD_DIM * k_cache.element_size()
    src = torch.empty(kv_bytes // k_cache.element_size(), dtype=DTYPE, device=device)
    dst = torch.empty_like(src)
    variants: dict[str, Callable[[], object]] = {
        "copy": lambda: dst.copy_(src),
        "gather + attend": lambda: paged_decode_attention_reference(q, k_cache, v_cache, table_, lens),
    }
    if with_kernel:
        expected = paged_decode_attention_reference(q.float(), k_cache.float(), v_cache.float(), table_, lens)
        got = paged_decode_attention(q, k_cache, v_cache, table_, lens)
        torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)
        variants["paged kernel"] = lambda: paged_decode_attention(q, k_cache, v_cache, table_, lens)
    times = {name: seconds(run, device) for name, run in variants.items()}
    return [
        {
            "device": device,
            "tokens_per_request": tokens,
            "cached_tokens": BATCH * tokens,
            "variant": name,
            "seconds": t,
            "gb_per_s": kv_bytes / t / 1e9,
            "vs_copy": times["copy"] / t,
        }
        for name, t in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="the smallest size only (the smoke test)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    if args.device == "cuda":
        for tokens in CUDA_TOKENS[:1] if args.quick else CUDA_TOKENS:
            rows += measure(tokens, "cuda", with_kernel=True)
    else:
        for tokens in INTERPRETER_TOKENS:
            rows += measure(tokens, "cpu", with_kernel=True)
        for tokens in () if args.quick else CPU_TOKENS:
            rows += measure(tokens, "cpu", with_kernel=False)
    print(
        table(
            rows, ["device", "cached_tokens", "variant", "gb_per_s", "vs_copy"], {"gb_per_s": ".2f", "vs_copy": ".3f"}
        )
    )
    name = "paged_attention" if args.device == "cpu" else "paged_attention_cuda"
    write_results(
        name,
        {"quick": args.quick, "machine": machine(), "dtype": str(DTYPE), "batch": BATCH, "heads": HEADS,
         "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "page_size": PAGE_SIZE, "rows": rows},
    )  # fmt: skip


if __name__ == "__main__":
    main()
