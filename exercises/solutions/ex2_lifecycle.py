# %% [markdown]
# # Exercises 2: the life of a request
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/minikv-course/minikv/blob/main/exercises/ex2_lifecycle.ipynb)
#
# Chapter 2 split the KV cache into storage (the tensors) and a manager (which slots
# hold which prefix), and followed one request through seven steps. Here you write those
# steps yourself, with a real `RadixCacheManager`, a real `PagePool` and a real
# `MHAKVCache`, and the checker runs your code through whole scenarios: requests that
# share prefixes, requests that run at the same time, a pool too small to hold
# everything, pages of more than one token.
#
# Each task has a cell with `# YOUR CODE HERE`; its last line, `check(...)`, runs the
# cases and shows what passed and the smallest failing case. Hints are in dropdowns.

# %%
import torch

import minikv
from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager
from minikv.exercises import check
from minikv.exercises.lifecycle import kv_fn

print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none, everything runs on the CPU")

# %% [markdown]
# ## The seven steps, as minikv runs them
#
# | step | call | why |
# | --- | --- | --- |
# | 1 | `handle, matched = manager.match_prefix(input_ids[:-1])` | the cached slots of all but the last token |
# | 2 | `manager.lock_handle(handle)` | so that step 3's eviction cannot take those slots away |
# | 3 | `pool.allocate(n, evict_from=manager)` | slots for the `n` uncached tokens, evicting if the pool is short |
# | 6 | `kv_cache.store_kv(k, v, own_slots, layer)` | the forward pass writes K and V of the new tokens |
# | 4 | `already = manager.insert_prefix(input_ids, indices)` | the finished request's tokens join the tree |
# | 5 | `pool.free(...)` | give back the slots the tree did not take |
# | 7 | `manager.lock_handle(handle, unlock=True)` | the prefix may be evicted again |
#
# Step 6 runs before step 4, as in a real server: K and V are written during the
# forward pass, long before the request finishes. `kv_fn(layer, input_ids, start)`
# stands in for the model: it returns the K and V rows of the tokens `input_ids[start:]`,
# each of shape `(tokens, heads, head_dim)`.
#
# Step 1 matches `input_ids[:-1]`, not the whole prompt: the model must run on at least
# the last token, because its output (the logits of the next token) is what the request
# is for. mini-sglang's `match_req`, vLLM and nano-vllm all do this; the notes match the
# whole prompt. Here is minikv serving two prompts that share three tokens, then the
# first prompt again: all of it is cached, and still its last token gets a new slot.

# %%
manager, pool = RadixCacheManager(), PagePool(num_pages=16)
kv_cache = MHAKVCache(num_kv_heads=2, num_layers=2, head_dim=4, num_pages=16, dtype=torch.float32,
                      kv_layout=KVCacheLayout.LayerFirst, device="cpu")  # fmt: skip
for prompt in ([1, 2, 3, 4], [1, 2, 3, 9, 9], [1, 2, 3, 4]):
    request = minikv.serve(manager, pool, prompt, kv_cache, kv_fn)
    print(f"prompt {prompt}: slots {request.indices.tolist()}")
    for step in request.trace:
        print(f"  step {step.number} {step.name:<14} {step.detail}")

# %% [markdown]
# ## Task 2.1 · `lifecycle.slots_to_free` (easy)
#
# When a request finishes, `insert_prefix(input_ids, indices)` returns `already_cached`:
# how many leading tokens the tree held *before* this insert. The request's `indices`
# has one slot per prompt token, and they fall into three groups:
#
# * `indices[:cached_len]`, the prefix the request matched at step 1. These slots
#   belong to the tree, and the request only borrowed them.
# * `indices[cached_len:already_cached]`, *duplicates*. While the request ran, another
#   request inserted the same tokens, so the tree already has its own slots for them and
#   ignores these.
# * The rest was inserted and now belongs to the tree, except with `page_size > 1`,
#   where `insert_prefix` inserts only whole pages: the tokens after the last whole page
#   (the *tail*) were not inserted.
#
# Write `slots_to_free(indices, cached_len, already_cached, page_size) -> Tensor`: the
# slots the request must give back to the pool, in the order they appear in `indices`.
# `indices` is a 1-D `int32` tensor; `cached_len` and `already_cached` are multiples of
# `page_size` (whole pages), with `cached_len <= already_cached`. Leave `indices` as it is.
#
# The notes this course follows say "free `indices[:already_cached]`". That frees slots
# the tree still holds, and the next request to get them overwrites a cached prefix.
# The checker notices.
#
# ```{admonition} Hint 1: the duplicates
# :class: dropdown
# `indices[cached_len:already_cached]` is empty when nothing was inserted meanwhile,
# which is the common case. It is not empty when two requests with the same prompt run
# at the same time: both matched nothing, the first one to finish inserts, and the
# second's slots are all duplicates.
# ```
#
# ```{admonition} Hint 2: the tail
# :class: dropdown
# The inserted part ends at `len(indices) - len(indices) % page_size`, and the tail is
# everything from there on. `cached_len` never lies past that point: `match_prefix`
# matches whole pages only, so `cached_len` is a multiple of `page_size`, and so is
# `already_cached`. A prompt shorter than one page matched nothing and inserted nothing:
# its tail is the whole prompt. `torch.cat` joins the two pieces.
# ```


