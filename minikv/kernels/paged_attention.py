"""``paged_decode_attention``: each request's new token attends over its K/V, read in place from the pages.

The store kernel (``minikv.kernels.store``) is the write half of the cache. This is the read half,
as a decode step needs it: request ``b`` has one query (its newest token) and ``lens[b]`` cached
tokens whose slots are the first ``lens[b]`` entries of its row of the slot table (a server's
``req_to_token``). One program per (request, query head):

1. load the query, and start a running maximum ``m``, a running sum ``total`` and an output ``acc``;
2. walk the request's slots ``BLOCK_N`` at a time: slot ``s`` is row ``s % page_size`` of page
   ``s // page_size``, so the K and V rows are loaded straight from the cache, wherever the pages
   are, with no gathered copy;
3. score the block, and fold it in with the *online softmax*: when the running maximum grows from
   ``m`` to ``m'``, everything summed so far is scaled by ``exp(m - m')``, so the result equals a
   softmax over all the scores without ever holding them all;
4. write ``acc / total``.

Query head ``h`` reads KV head ``h // group`` (grouped-query attention: ``group`` query heads share
one KV head). The reference, :func:`paged_decode_attention_reference`, is the course's gather path
(:func:`minikv.models.gather_kv` then :func:`minikv.models.causal_attention`); the tests check the
kernel against it, under Triton's interpreter on a CPU and compiled on a GPU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, no_type_check

import torch

from ..errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, SlotIndexError
from .devices import interpreted, triton_kernel

if TYPE_CHECKING:
    import triton.language as tl

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton_kernel
@no_type_check
def paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, lens_ptr, out_ptr,
    page_size, group, head_dim, scale,
    q_stride_b, q_stride_h,
    k_stride_p, k_stride_s, k_stride_h,
    v_stride_p, v_stride_s, v_stride_h,
    table_stride_b, out_stride_b, out_stride_h,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // group
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q_row = q_ptr + b * q_stride_b + h * q_stride_h
    q = tl.load(q_row + d, mask=d_ok, other=0.0).to(tl.float32)
    seq_len = tl.load(lens_ptr + b)
    table_row = table_ptr + b * table_stride_b

    m = tl.full([1], float("-inf"), tl.float32)  # the largest score so far
    total = tl.full([1], 0.0, tl.float32)  # the sum of exp(score - m) so far
    acc = tl.full([BLOCK_D], 0.0, tl.float32)  # the sum of exp(score - m) * v so far
    for start in range(0, seq_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        slot = tl.load(table_row + n, mask=n_ok, other=0).to(tl.int64)
        page = slot // page_size
        row = slot % page_size
        rows_ok = n_ok[:, None] & d_ok[None, :]
        k_rows = page * k_stride_p + row * k_stride_s + kv_head * k_stride_h
        k_at = k_cache_ptr + k_rows[:, None] + d[None, :]
        k = tl.load(k_at, mask=rows_ok, other=0.0).to(tl.float32)
        scores = tl.where(n_ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))

        m_new = tl.maximum(m, tl.max(scores, axis=0))
        rescale = tl.exp(m - m_new)  # what the old sums are worth at the new maximum
        p = tl.exp(scores - m_new)
        v_rows = page * v_stride_p + row * v_stride_s + kv_head * v_stride_h
        v_at = v_cache_ptr + v_rows[:, None] + d[None, :]
        v = tl.load(v_at, mask=rows_ok, other=0.0).to(tl.float32)
        total = total * rescale + tl.sum(p, axis=0)
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        m = m_new

    out = acc / total
    out_row = out_ptr + b * out_stride_b + h * out_stride_h
    tl.store(out_row + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def plan_block_n(device: torch.device) -> int:
    """Slots per loop step. On a GPU, 64 (with 8 warps: no register spills up to ``head_dim`` 128 in
    any dtype, sm_75 to sm_90, as the compile test checks); under the interpreter, whose cost is
    per step rather than per element, 128."""
    return 128 if interpreted(device) else 64


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """Decode attention of ``q`` over each request's cached K/V, read from the pages in place.

    ``q``: ``(batch, heads, head_dim)``, one query per request (its newest token, whose K/V are
    already stored). ``k_cache``/``v_cache``: one layer, ``(pages, page_size, kv_heads, head_dim)``
    with ``heads`` a multiple of ``kv_heads``. ``table``: ``(batch, width)`` int32 or int64, row
    ``b`` holding the slots of request ``b``'s tokens in order; ``lens``: ``(batch,)``, how many
    (at least 1, at most ``width``). Returns ``(batch, heads * head_dim)``, as
    :func:`minikv.models.causal_attention` does.

    Runs compiled on CUDA tensors and under Triton's interpreter on CPU tensors. Every slot read is
    checked on the host first (one transfer of ``lens`` and the table on a GPU): Triton does not
    check bounds, and a slot outside the cache would read another tensor's memory.
    """
    check_paged_attention_arguments(q, k_cache, v_cache, table, lens)
    batch, heads, head_dim = q.shape
    out = torch.empty(batch, heads, head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out.reshape(0, heads * head_dim)
    args, kwargs = paged_decode_arguments(q, k_cache, v_cache, table, lens.to(torch.int32), out)
    kernel = paged_decode_kernel.on(q.device)
    if q.is_cuda:
        with torch.cuda.device(q.device):
            kernel[(batch, heads)](*args, **kwargs)
    else:
        kernel[(batch, heads)](*args, **kwargs)
    return out.reshape(batch, heads * head_dim)


def paged_decode_arguments(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
) -> tuple[tuple[Any, ...], dict[str, int]]:
    """The kernel's arguments and constexprs for one launch over a ``(batch, heads)`` grid (checked tensors)."""
    _, heads, head_dim = q.shape
    table = table if table.stride(1) == 1 else table.contiguous()
    args = (
        q, k_cache, v_cache, table, lens.contiguous(), out,
        k_cache.shape[1], heads // k_cache.shape[2], head_dim, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        table.stride(0), out.stride(0), out.stride(1),
    )  # fmt: skip
    kwargs = {"BLOCK_N": plan_block_n(q.device), "BLOCK_D": _next_power_of_2(head_dim), "num_warps": 8}
    return args, kwargs


