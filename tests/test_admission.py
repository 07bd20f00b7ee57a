"""Admission policies (minikv.admission): how much room the engine keeps for decode when it admits.

* every policy generates exactly what ``recompute`` generates, on drawn workloads with shared
  prefixes, page sizes 1 and 4, arrivals spread over the run and tight pools, ``check()`` after each step;
* Optimistic is the engine as it was before admission policies (``PreviousEngine`` keeps that
  loop as the reference): same outputs, same admissions, same counts in ``engine.stats``;
* FullReservation never preempts, on every drawn workload;
* on one fixed workload Optimistic preempts, FullReservation runs fewer requests at once and does not;
* Retraction's ratio decays while decode fits and is reset after a retraction;
* a bad admission policy is refused, naming ``admission``, with nothing changed.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from engine_workloads import MODEL, VOCAB, reference, serve, workloads
from helpers import REPRODUCIBLE
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager
from minikv.admission import (
    ADMISSIONS,
    AdmissionPolicy,
    FullReservation,
    Optimistic,
    Retraction,
    as_admission,
)
from minikv.engine import Batch, Engine, EngineRequest, make_engine
from minikv.errors import ArgumentError, ArgumentTypeError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class PreviousEngine(Engine):
    """The engine's admission loop as it was before admission policies: one page held back per running request."""

    def _schedule_prefill(self) -> Batch | None:
        admitted: list[EngineRequest] = []
        reserve = self.page_size * len(self.running)
        self._order_waiting()
        while self.waiting and len(self.running) < self.max_running and self._free_rows:
            request = self.waiting[0]
            if not self._admit(request, reserve):
                break
            self.waiting.popleft()
            self.running.append(request)
            admitted.append(request)
            reserve += self.page_size
        for request in self.waiting:
            request.waited_steps += 1
        if not admitted:
            return None
        rows, cached = [r.row for r in admitted], [r.cached_len for r in admitted]
        for request in admitted:
            self._take_chunk(request, None)  # the whole prompt at once
        return Batch("prefill", admitted, rows, cached, [r.kv_len for r in admitted])


def make(name: str) -> AdmissionPolicy:
    # A fast decay, so that the drawn workloads reach the minimum ratio and retract.
    return Retraction(0.5, 0.05, 0.1) if name == "retraction" else as_admission(name)


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads(vary_insert_after_prefill=True), st.sampled_from(sorted(ADMISSIONS)))
def test_every_admission_policy_generates_what_recompute_generates(work: dict, name: str) -> None:
    engine, requests = serve(work, admission=make(name))
    for request, (prompt, max_new, _) in zip(requests, work["requests"], strict=True):
        assert request is not None and request.finished
        assert request.output == reference(prompt, max_new, work["stops"])
    assert not engine.waiting and not engine.running
    if name == "full":
        assert engine.stats.preemptions == 0


def counts(engine: Engine) -> dict:
    return {k: v for k, v in asdict(engine.stats).items() if not k.endswith("seconds")}


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads(vary_insert_after_prefill=True))
def test_optimistic_is_the_engine_before_admission_policies(work: dict) -> None:
    before, old = serve(work, PreviousEngine, admission="optimistic")
    after, new = serve(work, admission=Optimistic())
    assert [r.output for r in new] == [r.output for r in old]
    assert [r.admissions for r in new] == [r.admissions for r in old]
    assert counts(after) == counts(before)


@settings(REPRODUCIBLE, max_examples=60)
@given(workloads(vary_insert_after_prefill=True))
def test_full_reservation_never_preempts(work: dict) -> None:
    engine, requests = serve(work, admission=FullReservation())
    assert engine.stats.preemptions == 0
    assert all(r is not None and r.num_preemptions == 0 for r in requests)


