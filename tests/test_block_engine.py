"""``BlockEngine`` (minikv.block_engine): nano-vllm's loop over a block manager, minikv's or the learner's.

Outputs must equal ``recompute`` on drawn workloads, with minikv's ``BlockManager`` and with
``LearnerBlockManager`` over exercise 4's solutions; the two engines, run in lockstep, must make
the same decisions and leave the same pool. Prefix hits, preemption and bad arguments are tested
on their own.
"""

from __future__ import annotations

import runpy
from collections import deque
from functools import cache
from pathlib import Path

import pytest
import torch
from engine_workloads import VOCAB, workloads
from helpers import REPRODUCIBLE
from hypothesis import given, settings

import minikv.exercises as exercises
from minikv import KVCacheLayout
from minikv.block_engine import BlockEngine, BlockManagerLike, make_block_engine
from minikv.block_manager import BlockManager, Sequence
from minikv.engine import EngineRequest, recompute
from minikv.errors import ArgumentError, ArgumentTypeError, IntegrityError, OutOfSlotsError
from minikv.exercises.block_engine_adapter import LearnerBlockManager
from minikv.mha_pool import MHAKVCache
from minikv.tiny_model import TinyDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SOLUTION = Path(__file__).resolve().parent.parent / "exercises" / "solutions" / "ex4_naive.py"


def _solution() -> dict:
    real = exercises.check
    exercises.check = lambda exercise_id, fn: None
    try:
        return runpy.run_path(str(SOLUTION), run_name="solution")
    finally:
        exercises.check = real


EX4 = _solution()
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
"""Two layers: with one, K/V read before they are written (zeros) can still give the right argmax."""


@cache
def reference(prompt: tuple[int, ...], max_new: int, stops: tuple[int, ...]) -> list[int]:
    return recompute(MODEL, list(prompt), max_new, stops)


def learner(num_blocks: int, block_size: int) -> LearnerBlockManager:
    return LearnerBlockManager(num_blocks, block_size, allocate=EX4["allocate"], deallocate=EX4["deallocate"])


def pool_state(manager: BlockManagerLike) -> tuple:
    assert isinstance(manager, (BlockManager, LearnerBlockManager))
    return (
        [(b.ref_count, b.hash, tuple(b.token_ids)) for b in manager.blocks],
        dict(manager.hash_to_block),
        list(manager.free_block_ids),
    )


def serve_lockstep(work: dict) -> tuple[list[EngineRequest], list[EngineRequest]]:
    """The workload on two engines at once, minikv's manager and the learner's: same steps, same pools."""
    engines = [
        make_block_engine(MODEL, work["num_pages"], work["page_size"], manager, max_num_seqs=work["max_running"])
        for manager in (None, learner(work["num_pages"], work["page_size"]))
    ]
    arrivals = sorted(enumerate(work["requests"]), key=lambda item: (item[1][2], item[0]))
    requests: list[list[EngineRequest]] = [[], []]
    step = 0
    while arrivals or not engines[0].is_finished():
        while arrivals and arrivals[0][1][2] <= step:
            _, (prompt, max_new, _) = arrivals.pop(0)
            for engine, mine in zip(engines, requests, strict=True):
                mine.append(engine.add_request(EngineRequest(list(prompt), max_new, work["stops"])))
        steps = [engine.step() for engine in engines]
        assert [[r.uid for r in batch] for batch, _ in steps[:1]] == [[r.uid for r in batch] for batch, _ in steps[1:]]
        for engine in engines:
            engine.check()
        assert pool_state(engines[0].block_manager) == pool_state(engines[1].block_manager)
        step += 1
        assert step < 2000
    assert engines[1].is_finished()
    return requests[0], requests[1]


@settings(REPRODUCIBLE, max_examples=80)
@given(workloads())
def test_outputs_equal_recompute_with_either_manager(work: dict) -> None:
    theirs, mine = serve_lockstep(work)
    for request, same in zip(theirs, mine, strict=True):
        expected = reference(tuple(request.prompt.tolist()), request.max_new_tokens, work["stops"])
        assert request.output == expected
        assert same.output == expected
        assert same.admissions == request.admissions  # the learner's manager found the same cached blocks


def test_a_repeated_prompt_hits_its_full_blocks_and_recomputes_the_last() -> None:
    engine = make_block_engine(MODEL, num_blocks=16, block_size=4)
    for prompt, cached in (([1, 2, 3, 4, 5, 6, 7, 8], 4), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 8)):
        first = engine.add_request(EngineRequest(prompt, 3))
        while not engine.is_finished():
            engine.step()
            engine.check()
        again = engine.add_request(EngineRequest(prompt, 3))
        while not engine.is_finished():
            engine.step()
            engine.check()
        assert again.cached_tokens == cached  # a whole prompt of blocks still computes its last block
        assert again.output == first.output == recompute(MODEL, prompt, 3)


def test_requests_admitted_together_share_blocks_written_in_the_same_step() -> None:
    system = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts = [[*system, i, i + 1] for i in range(4)]
    for manager in (None, learner(32, 4)):
        engine = make_block_engine(MODEL, 32, 4, manager)
        outputs = engine.generate(prompts, 5)
        assert outputs == [recompute(MODEL, p, 5) for p in prompts]
        assert [r.cached_tokens for r in sorted(engine.finished, key=lambda r: r.uid)] == [0, 8, 8, 8]