def paged_decode_attention_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """The gather path, request by request: copy the rows the slots name, then attend (what the kernel must equal)."""
    from ..models.attention import causal_attention

    page_size = k_cache.shape[1]
    outputs = []
    for b, length in enumerate(lens.tolist()):
        slots = table[b, :length].long()
        pages, rows = slots // page_size, slots % page_size
        k, v = k_cache[pages, rows], v_cache[pages, rows]
        outputs.append(causal_attention(q[b : b + 1], k, v, q_start=length - 1))
    return torch.cat(outputs) if outputs else q.new_empty(0, q.shape[1] * q.shape[2])


def check_paged_attention_arguments(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor
) -> None:
    """Refuse, naming the argument, anything the kernel would read wrongly or out of bounds."""
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("table", table), ("lens", lens)):
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != q.device:
            raise DeviceMismatchError(f"{name} is on {tensor.device}, q on {q.device}: all must share one device")
    if q.dim() != 3:
        raise ArgumentError(f"q must be (batch, heads, head_dim), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ArgumentError(
            f"k_cache and v_cache must both be (pages, page_size, kv_heads, head_dim), "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    batch, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or kv_heads == 0 or heads % kv_heads:
        raise ArgumentError(
            f"k_cache: {kv_heads} KV heads of {k_cache.shape[3]} do not serve q's {heads} heads of {head_dim} "
            "(heads must be a multiple of kv_heads, head_dim equal)"
        )
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dtype not in ATTENTION_DTYPES or tensor.dtype != q.dtype:
            raise ArgumentError(f"{name} must be float32, float16 or bfloat16 like q ({q.dtype}), got {tensor.dtype}")
        if tensor.stride(-1) != 1:
            raise ArgumentError(f"{name} must have contiguous rows (last stride 1), got strides {tensor.stride()}")
    if table.dim() != 2 or table.shape[0] != batch or table.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(
            f"table must be (batch={batch}, width) int32 or int64, got {tuple(table.shape)} {table.dtype}"
        )
    if lens.shape != (batch,) or lens.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"lens must be ({batch},) int32 or int64, got {tuple(lens.shape)} {lens.dtype}")
    if batch == 0:
        return
    lengths = lens.tolist()
    if min(lengths) < 1 or max(lengths) > table.shape[1]:
        raise ArgumentError(f"lens must each be in [1, {table.shape[1]}] (the table's width), got {lengths}")
    used = torch.arange(table.shape[1], device=table.device)[None, :] < lens[:, None]
    slots = table[used]
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    low, high = int(slots.min()), int(slots.max())
    if low < 0 or high >= num_slots:
        raise SlotIndexError(f"table: slots must be in [0, {num_slots}), got {low if low < 0 else high}")


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