def fixed_workload(admission: AdmissionPolicy | str) -> tuple[Engine, int]:
    """Six 8-token prompts of their own, 12 new tokens each, on a pool with room for 60 slots.

    Returns the engine and the most requests that ran at once.
    """
    prompts = [[(7 * i + j) % VOCAB for j in range(8)] for i in range(6)]
    engine = make_engine(MODEL, num_pages=60, max_running=6, admission=admission)
    requests = [engine.submit(EngineRequest(p, 12)) for p in prompts]
    most = 0
    while engine.has_work():
        engine.step()
        engine.check()
        most = max(most, len(engine.running))
    assert [r.output for r in requests] == [reference(tuple(p), 12, ()) for p in prompts]
    return engine, most


def test_optimistic_preempts_where_full_reservation_admits_fewer_at_once() -> None:
    optimistic, most_optimistic = fixed_workload("optimistic")
    full, most_full = fixed_workload("full")
    assert optimistic.stats.preemptions > 0
    assert full.stats.preemptions == 0
    assert most_full < most_optimistic
    assert most_full == 60 // (8 + 12 - 1)  # each request reserves its whole 19 slots: three fit
    assert full.stats.prefill_tokens == 6 * 8  # nothing computed twice
    assert optimistic.stats.prefill_tokens > 6 * 8


def test_retraction_ratio_decays_to_its_minimum_and_resets_after_a_retraction() -> None:
    policy = Retraction(0.5, 0.2, 0.1)
    for expected in (0.4, 0.3, 0.2, 0.2):
        policy.decoded(0)
        assert policy.new_token_ratio == pytest.approx(expected)
    policy.decoded(2)
    assert policy.new_token_ratio == 0.5
    request = EngineRequest([1, 2, 3], 10)
    assert policy.reserve([], request, 1) == 5  # ceil(0.5 * (3 + 10 - 1 - 3))
    assert policy.reserve([], request, 4) == 4  # ceil(0.5 * (12 - 4)): whole pages


def test_retraction_admits_more_than_full_reservation_and_retracts() -> None:
    retraction, most = fixed_workload(Retraction(0.3, 0.1, 0.05))
    _, most_full = fixed_workload("full")
    assert most > most_full
    assert retraction.stats.preemptions > 0


def test_as_admission_builds_each_policy_by_name() -> None:
    assert isinstance(as_admission("optimistic"), Optimistic)
    assert isinstance(as_admission("full"), FullReservation)
    assert isinstance(as_admission("retraction"), Retraction)
    policy = Retraction()
    assert as_admission(policy) is policy
    assert make_engine(MODEL, 16).admission.name == "optimistic"


@pytest.mark.parametrize(
    ("admission", "error"),
    [("greedy", ArgumentError), (3, ArgumentTypeError), (None, ArgumentTypeError), (Optimistic, ArgumentTypeError)],
)
def test_a_bad_admission_policy_is_refused_naming_admission(admission: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="admission"):
        make_engine(MODEL, 16, admission=admission)  # type: ignore[arg-type]
    cache, pool = RadixCacheManager(MODEL.device), PagePool(16, 1, MODEL.device)
    kv = MHAKVCache(1, 1, 8, 16, torch.float32, KVCacheLayout.LayerFirst, MODEL.device)
    tree_before, free_before = cache.size_info, pool.num_free_slots
    with pytest.raises(error, match="admission"):
        Engine(MODEL, cache, pool, kv, admission=admission)  # type: ignore[arg-type]
    assert cache.size_info == tree_before and pool.num_free_slots == free_before


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"init_new_token_ratio": 0}, "init_new_token_ratio"),
        ({"init_new_token_ratio": 1.5}, "init_new_token_ratio"),
        ({"min_new_token_ratio": float("nan")}, "min_new_token_ratio"),
        ({"init_new_token_ratio": 0.2, "min_new_token_ratio": 0.5}, "min_new_token_ratio"),
        ({"new_token_ratio_decay": -0.1}, "new_token_ratio_decay"),
        ({"new_token_ratio_decay": "fast"}, "new_token_ratio_decay"),
        ({"init_new_token_ratio": True}, "init_new_token_ratio"),
    ],
)
def test_retraction_refuses_bad_ratios(kwargs: dict, name: str) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match=name):
        Retraction(**kwargs)
