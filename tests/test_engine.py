"""The serving engine: whatever it caches, shares, evicts or preempts, it generates what a recompute does.

Every run here is checked after every step (``Engine.check``: each slot free,
in the tree or held by one request, exactly once; then the manager's own
``check_integrity``), and its outputs are compared token for token with
:func:`minikv.engine.recompute`, which runs the model over the whole sequence
at every step and never touches a cache.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minikv import RadixCacheManager
from minikv.engine import EarlyFreeEngine, Engine, EngineRequest, Status, make_engine, recompute, tree_slots
from minikv.engine_stats import EngineStats, StatsRecorder
from minikv.errors import ArgumentError, ArgumentTypeError, MiniKVError, StepLimitError
from minikv.tiny_model import TinyDecoder

VOCAB = 32


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(vocab_size=VOCAB, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=96)


def shared_prompts(num: int = 6, system: int = 18, seed: int = 0) -> list[list[int]]:
    """``num`` prompts that share a ``system``-token prefix, then a question of 1-9 tokens each."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, VOCAB, system).tolist()
    return [prefix + rng.integers(0, VOCAB, int(rng.integers(1, 10))).tolist() for _ in range(num)]


def run_checked(engine: Engine, prompts: list[list[int]], max_new: int, stops: tuple[int, ...] = ()) -> list[list[int]]:
    requests = [engine.submit(EngineRequest(p, max_new, stops)) for p in prompts]
    steps = 0
    while engine.has_work():
        engine.step()
        engine.check()
        steps += 1
        assert steps < 1000
    assert all(r.finished for r in requests)
    engine.check()
    # Idle: nothing is held, so every slot is free or cached, and nothing is locked.
    assert engine.pool.num_free_slots + engine.cache.size_info.total_size == engine.pool.num_slots
    assert engine.cache.size_info.protected_size == 0
    return [r.output for r in requests]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prompts()


@pytest.fixture(scope="module")
def expected(model: TinyDecoder, prompts: list[list[int]]) -> list[list[int]]:
    return [recompute(model, p, 10) for p in prompts]


# -- the model's decode ------------------------------------------------------------------------


def test_decode_logits_equal_a_full_forward(model: TinyDecoder) -> None:
    """Two requests of different lengths decoded in one batch, each over its own slots, as forward computes them."""
    engine = make_engine(model, 64)
    a, b = [3, 1, 4, 1, 5], [9, 2, 6]
    slots_a, slots_b = torch.arange(0, 6, dtype=torch.int32), torch.arange(20, 24, dtype=torch.int32)
    model.prefill(a, engine.kv_cache, slots_a[:5], 0)
    model.prefill(b, engine.kv_cache, slots_b[:3], 0)
    out_loc = torch.tensor([5, 23], dtype=torch.int32)
    logits = model.decode([7, 8], [5, 3], engine.kv_cache, out_loc, [slots_a, slots_b])
    assert torch.allclose(logits[0], model.forward([*a, 7])[-1], atol=1e-5)
    assert torch.allclose(logits[1], model.forward([*b, 8])[-1], atol=1e-5)


def test_decode_refuses_mismatched_arguments(model: TinyDecoder) -> None:
    engine = make_engine(model, 16)
    slots = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ArgumentError, match="one entry per token"):
        model.decode([1], [3, 4], engine.kv_cache, slots[3:], [slots])
    with pytest.raises(ArgumentError, match="one slot per token"):
        model.decode([1], [2], engine.kv_cache, slots[3:], [slots])  # position 2 needs 3 slots
    with pytest.raises(ArgumentError, match="max_positions"):
        model.decode([1], [model.max_positions], engine.kv_cache, slots[3:], [slots])


