"""Exercise 7's checks (``minikv.exercises.paged_attention``): the spec in torch, the online softmax, the kernel.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``. The kernel's mutants are one
kernel with a ``BUG`` switch, so that each differs from the correct kernel (which must pass,
``test_the_buggy_kernel_without_bugs_passes``) in exactly one slip: a wrong softmax rescale, the
wrong KV head for a query head, a page-offset error, a missing length mask, no 1/sqrt(d) scale,
a mask on the loads but not on the scores, the table's stride ignored, a row stride used for pages.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from exercise_helpers import WrongAnswers, chapter_tests

from minikv.exercises import check
from minikv.exercises.paged_attention import rows_read
from minikv.kernels import paged_decode_attention, use_interpreter_without_cuda
from minikv.viz.storage import draw_rows_read

# Before Triton is imported: its own helpers (tl.sum, tl.max) are made interpretable at import, and
# the kernel below at decoration.
use_interpreter_without_cuda()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

WRONG = WrongAnswers()
wrong = WRONG.register

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- paged_attention.decode_torch -----------------------------------------------------------------


def _torch_decode(head_map="div", use_lens=True, scale=True, page_div=True, dtype_out=True):
    """The spec with one rule switched off; with nothing switched off it is correct."""

    def decode_torch(q, k_cache, v_cache, table, lens):
        batch, heads, dim = q.shape
        ps, kv_heads = k_cache.shape[1], k_cache.shape[2]
        out = torch.empty(batch, heads, dim, dtype=q.dtype if dtype_out else torch.float32, device=q.device)
        for b in range(batch):
            slots = table[b, : int(lens[b]) if use_lens else table.shape[1]].long()
            pages, rows = (slots // ps, slots % ps) if page_div else (slots % k_cache.shape[0], slots * 0)
            k, v = k_cache[pages, rows].float(), v_cache[pages, rows].float()
            for h in range(heads):
                g = h // (heads // kv_heads) if head_map == "div" else h % kv_heads
                scores = k[:, g] @ q[b, h].float() / (math.sqrt(dim) if scale else 1.0)
                out[b, h] = (scores.softmax(0) @ v[:, g]).to(out.dtype)
        return out

    return decode_torch


def test_the_torch_spec_without_slips_passes() -> None:
    assert check("paged_attention.decode_torch", _torch_decode()).passed


WRONG["paged_attention.decode_torch"] = [
    _torch_decode(head_map="mod"),
    _torch_decode(use_lens=False),
    _torch_decode(scale=False),
    _torch_decode(page_div=False),
]


# -- paged_attention.online_softmax ---------------------------------------------------------------


def _online(bug: int = 0):
    """The online softmax with one slip (``bug``); 0 is correct."""

    def online_softmax(blocks):
        m, total, acc = float("-inf"), 0.0, None
        for scores, values in blocks:
            m_new = max(m, float(scores.max()))
            rescale = math.exp(m - m_new)
            if bug == 1 and m > float("-inf"):
                rescale = math.exp(m_new - m)  # the rescale upside down
            p = torch.exp(scores - m_new) if bug != 2 else torch.exp(scores)  # no maximum subtracted
            total = total * rescale + float(p.sum())
            if bug == 3:  # forgets to rescale acc, only the sum
                acc = p @ values if acc is None else acc + p @ values
            else:
                acc = p @ values if acc is None else acc * rescale + p @ values
            m = m_new
        return acc / total

    return online_softmax


def test_the_online_softmax_without_slips_passes() -> None:
    assert check("paged_attention.online_softmax", _online()).passed


WRONG["paged_attention.online_softmax"] = [_online(1), _online(2), _online(3)]


@wrong("paged_attention.online_softmax")
def softmax_after_keeping_the_blocks(blocks):
    """Not online: keeps the blocks, which all share one buffer."""
    kept = list(blocks)
    scores = torch.cat([s for s, _ in kept])
    values = torch.cat([v for _, v in kept])
    return scores.softmax(0) @ values


@wrong("paged_attention.online_softmax")
def softmax_per_block_averaged(blocks):
    """Each block's softmax, averaged: right for one block only."""
    parts = [s.softmax(0) @ v for s, v in blocks]
    return sum(parts) / len(parts)


# -- paged_attention.decode: one kernel, one slip at a time ---------------------------------------


