"""Scheduling policies (minikv.scheduling): they reorder the waiting queue and nothing else.

* every policy generates exactly what ``recompute`` generates, on drawn workloads with shared
  prefixes, page sizes 1 and 4, arrivals spread over the run and tight pools that preempt;
* FCFS is the engine as it was before policies existed (``PreviousEngine`` below keeps that
  loop as the reference): same outputs, same counts in ``engine.stats``;
* longest-prefix-first computes fewer prompt tokens than FCFS when two prompts alternate;
* LPM starves a request that matches nothing while matching requests keep arriving; aging does not;
* asking for the match changes nothing in the tree;
* a bad policy is refused, naming ``policy``, with nothing changed.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch
from engine_workloads import MODEL, reference, serve, workloads
from helpers import REPRODUCIBLE
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager
from minikv.engine import Batch, Engine, EngineRequest, make_engine, recompute
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.scheduling import (
    FCFS,
    POLICIES,
    Aging,
    DFSWeight,
    LongestPrefixMatch,
    SchedulingPolicy,
    as_policy,
    cached_prefix_len,
)
from minikv.tiny_model import TinyDecoder

BIG = TinyDecoder(vocab_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=128)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class PreviousEngine(Engine):
    """The engine's admission loop as it was before policies: the waiting queue in arrival order."""

    def _schedule_prefill(self) -> Batch | None:
        admitted: list[EngineRequest] = []
        reserve = self.page_size * len(self.running)
        while self.waiting and len(self.running) < self.max_running and self._free_rows:
            request = self.waiting[0]
            if not self._admit(request, reserve):
                break
            self.waiting.popleft()
            self.running.append(request)
            admitted.append(request)
            reserve += self.page_size
        if not admitted:
            return None
        rows, cached = [r.row for r in admitted], [r.cached_len for r in admitted]
        for request in admitted:
            self._take_chunk(request, None)  # the whole prompt at once
        return Batch("prefill", admitted, rows, cached, [r.kv_len for r in admitted])


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads(), st.sampled_from(sorted(POLICIES)))
def test_every_policy_generates_what_recompute_generates(work: dict, name: str) -> None:
    policy = Aging(tokens_per_step=2) if name == "aging" else as_policy(name)
    engine, requests = serve(work, policy=policy)
    for request, (prompt, max_new, _) in zip(requests, work["requests"], strict=True):
        assert request is not None and request.finished
        assert request.output == reference(prompt, max_new, work["stops"])
    assert not engine.waiting and not engine.running


def counts(engine: Engine) -> dict:
    return {k: v for k, v in asdict(engine.stats).items() if not k.endswith("seconds")}


@settings(REPRODUCIBLE, max_examples=40)
@given(workloads())
def test_fcfs_is_the_engine_before_policies(work: dict) -> None:
    before, old = serve(work, PreviousEngine, policy="fcfs")
    after, new = serve(work, policy=FCFS())
    assert [r.output for r in new] == [r.output for r in old]
    assert [r.admissions for r in new] == [r.admissions for r in old]
    assert counts(after) == counts(before)


def two_alternating_prompts(n: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 32, 24), rng.integers(0, 32, 24)
    return [np.concatenate([(a, b)[i % 2], rng.integers(0, 32, 4)]) for i in range(n)]


def test_longest_prefix_match_computes_fewer_prompt_tokens_than_fcfs() -> None:
    # One request at a time on a pool with room for one system prompt: FCFS alternates the two
    # prompts, so each admission evicts the other; LPM serves every request of the cached one first.
    prompts = two_alternating_prompts()
    runs = {}
    for policy in ("fcfs", "lpm", "dfs-weight"):
        engine = make_engine(BIG, num_pages=40, max_running=1, policy=policy)
        outputs = engine.generate(prompts, 4)
        assert outputs == [recompute(BIG, p, 4) for p in prompts]
        runs[policy] = engine.stats.prefill_tokens
    assert runs["lpm"] < runs["fcfs"] and runs["dfs-weight"] < runs["fcfs"]
    assert runs["fcfs"] == 8 * 28  # every prompt computed whole


def starvation(policy: SchedulingPolicy, stream: int = 40) -> EngineRequest:
    """A request that matches nothing, submitted beside a stream of requests sharing a cached prompt.

    One request runs at a time; a new matching request arrives whenever fewer than two are waiting.
    Returns the lone request once everything has finished.
    """
    rng = np.random.default_rng(1)
    shared = rng.integers(0, 32, 24)
    engine = make_engine(BIG, num_pages=200, max_running=1, policy=policy)
    engine.submit(EngineRequest(np.concatenate([shared, [1]]), 2))
    lone = engine.submit(EngineRequest(rng.integers(0, 32, 8), 2))
    submitted = 1
    while engine.has_work():
        if submitted < stream and sum(r is not lone for r in engine.waiting) < 2:
            engine.submit(EngineRequest(np.concatenate([shared, [submitted % 32, 3]]), 2))
            submitted += 1
        engine.step()
    assert lone.output == recompute(BIG, lone.prompt, 2)
    return lone


