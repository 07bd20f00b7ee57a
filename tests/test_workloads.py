"""Workload generators: deterministic, well-shaped, and the offline optimum is right."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv import PagePool, RadixCacheManager, serve
from minikv.course.workloads import few_shot, multi_turn_chat, offline_optimal_hits, shared_system_prompt, total_tokens
from minikv.errors import ArgumentError, ArgumentTypeError

GENERATORS = {
    "shared_system_prompt": lambda seed: shared_system_prompt(40, seed=seed),
    "multi_turn_chat": lambda seed: multi_turn_chat(6, turns=4, seed=seed),
    "few_shot": lambda seed: few_shot(40, seed=seed),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_same_seed_same_requests_other_seed_other_requests(name: str) -> None:
    make = GENERATORS[name]
    first, again, other = make(1), make(1), make(2)
    assert len(first) == len(again)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(len(a) != len(b) or not np.array_equal(a, b) for a, b in zip(first, other, strict=False))


@pytest.mark.parametrize("name", GENERATORS)
def test_requests_are_1d_int64_token_ids_in_vocab(name: str) -> None:
    for request in GENERATORS[name](0):
        assert isinstance(request, np.ndarray)
        assert request.dtype == np.int64 and request.ndim == 1 and len(request) > 0
        assert request.min() >= 0 and request.max() < 32000


def test_shared_system_prompt_shape_and_cacheable_share() -> None:
    requests = shared_system_prompt(200, num_prompts=4, prompt_len=480, question_len=(96, 144))
    assert len(requests) == 200
    assert all(576 <= len(r) <= 624 for r in requests)
    heads = {r[:480].tobytes() for r in requests}
    assert len(heads) == 4
    hits = offline_optimal_hits(requests)
    share = sum(hits) / total_tokens(requests)
    assert 0.75 < share < 0.81  # 480 of ~600 tokens, minus the first sight of each prompt


def test_multi_turn_each_turn_extends_the_previous_one() -> None:
    requests = multi_turn_chat(5, turns=4, system_len=30, user_len=10, answer_len=(5, 15), seed=3)
    assert len(requests) == 20
    system = requests[0][:30]
    assert all(np.array_equal(r[:30], system) for r in requests)
    # Rebuild the conversations: each request extends exactly one earlier "open" conversation, or starts one.
    open_ends: list[np.ndarray] = []
    for r in requests:
        parents = [i for i, prev in enumerate(open_ends) if len(prev) < len(r) and np.array_equal(r[: len(prev)], prev)]
        if parents:
            (i,) = parents
            assert 10 + 5 <= len(r) - len(open_ends[i]) <= 10 + 15  # answer + user message
            open_ends[i] = r
        else:
            assert len(r) == 30 + 10
            open_ends.append(r)
    assert len(open_ends) == 5


def test_multi_turn_interleaves_conversations() -> None:
    requests = multi_turn_chat(4, turns=5, system_len=0, user_len=8, answer_len=8, seed=0)
    firsts = [i for i, r in enumerate(requests) if len(r) == 8]
    assert len(firsts) == 4
    assert firsts != [0, 5, 10, 15]  # not one whole conversation after another
    assert firsts != [0, 1, 2, 3]  # nor a fixed round-robin


def test_few_shot_structure() -> None:
    requests = few_shot(30, num_templates=2, template_len=10, num_examples=4, shots=2, example_len=7, question_len=5)
    assert all(len(r) == 10 + 2 * 7 + 5 for r in requests)
    assert len({r[:10].tobytes() for r in requests}) == 2
    example_blocks = {r[10:17].tobytes() for r in requests} | {r[17:24].tobytes() for r in requests}
    assert len(example_blocks) == 4
    assert all(r[10:17].tobytes() != r[17:24].tobytes() for r in requests)  # distinct examples per request


def test_offline_optimum_on_a_hand_made_example() -> None:
    requests = [
        np.array([1, 2, 3, 4, 5]),
        np.array([1, 2, 3, 9]),  # shares 3 with request 0
        np.array([7, 7]),  # shares nothing
        np.array([1, 2, 3, 9, 9, 9]),  # shares 4 with request 1 (only 3 with request 0)
        np.array([1, 2, 3, 4, 5]),  # identical to request 0
        np.array([1, 2]),  # a prefix of earlier requests
        np.array([7, 8]),  # shares 1 with request 2
    ]
    assert offline_optimal_hits(requests) == [0, 3, 0, 4, 5, 2, 1]
    assert offline_optimal_hits(requests, page_size=2) == [0, 2, 0, 4, 4, 2, 0]
    assert offline_optimal_hits(requests, page_size=4) == [0, 0, 0, 4, 4, 0, 0]
    assert offline_optimal_hits([]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), max_size=12), st.integers(1, 3))
def test_offline_optimum_matches_brute_force(raw: list[list[int]], page_size: int) -> None:
    requests = [np.array(r, dtype=np.int64) for r in raw]

    def lcp(a: np.ndarray, b: np.ndarray) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    expected = [max((lcp(r, e) for e in requests[:i]), default=0) for i, r in enumerate(requests)]
    assert offline_optimal_hits(requests, page_size) == [h - h % page_size for h in expected]


def test_radix_cache_without_eviction_reaches_the_offline_optimum() -> None:
    requests = few_shot(60, num_templates=2, num_examples=4, shots=2, seed=5)
    manager, pool = RadixCacheManager(), PagePool(total_tokens(requests))
    hits = [serve(manager, pool, r).cached_len for r in requests]
    assert hits == offline_optimal_hits(requests)


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [
        (lambda: shared_system_prompt(-1), ArgumentError, "num_requests"),
        (lambda: shared_system_prompt(5, num_prompts=0), ArgumentError, "num_prompts"),
        (lambda: shared_system_prompt(5, question_len=(9, 3)), ArgumentError, "question_len"),
        (lambda: shared_system_prompt(5, vocab_size=1), ArgumentError, "vocab_size"),
        (lambda: shared_system_prompt(5, seed=1.5), ArgumentTypeError, "seed"),
        (lambda: multi_turn_chat(3, user_len=0), ArgumentError, "user_len"),
        (lambda: multi_turn_chat(3, turns=0), ArgumentError, "turns"),
        (lambda: few_shot(3, num_examples=2, shots=3), ArgumentError, "shots"),
        (lambda: offline_optimal_hits([np.array([1])], page_size=0), ArgumentError, "page_size"),
        (lambda: offline_optimal_hits([np.array([1.0])]), ArgumentTypeError, "requests[0]"),
        (lambda: offline_optimal_hits(np.zeros((2, 2), dtype=np.int64)), ArgumentTypeError, "requests"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(call, error: type[Exception], argument: str) -> None:
    with pytest.raises(error, match=argument.replace("[", r"\[").replace("]", r"\]")):
        call()
