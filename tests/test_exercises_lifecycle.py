"""Exercise 2's checks (``minikv.exercises.lifecycle``): admit, finish and serve mistakes, and the slots to free.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from exercise_helpers import S, WrongAnswers, chapter_tests

import minikv
from minikv.exercises import check

WRONG = WrongAnswers()
wrong = WRONG.register


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


# -- wrong answers the hand-made cases alone passed (issue 15) ---------------------------------


@wrong("lifecycle.slots_to_free")
def free_sorted_and_unique(indices, cached_len, already_cached, page_size):
    inserted_end = len(indices) - len(indices) % page_size
    return torch.unique(torch.cat([indices[cached_len:already_cached], indices[inserted_end:]]))  # sorts them


@wrong("lifecycle.slots_to_free")
def free_with_a_bit_mask(indices, cached_len, already_cached, page_size):
    inserted_end = len(indices) & ~(page_size - 1)  # rounds down to a page only for powers of two
    return torch.cat([indices[cached_len:already_cached], indices[inserted_end:]])


WRONG["lifecycle.finish"].append(_finish_freeing(free_with_a_bit_mask))

WRONG["lifecycle.serve"].append(
    _serve_with(S["admit"], S["finish"], start=lambda cached: 0, slots=lambda indices, cached: indices)
)  # recomputes every token and rewrites the cached prefix's slots (with equal values)


def admit_without_evict_from(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids[:-1])
    manager.lock_handle(handle)
    try:
        new_slots = pool.allocate(len(input_ids) - handle.cached_len)
    except Exception:
        manager.lock_handle(handle, unlock=True)
        raise
    return handle, torch.cat([matched, new_slots])


def admit_peeks_at_the_whole_prompt(manager, pool, input_ids):
    manager.match_prefix(input_ids)  # "is all of it cached?": a second match, which stamps the path again
    return S["admit"](manager, pool, input_ids)


WRONG["lifecycle.admit"] += [admit_without_evict_from, admit_peeks_at_the_whole_prompt]
WRONG["lifecycle.serve"].append(_serve_with(admit_without_evict_from, S["finish"]))


def test_admit_without_evict_from_is_pointed_at_it() -> None:
    result = check("lifecycle.admit", admit_without_evict_from)
    assert "evict_from=manager" in result.smallest_failure.problem, str(result)


# -- correct alternatives, written differently from the solutions: they must pass -------------


def free_by_mask(indices, cached_len, already_cached, page_size):
    n = len(indices)
    keep = torch.zeros(n, dtype=torch.bool)
    keep[cached_len:already_cached] = True
    keep[n - n % page_size :] = True
    return indices[keep]


def free_by_loop(indices, cached_len, already_cached, page_size):
    out = []
    for position, slot in enumerate(indices.tolist()):
        if cached_len <= position < already_cached or position >= len(indices) // page_size * page_size:
            out.append(slot)
    return torch.tensor(out, dtype=torch.int64)


def admit_with_finally(manager, pool, input_ids):
    handle, matched = manager.match_prefix(input_ids[: len(input_ids) - 1])
    manager.lock_handle(handle)
    ok = False
    try:
        fresh = pool.allocate(len(input_ids) - len(matched), evict_from=manager)
        ok = True
    finally:
        if not ok:
            manager.lock_handle(handle, unlock=True)
    return handle, torch.cat((matched.to(fresh.dtype), fresh))


def serve_layer_by_layer_slices(manager, pool, input_ids, kv_cache, kv_fn):
    handle, indices = admit_with_finally(manager, pool, input_ids)
    for layer in range(kv_cache.num_layers):
        k, v = kv_fn(layer, input_ids, 0)  # every token's K/V, then only the new rows
        kv_cache.store_kv(k[handle.cached_len :], v[handle.cached_len :], indices[handle.cached_len :], layer)
    S["finish"](manager, pool, input_ids, handle, indices)
    return handle.cached_len


def test_correct_alternatives_pass() -> None:
    for exercise_id, fn in [
        ("lifecycle.slots_to_free", free_by_mask),
        ("lifecycle.slots_to_free", free_by_loop),
        ("lifecycle.admit", admit_with_finally),
        ("lifecycle.serve", serve_layer_by_layer_slices),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


def test_the_reference_under_another_name_is_refused() -> None:
    from minikv.lifecycle import admit as my_admit

    for exercise_id, fn in [("lifecycle.admit", my_admit), ("lifecycle.finish", minikv.finish)]:
        result = check(exercise_id, fn)
        assert not result.passed
        assert "minikv's own answer" in result.smallest_failure.problem


def test_a_stub_that_serve_calls_is_named() -> None:
    def admit(manager, pool, input_ids):
        raise NotImplementedError

    def serve(manager, pool, input_ids, kv_cache, kv_fn):
        handle, _ = admit(manager, pool, input_ids)
        return handle.cached_len

    result = check("lifecycle.serve", serve)
    assert result.not_written
    assert "`test_a_stub_that_serve_calls_is_named.<locals>.admit` still raises NotImplementedError" in str(result)


# issue 26: effects watched in serve ------------------------------------------------------


@wrong("lifecycle.serve")
def serve_in_the_notes_order(manager, pool, input_ids, kv_cache, kv_fn):
    """The notes' order: insert and free, *then* store; the freed slots are written after the pool has them."""
    handle, indices = S["admit"](manager, pool, input_ids)
    already = manager.insert_prefix(input_ids, indices)
    pool.free(S["slots_to_free"](indices, handle.cached_len, already, manager.page_size))
    for layer in range(kv_cache.num_layers):
        k, v = kv_fn(layer, input_ids, handle.cached_len)
        kv_cache.store_kv(k, v, indices[handle.cached_len :], layer)
    manager.lock_handle(handle, unlock=True)
    return handle.cached_len