def test_lpm_starves_a_request_and_aging_bounds_its_wait() -> None:
    starved = starvation(LongestPrefixMatch())
    assert starved.waited_steps >= 2 * 39  # it waits for the whole stream: two steps per request
    for tokens_per_step, bound in ((1, 24 + 4), (4, 24 // 4 + 4)):
        # Once it has waited 24 / tokens_per_step steps more than a newcomer it outranks every
        # match (24 tokens); then only the running request and an older waiting one go first.
        aged = starvation(Aging(tokens_per_step))
        assert aged.waited_steps <= bound < starved.waited_steps
    assert starvation(FCFS()).waited_steps <= 2


def test_the_policies_do_not_change_the_tree() -> None:
    engine = make_engine(BIG, num_pages=80, max_running=2)
    engine.generate(two_alternating_prompts(4), 3)
    tree = engine.cache
    assert isinstance(tree, RadixCacheManager)
    before = (tree.clock, tree.num_nodes, [(n.uid, n.timestamp, n.length) for n in tree.nodes()])
    waiting = [EngineRequest(p, 2) for p in two_alternating_prompts(6)]
    for i, request in enumerate(waiting):
        request.uid = i
    for policy in (FCFS(), LongestPrefixMatch(), DFSWeight(), Aging()):
        ordered = policy.order(waiting, tree)
        assert sorted(id(r) for r in ordered) == sorted(id(r) for r in waiting)
    assert cached_prefix_len(tree, waiting[0].token_ids) == 27  # served before: all but the last token
    assert (tree.clock, tree.num_nodes, [(n.uid, n.timestamp, n.length) for n in tree.nodes()]) == before


def test_dfs_weight_visits_the_heaviest_branch_first_and_unmatched_last() -> None:
    tree = RadixCacheManager()
    a, b = np.arange(1, 9), np.arange(10, 18)
    tree.insert_prefix(torch.from_numpy(a), torch.arange(8, dtype=torch.int32))
    tree.insert_prefix(torch.from_numpy(b), torch.arange(8, 16, dtype=torch.int32))
    prompts = [[20, 21], [*a, 30], [*b, 31], [*b, 32], [*a[:4], 33]]
    waiting = [EngineRequest(p, 1) for p in prompts]
    for i, request in enumerate(waiting):
        request.uid = i
    # b's subtree holds two requests, a's two (one filed inside it, at the node it stops in): tie,
    # the earliest arrival (uid 1, under a) goes first; the request that matches nothing comes last.
    assert [r.uid for r in DFSWeight().order(waiting, tree)] == [1, 4, 2, 3, 0]
    assert [r.uid for r in LongestPrefixMatch().order(waiting, tree)] == [1, 2, 3, 4, 0]
    waiting[0].waited_steps = 100
    assert Aging().order(waiting, tree)[0].uid == 0


def test_the_default_policy_is_fcfs_and_names_build_fresh_policies() -> None:
    engine = make_engine(MODEL, 16)
    assert isinstance(engine.policy, FCFS)
    assert isinstance(make_engine(MODEL, 16, policy="lpm").policy, LongestPrefixMatch)
    assert isinstance(make_engine(MODEL, 16, policy="dfs-weight").policy, DFSWeight)
    mine = Aging(3)
    assert make_engine(MODEL, 16, policy=mine).policy is mine


@pytest.mark.parametrize(
    ("policy", "error"),
    [("sjf", ArgumentError), ("LPM", ArgumentError), (3, ArgumentTypeError), (None, ArgumentTypeError),
     (LongestPrefixMatch, ArgumentTypeError), (object(), ArgumentTypeError)],
)  # fmt: skip
def test_a_bad_policy_is_refused_naming_it(policy: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="policy"):
        make_engine(MODEL, 16, policy=policy)  # type: ignore[arg-type]
    pool = PagePool(16, 1)
    kv = MHAKVCache(1, 1, 8, 16, torch.float32, KVCacheLayout.LayerFirst, "cpu")
    with pytest.raises(error, match="policy"):
        Engine(MODEL, RadixCacheManager(), pool, kv, policy=policy)  # type: ignore[arg-type]
    assert pool.num_free_slots == 16


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "2", True])
def test_aging_refuses_a_bad_rate(value: object) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match="tokens_per_step"):
        Aging(value)  # type: ignore[arg-type]


class Dropping(SchedulingPolicy):
    def order(self, waiting, cache):  # type: ignore[no-untyped-def]
        return list(waiting)[1:]


class Lazy(SchedulingPolicy):
    def order(self, waiting, cache):  # type: ignore[no-untyped-def]
        return reversed(waiting)


@pytest.mark.parametrize(("policy", "error"), [(Dropping(), ArgumentError), (Lazy(), ArgumentTypeError)])
def test_a_policy_that_loses_a_request_is_refused_and_the_queue_kept(
    policy: SchedulingPolicy, error: type[Exception]
) -> None:
    engine = make_engine(MODEL, 32, policy=policy)
    first = engine.submit(EngineRequest([1, 2, 3], 2))
    second = engine.submit(EngineRequest([4, 5], 2))
    with pytest.raises(error, match="policy"):
        engine.step()
    assert list(engine.waiting) == [first, second] and not engine.running
    engine.check()
