"""Exercise 4's vLLM-style block checks (``minikv.exercises.blocks``): chained hashes, allocate, deallocate.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from exercise_helpers import S, WrongAnswers, chapter_tests

from minikv.errors import OutOfSlotsError
from minikv.exercises import check

WRONG = WrongAnswers()
wrong = WRONG.register


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


@wrong("blocks.block_hashes")
def hashes_consume_the_callers_list(token_ids, block_size):
    hashes, prefix = [], -1
    while len(token_ids) >= block_size:
        prefix = S["compute_hash"](token_ids[:block_size], prefix)
        hashes.append(prefix)
        del token_ids[:block_size]  # the right hashes, but the caller's tokens are gone
    return hashes


@wrong("blocks.deallocate")
def deallocate_reverses_the_callers_table(pool, block_table):
    block_table.reverse()  # the right pool, but the request's block table is now backwards
    for block_id in block_table:
        block = pool.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            pool.free_block_ids.append(block_id)


def hashes_by_recursion(token_ids, block_size, prefix=-1):
    if len(token_ids) < block_size:
        return []
    head = S["compute_hash"](token_ids[:block_size], prefix)
    return [head, *hashes_by_recursion(token_ids[block_size:], block_size, head)]


def deallocate_by_slice(pool, block_table):
    for block_id in block_table[::-1]:
        pool.blocks[block_id].ref_count -= 1
        if not pool.blocks[block_id].ref_count:
            pool.free_block_ids.extend([block_id])


def test_correct_alternatives_pass() -> None:
    for exercise_id, fn in [
        ("blocks.block_hashes", hashes_by_recursion),
        ("blocks.deallocate", deallocate_by_slice),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


def _allocate_variant(
    *,
    last_block: bool = False,
    guard: bool = True,
    stale: bool = True,
    cost: bool = True,
    take_back: bool = True,
    guard_first_only: bool = False,
    consume: bool = False,
    guard_until: int | None = None,
) -> Callable:
    """The solution's allocate with one rule switched off."""

    def allocate(pool, token_ids):
        size = pool.block_size
        num_blocks = -(-len(token_ids) // size)
        hashes = S["block_hashes"](token_ids, size)
        hits = []
        for i in range(min(len(hashes), num_blocks if last_block else num_blocks - 1)):
            block_id = pool.hash_to_block.get(hashes[i])
            guarded = guard and (i == 0 or not guard_first_only) and (guard_until is None or i < guard_until)
            if block_id is None or (
                guarded and pool.blocks[block_id].token_ids != tuple(token_ids[i * size : (i + 1) * size])
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
        if consume:
            token_ids.clear()  # the caller's prompt is gone
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
    _allocate_variant(guard_first_only=True),
    _allocate_variant(consume=True),
]


# issue 26: wrong only near the limit, or only for long tables -----------------------------


def _allocate_off_by_one_at_the_limit() -> Callable:
    solution = _allocate_variant()

    def allocate(pool, token_ids):
        size = pool.block_size
        if -(-len(token_ids) // size) == len(pool.free_block_ids) and token_ids:
            raise OutOfSlotsError("not enough blocks")  # `>=` where `>` is meant, after checking nothing else
        return solution(pool, token_ids)

    return allocate


WRONG["blocks.allocate"] += [_allocate_variant(guard_until=2), _allocate_off_by_one_at_the_limit()]


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("blocks", WRONG)
