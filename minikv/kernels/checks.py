"""The checks of :func:`~minikv.store_cache`, one small function per rule.

Triton does not check bounds (under the interpreter an index one past the end silently
overwrites memory, and ``-1`` corrupts the heap), so everything is checked before launch:
:func:`check_store_arguments` from the tensors' metadata alone (no values, no transfer),
in this order: the options, the argument types, the cache's shape, the sources' shapes,
the slot list's shape, the dtypes, the devices, ``error_flag``, and memory overlaps;
then :func:`check_slots` from the slots' values (in range, none twice).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, SlotIndexError
from ..language import tr
from .cpu_copy import slot_runs

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("auto", "triton", "torch")
SLOT_CHECKS = ("host", "kernel")


def check_store_arguments(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
    slot_check: str = "host",
    error_flag: torch.Tensor | None = None,
    index_name: str = "indices",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every check of :func:`~minikv.store_cache` that needs only the tensors' metadata (no values, no transfer).

    Returns the caches as ``(pages, page_size, heads, head_dim)`` views and the sources,
    negated views (``x.conj().imag``) resolved into tensors whose memory holds their values.
    """
    check_options(backend, slot_check)
    named = (("k_cache", k_cache), ("v_cache", v_cache), (index_name, indices), ("k", k), ("v", v))
    check_dense_tensors(named)
    check_cache_shape(k_cache, v_cache)
    check_source_shapes(k, v, k_cache)
    check_slot_list(indices, k.shape[0], index_name)
    check_dtypes(k_cache, v_cache, k, v)
    check_devices(named)
    if slot_check == "kernel":
        check_error_flag(error_flag, backend, k_cache, v_cache)
    check_no_overlap(k_cache, v_cache, k, v)
    if k.is_neg() or v.is_neg():  # a negated view's memory holds -value, and the kernel reads memory
        k, v = k.resolve_neg(), v.resolve_neg()
    return as_paged(k_cache), as_paged(v_cache), k, v


def check_options(backend: str, slot_check: str) -> None:
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if slot_check not in SLOT_CHECKS:
        raise ArgumentError(f"slot_check must be one of {SLOT_CHECKS}, got {slot_check!r}")


def check_dense_tensors(named: Sequence[tuple[str, object]]) -> None:
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise ArgumentTypeError(f"{name} must be a dense tensor, got layout {tensor.layout}")