@triton.jit
def _buggy_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
    page_size, group, kv_heads, head_dim, scale,
    q_stride_b, q_stride_h,
    k_stride_p, k_stride_s, k_stride_h,
    v_stride_p, v_stride_s, v_stride_h,
    table_stride_b, out_stride_b, out_stride_h,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h % kv_heads if BUG == 2 else h // group
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q = tl.load(q_ptr + b * q_stride_b + h * q_stride_h + d, mask=d_ok, other=0.0).to(tl.float32)
    seq_len = tl.load(lens_ptr + b)
    m = tl.full([1], float("-inf"), tl.float32)
    total = tl.full([1], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < seq_len
        if BUG == 4:  # the missing mask: every lane of the block is read and scored
            n_ok = n >= 0
        slot = tl.load(table_ptr + b * table_stride_b + n, mask=n_ok, other=0).to(tl.int64)
        page = slot // page_size
        row = slot % page_size
        if BUG == 3:  # page-offset error: the row inside the page is forgotten
            row = row * 0
        mask = n_ok[:, None] & d_ok[None, :]
        if BUG == 7:  # the cache as flat rows: right only when pages are contiguous
            k_rows = slot * k_stride_s + kv_head * k_stride_h
            v_rows = slot * v_stride_s + kv_head * v_stride_h
        else:
            k_rows = page * k_stride_p + row * k_stride_s + kv_head * k_stride_h
            v_rows = page * v_stride_p + row * v_stride_s + kv_head * v_stride_h
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * (1.0 if BUG == 5 else scale)
        if BUG != 6:  # the mask kept on the loads but not on the scores: padding lanes score 0
            scores = tl.where(n_ok, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        rescale = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        total = total * rescale + tl.sum(p, axis=0)
        if BUG == 1:  # the wrong rescale: the output sum is not rescaled when the maximum grows
            rescale = rescale * 0 + 1
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    out = acc / total
    tl.store(out_ptr + b * out_stride_b + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def _triton_decode(bug: int = 0, table_width_stride: bool = False, block_n: int = 16):
    """A launcher for the kernel above; ``table_width_stride`` passes the table's width as its row stride."""

    def decode(q, k_cache, v_cache, table, lens):
        batch, heads, dim = q.shape
        out = torch.empty_like(q)
        table_stride = table.shape[1] if table_width_stride else table.stride(0)
        _buggy_decode_kernel[(batch, heads)](
            q, k_cache, v_cache, table, lens, out,
            k_cache.shape[1], heads // k_cache.shape[2], k_cache.shape[2], dim, 1.0 / math.sqrt(dim),
            q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
            table_stride, out.stride(0), out.stride(1),
            BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(dim), BUG=bug,
        )  # fmt: skip
        return out

    return decode


def test_the_buggy_kernel_without_bugs_passes() -> None:
    """Otherwise the wrong kernels below could fail for a reason of their own."""
    result = check("paged_attention.decode", _triton_decode())
    assert result.passed, str(result)


WRONG["paged_attention.decode"] = [
    _triton_decode(bug=1),  # wrong softmax rescale
    _triton_decode(bug=2),  # wrong GQA head mapping
    _triton_decode(bug=3),  # page-offset error
    _triton_decode(bug=4),  # missing length mask
    _triton_decode(bug=6),  # the length mask on the loads only, not on the scores
    _triton_decode(bug=5),  # no 1/sqrt(head_dim)
    _triton_decode(table_width_stride=True),  # the table's row stride taken as its width
    _triton_decode(bug=7),  # slot * row stride: right only for contiguous pages
]


# -- the probe and its picture ---------------------------------------------------------------------


def test_the_probe_sees_what_each_slip_reads() -> None:
    """rows_read names the right rows for minikv's kernel, extra rows for a missing mask, wrong KV heads for GQA."""

    def minikv_kernel(q, k, v, table, lens):
        return paged_decode_attention(q, k, v, table, lens).view(q.shape)

    good = rows_read(minikv_kernel)
    assert good.correct
    assert good.read.sum() == sum(good.lens)  # every request's own slots, nothing else
    unmasked = rows_read(_triton_decode(bug=4))
    assert not unmasked.correct and (unmasked.read & ~unmasked.expected).any()
    mapped = rows_read(_triton_decode(bug=2))
    assert (mapped.read == mapped.expected).all() and (mapped.kv_head != mapped.expected_kv_head).any()
    offset = rows_read(_triton_decode(bug=3))
    assert (offset.expected & ~offset.read).any()
    figure = draw_rows_read(unmasked)
    assert len(figure.axes) == len(unmasked.lens)
    assert any("wrong" in ax.get_title() for ax in figure.axes)
    np.testing.assert_array_equal(good.expected, unmasked.expected)


def decode_torch_flat_slots(q, k_cache, v_cache, table, lens):
    """Flat rows through reshape: a copy when the layer is not contiguous, which is fine for reading."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    k_rows = k_cache.reshape(-1, kv_heads, dim)
    v_rows = v_cache.reshape(-1, kv_heads, dim)
    out = torch.empty_like(q)
    for b in range(batch):
        slots = table[b, : int(lens[b])].long()
        k = k_rows[slots].float().repeat_interleave(heads // kv_heads, 1)
        v = v_rows[slots].float().repeat_interleave(heads // kv_heads, 1)
        out[b] = torch.einsum("hn,nhd->hd", (torch.einsum("hd,nhd->hn", q[b].float(), k) / dim**0.5).softmax(-1), v)
    return out


def test_draw_rows_read_refuses_what_is_not_a_probe_result() -> None:
    from types import SimpleNamespace

    from minikv.errors import ArgumentError

    with pytest.raises(ArgumentError, match="found"):
        draw_rows_read(SimpleNamespace(read=np.zeros((2, 6), bool), expected=np.zeros((2, 6), bool), page_size=4))
    with pytest.raises(ArgumentError, match="found"):
        draw_rows_read(SimpleNamespace(read=np.zeros((2, 8), bool), expected=np.zeros((1, 8), bool), page_size=4))


def test_correct_alternatives_pass() -> None:
    """The spec through flat rows; the same kernel with other block sizes: 4 (many loop steps) and 64 (one)."""
    for exercise_id, fn in [
        ("paged_attention.decode_torch", decode_torch_flat_slots),
        ("paged_attention.decode", _triton_decode(block_n=4)),
        ("paged_attention.decode", _triton_decode(block_n=64)),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("paged_attention", WRONG)
