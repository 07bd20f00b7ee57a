"""``store_cache``: write each token's K and V row into its slot of the cache.

The kernel is one line of arithmetic -- ``cache[slot[t]] = src[t]`` for K and for V --
and everything around it is about doing that line safely:

* validation first: Triton does not check bounds (under the interpreter an
  index one past the end silently overwrites memory, and ``-1`` corrupts the
  heap), so every shape, dtype, device and index is checked before launch;
* any strides: K and V may be slices of a fused QKV tensor, and the cache may be
  a layer of a page-first buffer whose pages are far apart in memory;
* any ``heads x head_dim``: block sizes are rounded up to powers of two and masked;
* several tokens per program: each program instance costs 1-2 ms under the
  interpreter, so on CPU each one copies 64 tokens.

Slots are flat token indices. A cache with ``page_size > 1`` has shape
``(num_pages, page_size, heads, head_dim)`` and slot ``s`` is row ``s % page_size``
of page ``s // page_size``: the kernel divides, the caller's slots stay flat.
"""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

from ..errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, SlotIndexError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""True when Triton kernels run in its interpreter (on CPU tensors) rather than compiled."""

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("auto", "triton", "torch")


@triton.jit
def _store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr,
    num_tokens, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program copies BLOCK_T tokens; each token is a (heads, head_dim) tile.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(loc_ptr + t, mask=t_ok, other=0).to(tl.int64)
    page = slot // page_size
    row = slot % page_size

    t3 = t.to(tl.int64)[:, None, None]
    h3 = h[None, :, None]
    d3 = d[None, None, :]
    mask = t_ok[:, None, None] & (h3 < num_heads) & (d3 < head_dim)
    dst = page[:, None, None] * c_stride_p + row[:, None, None] * c_stride_s + h3 * c_stride_h + d3 * c_stride_d

    k = tl.load(k_ptr + t3 * k_stride_t + h3 * k_stride_h + d3 * k_stride_d, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    v = tl.load(v_ptr + t3 * v_stride_t + h3 * v_stride_h + d3 * v_stride_d, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
) -> None:
    """Write ``k[i]``, ``v[i]`` into slot ``indices[i]`` of ``k_cache``, ``v_cache``.

    ``k_cache``/``v_cache``: ``(num_slots, heads, head_dim)`` or
    ``(num_pages, page_size, heads, head_dim)``, any strides. ``k``/``v``:
    ``(n, heads, head_dim)``, any strides, the cache's dtype and device.
    ``indices``: 1-D int32 or int64, unique, each in ``[0, num_slots)``.

    ``backend``: ``"triton"`` (compiled on CUDA, interpreted on CPU), ``"torch"``
    (the reference, and the fast path on CPU) or ``"auto"`` (Triton on CUDA,
    torch on CPU). Everything is validated before anything is written.
    """
    _store(k_cache, v_cache, indices, k, v, backend, "indices")


def _store(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    backend: str, index_name: str,
) -> None:  # fmt: skip
    """``store_cache``, with errors about the slot indices naming the caller's argument (``out_loc`` for ``store_kv``)."""
    k_cache4, v_cache4 = _validate(k_cache, v_cache, indices, k, v, backend, index_name)
    if len(indices) == 0:
        return
    use_triton = backend == "triton" or (backend == "auto" and k.is_cuda)
    if use_triton:
        # The kernel reads slot t at loc_ptr + t: a strided view of indices would name other slots.
        _launch(k_cache4, v_cache4, indices.contiguous(), k, v)
    else:
        _store_torch(k_cache4, v_cache4, indices, k, v)