# -- identical outputs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page_size", "num_pages", "manager"),
    [(1, 400, "radix"), (4, 100, "radix"), (16, 25, "radix"), (1, 400, "naive")],
)
def test_outputs_equal_a_recompute(
    model: TinyDecoder,
    prompts: list[list[int]],
    expected: list[list[int]],
    page_size: int,
    num_pages: int,
    manager: str,
) -> None:
    engine = make_engine(model, num_pages, page_size, manager, max_running=4)
    assert run_checked(engine, prompts, 10) == expected
    if manager == "radix":
        # The shared prefix (page-aligned) was computed once, by the first prefill batch.
        assert engine.stats.cached_tokens > 0
        assert engine.stats.prefill_tokens < sum(len(p) for p in prompts)
    else:
        assert engine.stats.cached_tokens == 0 and engine.stats.prefill_tokens == sum(len(p) for p in prompts)


@pytest.mark.parametrize(("page_size", "num_pages"), [(1, 60), (4, 15), (16, 4)])
@pytest.mark.parametrize("overlap", [False, True])
def test_outputs_survive_eviction_and_preemption(
    model: TinyDecoder,
    prompts: list[list[int]],
    expected: list[list[int]],
    page_size: int,
    num_pages: int,
    overlap: bool,
) -> None:
    engine = make_engine(model, num_pages, page_size, max_running=4, overlap=overlap)
    assert run_checked(engine, prompts, 10) == expected
    assert engine.stats.evicted_slots > 0
    if page_size < 16:  # four 16-slot pages hold one request at a time: never two to choose from
        assert engine.stats.preemptions > 0


