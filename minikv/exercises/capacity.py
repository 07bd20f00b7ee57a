"""Checks for chapter 1: what one token's KV costs, and how much sharing saves.

Every expected value comes from :mod:`minikv.capacity` or from a real
:class:`~minikv.RadixCacheManager`, never from a number written here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import capacity as _capacity
from ..radix_manager import RadixCacheManager
from ._core import Case, Mismatch, call, exercise, expect_equal, expect_int

_F = Callable[..., object]

_SHAPES = [
    # (description, num_layers, num_kv_heads, head_dim, dtype)
    ("the smallest model: 1 layer, 1 head, head_dim 1, float32", 1, 1, 1, torch.float32),
    ("Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in bfloat16", 32, 32, 128, torch.bfloat16),
    ("Llama-3-8B (32 layers, 8 KV heads: grouped-query attention) in bfloat16", 32, 8, 128, torch.bfloat16),
    ("Llama-3-8B in float32", 32, 8, 128, torch.float32),
    ("3 layers, 5 heads, head_dim 24 (nothing is a power of two) in float16", 3, 5, 24, torch.float16),
    ("80 layers, 8 KV heads, head_dim 128 (a 70B model) in float16", 80, 8, 128, torch.float16),
]


@exercise(
    "capacity.kv_bytes_per_token",
    "bytes of K and V for one token, all layers",
    forbid=((_capacity, "kv_bytes_per_token"),),
)
def _kv_bytes_cases() -> list[Case]:
    return [
        _bytes_case(desc, layers * heads * dim, _capacity.kv_bytes_per_token, layers, heads, dim, dtype)
        for desc, layers, heads, dim, dtype in _SHAPES
    ]


@exercise(
    "capacity.mla_bytes_per_token",
    "bytes per token under multi-head latent attention",
    forbid=((_capacity, "mla_bytes_per_token"),),
)
def _mla_cases() -> list[Case]:
    shapes = [
        ("1 layer, latent rank 4, no RoPE part, float32", 1, 4, 0, torch.float32),
        ("DeepSeek-V3 (61 layers, kv_lora_rank 512, qk_rope_head_dim 64) in bfloat16", 61, 512, 64, torch.bfloat16),
        ("DeepSeek-V3 in float32", 61, 512, 64, torch.float32),
        ("7 layers, rank 96, RoPE part 24, float16", 7, 96, 24, torch.float16),
    ]

    return [
        _bytes_case(desc, layers * (rank + rope), _capacity.mla_bytes_per_token, layers, rank, rope, dtype)
        for desc, layers, rank, rope, dtype in shapes
    ]


def _bytes_case(desc: str, weight: int, reference: Callable[..., int], *args: object) -> Case:
    """The learner's function, called with ``args``, must return what ``reference`` returns, in bytes."""

    def run(fn: _F) -> None:
        got = expect_int("the result", call(fn, *args))
        expected = reference(*args)
        if got != expected:
            raise Mismatch(
                f"{reference.__name__}({', '.join(map(str, args))}) is wrong{_ratio_hint(expected, got)}",
                f"{expected:,} bytes",
                f"{got:,} bytes",
            )

    return Case(desc, weight, run)


@exercise(
    "capacity.tokens_that_fit",
    "whole tokens whose KV fits in a memory budget",
    forbid=((_capacity, "tokens_that_fit"),),
)
def _fit_cases() -> list[Case]:
    gib = 1024**3
    llama3 = _capacity.MODELS["Llama-3-8B"].bytes_per_token()
    budgets = [
        ("no memory at all", 0, 100),
        ("memory for exactly 3 tokens", 300, 100),
        ("memory for 3 tokens and a bit more (a partial token does not count)", 399, 100),
        ("less memory than one token needs", 99, 100),
        ("Llama-3-8B in bfloat16 with 20 GiB left after the weights", 20 * gib, llama3),
        ("DeepSeek-V3 (MLA) in bfloat16 with 20 GiB", 20 * gib, _capacity.MODELS["DeepSeek-V3"].bytes_per_token()),
    ]

    def make(desc: str, memory: int, per_token: int) -> Case:
        def run(fn: _F) -> None:
            got = expect_int("the result", call(fn, memory, per_token))
            expect_equal(
                f"tokens_that_fit({memory:,}, {per_token:,})", _capacity.tokens_that_fit(memory, per_token), got
            )

        return Case(desc, memory // max(per_token, 1), run)

    return [make(*budget) for budget in budgets]


@exercise("capacity.cached_tokens_with_sharing", "KV rows a perfect prefix cache stores for a set of prompts")
def _sharing_cases() -> list[Case]:
    prompt_sets: list[tuple[str, list[list[int]]]] = [
        ("no prompts", []),
        ("one empty prompt", [[]]),
        ("one prompt of 4 tokens", [[1, 2, 3, 4]]),
        ("the same prompt twice", [[1, 2, 3], [1, 2, 3]]),
        ("one prompt is a prefix of the other", [[1, 2, 3, 4, 5], [1, 2]]),
        ("two prompts that share nothing", [[1, 2], [3, 4, 5]]),
        ("a shared system prompt and three questions", [[9, 9, 9, 1, 2], [9, 9, 9, 3], [9, 9, 9, 1, 4, 5]]),
        ("prompts in an order where neighbours share less than others do", [[1, 2, 3], [4, 5], [1, 2, 9]]),
        (
            "a prompt that shares with an earlier one only after a later one",
            [[5, 1, 1], [5, 1, 2, 2], [5, 3], [5, 1, 2, 7]],
        ),
        ("twelve prompts over a tiny vocabulary", [[(i * 7 + j * 3) % 3 for j in range(i % 5 + 2)] for i in range(12)]),
    ]

    def make(desc: str, prompts: list[list[int]]) -> Case:
        def run(fn: _F) -> None:
            given = [list(p) for p in prompts]
            got = expect_int("the result", call(fn, given))
            expected = _rows_in_a_radix_tree(prompts)
            if got != expected:
                total = sum(len(p) for p in prompts)
                raise Mismatch(
                    f"for the prompts {prompts}, a radix tree holding all of them stores {expected} rows "
                    f"(without sharing it would be {total}).",
                    str(expected),
                    str(got),
                )

        return Case(desc, sum(len(p) for p in prompts), run)

    return [make(*s) for s in prompt_sets]


def _rows_in_a_radix_tree(prompts: list[list[int]]) -> int:
    """The honest answer: insert every prompt into minikv's radix tree and count what it holds."""
    manager = RadixCacheManager("cpu")
    next_slot = 0
    for prompt in prompts:
        manager.insert_prefix(prompt, list(range(next_slot, next_slot + len(prompt))))
        next_slot += len(prompt)
    return manager.size_info.total_size


def _ratio_hint(expected: int, got: int) -> str:
    """Name the usual slips when the answer is off by a telling factor."""
    if got > 0 and expected % got == 0 and expected // got in (2, 4):
        return (
            f": it is 1/{expected // got} of the right answer. "
            "Did you count both K and V, and every layer, and use the dtype's element size?"
        )
    if expected > 0 and got % expected == 0 and got // expected in (2, 4):
        return (
            f": it is {got // expected} times the right answer. Is something counted twice, or the element size wrong?"
        )
    return "."
