"""Random workloads through the engine: no slot leaks, none is held twice, every request finishes
with the tokens a recompute generates -- for any pool that can hold each request alone.

Each example draws prompts that share prefixes (so the tree branches and requests duplicate
each other's work), budgets, stop tokens, a page size, a pool between "just enough for the
longest request" and roomy, a batch size, a manager and the overlap mode. After every step
``Engine.check`` proves that every slot is free, in the tree or held by one request, and runs
the manager's ``check_integrity``.
"""

from __future__ import annotations

from functools import cache

import pytest
from helpers import REPRODUCIBLE
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minikv.engine import EngineRequest, make_engine, recompute
from minikv.errors import IntegrityError
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