def test_a_preempted_request_can_resume_from_its_own_inserted_prefix(
    model: TinyDecoder, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """Preemption inserts the computed prefix; when eviction takes older leaves first, the resume
    matches generated tokens back (beyond the prompt) instead of recomputing them."""
    engine = make_engine(model, 13, page_size=4, max_running=4)
    requests = [engine.submit(EngineRequest(p, 10)) for p in prompts]
    engine.run()
    assert [r.output for r in requests] == expected
    preempted = [r for r in requests if r.num_preemptions]
    assert preempted and all(len(r.admissions) == 1 + r.num_preemptions for r in preempted)
    assert any(max(r.admissions[1:]) > len(r.prompt) for r in preempted)


def test_stop_tokens_end_a_request_and_are_its_last_token(model: TinyDecoder, prompts: list[list[int]]) -> None:
    free_run = [recompute(model, p, 10) for p in prompts]
    stops = (free_run[0][2], free_run[1][4])
    wanted = [recompute(model, p, 10, stops) for p in prompts]
    assert any(len(w) < 10 for w in wanted)
    for w in wanted:
        assert len(w) == 10 or w[-1] in stops
    for overlap in (False, True):
        engine = make_engine(model, 200, max_running=3, overlap=overlap)
        assert run_checked(engine, prompts, 10, stops) == wanted


def test_generated_tokens_enter_the_tree(model: TinyDecoder) -> None:
    """A finished request inserts prompt + generated tokens whose K/V exist (all but the last token)."""
    engine = make_engine(model, 200, page_size=4)
    prompt = shared_prompts(1, system=10, seed=2)[0]
    (output,) = engine.generate([prompt], 9)
    written = prompt + output[:-1]
    handle, _ = engine.cache.match_prefix([*written, 0])
    assert handle.cached_len == len(written) - len(written) % 4
    # Turn two of a chat resends all of it: only the last page (and the new message) is computed.
    engine.stats.prefill_tokens = 0
    engine.generate([[*prompt, *output, 5, 6, 7]], 2)
    assert engine.stats.prefill_tokens == len(prompt) + len(output) + 3 - handle.cached_len


def test_duplicates_are_freed_when_two_requests_compute_the_same_prefix(model: TinyDecoder) -> None:
    """Two identical prompts admitted in one batch both compute it; the second insert frees its copies."""
    engine = make_engine(model, 100)
    prompt = shared_prompts(1, seed=3)[0]
    assert run_checked(engine, [prompt, prompt], 4) == [recompute(model, prompt, 4)] * 2
    assert engine.cache.size_info.total_size == len(prompt) + 3
    assert len(tree_slots(engine.cache)) == len(prompt) + 3


@pytest.mark.parametrize("after_prefill", [True, False])
def test_prompts_are_shared_as_soon_as_they_are_prefilled(model: TinyDecoder, after_prefill: bool) -> None:
    """mini-sglang inserts a prompt right after its prefill; inserting only at finish shares nothing
    between requests that run side by side."""
    prompt = shared_prompts(1, system=12, seed=6)[0]
    engine = make_engine(model, 200, insert_after_prefill=after_prefill)
    first = engine.submit(EngineRequest(prompt, 8))
    engine.step()  # first's prefill
    second = engine.submit(EngineRequest([*prompt, 1, 2], 8))
    engine.step()  # second's prefill, while first is still running
    engine.check()
    assert first.status is second.status is Status.RUNNING
    assert second.cached_tokens == (len(prompt) if after_prefill else 0)
    engine.run()
    engine.check()
    assert [first.output, second.output] == [recompute(model, prompt, 8), recompute(model, [*prompt, 1, 2], 8)]


def test_a_prompt_prefilled_twice_in_one_batch_is_remapped_to_the_tree_copy(model: TinyDecoder) -> None:
    """Both compute it; the second insert finds it cached, frees its own copies and points its row
    at the tree's slots (freeing without remapping is mini-sglang's open bug #142)."""
    prompt = shared_prompts(1, seed=7)[0]
    engine = make_engine(model, 100, page_size=4)
    a, b = engine.submit(EngineRequest(prompt, 5)), engine.submit(EngineRequest(prompt, 5))
    batch = engine.step()
    assert batch is not None and batch.kind == "prefill" and len(batch.requests) == 2
    engine.check()
    shared = len(prompt) - len(prompt) % 4
    assert a.cached_len == b.cached_len == shared
    assert torch.equal(engine.req_to_token[a.row, :shared], engine.req_to_token[b.row, :shared])
    engine.run()
    engine.check()
    assert a.output == b.output == recompute(model, prompt, 5)


def test_admission_rechecks_after_locking(model: TinyDecoder) -> None:
    """Its own match counts as evictable until it is locked: the second check catches that, and nothing is held."""
    engine = make_engine(model, 16, max_running=2)
    first = list(range(10))
    engine.generate([first], 1)  # the tree now holds those 10 tokens; 6 slots are free
    taken = engine.pool.allocate(2)  # as if another request held 2 of them: 4 free + 10 evictable
    engine.submit(EngineRequest([*first, 20, 21, 22, 23, 24, 25], 1))  # matches 10, must compute 6
    assert engine.step() is None  # 6 <= 4 + 10 before locking, but 6 > 4 + 0 after
    assert len(engine.waiting) == 1 and not engine.running
    assert engine.cache.size_info.protected_size == 0
    engine.pool.free(taken)
    batch = engine.step()
    assert batch is not None and batch.kind == "prefill" and batch.starts == [10]
    engine.check()


def test_admission_evicts_unlocked_prefixes(model: TinyDecoder) -> None:
    engine = make_engine(model, 24)
    a, b = list(range(20)), list(range(10, 30))
    engine.generate([a], 1)
    assert engine.cache.size_info.evictable_size == 20
    engine.generate([b], 1)
    assert engine.stats.evicted_slots >= 16
    engine.check()


def test_identical_outputs_with_more_requests_than_rows(model: TinyDecoder, prompts: list[list[int]]) -> None:
    engine = make_engine(model, 400, max_running=1)
    assert run_checked(engine, prompts[:3], 3) == [recompute(model, p, 3) for p in prompts[:3]]


# -- overlap ---------------------------------------------------------------------------------


def test_overlap_schedules_a_stopped_request_once_more_and_drops_that_token(model: TinyDecoder) -> None:
    prompt = shared_prompts(1, seed=4)[0]
    free_run = recompute(model, prompt, 8)
    stops = (free_run[2],)
    plain, ahead = make_engine(model, 100), make_engine(model, 100, overlap=True)
    assert run_checked(plain, [prompt], 8, stops) == run_checked(ahead, [prompt], 8, stops) == [free_run[:3]]
    assert ahead.stats.decode_tokens == plain.stats.decode_tokens + 1  # one token computed in vain


def test_freeing_before_the_in_flight_batch_read_its_slots_gives_wrong_tokens(model: TinyDecoder) -> None:
    """One step late is not a detail: release a request when the scheduler knows it is done, and the
    batch still in flight computes its last token from the next request's row of req_to_token."""
    rng = np.random.default_rng(1)
    first, second = rng.integers(0, VOCAB, 8).tolist(), rng.integers(0, VOCAB, 12).tolist()
    wanted = [recompute(model, first, 2), recompute(model, second, 2)]
    safe = make_engine(model, 64, max_running=1, overlap=True)
    assert run_checked(safe, [first, second], 2) == wanted
    early = make_engine(model, 64, max_running=1, overlap=True, engine_class=EarlyFreeEngine)
    outputs = early.generate([first, second], 2)
    assert outputs[0] != wanted[0]  # the last token was computed from `second`'s ids and slots
    assert outputs[1] == wanted[1]


# -- bad input ---------------------------------------------------------------------------------


def engine_state(engine: Engine) -> tuple[object, ...]:
    return (
        [r.uid for r in engine.waiting],
        [r.uid for r in engine.running],
        engine.pool.num_free_slots,
        engine.cache.size_info,
        tree_slots(engine.cache).tolist(),
        engine.stats.prompt_tokens,
    )


def test_requests_the_engine_must_refuse(model: TinyDecoder) -> None:
    engine = make_engine(model, 8, page_size=4, max_running=2)  # 32 slots
    engine.generate([list(range(12))], 3)
    queued = engine.submit(EngineRequest(list(range(5)), 2))
    before = engine_state(engine)
    cases = [
        (EngineRequest(list(range(30)), 4), ArgumentError, "can never hold"),  # 33 tokens need 9 pages
        (EngineRequest([1, 2, 3], 95), ArgumentError, "max_positions"),
        (EngineRequest([1, 2, VOCAB], 2), ArgumentError, "prompt: token ids"),
        (EngineRequest([1, 2, 3], 2, stop_tokens=[VOCAB + 5]), ArgumentError, "stop_tokens"),
        (EngineRequest([1, 2, 3], 2, stop_tokens=[-1]), ArgumentError, "stop_tokens"),
        (queued, ArgumentError, "already submitted"),
    ]
    for request, error, message in cases:
        with pytest.raises(error, match=message):
            engine.submit(request)
        assert engine_state(engine) == before
    with pytest.raises(ArgumentTypeError):
        engine.submit([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="prompt: token ids"):  # one bad prompt: none is queued
        engine.generate([[1, 2], [VOCAB]], 2)
    assert engine_state(engine) == before
    engine.run()
    engine.check()


def test_requests_that_cannot_be_built() -> None:
    with pytest.raises(ArgumentError, match="at least one token"):
        EngineRequest([], 3)
    with pytest.raises(ArgumentError, match="max_new_tokens must be >= 1"):
        EngineRequest([1, 2], 0)
    with pytest.raises(ArgumentTypeError, match="max_new_tokens"):
        EngineRequest([1, 2], 2.0)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="stop_tokens"):
        EngineRequest([1, 2], 2, stop_tokens=[1.5])  # type: ignore[list-item]
    with pytest.raises(ArgumentTypeError, match="stop_tokens"):
        EngineRequest([1, 2], 2, stop_tokens=7)  # type: ignore[arg-type]
    for error in (ArgumentError, ArgumentTypeError):
        assert issubclass(error, MiniKVError)


def test_engine_parts_must_agree(model: TinyDecoder) -> None:
    engine = make_engine(model, 8, page_size=4)
    with pytest.raises(ArgumentError, match="must agree"):
        Engine(model, RadixCacheManager(page_size=1), engine.pool, engine.kv_cache)
    with pytest.raises(ArgumentError, match="naive"):
        make_engine(model, 8, page_size=4, manager="naive")
    with pytest.raises(ArgumentTypeError, match="TinyDecoder"):
        Engine(object(), engine.cache, engine.pool, engine.kv_cache)  # type: ignore[arg-type]


# -- a manager of one's own ---------------------------------------------------------------------


class OwnRadix(RadixCacheManager):
    """A manager that is not minikv's class itself, as a learner's exercise-5 cache is not."""


def test_make_engine_runs_a_manager_of_ones_own(model: TinyDecoder, prompts: list[list[int]], expected) -> None:
    engine = make_engine(model, 96, page_size=2, manager=OwnRadix(page_size=2), max_running=4)
    assert type(engine.cache) is OwnRadix
    assert run_checked(engine, prompts, 10) == expected
    assert len(tree_slots(engine.cache)) == engine.cache.size_info.total_size > 0


def test_make_engine_refuses_a_manager_that_does_not_fit(model: TinyDecoder) -> None:
    with pytest.raises(ArgumentError, match="manager: its page_size is 1, the engine's is 2"):
        make_engine(model, 16, page_size=2, manager=OwnRadix())
    used = OwnRadix()
    used.insert_prefix([1, 2], [0, 1])
    with pytest.raises(ArgumentError, match="manager: must be empty"):
        make_engine(model, 16, manager=used)


def test_tree_slots_reads_any_manager_with_a_root_node() -> None:
    class Holder:
        def __init__(self, root: object) -> None:
            self.root_node = root

    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [4, 5, 6])
    manager.insert_prefix([1, 9], [4, 7])
    assert sorted(tree_slots(Holder(manager.root_node)).tolist()) == [4, 5, 6, 7]  # type: ignore[arg-type]
    assert tree_slots(object()).tolist() == []  # type: ignore[arg-type]


