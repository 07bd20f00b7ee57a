# %% [markdown]
# # Exercises 3: storage and the store kernel
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex3_storage.ipynb)
#
# [Chapter 3](../book/03_storage.ipynb) opened `MHAKVCache`: one buffer holds K and V
# of every layer, each tensor-parallel rank keeps a slice of the KV heads, two memory
# layouts are exposed through one layer-first view, and a Triton kernel
# ([chapter 3b](../book/03_store_kernel.ipynb)) writes each new token's K and V rows
# into the slots the manager chose. Here you build those pieces. The last task is the
# kernel itself.
#
# **GPU or not.** On a Colab GPU runtime your Triton kernel compiles for the GPU and the
# checker hands it CUDA tensors. Without a GPU the same kernel runs in Triton's
# interpreter on CPU tensors. Triton decides which when `@triton.jit` runs, by reading
# `TRITON_INTERPRET`, so the next cell switches the interpreter on, on a machine without
# CUDA, before any kernel is defined (`import minikv` alone changes nothing).
# The interpreter is slow (about a millisecond per program instance), so the checker's
# cases stay small.

# %%
import torch

from minikv.exercises import check
from minikv.kernels import require_triton, use_interpreter_without_cuda

interpreted = use_interpreter_without_cuda()  # before any @triton.jit: sets TRITON_INTERPRET=1 without CUDA
device = "cuda" if torch.cuda.is_available() else "cpu"
print(
    "GPU:",
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none: Triton kernels run in its interpreter",
)
print("Triton interpreter:", interpreted)

# %% [markdown]
# ## Task 3.1 · `storage.tp_head_range` (easy)
#
# With tensor parallelism over `tp_size` GPUs, each GPU (each *rank*) computes attention
# for a slice of the heads, so it stores K and V only for its own KV heads: rank `r` of
# `tp_size` keeps an equal, contiguous share.
#
# Write `tp_head_range(num_kv_heads, tp_rank, tp_size) -> range`: the global KV head
# numbers that rank `tp_rank` stores. Raise `ValueError` if the heads cannot be split
# evenly, or if `tp_rank` is not a rank in `range(tp_size)`.
#
# ```{admonition} Hint
# :class: dropdown
# Each rank stores `num_kv_heads // tp_size` heads, and rank `r`'s first head is
# `r` times that.
# ```


# %%
def tp_head_range(num_kv_heads: int, tp_rank: int, tp_size: int) -> range:
    ### BEGIN SOLUTION
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank}")
    if num_kv_heads % tp_size:
        raise ValueError(f"{num_kv_heads} KV heads cannot be split evenly over {tp_size} ranks")
    local = num_kv_heads // tp_size
    return range(tp_rank * local, (tp_rank + 1) * local)
    ### END SOLUTION


check("storage.tp_head_range", tp_head_range)

# %% [markdown]
# ## Task 3.2 · `storage.page_first_view` (easy)
#
# A *page-first* buffer of shape `(2, pages, layers, heads, head_dim)` keeps all layers
# of one page next to each other in memory, which suits moving whole pages (to host
# memory, say). Attention and the store kernel want one layer at a time:
# `(2, layers, pages, heads, head_dim)`.
#
# Write `page_first_view(buffer) -> Tensor`: the layer-first view of a page-first
# buffer, with `view[kv, layer, page] == buffer[kv, page, layer]`, without copying a
# single element. `buffer` may be any tensor of that shape: any dtype, a slice of a
# larger tensor, any strides. A copy would not do: the store kernel writes through the view, and
# the writes must land in the buffer.
#
# ```{admonition} Hint 1
# :class: dropdown
# `reshape` and `view` keep the order of the elements in memory: they would show the
# same numbers under a different shape, which is not the swap you want. You need an
# operation that swaps two dimensions by changing the strides only.
# ```
#
# ```{admonition} Hint 2
# :class: dropdown
# `buffer.permute(0, 2, 1, 3, 4)`, or `buffer.transpose(1, 2)`. The result is not
# contiguous, which is fine: every kernel in minikv takes strides.
# ```


