# %% [markdown]
# # Exercises 7: reading the paged cache
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex7_paged_attention.ipynb)
#
# The store kernel of [chapter 3b](../book/03_store_kernel.ipynb) and [exercises 3](ex3_storage.ipynb)
# writes each token's K and V rows into the slots the manager chose. This is the other half, which
# [chapter 8](../book/08_scheduler.ipynb) ends with: a decode step reads them back. Request `b` has
# one query (its newest token) and `lens[b]` cached tokens; their slots are the first `lens[b]`
# entries of row `b` of the *slot table* (a server's `req_to_token`; FlashInfer calls it
# `kv_indices`). Slot `s` is row `s % page_size` of page `s // page_size`, wherever that page is.
#
# The spec, in the style of Sasha Rush's Triton-Puzzles: for each request `b` and query head `h`,
#
#     slots  = table[b, :lens[b]]
#     K, V   = k_cache[slots // page_size, slots % page_size, g], the same for v_cache
#     out[b, h] = softmax(K @ q[b, h] / sqrt(head_dim)) @ V
#
# where `g = h // (heads // kv_heads)`: with grouped-query attention (GQA) several query heads
# share one KV head. You write it in plain torch first, then the trick that lets a kernel do it
# without holding every score at once (the *online softmax*), then the Triton kernel itself,
# which reads K and V in place, with no gathered copy.
#
# **GPU or not.** On a Colab GPU runtime your kernel compiles for the GPU and the checker hands
# it CUDA tensors. Without one, the same kernel runs in Triton's interpreter on CPU tensors: the
# next cell switches the interpreter on before any kernel is defined. The checker's sizes are tiny
# so that the interpreter stays fast.

# %%
import math

import torch
from IPython.display import display

from minikv.exercises import check
from minikv.exercises.paged_attention import rows_read
from minikv.kernels import require_triton, use_interpreter_without_cuda
from minikv.viz.storage import draw_rows_read

interpreted = use_interpreter_without_cuda()  # before any @triton.jit: sets TRITON_INTERPRET=1 without CUDA
print(
    "GPU:",
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none: Triton kernels run in its interpreter",
)
print("Triton interpreter:", interpreted)

# %% [markdown]
# ## Task 7.1 · `paged_attention.decode_torch` (medium)
#
# Write the spec in plain torch: `decode_torch(q, k_cache, v_cache, table, lens) -> Tensor`.
#
# * `q`: `(batch, heads, head_dim)`, one query per request.
# * `k_cache`, `v_cache`: one layer, `(num_pages, page_size, kv_heads, head_dim)`, any strides (a
#   layer of a page-first buffer, say), float32 or float16.
# * `table`: `(batch, width)` `int32`; only the first `lens[b]` entries of row `b` are request
#   `b`'s, the rest are other requests' slots. `lens`: `(batch,)` `int32`, each at least 1.
# * Return `(batch, heads, head_dim)`, in `q`'s dtype. Compute in float32: scores of float16
#   rows lose too much otherwise. Leave every argument as it is.
#
# ```{admonition} Hint 1: one request at a time
# :class: dropdown
# `slots = table[b, :lens[b]].long()`, then `k = k_cache[slots // page_size, slots % page_size]`
# has shape `(lens[b], kv_heads, head_dim)`: the rows gathered into a dense tensor.
# ```
#
# ```{admonition} Hint 2: the heads
# :class: dropdown
# `k.repeat_interleave(heads // kv_heads, dim=1)` gives every query head its KV head's rows, in
# order: query heads `0 .. group-1` get KV head 0. Then
# `scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(head_dim)` and
# `torch.einsum("hn,nhd->hd", scores.softmax(-1), v)`.
# ```


