"""``LifecycleEngine``: the engine admitting and releasing requests with exercise 2's ``admit`` and ``finish``.

* with exercise 2's solutions (written here as a learner writes them) and with minikv's own
  (the defaults), on drawn workloads (shared prefixes, page sizes 1 and 4, arrivals spread
  over the run, tight pools, overlap, chunked prefill), every request generates what
  ``recompute`` generates, ``check()`` passes after every step, and the run is the plain
  engine's: the same admissions and the same counts;
* the functions are really called: once per admission, once per release;
* a wrong answer from ``admit`` is refused naming ``admit``; a function that is not callable,
  or an ``engine_class`` that is no ``LifecycleEngine``, is refused by name before anything is built.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import torch
from engine_workloads import reference, serve, workloads
from helpers import REPRODUCIBLE
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv.engine import EarlyFreeEngine, Engine, EngineRequest, make_engine, recompute
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.lifecycle import slots_to_free
from minikv.lifecycle_engine import LifecycleEngine, as_lifecycle, lifecycle_admit, lifecycle_finish
from minikv.tiny_model import TinyDecoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Exercise2:
    """Exercise 2's solutions of ``admit`` and ``finish``, counting their calls."""

    def __init__(self) -> None:
        self.admitted = 0
        self.finished = 0
        self.finished_lengths: list[int] = []

    def admit(self, manager: Any, pool: Any, input_ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        self.admitted += 1
        handle, matched = manager.match_prefix(input_ids[:-1])
        manager.lock_handle(handle)
        try:
            new_slots = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
        except Exception:
            manager.lock_handle(handle, unlock=True)
            raise
        return handle, torch.cat([matched, new_slots])

    def finish(self, manager: Any, pool: Any, input_ids: torch.Tensor, handle: Any, indices: torch.Tensor) -> int:
        self.finished += 1
        self.finished_lengths.append(len(input_ids))
        already_cached = manager.insert_prefix(input_ids, indices)
        pool.free(slots_to_free(indices, handle.cached_len, already_cached, manager.page_size))
        manager.lock_handle(handle, unlock=True)
        return already_cached


def counts(engine: Engine) -> dict:
    return {k: v for k, v in asdict(engine.stats).items() if not k.endswith("seconds")}


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads(vary_insert_after_prefill=True), st.sampled_from([None, 3]), st.booleans())
def test_the_engine_on_exercise_2s_functions_is_the_engine(work: dict, budget: int | None, learner: bool) -> None:
    functions = Exercise2()
    lifecycle = {"admit": functions.admit, "finish": functions.finish} if learner else {}
    engine, requests = serve(work, LifecycleEngine, prefill_budget=budget, **lifecycle)  # check() every step
    plain, expected = serve(work, prefill_budget=budget)
    assert isinstance(engine, LifecycleEngine)
    for request, (prompt, max_new, _) in zip(requests, work["requests"], strict=True):
        assert request is not None and request.finished
        assert request.output == reference(prompt, max_new, work["stops"])
    assert [r.output for r in requests] == [r.output for r in expected]
    assert [r.admissions for r in requests] == [r.admissions for r in expected]
    assert counts(engine) == counts(plain)
    assert engine.pool.num_free_slots == plain.pool.num_free_slots
    if learner:  # every admission (a preempted request is admitted again) and every release
        admissions = sum(len(r.admissions) for r in requests)
        assert functions.admitted == functions.finished == admissions