# %%
def page_first_view(buffer: torch.Tensor) -> torch.Tensor:
    ### BEGIN SOLUTION
    return buffer.permute(0, 2, 1, 3, 4)
    ### END SOLUTION


check("storage.page_first_view", page_first_view)

# %% [markdown]
# ## Task 3.3 · `storage.slot_mapping` (medium)
#
# A cache with `page_size > 1` gives each request whole pages. The request's *page
# table* lists its pages in order: token position `p` lives in page
# `page_table[p // page_size]`, at row `p % page_size` of that page. The store kernel,
# though, takes flat *slots*: slot `s` is row `s % page_size` of page `s // page_size`.
#
# Write `slot_mapping(page_table, start, end, page_size) -> Tensor`: the slots of token
# positions `start, ..., end - 1`, as a 1-D integer tensor. `page_table` is a 1-D
# `torch.int32` tensor of page ids, in any order, at least as long as the pages those
# positions need; every slot fits in an `int32`. Leave `page_table` as it is. A prefill maps a whole range
# and a decode step maps a single position. nano-vllm builds its `slot_mapping` this way.
#
# ```{admonition} Hint
# :class: dropdown
# `positions = torch.arange(start, end)`, then
# `page_table[positions // page_size] * page_size + positions % page_size`.
# ```