# %%
def slots_to_free(indices: torch.Tensor, cached_len: int, already_cached: int, page_size: int) -> torch.Tensor:
    ### BEGIN SOLUTION
    duplicates = indices[cached_len:already_cached]
    inserted_end = len(indices) - len(indices) % page_size
    tail = indices[inserted_end:]  # cached_len <= inserted_end: both are page-aligned
    return torch.cat([duplicates, tail])
    ### END SOLUTION


check("lifecycle.slots_to_free", slots_to_free)

# %% [markdown]
# ## Task 2.2 · `lifecycle.admit` (medium)
#
# Write `admit(manager, pool, input_ids) -> (handle, indices)`: steps 1 to 3. Match
# `input_ids[:-1]`, as a server does, so that the last token is always computed. `indices`
# holds one slot per token of `input_ids`: first the matched slots, then the new ones.
#
# In tasks 2.2 to 2.4, `input_ids` is a 1-D `torch.int64` tensor of token ids (so
# `input_ids[:-1]` and `len(input_ids)` work as on a list); do not change it.
#
# If the pool cannot supply the slots, `pool.allocate` raises `OutOfSlotsError`. Let
# that error out, but not before undoing step 2: a request that never runs must not
# leave its prefix locked forever.
#
# ```{admonition} Hint 1: why lock before allocating
# :class: dropdown
# `pool.allocate(n, evict_from=manager)` evicts unlocked prefixes when free pages run
# short, least recently used first, and the prefix you just matched is unlocked until you
# lock it. Allocate first, and the eviction may free exactly the slots you are about to
# read, then hand them back to you as "new".
# ```
#
# ```{admonition} Hint 2: why not the whole prompt
# :class: dropdown
# The forward pass computes the logits of the next token from the last prompt token. If
# the whole prompt matched, there would be nothing to run the model on. With
# `page_size > 1` the match of `input_ids[:-1]` ends at a page boundary by itself:
# `match_prefix` matches whole pages only.
# ```
#
# ```{admonition} Hint 3: undoing the lock
# :class: dropdown
# `try: ... except Exception: manager.lock_handle(handle, unlock=True); raise`.
# ```


# %%
def admit(manager, pool, input_ids):
    ### BEGIN SOLUTION
    handle, matched = manager.match_prefix(input_ids[:-1])
    manager.lock_handle(handle)
    try:
        new_slots = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
    except Exception:
        manager.lock_handle(handle, unlock=True)
        raise
    return handle, torch.cat([matched, new_slots])
    ### END SOLUTION


check("lifecycle.admit", admit)

# %% [markdown]
# ## Task 2.3 · `lifecycle.finish` (medium)
#
# Write `finish(manager, pool, input_ids, handle, indices) -> int`: steps 4, 5 and 7 for
# a request that `admit` started. Return what `insert_prefix` returned. `input_ids` is
# the request's 1-D `int64` tensor and `indices` the slots `admit` returned; leave both
# as they are. `slots_to_free` needs the page size: it is `manager.page_size` (the
# pool's is the same).
#
# The checker runs requests that overlap and finish out of order, and after each of your
# calls it accounts for every page: free in the pool, held by the tree or held by a
# running request, and never in two places at once.
#
# ```{admonition} Hint
# :class: dropdown
# `insert_prefix`, then `pool.free(slots_to_free(...))` with your function from task
# 2.1, then unlock. The handle's `cached_len` is the request's `cached_len`, and the
# page size is `manager.page_size`.
# ```


# %%
def finish(manager, pool, input_ids, handle, indices) -> int:
    ### BEGIN SOLUTION
    already_cached = manager.insert_prefix(input_ids, indices)
    pool.free(slots_to_free(indices, handle.cached_len, already_cached, manager.page_size))
    manager.lock_handle(handle, unlock=True)
    return already_cached
    ### END SOLUTION