@pytest.mark.parametrize("page_size", [3, 7, 16])
def test_a_request_as_long_as_the_model_allows_fits_any_page_size(page_size: int) -> None:
    # 100 positions: whole pages of 3, 7 or 16 slots hold more than 101 slots (102, 105, 112).
    model = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=100)
    engine = make_engine(model, num_pages=2 * -(-100 // page_size), page_size=page_size, max_running=2)
    prompts = [[1] * 60 + [2, 3], [1] * 60 + [4]]
    outputs = engine.generate(prompts, max_new_tokens=39)  # the longer one reaches position 100 exactly
    engine.check()
    assert outputs == [recompute(model, p, 39) for p in prompts]


@pytest.mark.parametrize("kind", ["tensor", "numpy"])
def test_a_request_keeps_its_own_copy_of_the_prompt(model: TinyDecoder, kind: str) -> None:
    buffer = torch.tensor([1, 2, 3, 4, 5]) if kind == "tensor" else np.array([1, 2, 3, 4, 5])
    engine = make_engine(model, num_pages=32)
    request = engine.submit(EngineRequest(buffer, 4))
    buffer[:] = 7  # the caller reuses its input buffer for the next request
    assert request.prompt.tolist() == [1, 2, 3, 4, 5]
    engine.run()
    assert request.output == recompute(model, [1, 2, 3, 4, 5], 4)


def test_an_engine_refuses_storage_its_model_cannot_use(model: TinyDecoder) -> None:
    from minikv import KVCacheLayout, MHAKVCache, PagePool

    pool, cache = PagePool(16), RadixCacheManager()

    def storage(**change: object) -> MHAKVCache:
        shape = {
            "num_kv_heads": model.num_kv_heads,
            "num_layers": model.num_layers,
            "head_dim": model.head_dim,
            "num_pages": 16,
            "dtype": model.dtype,
            "kv_layout": KVCacheLayout.LayerFirst,
            "device": "cpu",
        }
        return MHAKVCache(**{**shape, **change})  # type: ignore[arg-type]

    for bad, match in [(None, "kv_cache must be a BaseKVCache"), (storage(num_layers=3), "layers"),
                       (storage(num_kv_heads=2), "KV heads"), (storage(dtype=torch.float16), "float16")]:  # fmt: skip
        with pytest.raises(MiniKVError, match=match):
            Engine(model, cache, pool, bad)  # type: ignore[arg-type]
    assert pool.num_free_slots == 16 and cache.size_info.total_size == 0


@pytest.mark.parametrize(
    "prompt",
    [np.arange(6)[::-1], np.arange(6).astype(">i8"), np.arange(6, dtype=np.uint16)],
    ids=["reversed", "big-endian", "uint16"],
)
def test_a_request_takes_any_integer_numpy_array(model: TinyDecoder, prompt: np.ndarray) -> None:
    request = EngineRequest(prompt, 3)
    assert request.prompt.tolist() == prompt.tolist() and request.prompt.dtype == np.int64
    engine = make_engine(model, num_pages=32)
    assert engine.generate([prompt], 3) == [recompute(model, prompt.tolist(), 3)]


# -- every entry point names its bad argument and changes nothing ------------------------------


def test_run_refuses_a_bad_step_budget_and_says_when_work_is_left(model: TinyDecoder) -> None:
    engine = make_engine(model, 32)
    engine.submit(EngineRequest([1, 2, 3], 4))
    before = engine_state(engine)
    for bad, error in [
        (2.5, ArgumentTypeError),
        (-1, ArgumentError),
        (True, ArgumentTypeError),
        ("9", ArgumentTypeError),
    ]:
        with pytest.raises(error, match="max_steps"):
            engine.run(bad)  # type: ignore[arg-type]
        assert engine_state(engine) == before
    with pytest.raises(StepLimitError, match="max_steps: the engine did not finish within 2 steps"):
        engine.run(2)
    assert issubclass(StepLimitError, RuntimeError) and issubclass(StepLimitError, MiniKVError)
    engine.run()
    # A budget that is exactly enough is enough: one prefill and three decode steps, the last one finishing.
    assert engine.run(0) is engine.finished  # nothing to do: no step needed
    request = engine.submit(EngineRequest([1, 2, 3], 4))
    assert engine.run(4)[-1] is request and request.finished


def test_generate_refuses_arguments_that_are_not_lists(model: TinyDecoder) -> None:
    engine = make_engine(model, 32)
    before = engine_state(engine)
    for prompts, stops, name in [(5, (), "prompts"), ("abc", (), "prompts"), ([[1, 2]], 3, "stop_tokens"),
                                 ([[1, 2]], "ab", "stop_tokens"), ([[1, 2]], [1.5], "stop_tokens")]:  # fmt: skip
        with pytest.raises(ArgumentTypeError, match=name):
            engine.generate(prompts, 2, stops)  # type: ignore[arg-type]
        assert engine_state(engine) == before
    with pytest.raises(ArgumentTypeError, match="max_new_tokens"):
        engine.generate([[1, 2]], 2.0)  # type: ignore[arg-type]
    assert engine_state(engine) == before
    stops = iter([VOCAB - 1])  # read once, used for every prompt
    assert engine.generate([[1, 2], [3, 4]], 3, stops) == [
        recompute(model, p, 3, [VOCAB - 1]) for p in ([1, 2], [3, 4])
    ]


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        ({"num_pages": 0}, ArgumentError, "num_pages"),
        ({"num_pages": 4.0}, ArgumentTypeError, "num_pages"),
        ({"page_size": 0}, ArgumentError, "page_size"),
        ({"page_size": "4"}, ArgumentTypeError, "page_size"),
        ({"max_running": 0}, ArgumentError, "max_running"),
        ({"max_running": True}, ArgumentTypeError, "max_running"),
        ({"overlap": "yes"}, ArgumentTypeError, "overlap"),
        ({"insert_after_prefill": 1}, ArgumentTypeError, "insert_after_prefill"),
        ({"manager": "lru"}, ArgumentError, "manager"),
        ({"manager": 3}, ArgumentTypeError, "manager"),
        ({"engine_class": int}, ArgumentTypeError, "engine_class"),
        ({"engine_class": "Engine"}, ArgumentTypeError, "engine_class"),
    ],
)
def test_make_engine_names_its_bad_argument(model: TinyDecoder, change: dict, error: type, name: str) -> None:
    manager = OwnRadix()
    arguments = {"num_pages": 16, "manager": manager, **change}
    with pytest.raises(error, match=name):
        make_engine(model, **arguments)
    assert manager.size_info.total_size == 0 and manager.root_node.children == {}