@pytest.mark.parametrize("use_learner", [False, True])
def test_running_out_of_blocks_preempts_the_newest_and_resumes_exactly(use_learner: bool) -> None:
    prompts = [[i % VOCAB, 2, 3, 4, 5] for i in range(4)]
    engine = make_block_engine(MODEL, 6, 2, learner(6, 2) if use_learner else None, max_num_seqs=4)
    requests = [engine.add_request(EngineRequest(p, 6)) for p in prompts]
    while not engine.is_finished():
        engine.step()
        engine.check()
    assert sum(r.num_preemptions for r in requests) > 0
    assert requests[0].num_preemptions == 0  # the oldest is never the one to go
    assert [r.output for r in requests] == [recompute(MODEL, p, 6) for p in prompts]
    assert len(engine.block_manager.free_block_ids) == 6


def test_stop_tokens_end_a_request_early() -> None:
    prompt = [1, 2, 3]
    full = recompute(MODEL, prompt, 8)
    engine = make_block_engine(MODEL, 8, 4)
    assert engine.generate([prompt], 8, stop_tokens=[full[2]]) == [recompute(MODEL, prompt, 8, [full[2]])]


def test_check_catches_broken_books() -> None:
    engine = make_block_engine(MODEL, 8, 4)
    request = engine.add_request(EngineRequest([1, 2, 3, 4, 5], 4))
    engine.step()
    engine.check()
    engine.block_manager.free_block_ids.append(engine.seqs[request.uid].block_table[0])
    with pytest.raises(IntegrityError):
        engine.check()


def test_learner_manager_checks_its_pool() -> None:
    manager = learner(4, 2)
    seq = Sequence([1, 2, 3])
    manager.allocate(seq)
    manager.check_integrity()
    manager.append(seq, 4)  # fills the second block: hashed, as minikv's manager does
    reference_manager = BlockManager(4, 2)
    twin = Sequence([1, 2, 3])
    reference_manager.allocate(twin)
    reference_manager.append(twin, 4)
    assert pool_state(manager) == pool_state(reference_manager)
    manager.check_integrity()
    manager.blocks[seq.block_table[0]].ref_count = 2
    with pytest.raises(IntegrityError):
        manager.check_integrity()


def test_bad_arguments_are_refused_by_name() -> None:
    kv_cache = MHAKVCache(1, 2, 8, 4, torch.float32, KVCacheLayout.LayerFirst, "cpu", 2)  # 4 blocks of 2
    with pytest.raises(ArgumentTypeError, match="model"):
        BlockEngine("model", BlockManager(4, 2), kv_cache)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="block_manager"):
        BlockEngine(MODEL, object(), kv_cache)  # type: ignore[arg-type]
    busy = BlockManager(4, 2)
    busy.allocate(Sequence([1, 2, 3]))
    with pytest.raises(ArgumentError, match="block_manager"):
        BlockEngine(MODEL, busy, kv_cache)
    with pytest.raises(ArgumentError, match="kv_cache holds 4 pages"):
        BlockEngine(MODEL, BlockManager(5, 2), kv_cache)
    with pytest.raises(ArgumentError, match="max_num_seqs"):
        BlockEngine(MODEL, BlockManager(4, 2), kv_cache, max_num_seqs=0)
    with pytest.raises(ArgumentError, match="block_manager"):
        make_block_engine(MODEL, 4, 2, BlockManager(4, 4))
    with pytest.raises(ArgumentError, match="num_blocks"):
        make_block_engine(MODEL, 0, 2)
    with pytest.raises(ArgumentTypeError, match="allocate"):
        LearnerBlockManager(4, 2, allocate=None, deallocate=EX4["deallocate"])  # type: ignore[arg-type]

    engine = BlockEngine(MODEL, BlockManager(4, 2), kv_cache)
    with pytest.raises(ArgumentTypeError, match="request"):
        engine.add_request([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="request"):
        engine.add_request(EngineRequest([1, 2, 3, 4, 5, 6], 4))  # 9 tokens need 5 blocks of 2; there are 4
    with pytest.raises(ArgumentError, match="prompt"):
        engine.add_request(EngineRequest([VOCAB], 1))
    request = engine.add_request(EngineRequest([1, 2], 2))
    with pytest.raises(ArgumentError, match="request"):
        engine.add_request(request)
    assert list(engine.waiting) == [request]  # the refusals queued nothing
    with pytest.raises(ArgumentError, match="prompt"):
        engine.generate([[1, 2], [VOCAB]], 2)  # the second prompt is refused before the first is queued
    with pytest.raises(ArgumentTypeError, match="prompts"):
        engine.generate(7, 2)  # type: ignore[arg-type]
    assert list(engine.waiting) == [request]

    manager = learner(2, 2)
    with pytest.raises(ArgumentTypeError, match="seq"):
        manager.allocate([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="seq"):
        manager.append(Sequence([1]), 2)
    seq = Sequence([1, 2, 3, 4])
    assert manager.can_allocate(seq) and not manager.can_allocate(Sequence([1, 2, 3, 4, 5]))
    manager.allocate(seq)
    with pytest.raises(ArgumentError, match="seq"):
        manager.allocate(seq)
    assert not manager.can_append(seq)
    with pytest.raises(OutOfSlotsError, match="seq"):
        manager.append(seq, 5)
    manager.deallocate(seq)
    assert list(manager.free_block_ids) == [1, 0] and manager.free_block_ids == deque([1, 0])


def test_a_model_of_another_shape_is_refused() -> None:
    other = TinyDecoder(vocab_size=VOCAB, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
    kv_cache = make_block_engine(MODEL, 4, 2).kv_cache
    with pytest.raises(ArgumentError, match="kv_cache"):
        BlockEngine(other, BlockManager(4, 2), kv_cache)
