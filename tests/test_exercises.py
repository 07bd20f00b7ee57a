"""The exercise checker: it passes the solutions and fails the mistakes learners make.

For every exercise id there is a list of plausible wrong implementations -- the
bugs the course warns about, and the slips a first attempt makes -- and each must
fail its check with a readable report, while the solution from
``exercises/solutions/`` passes. A checker that passed a wrong answer would
teach the wrong thing.
"""

from __future__ import annotations

import heapq
import runpy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import minikv
import minikv.exercises as exercises
from minikv import NaiveCacheHandle, RadixTreeNode
from minikv.errors import EvictionError, IntegrityError, LockError, OutOfSlotsError
from minikv.exercises import _core, check, exercise_ids
from minikv.kernels import use_interpreter_without_cuda
from minikv.radix_manager import child_key

use_interpreter_without_cuda()  # before the @triton.jit below: Triton decides at decoration time

REPO = Path(__file__).resolve().parent.parent
SOLUTION_FILES = sorted((REPO / "exercises" / "solutions").glob("ex*.py"))


def _load_solutions() -> dict[str, dict]:
    """Run every solution file with ``check`` switched off, keeping what each defines."""
    real = exercises.check
    exercises.check = lambda exercise_id, fn: None
    try:
        return {path.stem: runpy.run_path(str(path), run_name="solution") for path in SOLUTION_FILES}
    finally:
        exercises.check = real


SOLUTIONS = _load_solutions()
S = {name: value for namespace in SOLUTIONS.values() for name, value in namespace.items() if not name.startswith("_")}


def solution_for(exercise_id: str) -> Callable:
    name = {"naive.manager": "NaiveManager"}.get(exercise_id, exercise_id.split(".", 1)[1])
    return S[name]


# -- wrong answers, one list per exercise -------------------------------------------

WRONG: dict[str, list[Callable]] = {}


