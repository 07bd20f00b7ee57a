"""Exercise 1's checks (``minikv.exercises.capacity``) against bytes-per-token, fit and sharing slips.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

import torch
from exercise_helpers import WrongAnswers, chapter_tests

from minikv import capacity
from minikv.exercises import check

WRONG = WrongAnswers()
wrong = WRONG.register


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_forgets_v(num_layers, num_kv_heads, head_dim, dtype):
    return num_layers * num_kv_heads * head_dim * _size(dtype)


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_assumes_fp16(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_layers * num_kv_heads * head_dim * 2


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_one_layer(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_kv_heads * head_dim * _size(dtype)


@wrong("capacity.mla_bytes_per_token")
def mla_counts_k_and_v(num_layers, rank, rope, dtype):
    return 2 * num_layers * (rank + rope) * _size(dtype)


@wrong("capacity.mla_bytes_per_token")
def mla_forgets_rope(num_layers, rank, rope, dtype):
    return num_layers * rank * _size(dtype)


@wrong("capacity.tokens_that_fit")
def fit_rounds(memory, per_token):
    return round(memory / per_token)


@wrong("capacity.tokens_that_fit")
def fit_ceils(memory, per_token):
    return -(-memory // per_token)


@wrong("capacity.cached_tokens_with_sharing")
def sharing_none(prompts):
    return sum(len(p) for p in prompts)


@wrong("capacity.cached_tokens_with_sharing")
def sharing_neighbours_unsorted(prompts):
    total, previous = 0, []
    for prompt in prompts:
        common = 0
        while common < min(len(prompt), len(previous)) and prompt[common] == previous[common]:
            common += 1
        total += len(prompt) - common
        previous = prompt
    return total


@wrong("capacity.cached_tokens_with_sharing")
def sharing_only_the_common_prefix_of_all(prompts):
    if not prompts:
        return 0
    common = 0
    while all(len(p) > common for p in prompts) and len({p[common] for p in prompts}) == 1:
        common += 1
    return sum(len(p) for p in prompts) - (len(prompts) - 1) * common


# -- wrong answers the hand-made cases alone passed (issue 15) ---------------------------------

_SIZES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_knows_three_dtypes(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_layers * num_kv_heads * head_dim * _SIZES[dtype]  # float64, ints, float8...: KeyError


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_from_finfo(num_layers, num_kv_heads, head_dim, dtype):
    return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8  # float types only


@wrong("capacity.mla_bytes_per_token")
def mla_knows_three_dtypes(num_layers, rank, rope, dtype):
    return num_layers * (rank + rope) * _SIZES[dtype]


@wrong("capacity.tokens_that_fit")
def fit_through_a_float(memory, per_token):
    return int(memory / per_token)  # exact only below 2^53


@wrong("capacity.cached_tokens_with_sharing")
def sharing_sorts_the_callers_list(prompts):
    prompts.sort()  # the right count, but the caller's list is reordered
    total, previous = 0, []
    for prompt in prompts:
        common = 0
        while common < min(len(prompt), len(previous)) and prompt[common] == previous[common]:
            common += 1
        total += len(prompt) - common
        previous = prompt
    return total


@wrong("capacity.cached_tokens_with_sharing")
def sharing_keys_as_bytes(prompts):
    return len({bytes(prompt[: i + 1]) for prompt in prompts for i in range(len(prompt))})  # ids < 256 only


@wrong("capacity.cached_tokens_with_sharing")
def sharing_keys_as_digits(prompts):
    return len({"".join(map(str, prompt[: i + 1])) for prompt in prompts for i in range(len(prompt))})  # 1,23 == 12,3


# -- correct alternatives, written differently from the solutions: they must pass -------------


def kv_bytes_by_itemsize(num_layers, num_kv_heads, head_dim, dtype):
    total = 0
    for _ in range(num_layers):
        total += num_kv_heads * head_dim * dtype.itemsize * 2
    return total


def fit_by_divmod(memory, per_token):
    tokens, _rest = divmod(memory, per_token)
    return tokens


def sharing_by_trie(prompts):
    def count(node):
        return sum(1 + count(child) for child in node.values())

    root: dict = {}
    for prompt in prompts:
        node = root
        for token in prompt:
            node = node.setdefault(token, {})
    return count(root)


def sharing_sorted_copy(prompts):
    total, previous = 0, []
    for prompt in sorted(prompts):
        common = next((i for i, (a, b) in enumerate(zip(prompt, previous, strict=False)) if a != b), None)
        common = min(len(prompt), len(previous)) if common is None else common
        total += len(prompt) - common
        previous = prompt
    return total


def test_correct_alternatives_pass() -> None:
    for exercise_id, fn in [
        ("capacity.kv_bytes_per_token", kv_bytes_by_itemsize),
        ("capacity.tokens_that_fit", fit_by_divmod),
        ("capacity.cached_tokens_with_sharing", sharing_by_trie),
        ("capacity.cached_tokens_with_sharing", sharing_sorted_copy),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


def test_the_reference_under_another_name_is_refused() -> None:
    mine = capacity.kv_bytes_per_token
    result = check("capacity.kv_bytes_per_token", mine)
    assert not result.passed
    assert "minikv's own answer" in result.smallest_failure.problem


# issue 26: one wrong answer per class the random cases now draw on purpose -------------------


@wrong("capacity.cached_tokens_with_sharing")
def sharing_sorted_as_text(prompts):
    """Sort, then count what each prompt adds to its neighbour: right for ints sorted as ints only."""
    total, previous = 0, []
    for prompt in sorted(prompts, key=str):
        common = 0
        while common < min(len(prompt), len(previous)) and prompt[common] == previous[common]:
            common += 1
        total += len(prompt) - common
        previous = prompt
    return total


@wrong("capacity.tokens_that_fit")
def fit_one_short_at_a_whole_number(memory, per_token):
    return max((memory - 1) // per_token, 0)


@wrong("capacity.kv_bytes_per_token")
def kv_bytes_guesses_other_sizes(num_layers, num_kv_heads, head_dim, dtype):
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else 32  # ints, bool, complex: guessed
    return 2 * num_layers * num_kv_heads * head_dim * bits // 8


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("capacity", WRONG)
