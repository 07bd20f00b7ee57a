"""Random workloads through the engine: no slot leaks, none is held twice, every request finishes
with the tokens a recompute generates -- for any pool that can hold each request alone.

Each example draws prompts that share prefixes (so the tree branches and requests duplicate
each other's work), budgets, stop tokens, a page size, a pool between "just enough for the
longest request" and roomy, a batch size, a manager and the overlap mode. After every step
``Engine.check`` proves that every slot is free, in the tree or held by one request, and runs
the manager's ``check_integrity``.

Issue 25's class-level guards for the engine, below the workloads: every page size (1-64)
against every model length (1-256 positions) with prompts up to the model's limit, run to
completion and compared with ``recompute``; callers that overwrite their prompt buffer after
each ``submit``; and constructor arguments that do not fit the model, refused when the engine
is built with nothing changed.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from minikv import KVCacheLayout, MHAKVCache, NaiveCacheManager, PagePool, RadixCacheManager
from minikv.engine import Engine, EngineRequest, make_engine, recompute
from minikv.errors import ArgumentError, IntegrityError, MiniKVError
from minikv.tiny_model import TinyDecoder

VOCAB = 16
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@cache
def reference(prompt: tuple[int, ...], max_new: int, stops: tuple[int, ...]) -> list[int]:
    return recompute(MODEL, list(prompt), max_new, stops)


tokens = st.integers(0, VOCAB - 1)


@st.composite
def workloads(draw: st.DrawFn, tight: bool = False) -> dict[str, object]:
    """A workload; ``tight``: longer generations, a pool of at most a few pages more than the
    longest request needs, and at least two requests running at once, so decode runs dry."""
    prefixes = draw(st.lists(st.lists(tokens, max_size=12), min_size=1, max_size=2))
    requests = []
    for _ in range(draw(st.integers(2 if tight else 1, 5))):
        prefix = draw(st.sampled_from(prefixes))
        prompt = prefix + draw(st.lists(tokens, min_size=1, max_size=8))
        requests.append((tuple(prompt), draw(st.integers(4, 14) if tight else st.integers(1, 8))))
    page_size = draw(st.sampled_from([1, 2, 4]))
    manager = draw(st.sampled_from(["radix", "naive"])) if page_size == 1 else "radix"
    longest = max(len(p) + n - 1 for p, n in requests)
    fewest = -(-longest // page_size)  # pages for the longest request alone
    return {
        "requests": requests,
        "stops": tuple(draw(st.lists(tokens, max_size=2, unique=True))),
        "page_size": page_size,
        "manager": manager,
        "num_pages": draw(st.integers(fewest, fewest + (8 if tight else 24) // page_size)),
        "max_running": draw(st.integers(2 if tight else 1, 4)),
        "overlap": draw(st.booleans()),
        "insert_after_prefill": draw(st.booleans()),
    }


@settings(REPRODUCIBLE, max_examples=200)
@given(workloads())
def test_random_workloads_keep_every_slot_accounted_for(work: dict) -> None:
    run_and_check(work)


@settings(REPRODUCIBLE, max_examples=100)
@given(workloads(tight=True))
def test_random_workloads_under_memory_pressure(work: dict) -> None:
    run_and_check(work)


def run_and_check(work: dict) -> None:
    engine = make_engine(
        MODEL,
        work["num_pages"],
        work["page_size"],
        work["manager"],
        work["max_running"],
        work["overlap"],
        work["insert_after_prefill"],
    )
    requests = [engine.submit(EngineRequest(list(p), n, work["stops"])) for p, n in work["requests"]]
    steps = 0
    while engine.has_work():
        engine.step()
        engine.check()
        steps += 1
        assert steps < 500, "the engine stopped making progress"
    assert all(r.finished for r in requests)
    event("preempted" if engine.stats.preemptions else "no preemption")
    event("evicted" if engine.stats.evicted_slots else "no eviction")
    assert engine.cache.size_info.protected_size == 0
    assert engine.pool.num_free_slots + engine.cache.size_info.total_size == engine.pool.num_slots
    for request, (prompt, max_new) in zip(requests, work["requests"], strict=True):
        assert request.output == reference(prompt, max_new, work["stops"])


def test_check_finds_a_leaked_slot_and_a_slot_held_twice() -> None:
    engine = make_engine(MODEL, 16)
    engine.submit(EngineRequest([1, 2, 3, 4], 6))
    engine.step()
    engine.check()
    leaked = engine.pool.allocate(1)  # taken from the pool, held by nobody
    with pytest.raises(IntegrityError, match="slot accounting"):
        engine.check()
    engine.pool.free(leaked)
    engine.check()
    (request,) = engine.running
    engine.pool.free(engine.req_to_token[request.row, :1])  # free, and still held by the request
    with pytest.raises(IntegrityError, match="held twice"):
        engine.check()


# -- every page size against every model length ----------------------------------------------------


@cache
def model_of_length(max_positions: int) -> TinyDecoder:
    return TinyDecoder(
        vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4, max_positions=max_positions
    )


@cache
def reference_of_length(max_positions: int, prompt: tuple[int, ...], max_new: int) -> list[int]:
    return recompute(model_of_length(max_positions), list(prompt), max_new)


@st.composite
def fitting_configurations(draw: st.DrawFn) -> dict[str, object]:
    """A model length and a page size over their whole ranges, and requests up to the model's limit."""
    max_positions = draw(st.integers(1, 256))
    page_size = draw(st.integers(1, 64))
    requests = []
    for _ in range(draw(st.integers(1, 3))):
        max_new = draw(st.integers(1, min(4, max_positions)))
        longest_prompt = max_positions - max_new + 1  # prompt + max_new - 1 <= max_positions
        # Lengths near the limit are the interesting ones: whole pages past max_positions.
        length = draw(st.one_of(st.just(longest_prompt), st.integers(1, longest_prompt)))
        requests.append((tuple(draw(st.lists(tokens, min_size=length, max_size=length))), max_new))
    longest = max(len(p) + n - 1 for p, n in requests)
    fewest = -(-longest // page_size)
    return {
        "max_positions": max_positions,
        "page_size": page_size,
        "requests": requests,
        "num_pages": draw(st.integers(fewest, 2 * fewest + 1)),
        "max_running": draw(st.integers(1, 3)),
        "overlap": draw(st.booleans()),
    }


@settings(REPRODUCIBLE, max_examples=60)
@given(fitting_configurations())
def test_every_page_size_with_every_model_length_runs_to_completion(work: dict) -> None:
    model = model_of_length(work["max_positions"])
    engine = make_engine(
        model, work["num_pages"], work["page_size"], max_running=work["max_running"], overlap=work["overlap"]
    )
    requests = [engine.submit(EngineRequest(list(p), n)) for p, n in work["requests"]]
    steps = 0
    while engine.has_work():
        engine.step()
        engine.check()
        steps += 1
        assert steps < 2000, "the engine stopped making progress"
    event("page size divides neither max_positions nor max_positions + 1"
          if work["max_positions"] % work["page_size"] and (work["max_positions"] + 1) % work["page_size"]
          else "page size divides max_positions or max_positions + 1")  # fmt: skip
    assert engine.pool.num_free_slots + engine.cache.size_info.total_size == engine.pool.num_slots
    for request, (prompt, max_new) in zip(requests, work["requests"], strict=True):
        assert request.output == reference_of_length(work["max_positions"], prompt, max_new)


@settings(REPRODUCIBLE, max_examples=40)
@given(max_positions=st.integers(1, 256), page_size=st.integers(1, 64), extra=st.integers(1, 8), data=st.data())
def test_a_request_longer_than_the_model_is_refused_at_submit(
    max_positions: int, page_size: int, extra: int, data: st.DataObject
) -> None:
    engine = make_engine(model_of_length(max_positions), 2 * -(-(max_positions + 9) // page_size), page_size)
    max_new = data.draw(st.integers(1, 4))
    length = max_positions - max_new + 1 + extra  # one token or more past what fits
    free_before = engine.pool.num_free_slots
    with pytest.raises(ArgumentError, match="max_positions"):
        engine.submit(EngineRequest([1] * length, max_new))
    assert not engine.has_work() and engine.pool.num_free_slots == free_before


# -- callers that reuse their prompt buffers --------------------------------------------------------


@settings(REPRODUCIBLE, max_examples=60)
@given(workloads(), st.sampled_from(["tensor", "numpy"]))
def test_a_caller_that_reuses_its_prompt_buffer_gets_what_a_recompute_gives(work: dict, kind: str) -> None:
    """One buffer for every prompt, overwritten after each submit (and zeroed while the engine runs)."""
    engine = make_engine(MODEL, work["num_pages"], work["page_size"], work["manager"], work["max_running"],
                         work["overlap"], work["insert_after_prefill"])  # fmt: skip
    longest = max(len(p) for p, _ in work["requests"])
    buffer = torch.zeros(longest, dtype=torch.int64) if kind == "tensor" else np.zeros(longest, dtype=np.int64)
    requests = []
    for prompt, max_new in work["requests"]:
        buffer[: len(prompt)] = torch.tensor(prompt) if kind == "tensor" else np.array(prompt)
        requests.append(engine.submit(EngineRequest(buffer[: len(prompt)], max_new, work["stops"])))
    while engine.has_work():
        buffer[:] = 0
        engine.step()
        engine.check()
    for request, (prompt, max_new) in zip(requests, work["requests"], strict=True):
        assert request.prompt.tolist() == list(prompt)
        assert request.output == reference(prompt, max_new, work["stops"])


# -- constructor arguments that do not fit the model ------------------------------------------------


PARTS = ("layers", "kv_heads", "head_dim", "dtype", "storage_page", "pool_page", "cache_page", "storage_pages")


@st.composite
def engine_parts(draw: st.DrawFn) -> dict[str, object]:
    """Storage, pool and manager for MODEL (1 layer, 1 KV head of 8, float32), with some parts changed."""
    page, pages = draw(st.integers(1, 4)), draw(st.integers(2, 12))
    naive = page == 1 and draw(st.booleans())
    broken = draw(st.sets(st.sampled_from(PARTS), max_size=2))
    assume(not (naive and "cache_page" in broken))  # the naive manager has page size 1 only
    other_page = draw(st.sampled_from([p for p in range(1, 5) if p != page]))
    return {
        "layers": draw(st.sampled_from([2, 3])) if "layers" in broken else 1,
        "kv_heads": 2 if "kv_heads" in broken else 1,
        "head_dim": draw(st.sampled_from([4, 16])) if "head_dim" in broken else 8,
        "dtype": draw(st.sampled_from([torch.float16, torch.bfloat16])) if "dtype" in broken else torch.float32,
        "storage_page": other_page if "storage_page" in broken else page,
        "pool_page": page
        if "pool_page" not in broken
        else draw(st.sampled_from([p for p in range(1, 5) if p != page])),
        "cache_page": other_page if "cache_page" in broken else page,
        "storage_pages": pages + draw(st.integers(1, 3)) if "storage_pages" in broken else pages,
        "pool_pages": pages,
        "naive": naive,
        "broken": broken,
    }


@settings(REPRODUCIBLE, max_examples=80)
@given(engine_parts())
def test_engine_parts_that_do_not_fit_the_model_are_refused_when_it_is_built(parts: dict) -> None:
    """Anything but the model's shape, or parts whose pages disagree, is refused by the constructor
    with nothing changed; what is accepted serves a request to completion."""
    kv_cache = MHAKVCache(parts["kv_heads"], parts["layers"], parts["head_dim"], parts["storage_pages"], parts["dtype"],
                          KVCacheLayout.LayerFirst, "cpu", parts["storage_page"])  # fmt: skip
    pool = PagePool(parts["pool_pages"], parts["pool_page"])
    cache = NaiveCacheManager() if parts["naive"] else RadixCacheManager(page_size=parts["cache_page"])
    before = (pool.num_free_slots, pool.allocation_order(), cache.size_info, kv_cache.k_cache(0).clone())
    if parts["broken"]:
        event(f"refused: {len(parts['broken'])} parts changed")
        with pytest.raises(MiniKVError):
            Engine(MODEL, cache, pool, kv_cache)
        after = (pool.num_free_slots, pool.allocation_order(), cache.size_info, kv_cache.k_cache(0))
        assert after[:3] == before[:3] and torch.equal(after[3], before[3])
        return
    event("built")
    engine = Engine(MODEL, cache, pool, kv_cache)
    prompt = [1, 2, 3][: max(1, pool.num_slots - 1)]
    max_new = max(1, min(3, pool.num_slots - len(prompt) + 1))
    (output,) = engine.generate([prompt], max_new)
    engine.check()
    assert output == reference(tuple(prompt), max_new, ())
