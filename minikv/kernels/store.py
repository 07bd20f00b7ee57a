"""``store_cache``: write each token's K and V row into its slot of the cache.

The kernel is one line of arithmetic -- ``cache[slot[t]] = src[t]`` for K and for V --
and everything around it is about doing that line safely:

* checks first: Triton does not check bounds (under the interpreter an index one past
  the end silently overwrites memory, and ``-1`` corrupts the heap), so shapes, dtypes,
  devices, strides and memory overlaps are checked before launch, on the host, from the
  tensors' metadata alone;
* the slots themselves (in range, no slot twice) are checked on the host by default.
  On a GPU that check needs the slots' values on the host, one transfer per call; a
  server that stores once per layer per step can ask the kernel to check the range
  instead (``slot_check="kernel"``): an out-of-range slot's row is not written, and the
  kernel counts it in ``error_flag``, which the caller reads when it chooses;
* any strides: K and V may be slices of a fused QKV tensor, and the cache may be
  a layer of a page-first buffer whose pages are far apart in memory;
* any ``heads x head_dim``: block sizes are rounded up to powers of two and masked.

Slots are flat token indices. A cache with ``page_size > 1`` has shape
``(num_pages, page_size, heads, head_dim)`` and slot ``s`` is row ``s % page_size``
of page ``s // page_size``: the kernel divides, the caller's slots stay flat.

Where the kernel runs follows :mod:`minikv.kernels.devices`: compiled on the GPU of CUDA
tensors, interpreted for CPU tensors. The plain-torch path for CPU tensors is in
:mod:`minikv.kernels.cpu_copy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, no_type_check

import numpy as np
import torch

from ..errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, SlotIndexError
from .cpu_copy import copy_rows, slot_runs
from .devices import interpreted, triton_kernel

if TYPE_CHECKING:
    import triton.language as tl

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("auto", "triton", "torch")
SLOT_CHECKS = ("host", "kernel")


@triton_kernel
@no_type_check
def store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, error_ptr,
    num_tokens, num_slots, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_SLOTS: tl.constexpr,
):  # fmt: skip
    # One program copies BLOCK_T tokens; each token is a (heads, head_dim) tile.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(loc_ptr + t, mask=t_ok, other=0).to(tl.int64)
    if CHECK_SLOTS:
        # A slot outside the cache writes nothing, and adds 1 to error_ptr[0].
        in_range = (slot >= 0) & (slot < num_slots)
        tl.atomic_add(error_ptr + t * 0, 1, mask=t_ok & ~in_range)
        t_ok = t_ok & in_range
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


# -- the launcher ------------------------------------------------------------------


@dataclass(frozen=True)
class StoreLaunch:
    """How the launcher runs the kernel for one call: block sizes, programs and warps."""

    block_t: int
    block_h: int
    block_d: int
    num_programs: int
    num_warps: int
    interpreted: bool


def plan_store_launch(num_tokens: int, num_heads: int, head_dim: int, device: torch.device | str) -> StoreLaunch:
    """Block sizes for ``num_tokens`` rows of ``num_heads x head_dim``, where the kernel runs on ``device``.

    On a GPU a program copies a tile of about 4096 elements (several tokens for small
    heads, one token for large ones), with 4 warps, or 8 for larger tiles. The
    interpreter's cost is per program, not per element, so there each program copies 64 tokens.
    """
    block_h = _next_power_of_2(num_heads)
    block_d = _next_power_of_2(head_dim)
    in_interpreter = interpreted(device)
    if in_interpreter:
        block_t, num_warps = 64, 4
    else:
        block_t = max(1, min(16, 4096 // (block_h * block_d)))
        num_warps = 4 if block_t * block_h * block_d <= 4096 else 8
    return StoreLaunch(block_t, block_h, block_d, -(-num_tokens // block_t), num_warps, in_interpreter)


def store_kernel_arguments(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    error_flag: torch.Tensor | None,
    launch: StoreLaunch,
) -> tuple[tuple[Any, ...], dict[str, int]]:
    """The kernel's positional arguments and keyword arguments (constexprs, ``num_warps``) for one launch."""
    num_tokens, num_heads, head_dim = k.shape
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    args = (
        k, v, k_cache, v_cache, indices, indices if error_flag is None else error_flag,
        num_tokens, num_slots, k_cache.shape[1], num_heads, head_dim,
        *k.stride(), *v.stride(), *k_cache.stride(),
    )  # fmt: skip
    kwargs = {
        "BLOCK_T": launch.block_t,
        "BLOCK_H": launch.block_h,
        "BLOCK_D": launch.block_d,
        "CHECK_SLOTS": int(error_flag is not None),
        "num_warps": launch.num_warps,
    }
    return args, kwargs