def store_cache_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """The plainest correct version, one token at a time: what every other path is checked against."""
    k_cache4, v_cache4 = _as_paged(k_cache), _as_paged(v_cache)
    page_size = k_cache4.shape[1]
    for i, slot in enumerate(indices.tolist()):
        k_cache4[slot // page_size, slot % page_size] = k[i]
        v_cache4[slot // page_size, slot % page_size] = v[i]


def _launch(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    num_tokens, num_heads, head_dim = k.shape
    block_h = triton.next_power_of_2(num_heads)
    block_d = triton.next_power_of_2(head_dim)
    if INTERPRETED:
        block_t = 64  # the interpreter's cost is per program, not per element
    else:
        block_t = max(1, min(16, 4096 // (block_h * block_d)))
    grid = (triton.cdiv(num_tokens, block_t),)
    _store_kernel[grid](
        k, v, k_cache, v_cache, indices,
        num_tokens, k_cache.shape[1], num_heads, head_dim,
        *k.stride(), *v.stride(), *k_cache.stride(),
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
    )  # fmt: skip


def _store_torch(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    num_pages, page_size = k_cache.shape[:2]
    paged_rows_adjacent = k_cache.stride(0) == page_size * k_cache.stride(1)  # v_cache has the same strides
    runs = _contiguous_runs(indices) if paged_rows_adjacent and not indices.is_cuda else None
    if runs is not None:
        # A pool hands out consecutive slots, so out_loc is mostly a few ascending runs:
        # one block copy per run moves memory at copy bandwidth, unlike a per-row scatter.
        for cache, src in ((k_cache, k), (v_cache, v)):
            flat = cache.view(num_pages * page_size, *cache.shape[2:])
            for start, first, length in runs:
                flat[first : first + length].copy_(src[start : start + length])
        return
    index = indices.long()
    for cache, src in ((k_cache, k), (v_cache, v)):
        if not paged_rows_adjacent:
            cache[index // page_size, index % page_size] = src
            continue
        # Pages are adjacent rows: one flat (slots, heads, head_dim) view.
        flat = cache.view(num_pages * page_size, *cache.shape[2:])
        wide_cache, wide_src = _as_wide_rows(flat), _as_wide_rows(src)
        if wide_cache is not None and wide_src is not None:
            # Scattered slots: copy each row as 8-byte words (4x fewer elements for bf16).
            wide_cache.index_copy_(0, index, wide_src)
        else:
            flat.index_copy_(0, index, src)


def _as_wide_rows(tensor: torch.Tensor) -> torch.Tensor | None:
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


def _contiguous_runs(indices: torch.Tensor, min_run: int = 16) -> list[tuple[int, int, int]] | None:
    """``(position, first slot, length)`` of each ascending run of slots, or ``None`` when runs are short."""
    slots = indices.numpy()
    starts, lengths = _runs(slots)
    if len(starts) * min_run > len(slots):
        return None
    return list(zip(starts.tolist(), slots[starts].tolist(), lengths.tolist()))


def _runs(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start positions and lengths of the runs of consecutive slots (each one more than the one before)."""
    breaks = np.flatnonzero(slots[1:] - slots[:-1] != 1)
    bounds = np.concatenate(([0], breaks + 1, [len(slots)])) if len(slots) else np.zeros(1, dtype=np.intp)
    return bounds[:-1], bounds[1:] - bounds[:-1]


def _all_distinct(indices: torch.Tensor) -> bool:
    """No slot twice. Ascending slots prove it without sorting; so do runs of slots that do not overlap."""
    if len(indices) < 2:
        return True
    if indices.is_cuda:
        if bool((indices[1:] > indices[:-1]).all()):
            return True
        return len(torch.unique(indices)) == len(indices)
    slots = indices.numpy()
    if not np.count_nonzero(slots[1:] <= slots[:-1]):
        return True
    # A pool hands out a few runs of consecutive slots: sorting the runs is far cheaper than sorting the slots.
    starts, lengths = _runs(slots)
    firsts = slots[starts].astype(np.int64)  # int64: a run's end may not fit in int32
    order = np.argsort(firsts)
    ends = firsts + lengths
    return not np.count_nonzero(firsts[order][1:] < ends[order][:-1])


def _as_paged(cache: torch.Tensor) -> torch.Tensor:
    return cache.unsqueeze(1) if cache.dim() == 3 else cache


def _validate(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    backend: str, index_name: str = "indices",
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache), (index_name, indices), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if k_cache.dim() not in (3, 4):
        raise ArgumentError(
            f"k_cache must be (slots, heads, head_dim) or (pages, page_size, heads, head_dim), got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ArgumentError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    if v_cache.stride() != k_cache.stride():
        raise ArgumentError(f"v_cache strides {v_cache.stride()} differ from k_cache strides {k_cache.stride()}")
    if k_cache.dtype not in SUPPORTED_DTYPES:
        raise ArgumentTypeError(f"k_cache dtype must be one of float32/float16/bfloat16, got {k_cache.dtype}")
    heads_dim = tuple(k_cache.shape[-2:])
    for name, src in (("k", k), ("v", v)):
        if src.dim() != 3 or tuple(src.shape[1:]) != heads_dim:
            raise ArgumentError(f"{name} must have shape (n, {heads_dim[0]}, {heads_dim[1]}), got {tuple(src.shape)}")
    if v.shape[0] != k.shape[0]:
        raise ArgumentError(f"v has {v.shape[0]} tokens but k has {k.shape[0]}")
    if indices.dim() != 1 or len(indices) != k.shape[0]:
        raise ArgumentError(
            f"{index_name} must be 1-D with {k.shape[0]} entries (one per token), got shape {tuple(indices.shape)}"
        )
    if indices.dtype not in (torch.int32, torch.int64):
        raise ArgumentTypeError(f"{index_name} must be int32 or int64, got {indices.dtype}")
    for name, tensor in (("v_cache", v_cache), ("k", k), ("v", v)):
        if tensor.dtype != k_cache.dtype:
            raise ArgumentTypeError(f"{name} dtype {tensor.dtype} differs from the cache dtype {k_cache.dtype}")
    device = k_cache.device
    for name, tensor in (("v_cache", v_cache), (index_name, indices), ("k", k), ("v", v)):
        if tensor.device != device:
            raise DeviceMismatchError(f"{name} is on {tensor.device}, but k_cache is on {device}")
    if backend == "triton" and device.type != "cuda" and not INTERPRETED:
        raise ArgumentError("backend 'triton' needs CUDA tensors unless TRITON_INTERPRET=1 was set before import")
    k_cache4, v_cache4 = _as_paged(k_cache), _as_paged(v_cache)
    num_slots = k_cache4.shape[0] * k_cache4.shape[1]
    if len(indices):
        if indices.is_cuda:
            low, high = int(indices.min()), int(indices.max())
        else:  # NumPy: a tenth of torch's per-call cost at these sizes
            slots = indices.numpy()
            low, high = int(np.minimum.reduce(slots)), int(np.maximum.reduce(slots))
        if low < 0 or high >= num_slots:
            bad = low if low < 0 else high
            raise SlotIndexError(f"{index_name}: slot {bad} is outside [0, {num_slots})")
        if not _all_distinct(indices):
            raise ArgumentError(f"{index_name} must be unique: two tokens cannot share one slot")
    if k_cache4.data_ptr() == v_cache4.data_ptr():
        raise ArgumentError("k_cache and v_cache must not be the same memory")
    return k_cache4, v_cache4
