"""The read half of the paged cache: gather a request's K/V rows by slot, then attend.

Both models of the course (the random ``TinyDecoder`` and a real Llama) call
these functions and nothing else to read the cache, so whatever the course
proves about one model's cache reads holds for the other's. A decode batch on a
GPU reads the pages in place instead, through the Triton kernel of
:mod:`minikv.kernels.paged_attention` (:func:`decode_attention` chooses).
"""

from __future__ import annotations

import math

import torch

from ..base import BaseKVCache
from ..errors import ArgumentError
from ..kernels.paged_attention import paged_decode_attention

DECODE_BACKENDS = ("auto", "gather", "triton")


def gather_kv(
    kv_cache: BaseKVCache,
    layer: int,
    indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the K and V rows of slots ``indices`` from one layer's cache.

    Slot ``s`` is row ``s % page_size`` of page ``s // page_size``: the
    store kernel's arithmetic, run backwards. This is the read half of paged
    attention; real kernels fuse it into the attention loop, without a copy.
    Returns two ``(len(indices), heads, head_dim)`` tensors.
    """
    k_pages, v_pages = kv_cache.k_cache(layer), kv_cache.v_cache(layer)
    page_size = k_pages.shape[1]
    slots = indices.long()
    pages, rows = slots // page_size, slots % page_size
    return k_pages[pages, rows], v_pages[pages, rows]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """Causal attention of queries at positions ``q_start..`` over keys at positions ``0..len(k)-1``.

    ``q`` is ``(queries, heads, head_dim)``; ``k`` and ``v`` are ``(keys, kv_heads, head_dim)``
    with ``heads`` a multiple of ``kv_heads``. Returns ``(queries, heads * head_dim)``.
    """
    heads, head_dim = q.shape[1:]
    group = heads // k.shape[1]
    # Each KV head serves `group` query heads: that sharing is all GQA is.
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    q_pos = torch.arange(q_start, q_start + len(q), device=q.device)[:, None]
    k_pos = torch.arange(len(k), device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out.reshape(len(q), heads * head_dim)


def paged_attention(
    q: torch.Tensor, kv_cache: BaseKVCache, layer: int, slots: torch.Tensor, q_start: int
) -> torch.Tensor:
    """Attention of one request's queries over the K/V its slots hold: gather, then attend."""
    k, v = gather_kv(kv_cache, layer, slots)
    return causal_attention(q, k, v, q_start)


def decode_attention(
    q: torch.Tensor,
    kv_cache: BaseKVCache,
    layer: int,
    tables: list[torch.Tensor],
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of a decode batch: query ``b`` (the newest token of request ``b``) over slots ``tables[b]``.

    ``backend``: ``"gather"`` copies each request's rows and attends (:func:`paged_attention`, the
    reference); ``"triton"`` reads them in place with :func:`~minikv.kernels.paged_attention.paged_decode_attention`
    (compiled on a GPU, interpreted on a CPU); ``"auto"`` takes the kernel for CUDA tensors and the
    gather path on a CPU, where the interpreter would be slow. Returns ``(batch, heads * head_dim)``.
    """
    if backend not in DECODE_BACKENDS:
        raise ArgumentError(f"attention_backend must be one of {DECODE_BACKENDS}, got {backend!r}")
    if backend == "gather" or (backend == "auto" and not q.is_cuda):
        rows = [paged_attention(q[b : b + 1], kv_cache, layer, t, q_start=len(t) - 1) for b, t in enumerate(tables)]
        return torch.cat(rows)
    lens = torch.tensor([len(table) for table in tables], device=q.device)
    table = torch.nn.utils.rnn.pad_sequence([t.to(torch.int64) for t in tables], batch_first=True)
    return paged_decode_attention(q, kv_cache.k_cache(layer), kv_cache.v_cache(layer), table, lens)
