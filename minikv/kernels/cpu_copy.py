"""The store on CPU tensors in plain torch: how to move K/V rows at copy speed without a GPU.

:func:`copy_rows` is what ``store_cache(..., backend="torch")`` runs once the inputs are
checked. It picks one of three ways to write ``cache[slot[i]] = src[i]``:

1. **Block copies of runs.** A page pool hands out consecutive slots, so ``out_loc`` is
   mostly a few ascending runs (:func:`contiguous_runs`). One ``copy_`` per run moves a
   whole block of rows, where a scatter would move one row at a time.
2. **A scatter of 8-byte words.** Scattered slots, rows contiguous in memory: each row is
   seen as int64 words (:func:`as_wide_rows`), so ``index_copy_`` moves fewer, wider elements.
3. **A plain scatter** through the ``(page, row)`` index, for any other strides.

Nothing here checks its input: :func:`~minikv.store_cache` does that first.
``benchmarks/store.py`` measures the three against a plain memory copy.
"""

from __future__ import annotations

import numpy as np
import torch

MIN_RUN = 16
"""Block copies are used when the runs are this long on average; shorter runs are scattered."""


def slot_runs(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start positions and lengths of the runs of consecutive slots (each one more than the one before)."""
    if len(slots) == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    breaks = np.flatnonzero(slots[1:] - slots[:-1] != 1)
    bounds = np.concatenate(([0], breaks + 1, [len(slots)]))
    return bounds[:-1], bounds[1:] - bounds[:-1]


def contiguous_runs(indices: torch.Tensor, min_run: int = MIN_RUN) -> list[tuple[int, int, int]] | None:
    """``(position, first slot, length)`` of each ascending run of CPU slots, or ``None`` when runs are short."""
    slots = indices.numpy()
    starts, lengths = slot_runs(slots)
    if len(starts) * min_run > len(slots):
        return None
    return list(zip(starts.tolist(), slots[starts].tolist(), lengths.tolist(), strict=True))


def as_wide_rows(tensor: torch.Tensor) -> torch.Tensor | None:
    """``(rows, heads, head_dim)`` seen as ``(rows, row_bytes // 8)`` int64 words, when each row is contiguous."""
    rows, heads, dim = tensor.shape
    row_bytes = heads * dim * tensor.element_size()
    if (
        tensor.stride(2) != 1
        or tensor.stride(1) != dim
        or row_bytes % 8
        or tensor.data_ptr() % 8
        or (tensor.stride(0) * tensor.element_size()) % 8
    ):
        return None
    return tensor.view(rows, heads * dim).view(torch.int64)


def copy_rows(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write ``k[i]``, ``v[i]`` to slot ``indices[i]`` of the ``(pages, page_size, heads, head_dim)`` caches.

    Works on any device (the run detection only on CPU slots); K and V caches share strides.
    """
    num_pages, page_size = k_cache.shape[:2]
    pages_adjacent = k_cache.stride(0) == page_size * k_cache.stride(1)
    runs = contiguous_runs(indices) if pages_adjacent and indices.is_cpu else None
    index = indices.long() if runs is None else indices
    for cache, src in ((k_cache, k), (v_cache, v)):
        if not pages_adjacent:
            cache[index // page_size, index % page_size] = src
            continue
        flat = cache.view(num_pages * page_size, *cache.shape[2:])  # one (slots, heads, head_dim) view
        if runs is not None:
            for start, first, length in runs:
                flat[first : first + length].copy_(src[start : start + length])
            continue
        wide_cache, wide_src = as_wide_rows(flat), as_wide_rows(src)
        if wide_cache is not None and wide_src is not None:
            wide_cache.index_copy_(0, index, wide_src)
        else:
            flat.index_copy_(0, index, src)