def launch_store_kernel(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    error_flag: torch.Tensor | None = None,
) -> None:
    """Launch the kernel, with none of :func:`~minikv.store_cache`'s checks.

    ``k_cache``/``v_cache``: ``(pages, page_size, heads, head_dim)``; ``indices``: contiguous.
    With ``error_flag`` (an int32 tensor), the kernel checks each slot's range itself and adds
    the number of slots outside the cache to ``error_flag[0]``; without it, every slot must be valid.
    The kernel runs on the tensors' own GPU, whichever GPU is current.
    """
    num_tokens, num_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    launch = plan_store_launch(num_tokens, num_heads, head_dim, k.device)
    args, kwargs = store_kernel_arguments(k_cache, v_cache, indices, k, v, error_flag, launch)
    kernel = store_kernel.interpreter if launch.interpreted else store_kernel.compiled
    if k.is_cuda:
        with torch.cuda.device(k.device):
            kernel[(launch.num_programs,)](*args, **kwargs)
    else:
        kernel[(launch.num_programs,)](*args, **kwargs)


# -- the public entry point --------------------------------------------------------


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    backend: str = "auto",
    *,
    slot_check: str = "host",
    error_flag: torch.Tensor | None = None,
    index_name: str = "indices",
) -> None:
    """Write ``k[i]``, ``v[i]`` into slot ``indices[i]`` of ``k_cache``, ``v_cache``.

    ``k_cache``/``v_cache``: ``(num_slots, heads, head_dim)`` or
    ``(num_pages, page_size, heads, head_dim)``, any strides, in memory of their own.
    ``k``/``v``: ``(n, heads, head_dim)``, any strides, the cache's dtype and device.
    ``indices``: 1-D int32 or int64, unique, each in ``[0, num_slots)``.

    ``backend``: ``"triton"`` (compiled for CUDA tensors, interpreted for CPU tensors),
    ``"torch"`` (plain torch: the reference's result, fast on CPU) or ``"auto"``
    (Triton for CUDA tensors, torch for CPU tensors).

    ``slot_check``: ``"host"`` (the default) checks every slot on the host before anything
    is written: a bad call raises and writes nothing. On CUDA that needs the slots' values
    on the host: one host-device transfer. ``"kernel"`` (Triton only) makes no transfer:
    the kernel skips each out-of-range slot and adds the number skipped to ``error_flag``
    (an int32 tensor on the cache's device) for the caller to read later; slots are
    trusted to be distinct. Everything else is checked from metadata, on the host, in both.

    ``index_name`` is the name errors give ``indices`` (``store_kv`` says ``out_loc``).
    """
    k_cache4, v_cache4, k, v = check_store_arguments(
        k_cache, v_cache, indices, k, v, backend, slot_check, error_flag, index_name
    )
    if slot_check == "host":
        check_slots(indices, k_cache4.shape[0] * k_cache4.shape[1], index_name)
    if len(indices) == 0:
        return
    use_triton = backend == "triton" or (backend == "auto" and (k.is_cuda or slot_check == "kernel"))
    if use_triton:
        # The kernel reads slot t at loc_ptr + t: a strided view of indices would name other slots.
        launch_store_kernel(
            k_cache4, v_cache4, indices.contiguous(), k, v, error_flag if slot_check == "kernel" else None
        )
    else:
        copy_rows(k_cache4, v_cache4, indices, k, v)