check("lifecycle.finish", finish)

# %% [markdown]
# ## Task 2.4 · `lifecycle.serve` (medium)
#
# Write `serve(manager, pool, input_ids, kv_cache, kv_fn) -> int`: all seven steps for
# one request. Return how many prompt tokens came from the cache (the handle's
# `cached_len`).
#
# After each request the checker reads the slots the tree points at for the prompt and
# compares what `kv_cache` holds there with `kv_fn`'s rows, in every layer. It also
# watches where you write: only the request's own new slots, never the slots of a
# cached prefix (even with equal values: on a real server other requests read them).
#
# ```{admonition} Hint 1: what to store
# :class: dropdown
# Only the new tokens: `kv_fn(layer, input_ids, cached_len)` gives their rows, and their
# slots are `indices[cached_len:]`. Loop over `range(kv_cache.num_layers)`.
# ```
#
# ```{admonition} Hint 2: a fully cached prompt
# :class: dropdown
# Even when every token is cached, your `admit` matched only `input_ids[:-1]`, so there
# is always at least one new token to store. Its slot is a duplicate at finish, and
# `slots_to_free` gives it back.
# ```


# %%
def serve(manager, pool, input_ids, kv_cache, kv_fn) -> int:
    ### BEGIN SOLUTION
    handle, indices = admit(manager, pool, input_ids)
    own_slots = indices[handle.cached_len :]
    for layer in range(kv_cache.num_layers):
        k, v = kv_fn(layer, input_ids, handle.cached_len)
        kv_cache.store_kv(k, v, own_slots, layer)
    finish(manager, pool, input_ids, handle, indices)
    return handle.cached_len
    ### END SOLUTION


check("lifecycle.serve", serve)

# %% [markdown]
# ## Your lifecycle in the engine
#
# Your `admit` and `finish` are not a model of a server's bookkeeping: they can be a
# server's bookkeeping. `make_engine(..., admit=admit, finish=finish)` builds the serving
# engine of [chapter 6](../book/06_forward_pass.ipynb) (a `LifecycleEngine`) that calls
# your `admit` to take a request in (match, lock, allocate) and your `finish` to give
# its memory back (insert, free with your `slots_to_free`, unlock). The engine keeps the
# rest: which request runs next, whether a request fits (it keeps room for the running
# requests' next tokens before it calls your `admit`), the slots each decode step needs,
# and preemption, which gives a request's memory back through your `finish` too.
#
# The next cell runs four requests that share prefixes on the chapter's tiny model, with
# a pool too small to hold them all, once with one-token pages and once with pages of
# four. After every step `engine.check()` accounts for every slot: free, in the tree, or
# held by one running request. The requests must generate the tokens of `recompute`,
# which uses no cache at all.

# %%
from minikv.engine import EngineRequest, make_engine, recompute
from minikv.tiny_model import TinyDecoder

model = TinyDecoder(seed=0)
prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 11, 12], [1, 2, 3, 4, 20], [30, 31, 32]]
expected = [recompute(model, prompt, 8) for prompt in prompts]
for page_size in (1, 4):
    engine = make_engine(model, num_pages=24 // page_size, page_size=page_size, max_running=3,
                         admit=admit, finish=finish)  # fmt: skip
    requests = [engine.submit(EngineRequest(prompt, 8)) for prompt in prompts]
    try:
        while engine.has_work():
            engine.step()
            engine.check()  # every slot free, in the tree, or held by one request
    except NotImplementedError:
        print("write slots_to_free (task 2.1), admit (task 2.2) and finish (task 2.3) first, then run this cell again")
        break
    outputs = [request.output for request in requests]
    assert outputs == expected, f"page_size {page_size}: the engine generated {outputs}, a recompute gives {expected}"
    print(f"page_size {page_size}: {engine.stats.preemptions} preemption(s), every slot accounted for "
          "after every step, and the tokens of a recompute")  # fmt: skip

# %% [markdown]
# ## What you have shown
#
# The order of the steps is what keeps the cache correct. Lock before you allocate, or
# eviction takes the prefix you are using. Free only your own duplicates and tail, or
# the tree points at slots that another request will overwrite. Unlock on every path,
# failures included, or the prefix can never be evicted. Nothing here is about threads:
# a server runs these steps in one scheduler loop, and the lock protects a prefix from
# that same loop's next `allocate`.
