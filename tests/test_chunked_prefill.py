"""Chunked prefill (``Engine(prefill_budget=N)``): a prompt computed over several steps beside decode.

The property: for any budget, page size, scheduling and admission policy, overlap or not, and
pool (roomy or tight enough to preempt mid-prompt), every request generates what ``recompute``
generates, each step computes at most the budget's prompt tokens, and ``Engine.check`` holds
after every step. Then the
pieces one by one: the pages of a finished chunk are in the tree (locked by the request) before
the prompt is done; a prompt prefilled twice at once has its duplicate pages freed and its row
remapped; a request preempted mid-prompt resumes from its inserted chunks; the steps of each token
give time to first token and the gaps; bad budgets are refused, naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from helpers import REPRODUCIBLE
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minikv.admission import ADMISSIONS
from minikv.engine import Batch, Engine, EngineRequest, make_engine, recompute
from minikv.errors import ArgumentError, ArgumentTypeError, IntegrityError
from minikv.scheduling import POLICIES
from minikv.tiny_model import TinyDecoder

VOCAB = 16
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

tokens = st.integers(0, VOCAB - 1)


@cache
def reference(prompt: tuple[int, ...], max_new: int, stops: tuple[int, ...]) -> list[int]:
    return recompute(MODEL, list(prompt), max_new, stops)


@st.composite
def workloads(draw: st.DrawFn, tight: bool = False) -> dict:
    """Long and short prompts over shared prefixes, arriving over the first steps, a budget, any policies.

    ``tight``: longer generations, at least two running, and a pool of at most a few pages more
    than the longest request needs, so decode runs dry and preempts (a prompt mid-chunk too).
    """
    prefixes = draw(st.lists(st.lists(tokens, max_size=20), min_size=1, max_size=2))
    requests = []
    for _ in range(draw(st.integers(2 if tight else 1, 5))):
        prompt = draw(st.sampled_from(prefixes)) + draw(st.lists(tokens, min_size=1, max_size=12))
        new = draw(st.integers(4, 14) if tight else st.integers(1, 10))
        requests.append((tuple(prompt), new, draw(st.integers(0, 6))))
    page_size = draw(st.sampled_from([1, 2, 4]))
    manager = draw(st.sampled_from(["radix", "naive"])) if page_size == 1 else "radix"
    fewest = -(-max(len(p) + n - 1 for p, n, _ in requests) // page_size)
    return {
        "requests": requests,  # (prompt, max_new_tokens, arrival step)
        "stops": tuple(draw(st.lists(tokens, max_size=2, unique=True))),
        "page_size": page_size,
        "manager": manager,
        "num_pages": draw(st.integers(fewest, fewest + (8 if tight else 16) // page_size)),
        "max_running": draw(st.integers(2 if tight else 1, 4)),
        "insert_after_prefill": draw(st.booleans()),
        "policy": draw(st.sampled_from(sorted(POLICIES))),
        "admission": draw(st.sampled_from(sorted(ADMISSIONS))),
        "budget": draw(st.integers(1, 12)),
        "overlap": draw(st.booleans()),
    }


def serve(work: dict, budget: int | None) -> tuple[Engine, list[EngineRequest], list[Step]]:
    """Submit each request at its arrival step and step to the end, checking the engine after every step."""
    engine = make_engine(
        MODEL, work["num_pages"], work["page_size"], work["manager"], work["max_running"],
        insert_after_prefill=work["insert_after_prefill"], policy=work["policy"], admission=work["admission"],
        prefill_budget=budget, overlap=work["overlap"],
    )  # fmt: skip
    arrivals = sorted(enumerate(work["requests"]), key=lambda item: (item[1][2], item[0]))
    requests: list[EngineRequest] = [EngineRequest(list(p), n, work["stops"]) for p, n, _ in work["requests"]]
    batches: list[Step] = []
    step = 0
    while arrivals or engine.has_work():
        while arrivals and arrivals[0][1][2] <= step:
            engine.submit(requests[arrivals.pop(0)[0]])
        batch = engine.step()
        engine.check()
        if batch is not None:
            batches.append(Step.of(batch))
        step += 1
        assert step < 2000, "the engine stopped making progress"
    return engine, requests, batches


@dataclass
class Step:
    """What one step ran, read right after it (a request's ``prefill_len`` changes if it is readmitted)."""

    kind: str
    prefill_tokens: int
    every_prefill_gives_a_token: bool

    @staticmethod
    def of(batch: Batch) -> Step:
        prefills = [b for b in (batch.parts or (batch,)) if b.kind == "prefill"]
        return Step(
            batch.kind,
            sum(sum(b.ends) - sum(b.starts) for b in prefills),
            all(b.gives_token(i) for b in prefills for i in range(len(b.requests))),
        )


@settings(REPRODUCIBLE, max_examples=200)
@given(workloads())
def test_chunked_prefill_generates_what_recompute_generates(work: dict) -> None:
    serve_and_check(work)


@settings(REPRODUCIBLE, max_examples=150)
@given(workloads(tight=True))
def test_chunked_prefill_under_memory_pressure(work: dict) -> None:
    serve_and_check(work)


def serve_and_check(work: dict) -> None:
    engine, requests, batches = serve(work, work["budget"])
    for request, (prompt, max_new, _) in zip(requests, work["requests"], strict=True):
        assert request.finished
        assert request.output == reference(prompt, max_new, work["stops"])
    assert all(step.prefill_tokens <= work["budget"] for step in batches)
    assert engine.cache.size_info.protected_size == 0
    assert engine.pool.num_free_slots + engine.cache.size_info.total_size == engine.pool.num_slots
    # The clock of each request: one step recorded per token, the first after it arrived.
    for request in requests:
        steps = engine.stats.requests[request.uid]
        assert len(steps.token_steps) == len(request.output)
        assert steps.token_steps == sorted(steps.token_steps) and steps.time_to_first_token >= 1
    event("mixed step" if any(b.kind == "mixed" for b in batches) else "no mixed step")
    event("preempted" if engine.stats.preemptions else "no preemption")
    event("overlap" if work["overlap"] else "no overlap")
    admissions = sum(len(r.admissions) for r in requests)
    event("prompts in chunks" if engine.stats.prefill_batches > admissions else "every prompt whole")


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads())
def test_without_a_budget_every_prompt_is_prefilled_whole_in_a_step_of_its_own(work: dict) -> None:
    _, requests, batches = serve(work, None)
    assert all(step.kind in ("prefill", "decode") for step in batches)
    assert all(step.every_prefill_gives_a_token for step in batches)
    for request, (prompt, max_new, _) in zip(requests, work["requests"], strict=True):
        assert request.output == reference(prompt, max_new, work["stops"])


