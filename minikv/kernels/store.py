"""``store_cache``: write each token's K and V row into its slot of the cache.

The kernel is one line of arithmetic -- ``cache[slot[t]] = src[t]`` for K and for V --
and everything around it is about doing that line safely:

* checks first: Triton does not check bounds (under the interpreter an index one past
  the end silently overwrites memory, and ``-1`` corrupts the heap), so shapes, dtypes,
  devices, strides and memory overlaps are checked before launch, on the host, from the
  tensors' metadata alone (the checks are in :mod:`minikv.kernels.checks`);
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

Where the kernel runs follows ``minikv.kernels.devices``: compiled on the GPU of CUDA
tensors, interpreted for CPU tensors. The plain-torch path for CPU tensors is in
:mod:`minikv.kernels.cpu_copy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, no_type_check

import torch

from .checks import (
    BACKENDS,
    SLOT_CHECKS,
    SUPPORTED_DTYPES,
    all_distinct,
    as_paged,
    check_slots,
    check_store_arguments,
)
from .cpu_copy import copy_rows
from .devices import interpreted, triton_kernel

if TYPE_CHECKING:
    import triton.language as tl


@triton_kernel
@no_type_check
def store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, error_ptr,
    num_tokens, num_slots, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    CHECK_SLOTS: tl.constexpr,
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
    page3 = page[:, None, None]
    row3 = row[:, None, None]
    mask = t_ok[:, None, None] & (h3 < num_heads) & (d3 < head_dim)
    dst = page3 * c_stride_p + row3 * c_stride_s + h3 * c_stride_h + d3 * c_stride_d

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

    ``slot_check``: ``"host"`` (the default) checks every slot on the host before
    anything is written: a bad call raises and writes nothing. On CUDA that needs the
    slots' values on the host: one host-device transfer. ``"kernel"`` (Triton only)
    makes no transfer: the kernel skips each out-of-range slot and adds the number
    skipped to ``error_flag`` (an int32 tensor on the cache's device) for the caller to
    read later; slots are trusted to be distinct. Everything else is checked from
    metadata, on the host, in both.

    ``index_name`` is the name errors give ``indices`` (``store_kv`` says ``out_loc``).
    """
    k_cache4, v_cache4, k, v = check_store_arguments(
        k_cache, v_cache, indices, k, v, backend, slot_check, error_flag, index_name
    )
    if slot_check == "host":
        check_slots(indices, k_cache4.shape[0] * k_cache4.shape[1], index_name)
    if len(indices) == 0:
        return
    in_kernel = slot_check == "kernel"
    use_triton = backend == "triton" or (backend == "auto" and (k.is_cuda or in_kernel))
    if use_triton:
        # The kernel reads slot t at loc_ptr + t: a strided view would name other slots.
        flag = error_flag if in_kernel else None
        launch_store_kernel(k_cache4, v_cache4, indices.contiguous(), k, v, flag)
    else:
        copy_rows(k_cache4, v_cache4, indices, k, v)


def store_cache_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """The plainest correct version, one token at a time: what every other path is checked against."""
    k_cache4, v_cache4 = as_paged(k_cache), as_paged(v_cache)
    page_size = k_cache4.shape[1]
    for i, slot in enumerate(indices.tolist()):
        k_cache4[slot // page_size, slot % page_size] = k[i]
        v_cache4[slot // page_size, slot % page_size] = v[i]


# -- helpers -----------------------------------------------------------------------


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
