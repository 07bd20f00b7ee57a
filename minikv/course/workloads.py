"""Deterministic request streams that share prefixes the way real traffic does.

A prefix cache is only as good as the sharing in its traffic, so the book and
the benchmarks replay three shapes of it:

* :func:`shared_system_prompt` -- a few long system prompts, each request one of
  them plus its own question (most prompt tokens are cacheable);
* :func:`multi_turn_chat` -- conversations whose turn ``k`` resends the whole
  history of turn ``k - 1`` (the cacheable share grows with every turn);
* :func:`few_shot` -- an instruction template, a few example blocks drawn from
  a fixed pool, then a question (sharing branches at every example).

Lengths given as ``(low, high)`` are drawn uniformly from that inclusive range
each time one is needed; a plain int is a fixed length.

Every generator returns a ``list`` of 1-D ``numpy.int64`` arrays, one per
request, in arrival order. NumPy rather than torch because that is what the
managers compare keys in; every manager accepts these arrays as they are.
The same arguments (``seed`` included) always give the same requests.

:func:`offline_optimal_hits` is the yardstick: for each request, the most
leading tokens any prefix cache with unlimited memory could serve from
requests seen before it.

:func:`replay_hit_rate` serves a stream through a :class:`~minikv.RadixCacheManager`
with a pool of a given size (evicting when it runs short) and counts the prompt
tokens found in the cache; :func:`hit_rate_sweep` does that for several pool sizes,
which :func:`minikv.viz.plots.plot_hit_rate_sweep` draws.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validate import as_count, as_positive, as_token_ids
from ..errors import ArgumentError, ArgumentTypeError
from ..lifecycle import serve
from ..page_pool import PagePool
from ..radix_manager import RadixCacheManager


def shared_system_prompt(
    num_requests: int,
    num_prompts: int = 4,
    prompt_len: int = 480,
    question_len: int | tuple[int, int] = (96, 144),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[np.ndarray]:
    """Requests that each start with one of ``num_prompts`` system prompts, then a question of their own.

    ``prompt_len`` is the length of each system prompt; with the defaults a
    request is ~600 tokens of which 480 (80%) are the shared system prompt.
    Prompts are picked uniformly at random per request; every question is new.
    """
    num_requests = as_count(num_requests, "num_requests")
    num_prompts = as_positive(num_prompts, "num_prompts")
    prompt_len = as_positive(prompt_len, "prompt_len")
    question = _as_length_range(question_len, "question_len")
    vocab_size = _as_vocab_size(vocab_size)
    rng = _rng(seed)
    prompts = [_tokens(rng, prompt_len, vocab_size) for _ in range(num_prompts)]
    choices = rng.integers(0, num_prompts, size=num_requests)
    return [np.concatenate([prompts[c], _tokens(rng, _draw(rng, question), vocab_size)]) for c in choices]


def multi_turn_chat(
    num_conversations: int,
    turns: int = 6,
    system_len: int = 100,
    user_len: int | tuple[int, int] = (20, 80),
    answer_len: int | tuple[int, int] = (50, 200),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[np.ndarray]:
    """Chat turns of ``num_conversations`` conversations, interleaved as they would arrive.

    Every conversation opens with the same ``system_len``-token system prompt.
    Turn ``k``'s prompt is turn ``k - 1``'s prompt, then the model's answer to
    it (``answer_len`` tokens), then the next user message (``user_len``
    tokens). Turns of one conversation stay in order; which conversation speaks
    next is drawn at random among those with turns left.

    The answer is part of the *next* prompt only: a server that caches just
    prompts (as :mod:`minikv.lifecycle` does) can reuse turn ``k - 1``'s prompt
    but must recompute the answer tokens.
    """
    num_conversations = as_count(num_conversations, "num_conversations")
    turns = as_positive(turns, "turns")
    system_len = as_count(system_len, "system_len")
    user = _as_length_range(user_len, "user_len", minimum=1)
    answer = _as_length_range(answer_len, "answer_len")
    vocab_size = _as_vocab_size(vocab_size)
    rng = _rng(seed)
    system = _tokens(rng, system_len, vocab_size)
    histories = [system for _ in range(num_conversations)]
    turns_left = np.full(num_conversations, turns)
    requests: list[np.ndarray] = []
    for _ in range(num_conversations * turns):
        speaking = np.flatnonzero(turns_left)
        c = int(speaking[rng.integers(0, len(speaking))])
        if turns_left[c] < turns:  # not the first turn: the previous answer joins the history
            histories[c] = np.concatenate([histories[c], _tokens(rng, _draw(rng, answer), vocab_size)])
        histories[c] = np.concatenate([histories[c], _tokens(rng, _draw(rng, user), vocab_size)])
        turns_left[c] -= 1
        requests.append(histories[c])
    return requests


def few_shot(
    num_requests: int,
    num_templates: int = 3,
    template_len: int = 60,
    num_examples: int = 8,
    shots: int = 3,
    example_len: int | tuple[int, int] = (80, 120),
    question_len: int | tuple[int, int] = (30, 60),
    vocab_size: int = 32000,
    seed: int = 0,
) -> list[np.ndarray]:
    """Requests built as an instruction template, ``shots`` example blocks, then a question.

    There are ``num_templates`` templates (``template_len`` tokens each) and one
    fixed pool of ``num_examples`` example blocks. Each request picks a template
    and ``shots`` distinct examples in random order, so two requests share the
    template and then as many leading examples as they happen to agree on:
    the radix tree branches at every example boundary.
    """
    num_requests = as_count(num_requests, "num_requests")
    num_templates = as_positive(num_templates, "num_templates")
    template_len = as_positive(template_len, "template_len")
    num_examples = as_positive(num_examples, "num_examples")
    shots = as_count(shots, "shots")
    if shots > num_examples:
        raise ArgumentError(f"shots: {shots} distinct examples asked for, but num_examples is {num_examples}")
    example = _as_length_range(example_len, "example_len", minimum=1)
    question = _as_length_range(question_len, "question_len")
    vocab_size = _as_vocab_size(vocab_size)
    rng = _rng(seed)
    templates = [_tokens(rng, template_len, vocab_size) for _ in range(num_templates)]
    examples = [_tokens(rng, _draw(rng, example), vocab_size) for _ in range(num_examples)]
    requests: list[np.ndarray] = []
    for _ in range(num_requests):
        template = templates[int(rng.integers(0, num_templates))]
        picked = rng.permutation(num_examples)[:shots]
        parts = [template, *(examples[int(e)] for e in picked), _tokens(rng, _draw(rng, question), vocab_size)]
        requests.append(np.concatenate(parts))
    return requests


def offline_optimal_hits(requests: Sequence[np.ndarray], page_size: int = 1) -> list[int]:
    """For each request, the longest prefix it shares with any *earlier* request, rounded down to whole pages.

    No prefix cache can serve more: a token can only be cached if an earlier
    request computed it after the same prefix. A radix cache that never evicts
    reaches this bound exactly, which the benchmarks check.

    Computed independently of any manager: earlier requests are kept sorted,
    and the longest common prefix with a set of sequences is always reached at
    the query's sorted neighbour on one side or the other.
    """
    page_size = as_positive(page_size, "page_size")
    arrays = _as_requests(requests)
    seen: list[bytes] = []  # earlier requests, sorted; big-endian bytes sort like token sequences
    hits: list[int] = []
    for ids in arrays:
        key = ids.astype(">u8").tobytes()
        pos = bisect.bisect_left(seen, key)
        best = 0
        for neighbour in seen[max(pos - 1, 0) : pos + 1]:
            best = max(best, _common_prefix_tokens(key, neighbour))
        hits.append(best - best % page_size)
        seen.insert(pos, key)
    return hits


def total_tokens(requests: Sequence[np.ndarray]) -> int:
    """Prompt tokens in a request stream (the denominator of a hit rate)."""
    return sum(len(r) for r in requests)


@dataclass(frozen=True)
class ReplayResult:
    """What one replay of a request stream through a radix cache with ``num_slots`` slots found.

    ``cached_tokens`` are the prompt tokens served from the cache (each request's
    ``cached_len``), ``prompt_tokens`` all prompt tokens, ``evicted_slots`` the slots
    the pool had to take back from the tree. ``optimal_tokens`` is what the replay
    would find with unlimited memory: :func:`offline_optimal_hits`, with each request's
    last token left out, as :func:`minikv.lifecycle.admit` always computes it.
    """

    num_slots: int
    page_size: int
    cached_tokens: int
    prompt_tokens: int
    evicted_slots: int
    optimal_tokens: int

    @property
    def hit_rate(self) -> float:
        """Cached tokens over prompt tokens (0 for an empty stream)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def optimal_rate(self) -> float:
        """The hit rate with unlimited memory: the most any pool size can reach."""
        return self.optimal_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def smallest_pool(requests: Sequence[np.ndarray], page_size: int = 1) -> int:
    """The fewest slots a replay can run with: the longest request, in whole pages.

    Requests are served one at a time and every cached prefix but the running request's
    own match can be evicted, so a pool this large never runs out.
    """
    page_size = as_positive(page_size, "page_size")
    arrays = _as_requests(requests)
    longest = max((len(r) for r in arrays), default=0)
    return -(-longest // page_size) * page_size


def replay_hit_rate(requests: Sequence[np.ndarray], num_slots: int, page_size: int = 1) -> ReplayResult:
    """Serve ``requests`` in order (:func:`minikv.lifecycle.serve`) through a fresh radix cache and pool.

    The pool has ``num_slots`` slots (whole pages); when it runs short the cache evicts its
    least recently used unlocked leaves. Requests run one at a time, so at most one prefix
    is locked at once. ``num_slots`` must be at least :func:`smallest_pool`.
    """
    page_size = as_positive(page_size, "page_size")
    arrays = _as_requests(requests)
    num_slots = as_positive(num_slots, "num_slots")
    if num_slots % page_size:
        raise ArgumentError(f"num_slots: {num_slots} is not a whole number of pages of {page_size}")
    least = smallest_pool(arrays, page_size)
    if num_slots < least:
        raise ArgumentError(f"num_slots: {num_slots} slots cannot hold the longest request ({least} slots)")
    manager = RadixCacheManager(page_size=page_size)
    pool = PagePool(num_slots // page_size, page_size=page_size)
    cached = sum(serve(manager, pool, ids).cached_len for ids in arrays)
    optimal = 0
    for ids, hit in zip(arrays, offline_optimal_hits(arrays, page_size), strict=True):
        last = max(len(ids) - 1, 0)  # admit matches input_ids[:-1] (an empty request matches nothing)
        optimal += min(hit, last - last % page_size)
    return ReplayResult(
        num_slots=num_slots,
        page_size=page_size,
        cached_tokens=cached,
        prompt_tokens=total_tokens(arrays),
        evicted_slots=pool.num_evicted_slots,
        optimal_tokens=optimal,
    )


def hit_rate_sweep(requests: Sequence[np.ndarray], pool_sizes: Sequence[int], page_size: int = 1) -> list[ReplayResult]:
    """:func:`replay_hit_rate` for each pool size in ``pool_sizes`` (slots), in the order given."""
    if isinstance(pool_sizes, (str, bytes)) or not isinstance(pool_sizes, Sequence):
        raise ArgumentTypeError(f"pool_sizes must be a sequence of slot counts, got {type(pool_sizes).__name__}")
    if not pool_sizes:
        raise ArgumentError("pool_sizes must not be empty")
    arrays = _as_requests(requests)
    return [replay_hit_rate(arrays, size, page_size) for size in pool_sizes]


# -- helpers -------------------------------------------------------------------


def _as_requests(requests: Sequence[np.ndarray]) -> list[np.ndarray]:
    if not isinstance(requests, (list, tuple)):
        raise ArgumentTypeError(f"requests must be a list of token-id arrays, got {type(requests).__name__}")
    return [as_token_ids(r, f"requests[{i}]") for i, r in enumerate(requests)]


def _common_prefix_tokens(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b)) // 8
    x = np.frombuffer(a, dtype=">u8", count=n)
    y = np.frombuffer(b, dtype=">u8", count=n)
    differ = np.flatnonzero(x != y)
    return int(differ[0]) if differ.size else n


def _rng(seed: object) -> np.random.Generator:
    return np.random.default_rng(as_count(seed, "seed"))


def _tokens(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    return rng.integers(0, vocab_size, size=n, dtype=np.int64)


def _draw(rng: np.random.Generator, length: tuple[int, int]) -> int:
    low, high = length
    return low if low == high else int(rng.integers(low, high + 1))


def _as_vocab_size(value: object) -> int:
    vocab_size = as_positive(value, "vocab_size")
    if vocab_size < 2:
        raise ArgumentError(f"vocab_size must be >= 2, got {vocab_size}")
    return vocab_size


def _as_length_range(value: object, name: str, minimum: int = 0) -> tuple[int, int]:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ArgumentError(f"{name} must be an int or a (low, high) pair, got {len(value)} values")
        low, high = as_count(value[0], f"{name}[0]"), as_count(value[1], f"{name}[1]")
    else:
        low = high = as_count(value, name)
    if low < minimum:
        raise ArgumentError(f"{name} must be >= {minimum}, got {low}")
    if low > high:
        raise ArgumentError(f"{name}: low {low} is above high {high}")
    return low, high