@pytest.mark.parametrize("page_size", [1, 4])
def test_make_engine_with_admit_and_finish_builds_a_lifecycle_engine(page_size: int) -> None:
    model = TinyDecoder(seed=0)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9], [8, 8, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    functions = Exercise2()
    # A tight pool: the newest request is preempted, its finish called, and it is admitted again.
    engine = make_engine(
        model, num_pages=20 // page_size, page_size=page_size, max_running=3,
        admit=functions.admit, finish=functions.finish,
    )  # fmt: skip
    assert type(engine) is LifecycleEngine
    assert (engine.admit_fn, engine.finish_fn) == (functions.admit, functions.finish)
    requests = [engine.submit(EngineRequest(p, 8)) for p in prompts]
    while engine.has_work():
        engine.step()
        engine.check()
    assert [r.output for r in requests] == [recompute(model, p, 8) for p in prompts]
    assert engine.stats.preemptions > 0
    assert functions.admitted == functions.finished == len(prompts) + engine.stats.preemptions


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_preempted_mid_prompt_finishes_what_it_computed_and_the_engine_frees_the_rest(
    overlap: bool,
) -> None:
    model = TinyDecoder(seed=0)
    functions = Exercise2()
    engine = make_engine(
        model, num_pages=5, page_size=4, max_running=3, prefill_budget=1, overlap=overlap,
        admit=functions.admit, finish=functions.finish,
    )  # fmt: skip
    short, long = [1, 2], list(range(3, 13))
    requests = [engine.submit(EngineRequest(short, 14)), engine.submit(EngineRequest(long, 2))]
    while engine.has_work():
        engine.step()
        engine.check()  # the pages reserved for the prompt and never written are back in the pool
    # The first release is the long prompt's preemption after 6 of its 10 tokens (its row held
    # 3 pages): finish got those 6, and the engine freed the third page, never written.
    assert engine.stats.preemptions == 1 and requests[1].admissions == [0, 4]
    assert functions.finished_lengths[0] == 6
    assert [r.output for r in requests] == [recompute(model, short, 14), recompute(model, long, 2)]


def test_the_defaults_are_minikvs_lifecycle() -> None:
    assert as_lifecycle(None, None) == (lifecycle_admit, lifecycle_finish)
    engine = make_engine(TinyDecoder(), num_pages=16, engine_class=LifecycleEngine)
    assert (engine.admit_fn, engine.finish_fn) == (lifecycle_admit, lifecycle_finish)  # type: ignore[attr-defined]
    only_admit = make_engine(TinyDecoder(), num_pages=16, admit=Exercise2().admit)
    assert only_admit.finish_fn is lifecycle_finish  # type: ignore[attr-defined]


@pytest.mark.parametrize("which", ["admit", "finish"])
@pytest.mark.parametrize("bad", [42, "admit", [None]], ids=["int", "str", "list"])
def test_a_function_that_is_not_callable_is_refused_by_name(which: str, bad: object) -> None:
    with pytest.raises(ArgumentTypeError, match=f"{which} must be None or a function"):
        make_engine(TinyDecoder(), num_pages=16, **{which: bad})  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=f"{which} must be None or a function"):
        as_lifecycle(**{"admit": None, "finish": None, which: bad})
    built = make_engine(TinyDecoder(), num_pages=16)
    with pytest.raises(ArgumentTypeError, match=f"{which} must be None or a function"):
        LifecycleEngine(built.model, built.cache, built.pool, built.kv_cache, **{which: bad})  # type: ignore[arg-type]
    assert built.pool.num_free_slots == 16 and built.cache.size_info.total_size == 0


def test_another_engine_class_is_refused_by_name() -> None:
    with pytest.raises(ArgumentError, match="engine_class: admit and finish drive a LifecycleEngine, got EarlyFree"):
        make_engine(TinyDecoder(), num_pages=16, engine_class=EarlyFreeEngine, admit=Exercise2().admit)


def wrong_answers() -> list[tuple[str, Any, type[Exception], str]]:
    def whole_prompt(manager: Any, pool: Any, input_ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        handle, matched = manager.match_prefix(input_ids)  # the notes' match: nothing left to compute
        manager.lock_handle(handle)
        new_slots = pool.allocate(len(input_ids) - handle.cached_len, evict_from=manager)
        return handle, torch.cat([matched, new_slots])

    def slots_only(manager: Any, pool: Any, input_ids: torch.Tensor) -> torch.Tensor:
        return Exercise2().admit(manager, pool, input_ids)[1]

    def one_slot_short(manager: Any, pool: Any, input_ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        handle, indices = Exercise2().admit(manager, pool, input_ids)
        return handle, indices[:-1]

    def a_list(manager: Any, pool: Any, input_ids: torch.Tensor) -> tuple[Any, list[int]]:
        handle, indices = Exercise2().admit(manager, pool, input_ids)
        return handle, indices.tolist()

    return [
        ("whole prompt", whole_prompt, ArgumentError, "admit: matched all 4 tokens"),
        ("slots only", slots_only, ArgumentTypeError, r"admit must return \(handle, indices\), got Tensor"),
        ("one slot short", one_slot_short, ArgumentError, r"admit: indices must be 1-D with one slot per token \(4\)"),
        ("a list", a_list, ArgumentTypeError, "admit: indices must be a tensor, got list"),
    ]


@pytest.mark.parametrize("case", wrong_answers(), ids=lambda c: c[0])
def test_a_wrong_answer_from_admit_is_refused_naming_admit(case: tuple) -> None:
    _, admit, error, message = case
    engine = make_engine(TinyDecoder(), num_pages=16, max_running=1, admit=admit)
    # The second request's whole prompt is cached by the time it is admitted: the whole-prompt match takes it all.
    with pytest.raises(error, match=message):
        engine.generate([[5, 6, 7, 8], [5, 6, 7, 8]], 2)
