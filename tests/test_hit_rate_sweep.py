"""minikv.course.workloads.replay_hit_rate / hit_rate_sweep and minikv.viz.plot_hit_rate_sweep."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib.figure import Figure

from minikv import PagePool, RadixCacheManager, serve
from minikv.course.workloads import (
    ReplayResult,
    few_shot,
    hit_rate_sweep,
    multi_turn_chat,
    offline_optimal_hits,
    replay_hit_rate,
    shared_system_prompt,
    smallest_pool,
    total_tokens,
)
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.viz import plot_hit_rate_sweep


def small_stream() -> list[np.ndarray]:
    return shared_system_prompt(40, num_prompts=3, prompt_len=30, question_len=(5, 12), seed=2)


def test_smallest_pool_is_the_longest_request_in_whole_pages() -> None:
    requests = [np.arange(5), np.arange(9), np.arange(3)]
    assert smallest_pool(requests) == 9
    assert smallest_pool(requests, page_size=4) == 12
    assert smallest_pool([]) == 0


def test_replay_counts_what_serve_finds() -> None:
    requests = small_stream()
    size = 3 * smallest_pool(requests)
    result = replay_hit_rate(requests, size)
    manager, pool = RadixCacheManager(), PagePool(size)
    cached = sum(serve(manager, pool, r).cached_len for r in requests)
    assert isinstance(result, ReplayResult)
    assert (result.num_slots, result.page_size) == (size, 1)
    assert result.cached_tokens == cached
    assert result.prompt_tokens == total_tokens(requests)
    assert result.evicted_slots == pool.num_evicted_slots > 0
    assert result.hit_rate == pytest.approx(cached / total_tokens(requests))


def test_an_unlimited_pool_reaches_the_offline_optimum_and_evicts_nothing() -> None:
    for requests in (small_stream(), multi_turn_chat(4, turns=3, system_len=10, user_len=5, answer_len=5, seed=1)):
        result = replay_hit_rate(requests, total_tokens(requests))
        assert result.evicted_slots == 0
        assert result.cached_tokens == result.optimal_tokens
        assert result.hit_rate == result.optimal_rate


def test_the_optimum_leaves_out_each_requests_last_token() -> None:
    requests = [np.array([1, 2, 3]), np.array([1, 2, 3]), np.array([1, 2, 3, 4])]
    assert offline_optimal_hits(requests) == [0, 3, 3]
    result = replay_hit_rate(requests, 8)
    # admit matches input_ids[:-1]: the second request can reuse 2 tokens, the third 3
    assert (result.optimal_tokens, result.cached_tokens) == (5, 5)


def test_pages_round_the_hits_down() -> None:
    requests = small_stream()
    paged = replay_hit_rate(requests, 4 * len(requests) * smallest_pool(requests, 4), page_size=4)
    hits = offline_optimal_hits(requests, page_size=4)
    assert paged.cached_tokens == sum(min(h, (len(r) - 1) // 4 * 4) for h, r in zip(hits, requests, strict=True))
    assert paged.cached_tokens <= replay_hit_rate(requests, total_tokens(requests)).cached_tokens


def test_sweep_rises_with_the_pool_and_keeps_the_order_given() -> None:
    requests = few_shot(60, num_templates=2, num_examples=4, shots=2, seed=3)
    least = smallest_pool(requests)
    sizes = [8 * least, least, 2 * least, total_tokens(requests)]
    results = hit_rate_sweep(requests, sizes)
    assert [r.num_slots for r in results] == sizes
    rates = [r.hit_rate for r in sorted(results, key=lambda r: r.num_slots)]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    assert results[-1].hit_rate == results[-1].optimal_rate
    assert len({r.optimal_tokens for r in results}) == 1


def test_same_arguments_same_results() -> None:
    requests = small_stream()
    sizes = [smallest_pool(requests), 200]
    assert hit_rate_sweep(requests, sizes) == hit_rate_sweep(requests, sizes)


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [
        (lambda r: replay_hit_rate(r, 10), ArgumentError, "num_slots"),  # smaller than the longest request
        (lambda r: replay_hit_rate(r, 0), ArgumentError, "num_slots"),
        (lambda r: replay_hit_rate(r, 101, page_size=4), ArgumentError, "num_slots"),
        (lambda r: replay_hit_rate(r, 100, page_size=0), ArgumentError, "page_size"),
        (lambda r: replay_hit_rate(np.zeros((2, 2), dtype=np.int64), 100), ArgumentTypeError, "requests"),
        (lambda r: hit_rate_sweep(r, []), ArgumentError, "pool_sizes"),
        (lambda r: hit_rate_sweep(r, 100), ArgumentTypeError, "pool_sizes"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(call, error: type[Exception], argument: str) -> None:
    with pytest.raises(error, match=argument):
        call(small_stream())


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def test_plot_draws_one_line_and_one_optimum_per_series() -> None:
    requests = small_stream()
    least = smallest_pool(requests)
    sweep = hit_rate_sweep(requests, [least, 2 * least, 4 * least])
    fig = plot_hit_rate_sweep(sweep)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 2
    assert list(lines[0].get_xdata()) == [least, 2 * least, 4 * least]
    assert list(lines[0].get_ydata()) == [r.hit_rate for r in sweep]
    assert list(lines[1].get_ydata()) == [sweep[0].optimal_rate] * 2
    assert ax.get_xscale() == "linear"
    assert png(fig) == png(plot_hit_rate_sweep(hit_rate_sweep(requests, [least, 2 * least, 4 * least])))

    wide = {"a": sweep, "b": hit_rate_sweep(requests, [least, 100 * least])}
    fig = plot_hit_rate_sweep(wide, title="two")
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 4 and ax.get_xscale() == "log" and ax.get_title() == "two"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "a: no eviction", "b", "b: no eviction"]


@pytest.mark.parametrize("bad", [[], {}, [object()], {"a": []}, {1: [object()]}, "abc"])
def test_plot_refuses_what_is_not_a_sweep(bad: object) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError)):
        plot_hit_rate_sweep(bad)


@pytest.mark.parametrize("page_size", [1, 4])
def test_an_empty_request_adds_nothing_to_the_optimum(page_size: int) -> None:
    requests = [np.array([], dtype=np.int64), np.arange(9), np.arange(9)]
    result = replay_hit_rate(requests, 16, page_size)
    without = replay_hit_rate(requests[1:], 16, page_size)
    assert result.optimal_tokens == without.optimal_tokens >= 0
    assert result.cached_tokens == without.cached_tokens