# %%
def slot_mapping(page_table: torch.Tensor, start: int, end: int, page_size: int) -> torch.Tensor:
    ### BEGIN SOLUTION
    positions = torch.arange(start, end, device=page_table.device)
    return page_table[positions // page_size].long() * page_size + positions % page_size
    ### END SOLUTION


check("storage.slot_mapping", slot_mapping)

# %% [markdown]
# ## Task 3.4 · `storage.store_torch` (medium)
#
# Before the kernel, write what it must do in plain torch.
# `store_torch(k_cache, v_cache, indices, k, v) -> None` writes token `i`'s K row
# `k[i]` (shape `(heads, head_dim)`) into slot `indices[i]` of `k_cache`, and its V row
# into the same slot of `v_cache`.
#
# * `k_cache` and `v_cache` have shape `(num_pages, page_size, heads, head_dim)`: one
#   layer of an `MHAKVCache`. They may be views with any strides: a layer of a
#   page-first buffer, for example, or one whose `head_dim` stride is not 1. Every
#   element that is not a target slot's row must stay as it was.
# * `k` and `v` have shape `(n, heads, head_dim)`, any strides: slices of a fused QKV
#   projection, say. The dtype is one of float64, float32, float16 and bfloat16, the
#   same for caches and sources.
# * `indices` is a 1-D `int32` or `int64` tensor of `n` distinct slots.
# * A slot outside `[0, num_pages * page_size)` is a bug in the caller: raise
#   `IndexError` before writing anything. Mind `-1`: torch reads it as "the last one".
#
# ```{admonition} Hint
# :class: dropdown
# Indexing with two index tensors writes through any view:
# `k_cache[pages, rows] = k`, with `pages = indices // page_size` and
# `rows = indices % page_size` (as `int64`).
# ```


# %%
def store_torch(k_cache, v_cache, indices, k, v) -> None:
    ### BEGIN SOLUTION
    num_pages, page_size = k_cache.shape[:2]
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= num_pages * page_size):
        raise IndexError(f"indices: slots must be in [0, {num_pages * page_size})")
    slots = indices.long()
    k_cache[slots // page_size, slots % page_size] = k
    v_cache[slots // page_size, slots % page_size] = v
    ### END SOLUTION


check("storage.store_torch", store_torch)

# %% [markdown]
# ## Task 3.5 · `storage.store` (hard): the store kernel in Triton
#
# Now the same in Triton: write the kernel and `store(k_cache, v_cache, indices, k, v)`,
# the launcher that validates the inputs and launches it. minikv's own kernel is read
# line by line in [chapter 3b](../book/03_store_kernel.ipynb).
#
# Each *program instance* copies a block of `BLOCK_T` tokens. Token `t`'s K row is a
# `(heads, head_dim)` tile: load it from `k` and store it at its slot in `k_cache`, and
# do the same for V. Every address is a base pointer plus index × stride, one term per
# dimension, with the strides passed in. The kernel signature below suggests the
# arguments, and you may change it.
#
# Three things make it more than a copy:
#
# * **Blocks must be powers of two.** `tl.arange(0, N)` needs a power of two, but heads
#   and `head_dim` need not be one (the checker uses 3 heads of 24). Round up with
#   `triton.next_power_of_2` and mask the extra lanes.
# * **The last block is partial.** Launch `triton.cdiv(n, BLOCK_T)` programs and mask
#   tokens `t >= n`. With no tokens at all, launch nothing.
# * **Triton does not check bounds.** In the interpreter a slot past the end silently
#   overwrites other memory, and `-1` can crash the process. Validate the indices in
#   `store` before launching, as in task 3.4. The checker surrounds each cache with
#   guard memory and tells you if you wrote outside it.
#
# On the CPU, every program instance costs about a millisecond in the interpreter, so
# give each program several tokens there: `BLOCK_T = 8 if k.is_cuda else 64`.
#
# ```{admonition} Hint 1: the indices of one program
# :class: dropdown
# `t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)` are the program's tokens,
# `h = tl.arange(0, BLOCK_H)` and `d = tl.arange(0, BLOCK_D)` the heads and the
# elements. Broadcast them to 3-D with `t[:, None, None]`, `h[None, :, None]` and
# `d[None, None, :]`. The mask is `(t < num_tokens) & (h < num_heads) & (d < head_dim)`,
# broadcast the same way.
# ```
#
# ```{admonition} Hint 2: from slot to address
# :class: dropdown
# `slot = tl.load(loc_ptr + t, mask=t < num_tokens, other=0).to(tl.int64)`; then
# `page = slot // page_size`, `row = slot % page_size`, and the destination offset is
# `page * c_stride_p + row * c_stride_s + h * c_stride_h + d * c_stride_d`, with the
# cache's four strides. The source offset is `t * k_stride_t + h * k_stride_h + d * k_stride_d`
# for K, and the same with V's strides for V: K and V may have different strides.
# ```
#
# ````{admonition} Hint 3: the launcher
# :class: dropdown
# Validate, return early when `n == 0`, make `indices` contiguous (the kernel reads
# slot `t` at `loc_ptr + t`), then
# ```python
# store_kernel[(triton.cdiv(n, BLOCK_T),)](
#     k, v, k_cache, v_cache, indices, n, page_size, heads, head_dim,
#     *k.stride(), *v.stride(), *k_cache.stride(), BLOCK_T=..., BLOCK_H=..., BLOCK_D=...)
# ```
# Passing a tensor passes its data pointer. `v_cache` has the same strides as `k_cache`.
# ````


# %%
triton, tl = require_triton()  # where Triton has no build (macOS, Windows), one line says so


@triton.jit
def store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr,
    num_tokens, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    ### BEGIN SOLUTION pass
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

    k_rows = tl.load(k_ptr + t3 * k_stride_t + h3 * k_stride_h + d3 * k_stride_d, mask=mask)
    tl.store(k_cache_ptr + dst, k_rows, mask=mask)
    v_rows = tl.load(v_ptr + t3 * v_stride_t + h3 * v_stride_h + d3 * v_stride_d, mask=mask)
    tl.store(v_cache_ptr + dst, v_rows, mask=mask)
    ### END SOLUTION


def store(k_cache, v_cache, indices, k, v) -> None:
    ### BEGIN SOLUTION
    num_pages, page_size, num_heads, head_dim = k_cache.shape
    num_tokens = len(indices)
    if num_tokens and (int(indices.min()) < 0 or int(indices.max()) >= num_pages * page_size):
        raise IndexError(f"indices: slots must be in [0, {num_pages * page_size})")
    if num_tokens == 0:
        return
    indices = indices.contiguous()
    block_t = 8 if k.is_cuda else 64
    store_kernel[(triton.cdiv(num_tokens, block_t),)](
        k, v, k_cache, v_cache, indices,
        num_tokens, page_size, num_heads, head_dim,
        *k.stride(), *v.stride(), *k_cache.stride(),
        BLOCK_T=block_t, BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
    ### END SOLUTION


check("storage.store", store)

# %% [markdown]
# ## Your kernel in the model
#
# Your store kernel is not an exercise on the side: it is the function the model calls
# in every layer, at every step, to write the new tokens' K and V. `MHAKVCache(...,
# store=fn)` makes the cache write through `fn` instead of minikv's kernel, and
# `make_engine(..., store=fn)` builds the serving engine of
# [chapter 6](../book/06_forward_pass.ipynb) on such a cache. The next cell runs that
# engine over the chapter's tiny model with your `store`: three requests, two of them
# sharing a prefix, prefilled and then decoded token by token, every K and V row
# written by your kernel and read back by attention. If the engine generates the same
# tokens as with minikv's kernel, and on the CPU the tokens of `recompute`, which uses
# no cache at all, your kernel put every row where attention looks for it. (A GPU may
# round batched and one-by-one matrix products apart, as chapter 6 notes, so there the
# yardstick is minikv's kernel alone.)
#
# The cache checks each call before your function sees it (slots in range and none
# twice, shapes, dtypes), as minikv's own path does. Without a GPU your kernel runs in
# Triton's interpreter, so the requests are short. If your `store` is not written yet,
# or Triton is not available here, the cell runs your `store_torch` instead, and says so.

# %%
from minikv.engine import make_engine, recompute
from minikv.tiny_model import TinyDecoder

model = TinyDecoder(seed=0, device=device)
prompts = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9], [8, 8, 2]]  # the first two share 4 tokens
minikvs = make_engine(model, num_pages=32, max_running=2).generate(prompts, 6)  # minikv's own kernel
yardstick = "minikv's kernel"
if device == "cpu":  # a GPU may round batched and one-by-one matmuls apart (chapter 6)
    assert minikvs == [recompute(model, prompt, 6) for prompt in prompts]
    yardstick += " and a recompute without any cache"

yours = {"store (task 3.5)": globals().get("store"), "store_torch (task 3.4)": store_torch}
for name, fn in yours.items():
    if fn is None:
        print(f"{name}: not defined here (no Triton), so not tried")
        continue
    engine = make_engine(model, num_pages=32, max_running=2, store=fn)
    try:
        outputs = engine.generate(prompts, 6)
    except NotImplementedError:
        print(f"{name}: not written yet")
        continue
    engine.check()
    assert outputs == minikvs, f"with your {name} the engine generated {outputs}; minikv's kernel gives {minikvs}"
    print(f"with your {name}, the engine generated {outputs}")
    print(f"the same tokens as {yardstick}")
    break
else:
    print("write store_torch (task 3.4) or store (task 3.5) first, then run this cell again")

# %% [markdown]
# ## What you have shown
#
# The kernel is one line of arithmetic, `cache[slot[t]] = src[t]`, and the rest is
# about addresses. Strides let one kernel serve every layout and every source tensor,
# the page division turns a flat slot into a page and a row, and the masks and the
# validation keep a wrong index from becoming a silent overwrite. Compare your kernel with
# `minikv/kernels/store.py`, which also checks shapes, dtypes and devices before
# anything is written.
