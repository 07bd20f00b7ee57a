"""``minikv.block_manager``: nano-vllm's hash-chained block table, tested against a model that uses no hashes.

* unit tests of every public function, on hand-made prompts whose block tables
  can be worked out on paper;
* a Hypothesis state machine that allocates, decodes into, frees and resumes
  sequences, comparing every block table, reference count, cached-token count,
  free-list order and hash-table entry with :class:`PrefixModel`, which names a
  cached block by the whole token prefix it ends instead of a chain of hashes;
* ``check_integrity`` mutations: each breaks one invariant of a healthy manager
  and must be reported under that invariant's name;
* bad input: every refusal names the argument and leaves the whole state as it was.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import minikv.block_manager as bm
from minikv.block_manager import NO_HASH, Block, BlockManager, Sequence, block_hashes, compute_hash
from minikv.errors import ArgumentError, ArgumentTypeError, IntegrityError, MiniKVError, OutOfSlotsError


def snapshot(manager: BlockManager) -> object:
    """Everything a refused call must leave alone, as plain data."""
    return (
        [(b.block_id, b.ref_count, b.hash, b.token_ids) for b in manager.blocks],
        dict(manager.hash_to_block),
        list(manager.free_block_ids),
        [(list(s.token_ids), list(s.block_table), s.num_cached_tokens) for s in manager.sequences],
    )


def allocated(manager: BlockManager, token_ids: list[int]) -> Sequence:
    seq = Sequence(token_ids)
    manager.allocate(seq)
    manager.check_integrity()
    return seq


# -- compute_hash and block_hashes ------------------------------------------------------


def blake2b_by_hand(tokens: list[int], prefix: int) -> int:
    h = hashlib.blake2b(digest_size=8)
    if prefix != -1:
        h.update(prefix.to_bytes(8, "little"))
    h.update(b"".join(t.to_bytes(8, "little", signed=True) for t in tokens))
    return int.from_bytes(h.digest(), "little")


def test_compute_hash_is_blake2b_over_the_parent_hash_then_int64_tokens() -> None:
    first = compute_hash([1, 2, 3, 4])
    assert first == blake2b_by_hand([1, 2, 3, 4], -1)
    assert compute_hash([5, -6], first) == blake2b_by_hand([5, -6], first)
    assert 0 <= first < 2**64 and first != NO_HASH


def test_compute_hash_takes_lists_tuples_arrays_and_tensors_alike() -> None:
    expected = compute_hash([3, 1, 4])
    assert compute_hash((3, 1, 4)) == expected
    assert compute_hash(np.array([3, 1, 4], dtype=np.int32)) == expected
    assert compute_hash(torch.tensor([3, 1, 4])) == expected


def test_the_chain_makes_equal_blocks_at_different_places_differ() -> None:
    block = [7, 7]
    first = compute_hash(block)
    second = compute_hash(block, first)
    assert first != second
    assert compute_hash(block, compute_hash([8, 8])) != second  # same block, different prefix


def test_block_hashes_chains_every_full_block_and_skips_the_partial_one() -> None:
    tokens = list(range(10))
    hashes = block_hashes(tokens, 4)
    assert len(hashes) == 2
    assert hashes[0] == compute_hash(tokens[0:4])
    assert hashes[1] == compute_hash(tokens[4:8], hashes[0])
    assert block_hashes(tokens[:8], 4) == hashes  # the partial block [8, 9] changes nothing
    assert block_hashes([], 4) == [] and block_hashes([1, 2, 3], 4) == []
    assert block_hashes([5, 6, 7], 1) == [
        compute_hash([5]),
        compute_hash([6], compute_hash([5])),
        compute_hash([7], compute_hash([6], compute_hash([5]))),
    ]


# -- Block and Sequence -------------------------------------------------------------------


def test_a_new_block_is_unused_and_unhashed() -> None:
    block = Block(3)
    assert (block.block_id, block.ref_count, block.hash, block.token_ids) == (3, 0, NO_HASH, ())


def test_a_sequence_copies_its_tokens_as_python_ints() -> None:
    prompt = [1, 2, 3]
    seq = Sequence(prompt)
    prompt.append(4)
    assert seq.token_ids == [1, 2, 3] and len(seq) == 3
    from_array = Sequence(np.array([5, 6], dtype=np.int16))
    assert from_array.token_ids == [5, 6] and all(type(t) is int for t in from_array.token_ids)
    assert seq.block_table == [] and seq.num_cached_tokens == 0
    assert Sequence([1, 2, 3]) != seq  # identity: two requests with one prompt are two sequences


# -- BlockManager: a fresh manager, allocate, cached_blocks, can_allocate -----------------------


def test_a_fresh_manager_has_every_block_free_in_order() -> None:
    manager = BlockManager(5, 4)
    assert list(manager.free_block_ids) == [0, 1, 2, 3, 4] and manager.num_free_blocks == 5
    assert manager.hash_to_block == {} and manager.sequences == ()
    assert repr(manager) == "BlockManager(num_blocks=5, block_size=4, free=5, sequences=0)"
    manager.check_integrity()


def test_allocate_hashes_the_full_blocks_and_leaves_the_partial_one_unhashed() -> None:
    manager = BlockManager(8, 4)
    seq = allocated(manager, list(range(1, 10)))
    assert seq.block_table == [0, 1, 2] and seq.num_cached_tokens == 0
    hashes = block_hashes(seq.token_ids, 4)
    assert [manager.blocks[b].hash for b in seq.block_table] == [*hashes, NO_HASH]
    assert [manager.blocks[b].token_ids for b in seq.block_table] == [(1, 2, 3, 4), (5, 6, 7, 8), ()]
    assert manager.hash_to_block == {hashes[0]: 0, hashes[1]: 1}
    assert [b.ref_count for b in manager.blocks[:4]] == [1, 1, 1, 0]
    assert list(manager.free_block_ids) == [3, 4, 5, 6, 7] and manager.sequences == (seq,)


def test_a_running_prefix_is_shared_and_costs_no_block() -> None:
    manager = BlockManager(4, 4)
    first = allocated(manager, [1, 2, 3, 4, 5, 6])
    second = allocated(manager, [1, 2, 3, 4, 9])
    assert second.block_table == [0, 2] and second.num_cached_tokens == 4
    assert manager.blocks[0].ref_count == 2 and first.block_table == [0, 1]
    assert manager.num_free_blocks == 1


def test_the_last_block_is_computed_even_when_it_is_cached() -> None:
    manager = BlockManager(8, 4)
    first = allocated(manager, list(range(8)))
    second = allocated(manager, list(range(8)))
    assert second.num_cached_tokens == 4 and second.block_table == [0, 2]
    # Both blocks 1 and 2 hold tokens 4..7 after the same prefix; the newer one is what the table finds now.
    assert manager.blocks[1].hash == manager.blocks[2].hash
    assert manager.hash_to_block[manager.blocks[2].hash] == 2
    assert first.block_table == [0, 1]
    assert allocated(manager, list(range(9))).block_table == [0, 2, 3]  # with a 9th token both full blocks are hits


def test_an_empty_prompt_holds_no_block_but_is_live() -> None:
    manager = BlockManager(2, 4)
    seq = allocated(manager, [])
    assert seq.block_table == [] and seq.num_cached_tokens == 0 and manager.sequences == (seq,)
    assert manager.cached_blocks([]) == []


def test_a_freed_block_keeps_its_hash_and_is_taken_back_from_the_free_list() -> None:
    manager = BlockManager(4, 4)
    first = allocated(manager, [1, 2, 3, 4, 5])
    manager.deallocate(first)
    assert manager.blocks[0].hash != NO_HASH and list(manager.free_block_ids) == [2, 3, 1, 0]
    revived = allocated(manager, [1, 2, 3, 4, 6, 7])
    assert revived.block_table == [0, 2] and revived.num_cached_tokens == 4
    assert list(manager.free_block_ids) == [3, 1]


def test_reusing_a_free_block_for_new_tokens_drops_its_old_hash() -> None:
    manager = BlockManager(2, 4)
    old = allocated(manager, [1, 2, 3, 4])
    old_hash = manager.blocks[0].hash
    manager.deallocate(old)
    allocated(manager, [5, 6, 7, 8, 9])  # takes block 1, then block 0
    assert old_hash not in manager.hash_to_block
    assert manager.cached_blocks([1, 2, 3, 4, 1]) == []


def test_reusing_a_block_keeps_the_entry_a_newer_block_registered_under_its_hash() -> None:
    manager = BlockManager(3, 2)
    first = allocated(manager, [1, 2])  # block 0: a last block, computed and registered
    second = allocated(manager, [1, 2])  # block 1: the same hash, now the block the table finds
    shared_hash = manager.blocks[0].hash
    manager.deallocate(first)
    manager.deallocate(second)
    assert list(manager.free_block_ids) == [2, 0, 1]
    third = allocated(manager, [8, 9, 7])  # takes blocks 2 and 0: block 0's old hash belongs to block 1 now
    assert third.block_table == [2, 0] and manager.hash_to_block[shared_hash] == 1
    manager.deallocate(third)
    resumed = allocated(manager, [1, 2, 3])
    assert resumed.block_table == [1, 0] and resumed.num_cached_tokens == 2


def test_the_collision_guard_compares_tokens_when_every_hash_collides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm, "_hash_block", lambda tokens, prefix: 7)
    manager = BlockManager(8, 2)
    allocated(manager, [1, 2, 3])
    other = allocated(manager, [9, 9, 3])  # hash 7 is found, but block 0 holds (1, 2)
    assert other.num_cached_tokens == 0 and other.block_table == [2, 3]
    same = allocated(manager, [9, 9, 1])  # now hash 7 points at block 2, holding (9, 9)
    assert same.block_table[0] == 2 and same.num_cached_tokens == 2


def test_a_collision_never_lists_one_block_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # With every hash equal, [1, 1] [1, 1] registers block 1 for both places; a
    # prompt repeating that block must not get block 1 at position 0 *and* 1.
    monkeypatch.setattr(bm, "_hash_block", lambda tokens, prefix: 7)
    manager = BlockManager(8, 2)
    first = allocated(manager, [1, 1, 1, 1, 5])
    manager.deallocate(first)
    again = allocated(manager, [1, 1, 1, 1, 6])
    assert len(set(again.block_table)) == 3 and again.num_cached_tokens == 2


def test_cached_blocks_says_what_allocate_reuses_and_changes_nothing() -> None:
    manager = BlockManager(6, 2)
    running = allocated(manager, [1, 2, 3, 4, 5, 6])
    manager.deallocate(allocated(manager, [1, 2, 7, 7, 8]))
    before = snapshot(manager)
    assert manager.cached_blocks([1, 2, 3, 4, 5, 6, 0]) == running.block_table
    assert manager.cached_blocks([1, 2, 3, 4, 5, 6]) == running.block_table[:2]  # never the last block
    assert manager.cached_blocks([1, 2, 7, 7, 9]) == [0, 3]
    assert manager.cached_blocks([2, 1, 3, 4]) == []  # a miss on block 0 ends the walk
    assert snapshot(manager) == before
    assert allocated(manager, [1, 2, 7, 7, 9]).block_table[:2] == [0, 3]


def test_allocate_refuses_when_free_blocks_are_short_and_changes_nothing() -> None:
    manager = BlockManager(4, 4)
    allocated(manager, list(range(12)))
    seq = Sequence(list(range(20, 30)))
    before = snapshot(manager)
    assert not manager.can_allocate(seq)
    with pytest.raises(OutOfSlotsError, match="seq"):
        manager.allocate(seq)
    assert snapshot(manager) == before and seq.block_table == []
    assert manager.can_allocate(Sequence([1, 2, 3, 4]))


def test_a_cached_block_on_the_free_list_costs_a_free_block() -> None:
    # 4 blocks needed, 2 of them cached but free, 3 free in all: the hits leave the free list too.
    manager = BlockManager(3, 4)
    manager.deallocate(allocated(manager, list(range(9))))
    seq = Sequence([*range(8), 50, 51, 52, 53, 54])
    assert manager.cached_blocks(seq.token_ids) == [0, 1]
    assert not manager.can_allocate(seq)
    with pytest.raises(OutOfSlotsError):
        manager.allocate(seq)
    roomy = BlockManager(4, 4)
    roomy.deallocate(allocated(roomy, list(range(9))))
    assert roomy.can_allocate(seq)
    roomy.allocate(seq)
    assert seq.block_table == [0, 1, 3, 2] and seq.num_cached_tokens == 8


# -- deallocate ----------------------------------------------------------------------------------


def test_deallocate_frees_the_tail_first_and_keeps_shared_blocks() -> None:
    manager = BlockManager(6, 2)
    first = allocated(manager, [1, 2, 3, 4, 5])
    second = allocated(manager, [1, 2, 3, 4, 6])
    manager.deallocate(first)
    manager.check_integrity()
    assert first.block_table == [] and first.num_cached_tokens == 0 and first.token_ids == [1, 2, 3, 4, 5]
    assert list(manager.free_block_ids) == [4, 5, 2]  # only its own tail block; 0 and 1 are second's too
    assert manager.blocks[0].ref_count == 1 and manager.sequences == (second,)
    manager.deallocate(second)
    assert list(manager.free_block_ids) == [4, 5, 2, 3, 1, 0]
    assert all(manager.blocks[b].hash != NO_HASH for b in (0, 1))


def test_a_preempted_sequence_resumes_on_its_cached_blocks() -> None:
    manager = BlockManager(6, 2)
    seq = allocated(manager, [1, 2, 3])
    for token in (4, 5, 6):
        manager.append(seq, token)
    manager.deallocate(seq)
    manager.allocate(seq)  # its prompt is now the six tokens it had, decoded ones included
    manager.check_integrity()
    assert seq.num_cached_tokens == 4 and seq.block_table[:2] == [0, 1]


# -- append and can_append ------------------------------------------------------------------------


def test_append_fills_the_last_block_then_opens_a_new_one() -> None:
    manager = BlockManager(4, 3)
    seq = allocated(manager, [1, 2])
    assert manager.can_append(seq)
    manager.append(seq, 3)  # fills block 0: hashed and registered
    assert seq.block_table == [0] and manager.blocks[0].hash == block_hashes([1, 2, 3], 3)[0]
    assert manager.hash_to_block == {manager.blocks[0].hash: 0}
    manager.append(seq, 4)  # opens block 1, unhashed
    assert seq.block_table == [0, 1] and manager.blocks[1].hash == NO_HASH and manager.blocks[1].ref_count == 1
    manager.append(seq, 5)
    manager.append(seq, np.int64(6))
    manager.check_integrity()
    assert seq.token_ids == [1, 2, 3, 4, 5, 6] and type(seq.token_ids[-1]) is int
    assert [manager.blocks[b].hash for b in seq.block_table] == block_hashes(seq.token_ids, 3)
    assert seq.num_cached_tokens == 0  # decode tokens were computed, not found


def test_blocks_filled_by_decode_are_hits_for_the_next_prompt() -> None:
    manager = BlockManager(6, 2)
    seq = allocated(manager, [1])
    for token in (2, 3, 4):
        manager.append(seq, token)
    follower = allocated(manager, [1, 2, 3, 4, 9])
    assert follower.block_table[:2] == seq.block_table and follower.num_cached_tokens == 4


def test_append_to_an_empty_sequence_takes_its_first_block() -> None:
    manager = BlockManager(2, 2)
    seq = allocated(manager, [])
    manager.append(seq, 7)
    assert seq.block_table == [0] and seq.token_ids == [7]
    manager.check_integrity()


def test_append_refuses_a_new_block_when_none_is_free_and_changes_nothing() -> None:
    manager = BlockManager(2, 2)
    seq = allocated(manager, [1, 2, 3, 4])
    assert not manager.can_append(seq)
    before = snapshot(manager)
    with pytest.raises(OutOfSlotsError, match="seq"):
        manager.append(seq, 5)
    assert snapshot(manager) == before
    partial = BlockManager(2, 2)
    half = allocated(partial, [1, 2, 3])
    assert partial.num_free_blocks == 0 and partial.can_append(half)  # the token fits in the last block
    partial.append(half, 4)
    partial.check_integrity()


# -- the state machine ----------------------------------------------------------------------------


class PrefixModel:
    """nano-vllm's rules with each cached block named by the whole prefix it ends, no hashing at all.

    If chaining hashes is a faithful stand-in for comparing prefixes, the
    manager and this model agree on every table, count and free-list position.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.content: list[tuple[int, ...] | None] = [None] * num_blocks
        self.index: dict[tuple[int, ...], int] = {}
        self.free = deque(range(num_blocks))

    def allocate(self, tokens: list[int]) -> tuple[list[int], int] | None:
        """The block table and cached-token count, or None (and no change) when blocks are short."""
        bs = self.block_size
        num_blocks = -(-len(tokens) // bs)
        hits: list[int] = []
        for end in range(bs, (num_blocks - 1) * bs + 1, bs):
            block = self.index.get(tuple(tokens[:end]))
            if block is None:
                break
            hits.append(block)
        if num_blocks - sum(1 for b in hits if self.ref[b]) > len(self.free):
            return None
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        table = list(hits)
        for i in range(len(hits), num_blocks):
            table.append(self._take())
            if (i + 1) * bs <= len(tokens):
                self._fill(table[-1], tuple(tokens[: (i + 1) * bs]))
        return table, len(hits) * bs

    def append(self, tokens: list[int], table: list[int], token: int) -> bool:
        if len(tokens) % self.block_size == 0:
            if not self.free:
                return False
            table.append(self._take())
        tokens.append(token)
        if len(tokens) % self.block_size == 0:
            self._fill(table[-1], tuple(tokens))
        return True

    def deallocate(self, table: list[int]) -> None:
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    def _take(self) -> int:
        b = self.free.popleft()
        if self.content[b] is not None and self.index.get(self.content[b]) == b:
            del self.index[self.content[b]]
        self.content[b], self.ref[b] = None, 1
        return b

    def _fill(self, b: int, prefix: tuple[int, ...]) -> None:
        self.content[b] = prefix
        self.index[prefix] = b


class BlockManagerMachine(RuleBasedStateMachine):
    """Prompts over a two-token vocabulary, often extending earlier ones, so blocks are shared and revived."""

    num_blocks = 8
    block_size = 2

    def __init__(self) -> None:
        super().__init__()
        self.manager = BlockManager(self.num_blocks, self.block_size)
        self.model = PrefixModel(self.num_blocks, self.block_size)
        # allocation number -> (seq, model tokens, model table); numbers, not id(), keep the draws reproducible
        self.running: dict[int, tuple[Sequence, list[int], list[int]]] = {}
        self.allocations = 0
        self.finished: list[Sequence] = []
        self.prompts: list[list[int]] = [[]]

    @rule(data=st.data())
    def allocate_a_new_prompt(self, data: st.DataObject) -> None:
        base = data.draw(st.sampled_from(self.prompts), label="base")
        keep = data.draw(st.integers(0, len(base)), label="keep")
        tail = data.draw(st.lists(st.integers(0, 1), max_size=3 * self.block_size), label="tail")
        prompt = base[:keep] + tail
        self.prompts.append(prompt)
        self._allocate(Sequence(prompt))

    @precondition(lambda self: self.finished)
    @rule(data=st.data())
    def resume_a_finished_sequence(self, data: st.DataObject) -> None:
        seq = self.finished.pop(data.draw(st.integers(0, len(self.finished) - 1), label="finished"))
        if not self._allocate(seq):
            self.finished.append(seq)

    def _allocate(self, seq: Sequence) -> bool:
        free_hashed = {b.block_id for b in self.manager.blocks if b.ref_count == 0 and b.hash != NO_HASH}
        expected = self.model.allocate(list(seq.token_ids))
        if expected is None:
            event("allocate: refused, blocks short")
            before = snapshot(self.manager)
            assert not self.manager.can_allocate(seq)
            with pytest.raises(OutOfSlotsError):
                self.manager.allocate(seq)
            assert snapshot(self.manager) == before
            return False
        assert self.manager.can_allocate(seq)
        self.manager.allocate(seq)
        assert seq.block_table == expected[0]
        assert seq.num_cached_tokens == expected[1]
        event(f"allocate: {'no' if not expected[1] else 'a'} cached prefix")
        if free_hashed & set(seq.block_table[: expected[1] // self.block_size]):
            event("allocate: revived a freed block")
        self.allocations += 1
        self.running[self.allocations] = (seq, list(seq.token_ids), expected[0])
        return True

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(0, 1))
    def decode_one_token(self, data: st.DataObject, token: int) -> None:
        seq, tokens, table = self.running[data.draw(st.sampled_from(sorted(self.running)), label="seq")]
        if not self.model.append(tokens, table, token):
            event("append: refused, no free block")
            before = snapshot(self.manager)
            assert not self.manager.can_append(seq)
            with pytest.raises(OutOfSlotsError):
                self.manager.append(seq, token)
            assert snapshot(self.manager) == before
            return
        assert self.manager.can_append(seq)
        self.manager.append(seq, token)
        assert seq.token_ids == tokens and seq.block_table == table

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq, _, table = self.running.pop(data.draw(st.sampled_from(sorted(self.running)), label="seq"))
        self.model.deallocate(table)
        self.manager.deallocate(seq)
        assert seq.block_table == [] and seq.num_cached_tokens == 0
        self.finished.append(seq)

    @invariant()
    def agrees_with_the_prefix_model(self) -> None:
        manager, model, bs = self.manager, self.model, self.block_size
        manager.check_integrity()
        assert manager.sequences == tuple(seq for seq, _, _ in self.running.values())
        assert [b.ref_count for b in manager.blocks] == model.ref
        assert list(manager.free_block_ids) == list(model.free)
        held = Counter(b for seq, _, _ in self.running.values() for b in seq.block_table)
        assert held == Counter({b: r for b, r in enumerate(model.ref) if r})  # ref counts are exact
        assert set(held).isdisjoint(manager.free_block_ids)
        assert set(held) | set(manager.free_block_ids) == set(range(self.num_blocks))  # nothing leaked
        for block, content in zip(manager.blocks, model.content, strict=True):
            if content is None:
                assert (block.hash, block.token_ids) == (NO_HASH, ())
            else:
                assert block.hash == block_hashes(content, bs)[-1] and block.token_ids == content[-bs:]
        assert manager.hash_to_block == {block_hashes(p, bs)[-1]: b for p, b in model.index.items()}


class SingleTokenBlocks(BlockManagerMachine):
    num_blocks = 5
    block_size = 1


class ThreeTokenBlocks(BlockManagerMachine):
    num_blocks = 5
    block_size = 3


STATEFUL = settings(REPRODUCIBLE, max_examples=40, stateful_step_count=30)
TestBlockManagerBlockSize2 = BlockManagerMachine.TestCase
TestBlockManagerBlockSize1 = SingleTokenBlocks.TestCase
TestBlockManagerBlockSize3 = ThreeTokenBlocks.TestCase
for _case in (TestBlockManagerBlockSize1, TestBlockManagerBlockSize2, TestBlockManagerBlockSize3):
    _case.settings = STATEFUL


def test_the_model_catches_a_manager_that_does_not_chain_its_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: hashing each block alone reuses [3, 4] computed after [9, 9] for [1, 2, 3, 4]."""
    prompts = ([1, 2, 5, 5, 0], [9, 9, 3, 4, 0], [1, 2, 3, 4, 0])
    model = PrefixModel(8, 2)
    expected = [model.allocate(prompt) for prompt in prompts]
    chained = BlockManager(8, 2)
    assert [(s.block_table, s.num_cached_tokens) for s in (allocated(chained, p) for p in prompts)] == expected
    real = bm._hash_block
    monkeypatch.setattr(bm, "_hash_block", lambda tokens, prefix: real(tokens, NO_HASH))
    unchained = BlockManager(8, 2)
    last = [allocated(unchained, p) for p in prompts][-1]
    assert (last.block_table, last.num_cached_tokens) == ([0, 4, 6], 4) != expected[-1]


# -- check_integrity mutations --------------------------------------------------------------------


def healthy_manager() -> tuple[BlockManager, dict[str, Sequence]]:
    """block_size 2. A = [1,2 | 3,4 | 5,8] on blocks 0, 1, 2; B = [1,2 | 3,4 | 6,7] shares 0 and 1, then 3;
    C = [9,9 | 9,9] ran on 4 and 5 and finished (free, hashed); D = [7] is partial on block 6. Free: 7, 5, 4.
    """
    manager = BlockManager(8, 2)
    a = allocated(manager, [1, 2, 3, 4, 5])
    b = allocated(manager, [1, 2, 3, 4, 6, 7])
    c = allocated(manager, [9, 9, 9])
    manager.append(c, 9)
    manager.deallocate(c)
    manager.append(a, 8)
    d = allocated(manager, [7])
    assert (a.block_table, b.block_table, d.block_table) == ([0, 1, 2], [0, 1, 3], [6])
    assert list(manager.free_block_ids) == [7, 5, 4]
    return manager, {"A": a, "B": b, "D": d}


def _rehash(m: BlockManager, block_id: int, new_hash: int) -> None:
    """Give a block another hash and keep the hash table consistent with it."""
    del m.hash_to_block[m.blocks[block_id].hash]
    m.blocks[block_id].hash = new_hash
    m.hash_to_block[new_hash] = block_id


Mutation = Callable[[BlockManager, dict[str, Sequence]], None]
MUTATIONS: list[tuple[str, str, Mutation]] = [
    ("one reference too many", "ref_count", lambda m, s: setattr(m.blocks[2], "ref_count", 2)),
    ("a shared block counted once", "ref_count", lambda m, s: setattr(m.blocks[0], "ref_count", 1)),
    ("a free block missing from the free list", "free list", lambda m, s: m.free_block_ids.remove(4)),
    ("a block on the free list twice", "free list", lambda m, s: m.free_block_ids.append(7)),
    ("a block in use on the free list", "free list", lambda m, s: m.free_block_ids.append(2)),
    ("an unknown block on the free list", "free list", lambda m, s: m.free_block_ids.append(99)),
    (
        "a hash entry pointing at another block",
        "hash table",
        lambda m, s: m.hash_to_block.__setitem__(m.blocks[4].hash, 5),
    ),
    ("a hash entry pointing outside the pool", "hash table", lambda m, s: m.hash_to_block.__setitem__(123, 99)),
    ("a hash without tokens", "hash iff full", lambda m, s: setattr(m.blocks[7], "hash", 42)),
    ("tokens without a hash", "hash iff full", lambda m, s: setattr(m.blocks[7], "token_ids", (1, 2))),
    ("a hashed block that is not full", "hash iff full", lambda m, s: setattr(m.blocks[4], "token_ids", (9,))),
    ("a block at the wrong position", "block ids", lambda m, s: setattr(m.blocks[3], "block_id", 5)),
    ("tokens added behind the manager's back", "table length", lambda m, s: s["A"].token_ids.append(1)),
    ("a token of a full block changed", "block contents", lambda m, s: s["B"].token_ids.__setitem__(4, 0)),
    ("a full block's hash not chained", "block contents", lambda m, s: _rehash(m, 1, compute_hash([3, 4]))),
    (
        "a partial block with a hash",
        "block contents",
        lambda m, s: (setattr(m.blocks[6], "hash", 5), setattr(m.blocks[6], "token_ids", (7, 0))),
    ),
    ("one block twice in a table", "table entries", lambda m, s: s["B"].block_table.__setitem__(2, 0)),
    ("a table naming no block", "table entries", lambda m, s: s["D"].block_table.__setitem__(0, 8)),
    ("cached tokens not a whole block", "num_cached_tokens", lambda m, s: setattr(s["B"], "num_cached_tokens", 3)),
    ("the last block counted as cached", "num_cached_tokens", lambda m, s: setattr(s["B"], "num_cached_tokens", 6)),
    ("a block lost from the pool", "block count", lambda m, s: m.blocks.pop()),
]


def test_the_healthy_manager_passes() -> None:
    manager, sequences = healthy_manager()
    manager.check_integrity()
    assert sequences["B"].num_cached_tokens == 4


@pytest.mark.parametrize(("name", "invariant", "mutate"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_check_integrity_names_the_broken_invariant(name: str, invariant: str, mutate: Mutation) -> None:
    manager, sequences = healthy_manager()
    mutate(manager, sequences)
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.invariant == invariant, str(caught.value)


# -- bad input -------------------------------------------------------------------------------------


def world() -> tuple[BlockManager, dict[str, Sequence]]:
    """The healthy manager, a sequence that never got blocks, and one that holds blocks of another manager."""
    manager, sequences = healthy_manager()
    sequences["new"] = Sequence([1, 2, 3])
    sequences["elsewhere"] = allocated(BlockManager(2, 2), [1, 2, 3])
    sequences["bad tokens"] = Sequence([1, 2])
    sequences["bad tokens"].token_ids.append("x")  # type: ignore[arg-type]
    return manager, sequences


Call = Callable[[BlockManager, dict[str, Sequence]], object]
BAD_CALLS: list[tuple[str, type[MiniKVError], str, Call]] = [
    ("allocate a non-sequence", ArgumentTypeError, "seq", lambda m, s: m.allocate([1, 2, 3])),
    ("allocate a live sequence", ArgumentError, "seq", lambda m, s: m.allocate(s["A"])),
    ("allocate another manager's sequence", ArgumentError, "seq", lambda m, s: m.allocate(s["elsewhere"])),
    ("allocate tokens that are not ints", ArgumentTypeError, "seq.token_ids", lambda m, s: m.allocate(s["bad tokens"])),
    (
        "allocate more blocks than are free",
        OutOfSlotsError,
        "seq",
        lambda m, s: m.allocate(Sequence(list(range(100, 110)))),
    ),
    ("can_allocate a live sequence", ArgumentError, "seq", lambda m, s: m.can_allocate(s["B"])),
    ("can_allocate a non-sequence", ArgumentTypeError, "seq", lambda m, s: m.can_allocate(None)),
    ("deallocate a sequence never allocated", ArgumentError, "seq", lambda m, s: m.deallocate(s["new"])),
    ("deallocate another manager's sequence", ArgumentError, "seq", lambda m, s: m.deallocate(s["elsewhere"])),
    ("deallocate a non-sequence", ArgumentTypeError, "seq", lambda m, s: m.deallocate("A")),
    ("append to a sequence never allocated", ArgumentError, "seq", lambda m, s: m.append(s["new"], 1)),
    ("append a float", ArgumentTypeError, "token_id", lambda m, s: m.append(s["D"], 1.0)),
    ("append a bool", ArgumentTypeError, "token_id", lambda m, s: m.append(s["D"], True)),
    ("append an id beyond 64 bits", ArgumentError, "token_id", lambda m, s: m.append(s["D"], 2**63)),
    ("can_append to a sequence never allocated", ArgumentError, "seq", lambda m, s: m.can_append(s["new"])),
    ("cached_blocks of a string", ArgumentTypeError, "token_ids", lambda m, s: m.cached_blocks("1234")),
    ("cached_blocks of floats", ArgumentTypeError, "token_ids", lambda m, s: m.cached_blocks([1.0, 2.0])),
    (
        "cached_blocks of uint64 ids past int64",
        ArgumentError,
        "token_ids",
        lambda m, s: m.cached_blocks(np.array([1, 2, 3, 4, 2**63], dtype=np.uint64)),
    ),
]


def test_the_bad_call_table_covers_every_public_method() -> None:
    public = {name for name, value in vars(BlockManager).items() if not name.startswith("_") and callable(value)}
    assert {description.split()[0] for description, *_ in BAD_CALLS} == public - {"check_integrity"}


@pytest.mark.parametrize(("name", "error", "argument", "bad_call"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_names_the_argument_and_changes_nothing(
    name: str, error: type[MiniKVError], argument: str, bad_call: Call
) -> None:
    manager, sequences = world()
    before = (
        snapshot(manager),
        [(list(s.token_ids), list(s.block_table), s.num_cached_tokens) for s in sequences.values()],
    )
    with pytest.raises(error) as caught:
        bad_call(manager, sequences)
    assert str(caught.value).startswith(argument), str(caught.value)
    after = (
        snapshot(manager),
        [(list(s.token_ids), list(s.block_table), s.num_cached_tokens) for s in sequences.values()],
    )
    assert after == before
    manager.check_integrity()


@pytest.mark.parametrize(
    ("make", "error", "argument"),
    [
        (lambda: BlockManager(0, 4), ArgumentError, "num_blocks"),
        (lambda: BlockManager(4, 0), ArgumentError, "block_size"),
        (lambda: BlockManager(4.0, 4), ArgumentTypeError, "num_blocks"),
        (lambda: BlockManager(4, True), ArgumentTypeError, "block_size"),
        (lambda: Sequence([1.5]), ArgumentTypeError, "token_ids"),
        (lambda: Sequence("abc"), ArgumentTypeError, "token_ids"),
        (lambda: Sequence([True, 2]), ArgumentTypeError, "token_ids"),
        (lambda: Sequence([2**70]), ArgumentError, "token_ids"),
        (lambda: Sequence(np.array([1, 2**63], dtype=np.uint64)), ArgumentError, "token_ids"),
        (lambda: compute_hash(np.array([2**64 - 1], dtype=np.uint64)), ArgumentError, "token_ids"),
        (lambda: block_hashes(np.array([2**63] * 4, dtype=np.uint64), 2), ArgumentError, "token_ids"),
        (lambda: Sequence(np.zeros((2, 2), dtype=np.int64)), ArgumentTypeError, "token_ids"),
        (lambda: compute_hash([1.0]), ArgumentTypeError, "token_ids"),
        (lambda: compute_hash([1], -2), ArgumentError, "prefix_hash"),
        (lambda: compute_hash([1], 2**64), ArgumentError, "prefix_hash"),
        (lambda: compute_hash([1], "0"), ArgumentTypeError, "prefix_hash"),
        (lambda: block_hashes([1, 2], 0), ArgumentError, "block_size"),
        (lambda: block_hashes([1, 2], 2.0), ArgumentTypeError, "block_size"),
        (lambda: block_hashes(None, 2), ArgumentTypeError, "token_ids"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_construction_names_the_argument(
    make: Callable[[], object], error: type[MiniKVError], argument: str
) -> None:
    with pytest.raises(error) as caught:
        make()
    assert str(caught.value).startswith(argument), str(caught.value)


# -- the manager does not trust what users can write ---------------------------------------------


def test_uint64_ids_below_2_63_hash_like_the_same_ints() -> None:
    big = [2**63 - 1, 5, 2**62, 7]
    assert block_hashes(np.array(big, dtype=np.uint64), 2) == block_hashes(big, 2)
    assert Sequence(np.array(big, dtype=np.uint64)).token_ids == big


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.__setitem__(0, 99),  # a block id that does not exist
        lambda t: t.__setitem__(-1, 4),  # a real block this sequence does not hold
        lambda t: t.reverse(),
        lambda t: t.append(t[0]),
        lambda t: t.clear(),
    ],
    ids=["bogus id", "another block", "reversed", "one block twice", "emptied"],
)
def test_deallocate_refuses_an_edited_block_table_before_releasing_anything(edit: Callable[[list[int]], None]) -> None:
    manager, sequences = healthy_manager()
    seq = sequences["B"]
    table = list(seq.block_table)
    edit(seq.block_table)
    before = snapshot(manager)
    with pytest.raises(ArgumentError, match=r"^seq\.block_table"):
        manager.deallocate(seq)
    assert snapshot(manager) == before and seq in manager.sequences
    with pytest.raises(ArgumentError, match=r"^seq\.block_table"):
        manager.append(seq, 1)
    assert snapshot(manager) == before
    seq.block_table[:] = table  # put back what the manager wrote: now it can go
    manager.deallocate(seq)
    manager.check_integrity()


def test_append_refuses_tokens_added_behind_the_managers_back() -> None:
    manager = BlockManager(4, 2)
    seq = allocated(manager, [1, 2])
    seq.token_ids.append(3)  # not through append: the manager took no block for it
    before = snapshot(manager)
    with pytest.raises(ArgumentError, match=r"^seq\.token_ids"):
        manager.append(seq, 5)
    assert snapshot(manager) == before


def test_check_integrity_sees_a_table_swapped_for_another_that_holds_the_same_tokens() -> None:
    manager = BlockManager(4, 2)
    first, second = allocated(manager, [1, 2, 3]), allocated(manager, [1, 2, 3])
    assert first.block_table == [0, 1] and second.block_table == [0, 2]
    second.block_table = [0, 1]  # same tokens, so every block still holds what it should
    with pytest.raises(IntegrityError) as caught:
        manager.check_integrity()
    assert caught.value.invariant == "block table"