def test_the_engine_constructor_refuses_flags_that_are_not_bools(model: TinyDecoder) -> None:
    parts = make_engine(model, 8)
    for name in ("overlap", "insert_after_prefill"):
        with pytest.raises(ArgumentTypeError, match=name):
            Engine(model, parts.cache, parts.pool, parts.kv_cache, **{name: "no"})  # type: ignore[arg-type]
    assert Engine(model, parts.cache, parts.pool, parts.kv_cache, overlap=np.bool_(True)).overlap is True


def test_recompute_refuses_what_submit_refuses(model: TinyDecoder) -> None:
    for args, error, match in [
        (([1, VOCAB], 2), ArgumentError, "prompt: token ids"),
        (([1, 2], 2, [VOCAB]), ArgumentError, "stop_tokens"),
        (([1] * 90, 8), ArgumentError, "max_positions"),
        (([], 2), ArgumentError, "at least one token"),
        (([1, 2], 0), ArgumentError, "max_new_tokens"),
    ]:
        with pytest.raises(error, match=match):
            recompute(model, *args)
    with pytest.raises(ArgumentTypeError, match="model"):
        recompute(object(), [1, 2], 2)  # type: ignore[arg-type]


# -- the statistics are kept beside the loop ------------------------------------------------------


def test_stats_count_what_the_engine_did(model: TinyDecoder, prompts: list[list[int]]) -> None:
    engine = make_engine(model, 40, max_running=3)  # tight: evicts and preempts
    second = StatsRecorder().attach(engine)  # a second recorder sees the same events
    requests = [engine.submit(EngineRequest(p, 10)) for p in prompts]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    stats = engine.stats
    assert isinstance(stats, EngineStats)
    assert stats.steps == steps
    assert stats.prompt_tokens == sum(len(p) for p in prompts)
    assert stats.cached_tokens == sum(sum(r.admissions) for r in requests)
    assert stats.preemptions == sum(r.num_preemptions for r in requests) > 0
    assert stats.evicted_slots == engine.pool.num_evicted_slots > 0
    # Each admission's prefill gives one token (a resumed request's too); decode gives the rest.
    assert stats.decode_tokens == sum(len(r.output) - len(r.admissions) for r in requests)
    assert stats.prefill_batches + stats.decode_batches <= stats.steps
    assert 0 < stats.prefill_seconds <= stats.model_seconds <= stats.step_seconds
    assert 0 < stats.cache_seconds <= stats.step_seconds
    counts = ("steps", "prefill_batches", "decode_batches", "prompt_tokens", "prefill_tokens", "cached_tokens",
              "decode_tokens", "preemptions", "evicted_slots")  # fmt: skip
    assert [getattr(second, c) for c in counts] == [getattr(stats, c) for c in counts]


def test_the_engine_loop_neither_counts_nor_times() -> None:
    """Issue 21: the scheduler's methods read as the scheduler; the recorder keeps the figures."""
    import inspect

    import minikv.engine as engine_module

    source = inspect.getsource(engine_module)
    for trace in ("self.stats.", "perf_counter", "import time", "unsafe_early_free"):
        assert trace not in source