@wrong("lifecycle.serve")
def serve_stores_one_layer(manager, pool, input_ids, kv_cache, kv_fn):
    handle, indices = S["admit"](manager, pool, input_ids)
    k, v = kv_fn(0, input_ids, handle.cached_len)
    kv_cache.store_kv(k, v, indices[handle.cached_len :], 0)
    S["finish"](manager, pool, input_ids, handle, indices)
    return handle.cached_len


@wrong("lifecycle.slots_to_free")
def free_forgets_a_short_prompt(indices, cached_len, already_cached, page_size):
    """Right for prompts of a page or more; a prompt shorter than one page gives back nothing."""
    if len(indices) < page_size:
        return indices[:0]
    return S["slots_to_free"](indices, cached_len, already_cached, page_size)


def test_the_notes_slice_reports_the_tree_slot_case_first() -> None:
    result = check("lifecycle.slots_to_free", lambda indices, cached, already, page_size: indices[:already])
    failure = result.smallest_failure
    assert failure is not None and "the request matched that token" in failure.problem, str(result)
    assert "indices[cached_len:already_cached]" not in str(result)  # a hint, not the answer


def test_the_notes_order_fails_with_a_clear_message() -> None:
    result = check("lifecycle.serve", serve_in_the_notes_order)
    failure = result.smallest_failure
    assert failure is not None and "after that slot had gone back to the pool" in failure.problem, str(result)


# issue 26: what admit returns is the request's own ---------------------------------------

_ADMIT_BUFFER = torch.empty(4096, dtype=torch.int64)


@wrong("lifecycle.admit")
def admit_into_one_buffer(manager, pool, input_ids):
    """Saves an allocation per request by filling one buffer: every running request's indices are the same memory."""
    handle, matched = manager.match_prefix(input_ids[:-1])
    manager.lock_handle(handle)
    try:
        new_slots = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
    except Exception:
        manager.lock_handle(handle, unlock=True)
        raise
    indices = _ADMIT_BUFFER[: len(input_ids)]
    indices[: handle.cached_len] = matched
    indices[handle.cached_len :] = new_slots
    return handle, indices


def test_admit_into_one_buffer_is_told_why() -> None:
    result = check("lifecycle.admit", admit_into_one_buffer)
    failure = result.smallest_failure
    assert failure is not None and "share memory with the first call's" in failure.problem, str(result)


def test_slots_to_free_may_return_a_view_of_indices() -> None:
    """finish hands the result straight to pool.free, which copies it: the task forbids changing indices, not
    returning a slice of it."""

    def free_as_slices(indices, cached_len, already_cached, page_size):
        tail = indices[len(indices) - len(indices) % page_size :]
        return tail if already_cached == cached_len else torch.cat([indices[cached_len:already_cached], tail])

    result = check("lifecycle.slots_to_free", free_as_slices)
    assert result.passed, str(result)


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("lifecycle", WRONG)
