"""Exercise 3's checks (``minikv.exercises.storage``): head splits, layouts, slot maps, torch and Triton stores.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from exercise_helpers import WrongAnswers, chapter_tests

from minikv.exercises import check
from minikv.kernels import use_interpreter_without_cuda

# Before Triton is imported: its own helpers (tl.sum, tl.max) are made interpretable at import, and
# the kernels below at decoration. Imported first, Triton would leave them compiled-only, and
# exercise 7's kernel, which calls tl.max, would fail in any test module collected after this one.
use_interpreter_without_cuda()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

WRONG = WrongAnswers()
wrong = WRONG.register


@wrong("storage.tp_head_range")
def heads_interleaved(num_kv_heads, tp_rank, tp_size):
    return range(tp_rank, num_kv_heads, tp_size)


@wrong("storage.tp_head_range")
def heads_without_checks(num_kv_heads, tp_rank, tp_size):
    local = num_kv_heads // tp_size
    return range(tp_rank * local, (tp_rank + 1) * local)


@wrong("storage.tp_head_range")
def heads_by_rank_times_size(num_kv_heads, tp_rank, tp_size):
    if num_kv_heads % tp_size or not 0 <= tp_rank < tp_size:
        raise ValueError("bad split")
    return range(tp_rank * tp_size, tp_rank * tp_size + num_kv_heads // tp_size)


@wrong("storage.page_first_view")
def view_by_reshape(buffer):
    two, pages, layers, heads, dim = buffer.shape
    return buffer.reshape(two, layers, pages, heads, dim)


@wrong("storage.page_first_view")
def view_that_copies(buffer):
    return buffer.permute(0, 2, 1, 3, 4).contiguous()


@wrong("storage.page_first_view")
def view_swaps_heads(buffer):
    return buffer.permute(0, 2, 1, 3, 4).flip(3)


@wrong("storage.slot_mapping")
def slots_are_positions(page_table, start, end, page_size):
    return torch.arange(start, end)


@wrong("storage.slot_mapping")
def slots_from_page_ids(page_table, start, end, page_size):
    positions = torch.arange(start, end)
    return page_table[positions // page_size].long() + positions % page_size


@wrong("storage.slot_mapping")
def slots_end_inclusive(page_table, start, end, page_size):
    positions = torch.arange(start, min(end + 1, len(page_table) * page_size))
    return page_table[positions // page_size].long() * page_size + positions % page_size


@wrong("storage.tp_head_range")
def heads_forget_negative_ranks(num_kv_heads, tp_rank, tp_size):
    if num_kv_heads % tp_size or tp_rank >= tp_size:
        raise ValueError("bad split")
    local = num_kv_heads // tp_size
    return range(tp_rank * local, (tp_rank + 1) * local)  # rank -1 gets a range of negative heads


@wrong("storage.page_first_view")
def view_with_strides_from_the_shape(buffer):
    two, pages, layers, heads, dim = buffer.shape  # right only for a contiguous buffer at offset 0
    return buffer.as_strided(
        (two, layers, pages, heads, dim),
        (pages * layers * heads * dim, heads * dim, layers * heads * dim, dim, 1),
    )


@wrong("storage.page_first_view")
def view_forgets_the_offset(buffer):
    s = buffer.stride()
    shape = (buffer.shape[0], buffer.shape[2], buffer.shape[1], *buffer.shape[3:])
    return buffer.as_strided(shape, (s[0], s[2], s[1], s[3], s[4]), 0)  # as_strided's offset is not the view's


@wrong("storage.slot_mapping")
def slots_through_float32(page_table, start, end, page_size):
    positions = torch.arange(start, end)
    return (page_table[positions // page_size].float() * page_size + positions % page_size).long()  # 2^24


@wrong("storage.slot_mapping")
def slots_scale_the_callers_table(page_table, start, end, page_size):
    positions = torch.arange(start, end)
    page_table.mul_(page_size)  # right slots, but the caller's page table is now scaled
    return page_table[positions // page_size].long() + positions % page_size


def _checked(store: Callable) -> Callable:
    """Validation first (a correct part), so that only the bug under test differs."""

    def checked(k_cache, v_cache, indices, k, v):
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= num_slots):
            raise IndexError("slot out of range")
        store(k_cache, v_cache, indices, k, v)

    checked.__name__ = store.__name__
    return checked


@wrong("storage.store_torch")
@_checked
def store_torch_swaps_k_and_v(k_cache, v_cache, indices, k, v):
    ps = k_cache.shape[1]
    slots = indices.long()
    k_cache[slots // ps, slots % ps] = v
    v_cache[slots // ps, slots % ps] = k


@wrong("storage.store_torch")
@_checked
def store_torch_through_reshape(k_cache, v_cache, indices, k, v):
    heads, dim = k_cache.shape[2:]
    k_cache.reshape(-1, heads, dim)[indices.long()] = k  # a copy when the cache is not contiguous
    v_cache.reshape(-1, heads, dim)[indices.long()] = v


@wrong("storage.store_torch")
def store_torch_trusts_indices(k_cache, v_cache, indices, k, v):
    ps = k_cache.shape[1]
    slots = indices.long()
    k_cache[slots // ps, slots % ps] = k
    v_cache[slots // ps, slots % ps] = v


@wrong("storage.store_torch")
@_checked
def store_torch_ignores_pages(k_cache, v_cache, indices, k, v):
    slots = indices.long()
    k_cache[slots, 0] = k
    v_cache[slots, 0] = v


@wrong("storage.store_torch")
def store_torch_checks_only_the_last_slot(k_cache, v_cache, indices, k, v):
    num_pages, ps = k_cache.shape[:2]
    if len(indices) and not 0 <= int(indices[-1]) < num_pages * ps:
        raise IndexError("slot out of range")
    slots = indices.long()
    k_cache[slots // ps, slots % ps] = k
    v_cache[slots // ps, slots % ps] = v


@wrong("storage.store_torch")
@_checked
def store_torch_one_row_view(k_cache, v_cache, indices, k, v):
    pages, ps, heads, dim = k_cache.shape
    flat_k = k_cache.as_strided((pages * ps, heads * dim), (k_cache.stride(1), 1))  # rows assumed contiguous
    flat_v = v_cache.as_strided((pages * ps, heads * dim), (v_cache.stride(1), 1))
    rows = (indices.long() // ps) * (k_cache.stride(0) // k_cache.stride(1)) + indices.long() % ps
    flat_k[rows] = k.reshape(len(indices), -1)
    flat_v[rows] = v.reshape(len(indices), -1)


def store_torch_token_by_token(k_cache, v_cache, indices, k, v):
    """A correct alternative: one token at a time, validated first."""
    pages, ps = k_cache.shape[:2]
    slots = [int(s) for s in indices]
    if any(s < 0 or s >= pages * ps for s in slots):
        raise IndexError("slot out of range")
    for i, slot in enumerate(slots):
        page, row = divmod(slot, ps)
        k_cache[page, row].copy_(k[i])
        v_cache[page, row].copy_(v[i])


def store_torch_index_put(k_cache, v_cache, indices, k, v):
    """A correct alternative: index_put_ with a pair of index tensors."""
    pages, ps = k_cache.shape[:2]
    if indices.numel() and not bool(((indices >= 0) & (indices < pages * ps)).all()):
        raise IndexError("slot out of range")
    page, row = indices.long().div(ps, rounding_mode="floor"), indices.long().remainder(ps)
    k_cache.index_put_((page, row), k)
    v_cache.index_put_((page, row), v)


def view_by_transpose(buffer):
    return buffer.transpose(1, 2)


def slots_page_by_page(page_table, start, end, page_size):
    out = []
    for position in range(start, end):
        out.append(int(page_table[position // page_size]) * page_size + position % page_size)
    return torch.tensor(out, dtype=torch.int64)


def heads_by_slicing(num_kv_heads, tp_rank, tp_size):
    if tp_rank not in range(tp_size) or num_kv_heads % tp_size:
        raise ValueError("impossible split")
    per = num_kv_heads // tp_size
    return range(num_kv_heads)[tp_rank * per : tp_rank * per + per]


def test_correct_alternatives_pass() -> None:
    for exercise_id, fn in [
        ("storage.store_torch", store_torch_token_by_token),
        ("storage.store_torch", store_torch_index_put),
        ("storage.page_first_view", view_by_transpose),
        ("storage.slot_mapping", slots_page_by_page),
        ("storage.tp_head_range", heads_by_slicing),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


def test_the_reference_store_under_another_name_is_refused() -> None:
    from minikv.kernels.store import store_cache_reference as mine

    result = check("storage.store_torch", mine)
    assert not result.passed and "minikv's own answer" in result.smallest_failure.problem


@triton.jit
def _buggy_store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr,
    num_tokens, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    # BUG 0: none; 1: K and V swapped; 2: V read with K's strides; 3: slot used as a page index;
    # 4: the cache's head and element strides taken as (head_dim, 1); 5: the sources' element stride taken as 1;
    # 6: the slot stays int32, and so does the offset computed from it.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(loc_ptr + t, mask=t_ok, other=0)
    if BUG != 6:
        slot = slot.to(tl.int64)
    if BUG == 3:
        page = slot
        row = slot * 0
    else:
        page = slot // page_size
        row = slot % page_size
    t3 = t.to(tl.int64)[:, None, None]
    h3 = h[None, :, None]
    d3 = d[None, None, :]
    mask = t_ok[:, None, None] & (h3 < num_heads) & (d3 < head_dim)
    if BUG == 4:
        dst = page[:, None, None] * c_stride_p + row[:, None, None] * c_stride_s + h3 * head_dim + d3
    else:
        dst = page[:, None, None] * c_stride_p + row[:, None, None] * c_stride_s + h3 * c_stride_h + d3 * c_stride_d
    if BUG == 5:
        k_rows = tl.load(k_ptr + t3 * k_stride_t + h3 * k_stride_h + d3, mask=mask)
    else:
        k_rows = tl.load(k_ptr + t3 * k_stride_t + h3 * k_stride_h + d3 * k_stride_d, mask=mask)
    if BUG == 2:
        v_rows = tl.load(v_ptr + t3 * k_stride_t + h3 * k_stride_h + d3 * k_stride_d, mask=mask)
    else:
        v_rows = tl.load(v_ptr + t3 * v_stride_t + h3 * v_stride_h + d3 * v_stride_d, mask=mask)
    if BUG == 1:
        tl.store(k_cache_ptr + dst, v_rows, mask=mask)
        tl.store(v_cache_ptr + dst, k_rows, mask=mask)
    else:
        tl.store(k_cache_ptr + dst, k_rows, mask=mask)
        tl.store(v_cache_ptr + dst, v_rows, mask=mask)


def triton_store(
    bug: int = 0,
    contiguous_strides: bool = False,
    drop_last_block: bool = False,
    contiguous_indices: bool = True,
    validate: bool = True,
) -> Callable:
    def store(k_cache, v_cache, indices, k, v):
        pages, page_size, heads, dim = k_cache.shape
        n = len(indices)
        if validate and n and (int(indices.min()) < 0 or int(indices.max()) >= pages * page_size):
            raise IndexError("slot out of range")
        if n == 0:
            return
        if contiguous_indices:
            indices = indices.contiguous()
        block_t = 16
        grid = n // block_t if drop_last_block else triton.cdiv(n, block_t)
        if grid == 0:
            return
        if contiguous_strides:  # as if every tensor were contiguous
            k_strides = v_strides = (heads * dim, dim, 1)
            c_strides = (page_size * heads * dim, heads * dim, dim, 1)
        else:
            k_strides, v_strides, c_strides = k.stride(), v.stride(), k_cache.stride()
        _buggy_store_kernel[(grid,)](
            k, v, k_cache, v_cache, indices, n, page_size, heads, dim, *k_strides, *v_strides, *c_strides,
            BLOCK_T=block_t, BLOCK_H=triton.next_power_of_2(heads), BLOCK_D=triton.next_power_of_2(dim), BUG=bug,
        )  # fmt: skip

    return store


def test_the_buggy_kernel_without_bugs_passes() -> None:
    """Otherwise the wrong stores below could fail for a reason of their own."""
    assert check("storage.store", triton_store()).passed


WRONG["storage.store"] = [
    triton_store(bug=1),
    triton_store(bug=2),
    triton_store(bug=3),
    triton_store(contiguous_strides=True),
    triton_store(drop_last_block=True),
    triton_store(contiguous_indices=False),
    triton_store(validate=False),
    triton_store(bug=4),
    triton_store(bug=5),
    triton_store(bug=6),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the far-slot case runs on the CPU only (8 GiB of lazy memory)")
def test_an_offset_computed_in_int32_is_caught() -> None:
    """Issue 26: a slot 2^31 elements into the cache; the int32 offset wraps before the cache, into guard memory."""
    result = check("storage.store", triton_store(bug=6))
    failure = result.smallest_failure
    assert failure is not None and "computed in 32 bits" in failure.problem, str(result)
    assert result.num_passed == len(result.cases) - 1  # only the far slot tells int32 from int64


# issue 26: degenerate splits, and a real view that must pass --------------------------------


@wrong("storage.tp_head_range")
def heads_divide_before_checking_the_rank(num_kv_heads, tp_rank, tp_size):
    if num_kv_heads % tp_size:  # tp_size 0: ZeroDivisionError, not ValueError
        raise ValueError("uneven")
    if not 0 <= tp_rank < tp_size:
        raise ValueError("rank")
    local = num_kv_heads // tp_size
    return range(tp_rank * local, (tp_rank + 1) * local)


@wrong("storage.tp_head_range")
def heads_allow_more_gpus_than_heads(num_kv_heads, tp_rank, tp_size):
    if not 0 <= tp_rank < tp_size:
        raise ValueError("rank")
    if num_kv_heads % tp_size and tp_size < num_kv_heads:
        raise ValueError("uneven")
    local = num_kv_heads // tp_size
    return range(tp_rank * local, (tp_rank + 1) * local)


def test_a_view_through_dlpack_of_a_sliced_buffer_is_a_view() -> None:
    result = check("storage.page_first_view", lambda buffer: torch.from_dlpack(buffer.permute(0, 2, 1, 3, 4)))
    assert result.passed, str(result)


def test_the_slot_mapping_shrinker_keeps_the_page_table_long_enough() -> None:
    from minikv.exercises import storage

    def off_for_page_size_one(page_table, start, end, page_size):
        positions = torch.arange(start, end)
        return page_table[positions // page_size].long() * page_size + positions % page_size + (page_size == 1)

    result = check("storage.slot_mapping", off_for_page_size_one)
    assert not result.passed
    assert all("the checker could not use" not in case.problem for case in result.cases), str(result)
    assert storage.MAPPING_DRAWS >= 1000


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("storage", WRONG)
