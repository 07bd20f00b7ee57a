"""Checks for chapter 1: what one token's KV costs, and how much sharing saves.

Every expected value comes from :mod:`minikv.capacity` or from a real
:class:`~minikv.RadixCacheManager`, never from a number written here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from .. import capacity as _capacity
from ..language import tr
from ..radix_manager import RadixCacheManager
from ._core import (
    Case,
    Draw,
    Mismatch,
    call,
    call_watching,
    exercise,
    expect_equal,
    expect_int,
    random_case,
    shrink_int,
    shrink_tuple,
)

_F = Callable[..., object]


def _shapes() -> list[tuple[str, int, int, int, torch.dtype]]:
    """(description, num_layers, num_kv_heads, head_dim, dtype), described in the current language."""
    return [
        (tr("the smallest model: 1 layer, 1 head, head_dim 1, float32"), 1, 1, 1, torch.float32),
        (tr("Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in bfloat16"), 32, 32, 128, torch.bfloat16),
        (tr("Llama-3-8B (32 layers, 8 KV heads: grouped-query attention) in bfloat16"), 32, 8, 128, torch.bfloat16),
        (tr("Llama-3-8B in float32"), 32, 8, 128, torch.float32),
        (tr("3 layers, 5 heads, head_dim 24 (nothing is a power of two) in float16"), 3, 5, 24, torch.float16),
        (tr("80 layers, 8 KV heads, head_dim 128 (a 70B model) in float16"), 80, 8, 128, torch.float16),
    ]


@exercise(
    "capacity.kv_bytes_per_token",
    lambda: tr("bytes of K and V for one token, all layers"),
)
def _kv_bytes_cases() -> list[Case]:
    return [
        _bytes_case(desc, layers * heads * dim, _capacity.kv_bytes_per_token, layers, heads, dim, dtype)
        for desc, layers, heads, dim, dtype in _shapes()
    ] + [_random_bytes_case(_capacity.kv_bytes_per_token, 1, seed=100)]


@exercise(
    "capacity.mla_bytes_per_token",
    lambda: tr("bytes per token under multi-head latent attention"),
)
def _mla_cases() -> list[Case]:
    shapes = [
        (tr("1 layer, latent rank 4, no RoPE part, float32"), 1, 4, 0, torch.float32),
        (
            tr("DeepSeek-V3 (61 layers, kv_lora_rank 512, qk_rope_head_dim 64) in bfloat16"),
            61,
            512,
            64,
            torch.bfloat16,
        ),
        (tr("DeepSeek-V3 in float32"), 61, 512, 64, torch.float32),
        (tr("7 layers, rank 96, RoPE part 24, float16"), 7, 96, 24, torch.float16),
    ]

    return [
        _bytes_case(desc, layers * (rank + rope), _capacity.mla_bytes_per_token, layers, rank, rope, dtype)
        for desc, layers, rank, rope, dtype in shapes
    ] + [_random_bytes_case(_capacity.mla_bytes_per_token, 0, seed=200)]


DTYPES = tuple(
    dtype
    for dtype in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
        torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
        getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None),
    )
    if dtype is not None
)  # fmt: skip
"""Every dtype a cache could hold: the task says "elements of type dtype", so any torch dtype is allowed."""


def _random_bytes_case(reference: Callable[..., int], lowest_last: int, seed: int) -> Case:
    """Random shapes (1 to thousands in every dimension; the last may be ``lowest_last``) in every dtype."""

    def draw(rng: random.Random, size: int) -> tuple[object, ...]:
        top = 4 + size * 40
        last = rng.randint(lowest_last, top) if rng.random() < 0.8 else lowest_last
        return (rng.randint(1, top), rng.randint(1, top), last, rng.choice(DTYPES))

    def run(fn: _F, args: tuple[object, ...]) -> None:
        _bytes_case("", 0, reference, *args).run(fn)

    def shrink(args: tuple[object, ...]) -> list[tuple[object, ...]]:
        a, b, c, dtype = args
        assert isinstance(a, int) and isinstance(b, int) and isinstance(c, int)
        smaller: list[tuple[object, ...]] = [(x, b, c, dtype) for x in shrink_int(a, 1)]
        smaller += [(a, x, c, dtype) for x in shrink_int(b, 1)]
        smaller += [(a, b, x, dtype) for x in shrink_int(c, lowest_last)]
        return smaller

    def show(args: tuple[object, ...]) -> str:
        return f"{reference.__name__}({', '.join(map(str, args))})"

    def boundary(rng: random.Random, size: int) -> tuple[object, ...]:
        """Dimensions of 1 (and a last one of ``lowest_last``) beside large ones: what a formula drops shows."""
        ends = (1, 1, 2, rng.randint(1, 10**6))
        last = rng.choice((lowest_last, lowest_last + 1, rng.randint(lowest_last, 10**5)))
        return (rng.choice(ends), rng.choice(ends), last, rng.choice(DTYPES))

    def rare_dtype(rng: random.Random, size: int) -> tuple[object, ...]:
        """The dtypes whose element size a float-only formula gets wrong: 1, 8 and 16 bytes, bool, float8."""
        top = 4 + size * 40
        odd = [d for d in DTYPES if d.is_complex or not d.is_floating_point or d.itemsize == 1]
        return (rng.randint(1, top), rng.randint(1, top), rng.randint(max(lowest_last, 1), top), rng.choice(odd))

    return random_case(
        tr(
            "{n} random shapes in every dtype (float64, ints, bool, complex, float8...), dimensions of 1 and huge ones",
            n=BYTES_DRAWS,
        ),
        Draw(draw, run, show, shrink, classes=((tr("dimensions of 1"), boundary), (tr("a rare dtype"), rare_dtype))),
        seed=seed,
        max_size=60,
        count=BYTES_DRAWS,
    )


BYTES_DRAWS, FIT_DRAWS, SHARING_DRAWS = 2000, 3000, 1000
"""How many random inputs each capacity check draws: as many as keep the check well under a second."""


def _bytes_case(desc: str, weight: int, reference: Callable[..., int], *args: object) -> Case:
    """The learner's function, called with ``args``, must return what ``reference`` returns, in bytes."""

    def run(fn: _F) -> None:
        got = expect_int(tr("the result"), call(fn, *args))
        expected = reference(*args)
        if got != expected:
            raise Mismatch(
                tr(
                    "{call} is wrong{hint}",
                    call=f"{reference.__name__}({', '.join(map(str, args))})",
                    hint=_ratio_hint(expected, got),
                ),
                tr("{n:,} bytes", n=expected),
                tr("{n:,} bytes", n=got),
            )

    return Case(desc, weight, run)