def wrong(exercise_id: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        WRONG.setdefault(exercise_id, []).append(fn)
        return fn

    return register


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# capacity ---------------------------------------------------------------------------


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_forgets_v(num_layers, num_kv_heads, head_dim, dtype):
    return num_layers * num_kv_heads * head_dim * _size(dtype)


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_assumes_fp16(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_layers * num_kv_heads * head_dim * 2


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_one_layer(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_kv_heads * head_dim * _size(dtype)


@wrong("capacity.mla_bytes_per_token")
def mla_counts_k_and_v(num_layers, rank, rope, dtype):
    return 2 * num_layers * (rank + rope) * _size(dtype)


@wrong("capacity.mla_bytes_per_token")
def mla_forgets_rope(num_layers, rank, rope, dtype):
    return num_layers * rank * _size(dtype)


@wrong("capacity.tokens_that_fit")
def fit_rounds(memory, per_token):
    return round(memory / per_token)


@wrong("capacity.tokens_that_fit")
def fit_ceils(memory, per_token):
    return -(-memory // per_token)


@wrong("capacity.cached_tokens_with_sharing")
def sharing_none(prompts):
    return sum(len(p) for p in prompts)


@wrong("capacity.cached_tokens_with_sharing")
def sharing_neighbours_unsorted(prompts):
    total, previous = 0, []
    for prompt in prompts:
        common = 0
        while common < min(len(prompt), len(previous)) and prompt[common] == previous[common]:
            common += 1
        total += len(prompt) - common
        previous = prompt
    return total


@wrong("capacity.cached_tokens_with_sharing")
def sharing_only_the_common_prefix_of_all(prompts):
    if not prompts:
        return 0
    common = 0
    while all(len(p) > common for p in prompts) and len({p[common] for p in prompts}) == 1:
        common += 1
    return sum(len(p) for p in prompts) - (len(prompts) - 1) * common


# lifecycle --------------------------------------------------------------------------


@wrong("lifecycle.slots_to_free")
def free_the_notes_way(indices, cached_len, already_cached, page_size):
    return indices[:already_cached]  # frees slots the tree still holds


@wrong("lifecycle.slots_to_free")
def free_without_tail(indices, cached_len, already_cached, page_size):
    return indices[cached_len:already_cached]


@wrong("lifecycle.slots_to_free")
def free_everything_new(indices, cached_len, already_cached, page_size):
    return indices[cached_len:]


def admit_matching_the_whole_prompt(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids)  # the notes' match: nothing left to compute
    manager.lock_handle(handle)
    try:
        new_slots = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
    except Exception:
        manager.lock_handle(handle, unlock=True)
        raise
    return handle, torch.cat([matched, new_slots])


def admit_without_lock(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids[:-1])
    return handle, torch.cat([matched, pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)])


def admit_locks_after_allocating(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids[:-1])
    new = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
    manager.lock_handle(handle)
    return handle, torch.cat([matched, new])


def admit_keeps_lock_on_failure(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids[:-1])
    manager.lock_handle(handle)
    return handle, torch.cat([matched, pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)])


def admit_locks_twice(manager, pool, input_ids):
    handle, indices = S["admit"](manager, pool, input_ids)
    manager.lock_handle(handle)
    return handle, indices


WRONG["lifecycle.admit"] = [
    admit_matching_the_whole_prompt,
    admit_without_lock,
    admit_locks_after_allocating,
    admit_keeps_lock_on_failure,
    admit_locks_twice,
]


def _finish_freeing(choose: Callable, unlock: bool = True) -> Callable:
    def finish(manager, pool, input_ids, handle, indices):
        already = manager.insert_prefix(input_ids, indices)
        pool.free(choose(indices, handle.cached_len, already, manager.page_size))
        if unlock:
            manager.lock_handle(handle, unlock=True)
        return already

    finish.__name__ = f"finish_{choose.__name__}{'' if unlock else '_no_unlock'}"
    return finish


WRONG["lifecycle.finish"] = [
    _finish_freeing(free_the_notes_way),
    _finish_freeing(free_without_tail),
    _finish_freeing(lambda i, c, a, p: i[max(len(i) - len(i) % p, c) :]),  # frees the tail, keeps the duplicates
    _finish_freeing(S["slots_to_free"], unlock=False),
]


def _serve_with(
    admit: Callable, finish: Callable, start: Callable[[int], int] = lambda cached: cached, slots=None
) -> Callable:
    def serve(manager, pool, input_ids, kv_cache, kv_fn):
        handle, indices = admit(manager, pool, input_ids)
        own = indices[handle.cached_len :] if slots is None else slots(indices, handle.cached_len)
        if len(own):
            for layer in range(kv_cache.num_layers):
                k, v = kv_fn(layer, input_ids, start(handle.cached_len))
                kv_cache.store_kv(k, v, own, layer)
        finish(manager, pool, input_ids, handle, indices)
        return handle.cached_len

    return serve


WRONG["lifecycle.serve"] = [
    _serve_with(admit_matching_the_whole_prompt, S["finish"]),
    _serve_with(admit_keeps_lock_on_failure, S["finish"]),
    _serve_with(admit_without_lock, S["finish"]),
    _serve_with(S["admit"], _finish_freeing(free_the_notes_way)),
    _serve_with(S["admit"], S["finish"], start=lambda cached: 0),  # K/V of every token into the new slots
    _serve_with(S["admit"], S["finish"], slots=lambda indices, cached: indices[: len(indices) - cached]),  # wrong slots
]


# storage ----------------------------------------------------------------------------


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


@triton.jit
def _buggy_store_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr,
    num_tokens, page_size, num_heads, head_dim,
    k_stride_t, k_stride_h, k_stride_d,
    v_stride_t, v_stride_h, v_stride_d,
    c_stride_p, c_stride_s, c_stride_h, c_stride_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    # BUG 0: none; 1: K and V swapped; 2: V read with K's strides; 3: slot used as a page index.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t_ok = t < num_tokens
    slot = tl.load(loc_ptr + t, mask=t_ok, other=0).to(tl.int64)
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
    dst = page[:, None, None] * c_stride_p + row[:, None, None] * c_stride_s + h3 * c_stride_h + d3 * c_stride_d
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


def _triton_store(
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
    assert check("storage.store", _triton_store()).passed


WRONG["storage.store"] = [
    _triton_store(bug=1),
    _triton_store(bug=2),
    _triton_store(bug=3),
    _triton_store(contiguous_strides=True),
    _triton_store(drop_last_block=True),
    _triton_store(contiguous_indices=False),
    _triton_store(validate=False),
]


# naive and blocks ---------------------------------------------------------------------


def _naive_variant(name: str, **overrides: Callable) -> type:
    return type(name, (S["NaiveManager"],), overrides)


WRONG["naive.manager"] = [
    _naive_variant("InsertReturnsZero", insert_prefix=lambda self, ids, indices: 0),
    _naive_variant("FloatEmptyTensor", match_prefix=lambda self, ids: (NaiveCacheHandle(0), torch.tensor([]))),
    _naive_variant("EvictPretends", evict=lambda self, size: self.empty_tensor),
    _naive_variant("InsertTrustsLengths", insert_prefix=lambda self, ids, indices: len(indices)),
    _naive_variant(
        "InsertReturnsTokensCount", insert_prefix=lambda self, ids, indices: len(ids) - 1 if len(ids) else 0
    ),
]


@wrong("blocks.block_hashes")
def hashes_unchained(token_ids, block_size):
    return [
        S["compute_hash"](token_ids[i : i + block_size]) for i in range(0, len(token_ids) - block_size + 1, block_size)
    ]


@wrong("blocks.block_hashes")
def hashes_include_partial_block(token_ids, block_size):
    hashes, prefix = [], -1
    for start in range(0, len(token_ids), block_size):
        prefix = S["compute_hash"](token_ids[start : start + block_size], prefix)
        hashes.append(prefix)
    return hashes


@wrong("blocks.block_hashes")
def hashes_start_at_zero(token_ids, block_size):
    hashes, prefix = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prefix = S["compute_hash"](token_ids[start : start + block_size], prefix)
        hashes.append(prefix)
    return hashes


@wrong("blocks.deallocate")
def deallocate_forward(pool, block_table):
    for block_id in block_table:
        pool.blocks[block_id].ref_count -= 1
        if pool.blocks[block_id].ref_count == 0:
            pool.free_block_ids.append(block_id)


@wrong("blocks.deallocate")
def deallocate_forgets_hashes(pool, block_table):
    for block_id in reversed(block_table):
        block = pool.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            pool.free_block_ids.append(block_id)
            pool.hash_to_block.pop(block.hash, None)
            block.hash, block.token_ids = -1, ()


@wrong("blocks.deallocate")
def deallocate_frees_shared_blocks(pool, block_table):
    for block_id in reversed(block_table):
        pool.blocks[block_id].ref_count = 0
        pool.free_block_ids.append(block_id)


def _allocate_variant(
    *, last_block: bool = False, guard: bool = True, stale: bool = True, cost: bool = True, take_back: bool = True
) -> Callable:
    """The solution's allocate with one rule switched off."""

    def allocate(pool, token_ids):
        size = pool.block_size
        num_blocks = -(-len(token_ids) // size)
        hashes = S["block_hashes"](token_ids, size)
        hits = []
        for i in range(min(len(hashes), num_blocks if last_block else num_blocks - 1)):
            block_id = pool.hash_to_block.get(hashes[i])
            if block_id is None or (
                guard and pool.blocks[block_id].token_ids != tuple(token_ids[i * size : (i + 1) * size])
            ):
                break
            hits.append(block_id)
        in_use = sum(1 for b in hits if pool.blocks[b].ref_count > 0)
        needed = num_blocks - (in_use if cost else len(hits))
        if needed > len(pool.free_block_ids):
            raise OutOfSlotsError("not enough blocks")
        table = []
        for i in range(num_blocks):
            if i < len(hits):
                block = pool.blocks[hits[i]]
                if block.ref_count == 0 and take_back:
                    pool.free_block_ids.remove(block.block_id)
                block.ref_count += 1
            else:
                block = pool.blocks[pool.free_block_ids.popleft()]
                if stale and block.hash != -1 and pool.hash_to_block.get(block.hash) == block.block_id:
                    del pool.hash_to_block[block.hash]
                block.ref_count, block.hash, block.token_ids = 1, -1, ()
                if i < len(hashes):
                    block.hash, block.token_ids = hashes[i], tuple(token_ids[i * size : (i + 1) * size])
                    pool.hash_to_block[block.hash] = block.block_id
            table.append(block.block_id)
        return table, len(hits) * size

    return allocate


def test_the_allocate_variant_without_changes_passes() -> None:
    assert check("blocks.allocate", _allocate_variant()).passed


WRONG["blocks.allocate"] = [
    _allocate_variant(last_block=True),
    _allocate_variant(guard=False),
    _allocate_variant(stale=False),
    _allocate_variant(cost=False),
    _allocate_variant(take_back=False),
]


# radix ---------------------------------------------------------------------------------


@wrong("radix.match_len")
def match_len_shorter_length(key, input_ids):
    return min(len(key), len(input_ids))


@wrong("radix.match_len")
def match_len_off_by_one(key, input_ids):
    n = min(len(key), len(input_ids))
    differ = np.flatnonzero(key[:n] != input_ids[:n])
    return int(differ[0]) + 1 if len(differ) else n


@wrong("radix.match_len")
def match_len_unbounded(key, input_ids):
    i = 0
    while key[i] == input_ids[i]:  # runs off the end of a full match
        i += 1
    return i


def _split_variant(
    *, copy_ref: bool = True, link_lower: bool = True, keep_lower: bool = True, copy_time: bool = True
) -> Callable:
    def split_at(node, pos, page_size=1):
        if not 0 < pos < node.length:
            raise ValueError("pos")
        if not keep_lower:  # the given node becomes the upper half; a new node takes the rest
            lower = RadixTreeNode(node.timestamp)
            lower.set_key_value(node.key[pos:], node.value[pos:])
            lower.ref_count = node.ref_count
            for child in list(node.children.values()):
                child.set_parent(lower, page_size)
            node.children.clear()
            node.set_key_value(node.key[:pos], node.value[:pos])
            lower.set_parent(node, page_size)
            return node
        upper = RadixTreeNode(node.timestamp if copy_time else 0)
        upper.set_key_value(node.key[:pos], node.value[:pos])
        if copy_ref:
            upper.ref_count = node.ref_count
        upper.set_parent(node.parent, page_size)
        node.set_key_value(node.key[pos:], node.value[pos:])
        if link_lower:
            node.set_parent(upper, page_size)
        else:
            upper.children[child_key(node.key, page_size)] = node  # listed, but node.parent is stale
        return upper

    return split_at


def test_the_split_variant_without_changes_passes() -> None:
    assert check("radix.split_at", _split_variant()).passed


WRONG["radix.split_at"] = [
    _split_variant(copy_ref=False),
    _split_variant(link_lower=False),
    _split_variant(keep_lower=False),
    _split_variant(copy_time=False),
]


def _walk_variant(*, split: bool = True, stamp_lower: bool = False, align: bool = True, stamp: bool = True) -> Callable:
    def walk(manager, input_ids):
        ps = manager.page_size
        now = manager.tick()
        node, prefix_len = manager.root_node, 0
        total = len(input_ids) - len(input_ids) % ps if align else len(input_ids)
        while prefix_len < total:
            child = node.children.get(child_key(input_ids[prefix_len:], ps))
            if child is None:
                break
            matched = S["match_len"](child.key, input_ids[prefix_len:total])
            if align:
                matched -= matched % ps
            prefix_len += matched
            if matched < child.length:
                if split:
                    if stamp_lower:
                        child.timestamp = now
                    node = S["split_at"](child, matched, ps)
                    if stamp:
                        node.timestamp = now
                else:
                    node = child
                break
            node = child
            if stamp:
                node.timestamp = now
        return node, prefix_len

    return walk


def test_the_walk_variant_without_changes_passes() -> None:
    assert check("radix.walk", _walk_variant()).passed


WRONG["radix.walk"] = [
    _walk_variant(split=False),
    _walk_variant(stamp_lower=True),
    _walk_variant(align=False),
    _walk_variant(stamp=False),
]


def _lock_variant(
    *, skip_own: bool = False, touch_root: bool = False, every_change: bool = False, check_unlock: bool = True
) -> Callable:
    def lock_handle(manager, handle, unlock=False):
        path, node = [], handle.node
        if node is manager.root_node and not touch_root:
            return
        if skip_own:
            node = node.parent
        while node is not None and (touch_root or node is not manager.root_node):
            path.append(node)
            node = node.parent
        if unlock and check_unlock and any(n.ref_count <= 0 for n in path):
            raise LockError("not locked")
        for n in path:
            before = n.ref_count
            n.ref_count += -1 if unlock else 1
            moved = every_change or (before == 0) != (n.ref_count == 0)
            if moved and n is not manager.root_node:
                sign = 1 if unlock else -1
                manager.evictable_size += sign * n.length
                manager.protected_size -= sign * n.length

    return lock_handle


def test_the_lock_variant_without_changes_passes() -> None:
    assert check("radix.lock_handle", _lock_variant()).passed


WRONG["radix.lock_handle"] = [
    _lock_variant(skip_own=True),
    _lock_variant(touch_root=True),
    _lock_variant(every_change=True),
    _lock_variant(check_unlock=False),
]


def _evict_variant(
    *, respect_locks: bool = True, lru: bool = True, parents: bool = True, count: bool = True, empty_dtype=torch.int32
) -> Callable:
    def evict(manager, size):
        if size < 0:
            raise ValueError("size")
        if size == 0:
            return torch.empty(0, dtype=empty_dtype)
        if size > manager.evictable_size:
            raise EvictionError("too much")
        heap, stack, order = [], [manager.root_node], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not manager.root_node and not node.children and (node.ref_count == 0 or not respect_locks):
                order += 1
                heap.append(((node.timestamp if lru else order), node.uid, node))
        heapq.heapify(heap)
        freed, evicted = 0, []
        while freed < size and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[child_key(node.key, manager.page_size)]
            if count:
                manager.evictable_size -= node.length
            freed += node.length
            evicted.append(node.value)
            if parents and parent is not manager.root_node and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, (parent.timestamp if lru else 0, parent.uid, parent))
        return torch.cat(evicted) if evicted else torch.empty(0, dtype=torch.int32)

    return evict


def test_the_evict_variant_without_changes_passes() -> None:
    assert check("radix.evict", _evict_variant()).passed


WRONG["radix.evict"] = [
    _evict_variant(respect_locks=False),
    _evict_variant(lru=False),
    _evict_variant(parents=False),
    _evict_variant(count=False),
    _evict_variant(empty_dtype=torch.float32),
]


def _insert_variant(
    *, align: bool = True, clone: bool = True, count: bool = True, page_key: bool = True, returns_prefix: bool = True
) -> Callable:
    def page_aligned_insert(manager, input_ids, indices):
        ps = manager.page_size
        aligned = len(input_ids) - len(input_ids) % ps if align else len(input_ids)
        node, prefix_len = manager.walk(input_ids[:aligned])
        if prefix_len < aligned:
            leaf = RadixTreeNode(manager.clock)
            value = indices[prefix_len:aligned]
            leaf.set_key_value(
                torch.from_numpy(input_ids[prefix_len:aligned].copy()), value.clone() if clone else value
            )
            leaf.set_parent(node, ps if page_key else 1)
            if count:
                manager.evictable_size += leaf.length
        return prefix_len if returns_prefix else aligned

    return page_aligned_insert


def test_the_insert_variant_without_changes_passes() -> None:
    assert check("radix.page_aligned_insert", _insert_variant()).passed


WRONG["radix.page_aligned_insert"] = [
    _insert_variant(align=False),
    _insert_variant(clone=False),
    _insert_variant(count=False),
    _insert_variant(page_key=False),
    _insert_variant(returns_prefix=False),
]


def _integrity_skipping(*rules: str) -> Callable:
    """The solution's check_integrity with some rules left out, as a learner might forget them."""

    def check_integrity(manager):
        root, ps = manager.root_node, manager.page_size
        if "root" not in rules and (root.ref_count != 1 or root.length != 0 or root.parent is not None):
            raise IntegrityError("root", "bad root")
        evictable = protected = 0
        seen: set[int] = set()
        stack = [root]
        while stack:
            parent = stack.pop()
            for key, node in parent.children.items():
                if "parent" not in rules and node.parent is not parent:
                    raise IntegrityError("parent link", "")
                if "empty" not in rules and node.length == 0:
                    raise IntegrityError("empty node", "")
                if "lengths" not in rules and (len(node.key) != node.length or len(node.value) != node.length):
                    raise IntegrityError("key/value length", "")
                if "key" not in rules and node.length and child_key(node.key, ps) != key:
                    raise IntegrityError("child key", "")
                if "negative" not in rules and node.ref_count < 0:
                    raise IntegrityError("ref_count", "")
                if "monotone" not in rules and parent is not root and node.ref_count > parent.ref_count:
                    raise IntegrityError("lock covers path", "")
                if "lru" not in rules and parent is not root and node.timestamp > parent.timestamp:
                    raise IntegrityError("LRU order", "")
                if "pages" not in rules and ps > 1:
                    if node.length % ps:
                        raise IntegrityError("page alignment", "")
                    pages = node.value.view(-1, ps).long()
                    if bool((pages[:, 0] % ps != 0).any()) or not torch.equal(
                        pages - pages[:, :1], torch.arange(ps).expand_as(pages)
                    ):
                        raise IntegrityError("page alignment", "")
                if "slots" not in rules:
                    for slot in node.value.tolist():
                        if slot in seen:
                            raise IntegrityError("slot held twice", "")
                        seen.add(slot)
                if node.ref_count == 0:
                    evictable += node.length
                else:
                    protected += node.length
                stack.append(node)
        if "sizes" not in rules and (evictable != manager.evictable_size or protected != manager.protected_size):
            raise IntegrityError("sizes", "")

    check_integrity.__name__ = "check_integrity_without_" + "_".join(rules)
    return check_integrity


def test_the_integrity_variant_without_omissions_passes() -> None:
    assert check("radix.check_integrity", _integrity_skipping()).passed


WRONG["radix.check_integrity"] = [
    _integrity_skipping(rule)
    for rule in ("root", "parent", "empty", "lengths", "key", "monotone", "lru", "pages", "slots", "sizes")
] + [
    _integrity_skipping("negative", "sizes"),
    lambda manager: None,  # mini-sglang's: `pass`
]


def _always_raises(manager):
    raise IntegrityError("paranoid", "everything looks wrong to me")


WRONG["radix.check_integrity"].append(_always_raises)


# -- the tests -------------------------------------------------------------------------


def test_every_exercise_has_a_solution_and_wrong_answers() -> None:
    ids = exercise_ids()
    assert len(ids) >= 20
    for exercise_id in ids:
        assert solution_for(exercise_id) is not None
        assert len(WRONG.get(exercise_id, [])) >= 2, f"{exercise_id} needs at least two wrong implementations"
    assert set(WRONG) <= set(ids)


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_the_solution_passes(exercise_id: str) -> None:
    result = check(exercise_id, solution_for(exercise_id))
    assert result.passed, str(result)
    assert str(result).startswith(f"✓ {exercise_id}: all ")


WRONG_CASES = [(exercise_id, fn) for exercise_id, fns in WRONG.items() for fn in fns]


@pytest.mark.parametrize(
    ("exercise_id", "fn"), WRONG_CASES, ids=[f"{e}-{i}" for e, fns in WRONG.items() for i in range(len(fns))]
)
def test_a_wrong_answer_fails_with_a_readable_report(exercise_id: str, fn: Callable) -> None:
    result = check(exercise_id, fn)
    assert not result.passed, f"{exercise_id}: the checker passed a wrong answer ({getattr(fn, '__name__', fn)})"
    assert not result.not_written
    failure = result.smallest_failure
    assert failure is not None and failure.problem
    assert "the checker could not use" not in failure.problem, failure.problem
    text, page = str(result), result._repr_html_()
    assert "Smallest failing case:" in text and failure.description in text
    assert "Smallest failing case:" in page
    assert str(REPO) not in text and str(REPO) not in page


def test_the_smallest_failing_case_is_reported() -> None:
    result = check("radix.evict", _evict_variant(parents=False))
    failing = [case for case in result.cases if not case.passed]
    assert len(failing) >= 2
    assert result.smallest_failure is min(failing, key=lambda case: case.size)


def test_a_stub_is_reported_as_not_written_without_paths() -> None:
    def stub(*args, **kwargs):
        raise NotImplementedError

    for exercise_id in exercise_ids():
        result = check(exercise_id, stub)
        assert result.not_written, exercise_id
        assert "not written yet" in str(result)
        assert "/" not in str(result)


def test_a_learner_exception_names_the_line_not_the_file() -> None:
    def evict(manager, size):
        leaves = []
        return leaves[size]  # IndexError

    result = check("radix.evict", evict)
    problem = result.smallest_failure.problem
    assert "IndexError" in problem and "in evict, at `return leaves[size]  # IndexError`" in problem
    assert str(REPO) not in str(result)


def test_calling_the_reference_is_refused() -> None:
    result = check("radix.evict", lambda manager, size: manager.evict(size))
    assert not result.passed
    assert "minikv's own answer" in result.smallest_failure.problem
    # and the reference works again afterwards
    from minikv import RadixCacheManager

    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    assert manager.evict(1).tolist() == [0, 1]


def test_a_function_that_never_returns_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "CASE_TIME_LIMIT_S", 0.2)

    def match_len(key, input_ids):
        while True:
            pass

    result = check("radix.match_len", match_len)
    assert not result.passed
    assert "took longer than" in result.smallest_failure.problem


def test_a_wrong_return_type_is_a_failure_not_a_crash() -> None:
    for exercise_id in exercise_ids():
        result = check(exercise_id, lambda *args, **kwargs: "nonsense")
        assert not result.passed, exercise_id


def test_bad_arguments_to_check_raise() -> None:
    from minikv.errors import ArgumentError, ArgumentTypeError

    with pytest.raises(ArgumentError, match=r"unknown exercise 'radix\.nope'"):
        check("radix.nope", lambda: None)
    with pytest.raises(ArgumentTypeError, match="fn"):
        check("radix.evict", 42)


def test_minikv_check_integrity_agrees_with_every_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """The corruptions shown to learners are real: minikv's own check rejects each and passes the healthy trees."""
    import dataclasses

    entry = _core.REGISTRY["radix.check_integrity"]
    monkeypatch.setitem(_core.REGISTRY, "radix.check_integrity", dataclasses.replace(entry, forbidden=()))
    result = check("radix.check_integrity", minikv.RadixCacheManager.check_integrity)
    assert result.passed, str(result)
    assert sum(case.description.startswith("catch:") for case in result.cases) >= 12