def long_and_short(budget: int | None, page_size: int = 4) -> tuple[Engine, EngineRequest, EngineRequest]:
    """A short request decoding when a 40-token prompt arrives at step 2."""
    rng = np.random.default_rng(3)
    engine = make_engine(MODEL, num_pages=64 // page_size, page_size=page_size, prefill_budget=budget)
    short = engine.submit(EngineRequest(rng.integers(0, VOCAB, 4), 12))
    engine.step()
    long = engine.submit(EngineRequest(rng.integers(0, VOCAB, 40), 3))
    return engine, short, long


def test_a_long_prompt_is_prefilled_over_several_steps_beside_decode() -> None:
    engine, short, long = long_and_short(budget=8)
    kinds = []
    for _ in range(5):
        batch = engine.step()
        assert batch is not None
        kinds.append(batch.kind)
        engine.check()
        assert long in batch.requests and short in batch.requests
    assert kinds == ["mixed"] * 5
    assert long.kv_len == 40 and len(long.output) == 1  # 5 chunks of 8; only the last one gave a token
    assert len(short.output) == 1 + 5  # a token every step, the long prompt notwithstanding
    engine.run()
    assert long.output == recompute(MODEL, long.prompt, 3) and short.output == recompute(MODEL, short.prompt, 12)


def test_each_finished_chunk_is_in_the_tree_locked_by_its_request() -> None:
    engine, _, long = long_and_short(budget=10, page_size=4)
    engine.step()  # tokens 0-9: two whole pages go into the tree, the half page stays the request's
    assert long.cached_len == 8 and long.prefilling
    assert engine.cache.size_info.protected_size == 4 + 8  # the short prompt's page and the chunk's two
    engine.step()  # tokens 10-19
    assert long.cached_len == 20 and long.prefilling
    assert engine.cache.size_info.protected_size == 4 + 20
    assert engine.cache.size_info.evictable_size == 0  # locked by the request: eviction cannot take them


def test_a_request_arriving_mid_prompt_matches_the_chunks_inserted_so_far() -> None:
    engine, _, long = long_and_short(budget=12, page_size=4)
    engine.step()  # 0-11
    engine.step()  # 12-23
    twin = engine.submit(EngineRequest(long.prompt, 2))
    engine.step()  # 24-35: the budget is spent on the long prompt, the twin waits
    assert twin.admissions == []
    engine.step()  # 36-39, then the twin, with the 8 tokens of budget left
    assert twin.admissions == [36]  # what the long prompt's chunks had inserted
    engine.run()
    assert twin.output == recompute(MODEL, long.prompt, 2)


def test_a_prompt_prefilled_twice_at_once_frees_its_duplicate_pages_and_remaps_its_row() -> None:
    prompt = np.random.default_rng(5).integers(0, VOCAB, 16)
    engine = make_engine(MODEL, num_pages=20, page_size=4, prefill_budget=32)
    first, second = (engine.submit(EngineRequest(prompt, 3)) for _ in range(2))
    engine.step()  # both admitted with nothing cached; the first inserts its pages, the second finds them
    engine.check()
    assert engine.stats.duplicate_tokens == 16
    assert first.cached_len == second.cached_len == 16
    assert engine.req_to_token[second.row, :16].tolist() == engine.req_to_token[first.row, :16].tolist()
    engine.run()
    assert first.output == second.output == recompute(MODEL, prompt, 3)


def test_a_request_preempted_mid_prompt_resumes_from_its_inserted_chunks() -> None:
    rng = np.random.default_rng(7)
    # Two decoders that grow until the pool is short, and a long prompt admitted last: the newest goes.
    engine = make_engine(MODEL, num_pages=15, page_size=4, max_running=3, prefill_budget=4)
    decoders = [engine.submit(EngineRequest(rng.integers(0, VOCAB, 5), 20)) for _ in range(2)]
    engine.step()
    long = engine.submit(EngineRequest(rng.integers(0, VOCAB, 32), 2))
    preempted_while_prefilling = False
    while engine.has_work():
        was_prefilling = long.prefilling
        before = long.num_preemptions
        engine.step()
        engine.check()
        preempted_while_prefilling |= was_prefilling and long.num_preemptions > before
    assert preempted_while_prefilling
    assert long.admissions == [0, 12]  # it matched the chunks it had computed
    assert long.output == recompute(MODEL, long.prompt, 2)
    assert all(d.output == recompute(MODEL, d.prompt, 20) for d in decoders)


def test_check_finds_a_chunk_counted_beyond_the_request_slots() -> None:
    engine, _, long = long_and_short(budget=8)
    engine.step()
    engine.check()
    long.kv_len = long.num_slots + 1  # a chunk scheduled past the pages admission allocated
    with pytest.raises(IntegrityError, match="request bookkeeping"):
        engine.check()
    long.kv_len = long.cached_len - 1  # computed less than what the tree already holds for it
    with pytest.raises(IntegrityError, match="request bookkeeping"):
        engine.check()


def test_time_to_first_token_and_inter_token_gaps_in_steps() -> None:
    whole, short_w, long_w = long_and_short(budget=None)
    whole.run()
    chunked, short_c, long_c = long_and_short(budget=8)
    chunked.run()
    assert short_w.output == short_c.output and long_w.output == long_c.output
    w, c = whole.stats.requests, chunked.stats.requests
    assert w[short_w.uid].time_to_first_token == c[short_c.uid].time_to_first_token == 1
    assert w[long_w.uid].time_to_first_token == 1  # submitted after step 1, prefilled whole in step 2
    assert c[long_c.uid].time_to_first_token == 5  # five chunks of 8 tokens
    assert max(w[short_w.uid].inter_token_gaps) == 2  # the decoder waits one step for the prefill
    assert max(c[short_c.uid].inter_token_gaps) == 1  # it decodes beside the chunks
    assert max(whole.stats.inter_token_gaps()) == 2 and max(chunked.stats.inter_token_gaps()) == 1
    assert sorted(whole.stats.times_to_first_token()) == [1, 1]


@pytest.mark.parametrize(
    ("budget", "error"), [(0, ArgumentError), (-3, ArgumentError), (2.5, ArgumentTypeError), (True, ArgumentTypeError),
                          ("8", ArgumentTypeError)],
)  # fmt: skip
def test_a_bad_budget_is_refused_naming_it(budget: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="prefill_budget"):
        make_engine(MODEL, num_pages=16, prefill_budget=budget)  # type: ignore[arg-type]
    engine = make_engine(MODEL, num_pages=16)
    with pytest.raises(error, match="prefill_budget"):
        Engine(MODEL, engine.cache, engine.pool, engine.kv_cache, prefill_budget=budget)  # type: ignore[arg-type]
    assert engine.pool.num_free_slots == 16 and engine.cache.size_info.total_size == 0


def test_chunks_run_one_step_ahead_with_overlap() -> None:
    rng = np.random.default_rng(3)
    engine = make_engine(MODEL, num_pages=16, page_size=4, overlap=True, prefill_budget=8)
    short = engine.submit(EngineRequest(rng.integers(0, VOCAB, 4), 12))
    engine.step()
    long = engine.submit(EngineRequest(rng.integers(0, VOCAB, 40), 3))
    for _ in range(5):
        engine.step()
        engine.check()
    assert long.kv_len == 40 and long.output == []  # five chunks launched; the last one is still in flight
    engine.step()
    assert len(long.output) == 1
    engine.run()
    assert long.output == recompute(MODEL, long.prompt, 3) and short.output == recompute(MODEL, short.prompt, 12)