# %%
def decode_torch(q, k_cache, v_cache, table, lens):
    ### BEGIN SOLUTION
    batch, heads, head_dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(batch):
        slots = table[b, : int(lens[b])].long()
        pages, rows = slots // page_size, slots % page_size
        k = k_cache[pages, rows].float().repeat_interleave(heads // kv_heads, dim=1)
        v = v_cache[pages, rows].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(head_dim)
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
    ### END SOLUTION


check("paged_attention.decode_torch", decode_torch)

# %% [markdown]
# ## Task 7.2 · `paged_attention.online_softmax` (medium)
#
# A kernel walks a request's slots a block at a time and cannot keep all the scores: a request
# may have thousands of tokens. The *online softmax* keeps three running values instead:
#
# * `m`, the largest score so far;
# * `total`, the sum of `exp(score - m)` so far;
# * `acc`, the sum of `exp(score - m) * value` so far.
#
# When a block raises the maximum from `m` to `m_new`, everything summed so far was measured
# against the old maximum, so both sums are multiplied by `exp(m - m_new)` before the block's own
# terms are added. At the end, `acc / total` equals `softmax(scores) @ values`, and no `exp` ever
# sees a positive number, so nothing overflows.
#
# Write `online_softmax(blocks) -> Tensor`: `blocks` yields `(scores, values)` pairs, `scores` of
# shape `(n,)` and `values` of shape `(n, dim)` (float32); return the `(dim,)` result. Some scores
# may be `-inf` (masked lanes, as in a kernel's last block), never a whole block. The blocks arrive
# one at a time in the same two buffers, as a kernel holds one block in registers: fold each into
# your running values before asking for the next.
#
# ```{admonition} Hint 1: the start
# :class: dropdown
# `m = -inf`, `total = 0` and `acc = torch.zeros(dim)`: then `exp(m - m_new)` is 0 on the first
# block, and the first block needs no special case.
# ```
#
# ```{admonition} Hint 2: one block
# :class: dropdown
# `m_new = max(m, scores.max())`, `rescale = exp(m - m_new)`, `p = exp(scores - m_new)`,
# `total = total * rescale + p.sum()`, `acc = acc * rescale + p @ values`, `m = m_new`.
# ```


# %%
def online_softmax(blocks):
    ### BEGIN SOLUTION
    m = torch.tensor(float("-inf"))
    total = torch.tensor(0.0)
    acc = None
    for scores, values in blocks:
        m_new = torch.maximum(m, scores.max())
        rescale = torch.exp(m - m_new)  # what the sums so far are worth against the new maximum
        p = torch.exp(scores - m_new)
        total = total * rescale + p.sum()
        acc = p @ values if acc is None else acc * rescale + p @ values
        m = m_new
    return acc / total
    ### END SOLUTION


check("paged_attention.online_softmax", online_softmax)

# %% [markdown]
# ## Task 7.3 · `paged_attention.decode` (hard): the kernel
#
# Now in Triton: write the kernel and `decode(q, k_cache, v_cache, table, lens)`, the launcher,
# with the same contract as task 7.1. Launch one *program* per (request, query head):
# `grid = (batch, heads)`. Program `(b, h)`:
#
# 1. loads its query row `q[b, h]` and the length `lens[b]`;
# 2. walks the request's slots `BLOCK_N` at a time: loads the block's slots from the table, turns
#    each into a page and a row, loads those K rows of KV head `h // group` *from the cache
#    itself*, scores them, and folds the block in with the online softmax of task 7.2;
# 3. stores `acc / total` in `out[b, h]`.
#
# What makes it more than task 7.1:
#
# * **Masks.** The last block runs past `lens[b]`: mask those lanes out of the loads, and give their
#   scores `-inf` so that they weigh nothing. `head_dim` need not be a power of two either
#   (`BLOCK_D = triton.next_power_of_2(head_dim)`, mask `d < head_dim`).
# * **Strides.** Every address is a base plus index × stride: the caches may be a layer of a
#   page-first buffer, and the table a slice of a wider one. Pass the strides in.
# * **Bounds.** Triton checks none. The checker surrounds every tensor with NaN: read outside it
#   and your answer turns NaN.
#
# Under the interpreter each program costs about a millisecond per block, so take
# `BLOCK_N = 16` here (the checker's requests are short); minikv's kernel uses 64 on a GPU.
#
# ```{admonition} Hint 1: the indices
# :class: dropdown
# `b, h = tl.program_id(0), tl.program_id(1)`, `d = tl.arange(0, BLOCK_D)`, and in the loop
# `for start in range(0, seq_len, BLOCK_N):` the positions `n = start + tl.arange(0, BLOCK_N)`,
# valid where `n < seq_len`.
# ```
#
# ```{admonition} Hint 2: from slot to K row
# :class: dropdown
# `slot = tl.load(table_ptr + b * table_stride_b + n, mask=n_ok, other=0)`, then
# `page = slot // page_size`, `row = slot % page_size`, and the K rows are at
# `k_ptr + page[:, None] * k_stride_p + row[:, None] * k_stride_s + kv_head * k_stride_h + d[None, :]`,
# loaded with the mask `n_ok[:, None] & d_ok[None, :]` and `other=0.0`. Scores:
# `tl.sum(k * q[None, :], axis=1) * scale`, then `tl.where(n_ok, scores, float("-inf"))`.
# ```
#
# ```{admonition} Hint 3: the running values
# :class: dropdown
# Start with `m = tl.full([1], float("-inf"), tl.float32)`, `total = tl.full([1], 0.0, tl.float32)`,
# `acc = tl.zeros([BLOCK_D], tl.float32)`; each block is task 7.2's four lines with `tl.maximum`,
# `tl.max`, `tl.exp` and `tl.sum(p[:, None] * v, axis=0)`. Compute in float32 (`.to(tl.float32)`
# after each load) and convert back when storing: `out.to(out_ptr.dtype.element_ty)`.
# ```


# %%
triton, tl = require_triton()  # where Triton has no build (macOS, Windows), one line says so


@triton.jit
def decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr,
    page_size, group, head_dim, scale,
    q_stride_b, q_stride_h,
    k_stride_p, k_stride_s, k_stride_h,
    v_stride_p, v_stride_s, v_stride_h,
    table_stride_b, out_stride_b, out_stride_h,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    ### BEGIN SOLUTION pass
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // group
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
        slot = tl.load(table_ptr + b * table_stride_b + n, mask=n_ok, other=0).to(tl.int64)
        page = slot // page_size
        row = slot % page_size
        mask = n_ok[:, None] & d_ok[None, :]
        k_rows = page * k_stride_p + row * k_stride_s + kv_head * k_stride_h
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        scores = tl.where(n_ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))

        m_new = tl.maximum(m, tl.max(scores, axis=0))
        rescale = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        v_rows = page * v_stride_p + row * v_stride_s + kv_head * v_stride_h
        v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        total = total * rescale + tl.sum(p, axis=0)
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        m = m_new

    out = acc / total
    tl.store(out_ptr + b * out_stride_b + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    ### END SOLUTION


def decode(q, k_cache, v_cache, table, lens):
    ### BEGIN SOLUTION
    batch, heads, head_dim = q.shape
    out = torch.empty_like(q)
    decode_kernel[(batch, heads)](
        q, k_cache, v_cache, table, lens, out,
        k_cache.shape[1], heads // k_cache.shape[2], head_dim, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        table.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=16, BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
    return out
    ### END SOLUTION


check("paged_attention.decode", decode)

# %% [markdown]
# ## Which rows did your kernel read?
#
# `rows_read(decode)` runs your launcher on a *probe cache*: three requests (6, 10 and 3 tokens,
# pages of 4; the first two share page 2, a cached prefix; page 1 belongs to nobody). Every K row
# is zero, so a query head weighs all the rows it reads equally, and the V row of slot `s` is
# non-zero only at element `s`. The output itself then says which slots each head drew on. Below,
# each panel is one request's view of the cache: filled cells are the rows its kernel read. A red
# cell is a row it read but does not own (a missing mask, a wrong page), an empty outlined one a
# row it owns but skipped.

# %%
try:
    found = rows_read(decode)
    print("every request read exactly its own rows, each query head its KV head's:", found.correct)
    display(draw_rows_read(found))
except NotImplementedError:
    print("✗ decode is still the stub: write it, then run this cell again.")

# %% [markdown]
# ## What you have built
#
# The read half of a paged cache is a gather that never happens: the slot table says where each
# token's K and V rows are, and the kernel loads them where they lie, page by page, folding each
# block into three running values. This is what FlashInfer's `kv_indices` and vLLM's paged
# attention do at scale, with more programs per request (the sequence split across them, then
# merged with the same rescaling) and tensor cores for the dot products. Compare yours with
# `minikv/kernels/paged_attention.py`, which also checks every argument and every slot before it
# launches.