@exercise(
    "capacity.tokens_that_fit",
    lambda: tr("whole tokens whose KV fits in a memory budget"),
)
def _fit_cases() -> list[Case]:
    gib = 1024**3
    llama3 = _capacity.MODELS["Llama-3-8B"].bytes_per_token()
    budgets = [
        (tr("no memory at all"), 0, 100),
        (tr("memory for exactly 3 tokens"), 300, 100),
        (tr("memory for 3 tokens and a bit more (a partial token does not count)"), 399, 100),
        (tr("less memory than one token needs"), 99, 100),
        (tr("Llama-3-8B in bfloat16 with 20 GiB left after the weights"), 20 * gib, llama3),
        (
            tr("DeepSeek-V3 (MLA) in bfloat16 with 20 GiB"),
            20 * gib,
            _capacity.MODELS["DeepSeek-V3"].bytes_per_token(),
        ),
    ]

    def make(desc: str, memory: int, per_token: int) -> Case:
        def run(fn: _F) -> None:
            got = expect_int(tr("the result"), call(fn, memory, per_token))
            expect_equal(
                f"tokens_that_fit({memory:,}, {per_token:,})", _capacity.tokens_that_fit(memory, per_token), got
            )

        return Case(desc, memory // max(per_token, 1), run)

    def draw(rng: random.Random, size: int) -> tuple[int, int]:
        per_token = rng.randint(1, 2 ** rng.randint(1, 8 + size))
        memory = rng.randint(0, 2 ** rng.randint(0, 2 * size + 4))
        if rng.random() < 0.3:  # a whole number of tokens, or one byte short of it
            memory = per_token * rng.randint(0, 2**size) - rng.randint(0, 1)
        return max(memory, 0), per_token

    def run_one(fn: _F, args: tuple[int, int]) -> None:
        make("", *args).run(fn)

    def shrink(args: tuple[int, int]) -> list[tuple[int, int]]:
        memory, per_token = args
        return [(m, per_token) for m in shrink_int(memory)] + [(memory, p) for p in shrink_int(per_token, 1)]

    def near_a_whole_number(rng: random.Random, size: int) -> tuple[int, int]:
        """A budget of exactly k tokens, one byte short of it or one byte over: where rounding shows."""
        per_token = rng.randint(1, 2 ** rng.randint(1, 8 + size))
        tokens = rng.choice((0, 1, 2, rng.randint(3, 2 ** (2 * size + 4))))
        return max(per_token * tokens + rng.choice((-1, 0, 1)), 0), per_token

    def beyond_a_float(rng: random.Random, size: int) -> tuple[int, int]:
        """Budgets past 2^53 bytes, where ``int(memory / per_token)`` is off."""
        per_token = rng.randint(1, 2**20)
        return per_token * rng.randint(2**53, 2**80) - rng.randint(0, 1), per_token

    return [make(*budget) for budget in budgets] + [
        random_case(
            tr(
                "{n} random budgets, up to 2^100 bytes (beyond what a float holds exactly), "
                "many of them a whole number of tokens give or take a byte",
                n=FIT_DRAWS,
            ),
            Draw(
                draw,
                run_one,
                lambda a: f"tokens_that_fit({a[0]}, {a[1]})",
                shrink,
                classes=(
                    (tr("a whole number of tokens ± 1 byte"), near_a_whole_number),
                    (tr("past 2^53"), beyond_a_float),
                ),
            ),
            seed=300,
            max_size=48,
            count=FIT_DRAWS,
        )
    ]


@exercise(
    "capacity.cached_tokens_with_sharing", lambda: tr("KV rows a perfect prefix cache stores for a set of prompts")
)
def _sharing_cases() -> list[Case]:
    prompt_sets: list[tuple[str, list[list[int]]]] = [
        (tr("no prompts"), []),
        (tr("one empty prompt"), [[]]),
        (tr("one prompt of 4 tokens"), [[1, 2, 3, 4]]),
        (tr("the same prompt twice"), [[1, 2, 3], [1, 2, 3]]),
        (tr("one prompt is a prefix of the other"), [[1, 2, 3, 4, 5], [1, 2]]),
        (tr("two prompts that share nothing"), [[1, 2], [3, 4, 5]]),
        (tr("a shared system prompt and three questions"), [[9, 9, 9, 1, 2], [9, 9, 9, 3], [9, 9, 9, 1, 4, 5]]),
        (tr("prompts in an order where neighbours share less than others do"), [[1, 2, 3], [4, 5], [1, 2, 9]]),
        (
            tr("a prompt that shares with an earlier one only after a later one"),
            [[5, 1, 1], [5, 1, 2, 2], [5, 3], [5, 1, 2, 7]],
        ),
        (
            tr("twelve prompts over a tiny vocabulary"),
            [[(i * 7 + j * 3) % 3 for j in range(i % 5 + 2)] for i in range(12)],
        ),
    ]

    def make(desc: str, prompts: list[list[int]]) -> Case:
        def run(fn: _F) -> None:
            given = [list(p) for p in prompts]
            got = expect_int(tr("the result"), call_watching(fn, ("prompts",), given))
            expected = _rows_in_a_radix_tree(prompts)
            if got != expected:
                raise Mismatch(
                    tr(
                        "for the prompts {prompts}, a radix tree holding all of them stores {expected} rows "
                        "(without sharing it would be {total}).",
                        prompts=_short_prompts(prompts),
                        expected=expected,
                        total=sum(len(p) for p in prompts),
                    ),
                    str(expected),
                    str(got),
                )

        return Case(desc, sum(len(p) for p in prompts), run)

    def draw(rng: random.Random, size: int) -> tuple[tuple[int, ...], ...]:
        # Any ids >= 0: a tiny vocabulary (lots of sharing), ids whose digits run together (1, 12 / 11, 2),
        # or large ids as a real vocabulary has them, and beyond.
        vocab = rng.choice(((0, 1, 2), (1, 2, 11, 12, 21, 112), None))

        def token() -> int:
            if vocab is None:
                return rng.randrange(2**40) if rng.random() < 0.5 else rng.randrange(12)
            return rng.choice(vocab)

        prompts: list[tuple[int, ...]] = []
        for _ in range(rng.randint(0, 2 + size // 2)):
            base = rng.choice(prompts) if prompts and rng.random() < 0.6 else ()
            prompts.append(base[: rng.randint(0, len(base))] + tuple(token() for _ in range(rng.randint(0, size))))
        return tuple(prompts)

    def run_one(fn: _F, prompts: tuple[tuple[int, ...], ...]) -> None:
        make("", [list(p) for p in prompts]).run(fn)

    def shrink(prompts: tuple[tuple[int, ...], ...]) -> list[tuple[tuple[int, ...], ...]]:
        smaller = list(shrink_tuple(prompts))
        for i, prompt in enumerate(prompts):
            smaller += [(*prompts[:i], p, *prompts[i + 1 :]) for p in shrink_tuple(prompt)]
        return smaller

    def digits_run_together(rng: random.Random, size: int) -> tuple[tuple[int, ...], ...]:
        """Prompts that nest inside each other, over ids whose decimal digits run together (2, 20, 200, 12):
        sorted as text, ``[1, 20]`` comes between ``[1, 2, 3]`` and ``[1, 2]``."""
        vocab = (1, 2, 3, 12, 20, 21, 200)
        prompts: list[tuple[int, ...]] = []
        for _ in range(rng.randint(2, 3 + size // 2)):
            base = rng.choice(prompts) if prompts and rng.random() < 0.8 else ()
            cut = base[: rng.randint(0, len(base))]
            prompts.append(cut + tuple(rng.choice(vocab) for _ in range(rng.randint(0, 1 + size // 3))))
        return tuple(prompts)

    def many_repeats(rng: random.Random, size: int) -> tuple[tuple[int, ...], ...]:
        """The same few prompts again and again, in any order, some empty."""
        pool = [tuple(rng.randrange(3) for _ in range(rng.randint(0, 1 + size))) for _ in range(rng.randint(1, 3))]
        return tuple(rng.choice(pool) for _ in range(rng.randint(1, 2 + size)))

    return [make(*s) for s in prompt_sets] + [
        random_case(
            tr(
                "{n} random prompt sets, in any order, with token ids up to 2^40, "
                "many nested over ids like 2, 20 and 200",
                n=SHARING_DRAWS,
            ),
            Draw(
                draw,
                run_one,
                lambda p: str([list(x) for x in p]),
                shrink,
                lambda p: sum(map(len, p)),
                classes=(
                    (tr("nested prompts over 2, 20, 200"), digits_run_together),
                    (tr("repeats"), many_repeats),
                ),
            ),
            seed=400,
            max_size=12,
            count=SHARING_DRAWS,
        )
    ]


def _short_prompts(prompts: list[list[int]]) -> str:
    text = str(prompts)
    return text if len(text) <= 300 else text[:300] + " ..."


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
        return tr(
            ": it is 1/{k} of the right answer. "
            "Did you count both K and V, and every layer, and use the dtype's element size?",
            k=expected // got,
        )
    if expected > 0 and got % expected == 0 and got // expected in (2, 4):
        return tr(
            ": it is {k} times the right answer. Is something counted twice, or the element size wrong?",
            k=got // expected,
        )
    return tr(".")