def store_cache_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """The plainest correct version, one token at a time: what every other path is checked against."""
    k_cache4, v_cache4 = _as_paged(k_cache), _as_paged(v_cache)
    page_size = k_cache4.shape[1]
    for i, slot in enumerate(indices.tolist()):
        k_cache4[slot // page_size, slot % page_size] = k[i]
        v_cache4[slot // page_size, slot % page_size] = v[i]


# -- checks ------------------------------------------------------------------------


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
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if slot_check not in SLOT_CHECKS:
        raise ArgumentError(f"slot_check must be one of {SLOT_CHECKS}, got {slot_check!r}")
    named = (("k_cache", k_cache), ("v_cache", v_cache), (index_name, indices), ("k", k), ("v", v))
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise ArgumentTypeError(f"{name} must be a dense tensor, got layout {tensor.layout}")
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
    for name, tensor in named[1:]:
        if tensor.device != device:
            raise DeviceMismatchError(f"{name} is on {tensor.device}, but k_cache is on {device}")
    if not (k_cache.is_cpu or k_cache.is_cuda):
        raise ArgumentError(f"k_cache is on {device}: store_cache writes to 'cpu' or 'cuda' tensors only")
    if slot_check == "kernel":
        if backend == "torch":
            raise ArgumentError("slot_check='kernel' needs the Triton kernel: use backend 'triton' or 'auto'")
        _check_error_flag(error_flag, device)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.is_neg():
            raise ArgumentError(f"{name} is a negated view (such as x.conj().imag): writes through it change sign")
    _check_no_self_overlap(k_cache, "k_cache")  # v_cache has the same shape and strides
    k_range, v_range = _memory_range(k_cache), _memory_range(v_cache)
    if _overlap(k_range, v_range):
        raise ArgumentError("k_cache and v_cache must not share memory: each needs a memory range of its own")
    for src_name, src in (("k", k), ("v", v)):
        src_range = _memory_range(src)
        for cache_name, cache_range in (("k_cache", k_range), ("v_cache", v_range)):
            if _overlap(src_range, cache_range):
                raise ArgumentError(
                    f"{src_name} shares memory with {cache_name}: copy it first (a store would overwrite its source)"
                )
    if k.is_neg() or v.is_neg():  # a negated view's memory holds -value, and the kernel reads memory
        k, v = k.resolve_neg(), v.resolve_neg()
    return _as_paged(k_cache), _as_paged(v_cache), k, v


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
        raise SlotIndexError(f"{index_name}: slot {bad} is outside [0, {num_slots})")
    if repeated if repeated is not None else not all_distinct(indices):
        raise ArgumentError(f"{index_name} must be unique: two tokens cannot share one slot")


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


def _check_error_flag(error_flag: torch.Tensor | None, device: torch.device) -> None:
    if not isinstance(error_flag, torch.Tensor):
        raise ArgumentTypeError(
            f"slot_check='kernel' needs error_flag, an int32 tensor, got {type(error_flag).__name__}"
        )
    if error_flag.dtype != torch.int32 or error_flag.numel() < 1 or error_flag.layout != torch.strided:
        raise ArgumentTypeError(
            f"error_flag must be a dense int32 tensor, got {error_flag.dtype} {tuple(error_flag.shape)}"
        )
    if error_flag.device != device:
        raise DeviceMismatchError(f"error_flag is on {error_flag.device}, but k_cache is on {device}")


def _memory_range(tensor: torch.Tensor) -> tuple[int, int]:
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


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _check_no_self_overlap(cache: torch.Tensor, name: str) -> None:
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


def _as_paged(cache: torch.Tensor) -> torch.Tensor:
    return cache.unsqueeze(1) if cache.dim() == 3 else cache


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


__all__: Sequence[str] = (
    "BACKENDS",
    "SLOT_CHECKS",
    "SUPPORTED_DTYPES",
    "StoreLaunch",
    "all_distinct",
    "check_slots",
    "check_store_arguments",
    "launch_store_kernel",
    "plan_store_launch",
    "store_cache",
    "store_cache_reference",
    "store_kernel",
    "store_kernel_arguments",
)
