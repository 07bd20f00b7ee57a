"""Exercise 1's checks (``minikv.exercises.capacity``) against bytes-per-token, fit and sharing slips.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

import torch
from exercise_helpers import WrongAnswers, chapter_tests

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


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("capacity", WRONG)