def check_cache_shape(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """``(slots, heads, head_dim)`` or ``(pages, page_size, heads, head_dim)``, V like K, a float dtype."""
    if k_cache.dim() not in (3, 4):
        raise ArgumentError(
            "k_cache must be (slots, heads, head_dim) or (pages, page_size, heads, head_dim), "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ArgumentError(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    if v_cache.stride() != k_cache.stride():
        raise ArgumentError(f"v_cache strides {v_cache.stride()} differ from k_cache strides {k_cache.stride()}")
    if k_cache.dtype not in SUPPORTED_DTYPES:
        raise ArgumentTypeError(f"k_cache dtype must be one of float32/float16/bfloat16, got {k_cache.dtype}")


def check_source_shapes(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor) -> None:
    """``k`` and ``v``: ``(n, heads, head_dim)`` with the cache's heads and head_dim, the same ``n``."""
    heads_dim = tuple(k_cache.shape[-2:])
    for name, src in (("k", k), ("v", v)):
        if src.dim() != 3 or tuple(src.shape[1:]) != heads_dim:
            raise ArgumentError(f"{name} must have shape (n, {heads_dim[0]}, {heads_dim[1]}), got {tuple(src.shape)}")
    if v.shape[0] != k.shape[0]:
        raise ArgumentError(f"v has {v.shape[0]} tokens but k has {k.shape[0]}")


def check_slot_list(indices: torch.Tensor, num_tokens: int, index_name: str) -> None:
    """One int32 or int64 slot per token, in a 1-D tensor."""
    if indices.dim() != 1 or len(indices) != num_tokens:
        raise ArgumentError(
            f"{index_name} must be 1-D with {num_tokens} entries (one per token), got shape {tuple(indices.shape)}"
        )
    if indices.dtype not in (torch.int32, torch.int64):
        raise ArgumentTypeError(f"{index_name} must be int32 or int64, got {indices.dtype}")


def check_dtypes(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, tensor in (("v_cache", v_cache), ("k", k), ("v", v)):
        if tensor.dtype != k_cache.dtype:
            raise ArgumentTypeError(f"{name} dtype {tensor.dtype} differs from the cache dtype {k_cache.dtype}")


def check_devices(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Every tensor on ``k_cache``'s device (the first of ``named``), which is a CPU or a CUDA device."""
    k_cache = named[0][1]
    for name, tensor in named[1:]:
        if tensor.device != k_cache.device:
            raise DeviceMismatchError(f"{name} is on {tensor.device}, but k_cache is on {k_cache.device}")
    if not (k_cache.is_cpu or k_cache.is_cuda):
        raise ArgumentError(f"k_cache is on {k_cache.device}: store_cache writes to 'cpu' or 'cuda' tensors only")


def check_error_flag(
    error_flag: torch.Tensor | None, backend: str, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> None:
    """For ``slot_check="kernel"``: the Triton kernel, and a dense int32 counter of its own on the cache's device.

    A counter in the cache's memory would have the kernel write its count into a cache row no slot named.
    """
    if backend == "torch":
        raise ArgumentError("slot_check='kernel' needs the Triton kernel: use backend 'triton' or 'auto'")
    if not isinstance(error_flag, torch.Tensor):
        raise ArgumentTypeError(
            f"slot_check='kernel' needs error_flag, an int32 tensor, got {type(error_flag).__name__}"
        )
    if error_flag.dtype != torch.int32 or error_flag.numel() < 1 or error_flag.layout != torch.strided:
        raise ArgumentTypeError(
            f"error_flag must be a dense int32 tensor, got {error_flag.dtype} {tuple(error_flag.shape)}"
        )
    if error_flag.device != k_cache.device:
        raise DeviceMismatchError(f"error_flag is on {error_flag.device}, but k_cache is on {k_cache.device}")
    first = error_flag.data_ptr()  # the kernel adds its count to the first element only
    flag_range = (first, first + error_flag.element_size())
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if overlap(flag_range, memory_range(cache)):
            raise ArgumentError(f"error_flag shares memory with {name}: give the kernel a counter of its own")


def check_no_overlap(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Writes land where they should: no negated cache, no two slots in one place, sources apart from caches."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.is_neg():
            raise ArgumentError(f"{name} is a negated view (such as x.conj().imag): writes through it change sign")
    check_no_self_overlap(k_cache, "k_cache")  # v_cache has the same shape and strides
    k_range, v_range = memory_range(k_cache), memory_range(v_cache)
    if overlap(k_range, v_range):
        raise ArgumentError("k_cache and v_cache must not share memory: each needs a memory range of its own")
    for src_name, src in (("k", k), ("v", v)):
        src_range = memory_range(src)
        for cache_name, cache_range in (("k_cache", k_range), ("v_cache", v_range)):
            if overlap(src_range, cache_range):
                raise ArgumentError(
                    f"{src_name} shares memory with {cache_name}: copy it first (a store would overwrite its source)"
                )


def check_no_self_overlap(cache: torch.Tensor, name: str) -> None:
    """Refuse caches where two slots share memory (a stride of 0, as ``expand`` makes, or strides that interleave).

    Sorted by stride, each dimension must step past everything the smaller ones span
    (a contiguous tensor does, by definition).
    """
    if cache.is_contiguous():
        return
    dims = sorted((stride, size) for size, stride in zip(cache.shape, cache.stride(), strict=True) if size > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            raise ArgumentError(
                f"{name} has strides {cache.stride()} for shape {tuple(cache.shape)}: some of its elements share memory"
            )
        span += (size - 1) * stride


def memory_range(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, end)`` that ``tensor``'s elements occupy (an empty range when it has none)."""
    if tensor.numel() == 0:
        return 0, 0
    if tensor.is_contiguous():
        return tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    last = 0
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        last += (size - 1) * stride
    first = tensor.data_ptr()
    return first, first + (last + 1) * tensor.element_size()


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two byte ranges ``[first, end)`` share a byte."""
    return a[0] < b[1] and b[0] < a[1]


# -- the slots' values ---------------------------------------------------------------


def check_slots(indices: torch.Tensor, num_slots: int, index_name: str = "indices") -> None:
    """Every slot in ``[0, num_slots)`` and none twice, checked on the host.

    CPU slots are checked with NumPy. CUDA slots are checked on the GPU and the verdict
    comes back in one transfer (three numbers), the only host-device sync of a store.
    """
    if len(indices) == 0:
        return
    if indices.is_cpu:
        slots = indices.numpy()
        low, high = int(np.minimum.reduce(slots)), int(np.maximum.reduce(slots))
        repeated = None  # checked below, once the range is known to be sane
    else:
        low, high, repeated = _slot_verdict_on_device(indices)
    if low < 0 or high >= num_slots:
        bad = low if low < 0 else high
        raise SlotIndexError(
            tr("{name}: slot {slot} is outside [0, {below})", name=index_name, slot=bad, below=num_slots)
        )
    if repeated if repeated is not None else not all_distinct(indices):
        raise ArgumentError(tr("{name} must be unique: two tokens cannot share one slot", name=index_name))


def _slot_verdict_on_device(indices: torch.Tensor) -> tuple[int, int, bool]:
    """The lowest slot, the highest, and whether one repeats: computed where the slots are, read in one transfer."""
    ordered = torch.sort(indices).values
    repeats = (ordered[1:] == ordered[:-1]).any()
    low, high, repeated = torch.stack((ordered[0].long(), ordered[-1].long(), repeats.long())).tolist()
    return low, high, bool(repeated)


def all_distinct(indices: torch.Tensor) -> bool:
    """No slot twice. Ascending slots prove it without sorting; so do runs of slots that do not overlap."""
    if len(indices) < 2:
        return True
    if not indices.is_cpu:
        return len(torch.unique(indices)) == len(indices)
    slots = indices.numpy()
    if not np.count_nonzero(slots[1:] <= slots[:-1]):
        return True
    # A pool hands out a few runs of consecutive slots: sorting the runs instead of the slots.
    starts, lengths = slot_runs(slots)
    firsts = slots[starts].astype(np.int64)  # int64: a run's end may not fit in int32
    order = np.argsort(firsts)
    ends = firsts + lengths
    return not np.count_nonzero(firsts[order][1:] < ends[order][:-1])


def as_paged(cache: torch.Tensor) -> torch.Tensor:
    """A cache as ``(pages, page_size, heads, head_dim)``: a flat cache is pages of one slot."""
    return cache.unsqueeze(1) if cache.dim() == 3 else cache
