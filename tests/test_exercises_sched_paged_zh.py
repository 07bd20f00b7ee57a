"""Exercises 6 and 7's checks report in the learner's language (issue 27).

Each check runs a plausible wrong answer (a mutant of ``test_exercises_scheduling.py`` or
``test_exercises_paged_attention.py``) once in English and once in Chinese. The Chinese report
must carry the Chinese form of the message this mutant triggers and no run of English prose
(four or more plain words outside backticks and identifiers) that the scheduling and
paged-attention checks write; the English report must stay English, word for word the message
the other tests read; and both must give the same verdict, case by case.

The search for English (``exercise_helpers.english_runs``) spares nothing the checker
writes, the shared modules' frame and random-case sentences included; only an error message
the learner's code raised is left out, since those are the learner's own words.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import test_exercises_paged_attention as paged_tests
import test_exercises_scheduling as scheduling_tests
from exercise_helpers import assert_reported_in_both_languages, chapter_ids

from minikv.language import catalog

S, P = scheduling_tests, paged_tests

# (exercise id, wrong answer, English words of the message it should trigger, their Chinese form)
MUTANTS: list[tuple[str, Callable[..., object], str, str]] = [
    ("scheduling.cached_prefix_len", S.prefix_of_all_ids, "admission matches `ids[:-1]`", "接纳时匹配的是 `ids[:-1]`"),
    ("scheduling.cached_prefix_len", S.prefix_by_match_prefix, "your function changed the tree", "你的函数改变了树"),
    ("scheduling.lpm_order", S.lpm_ties_reversed, "requests with equal matches keep their order", "匹配长度相同的请求"),
    ("scheduling.lpm_order", S.lpm_sorts_in_place, "reordered the list `waiting`", "重排了传给它的列表 `waiting`"),
    ("scheduling.lpm_order", S.lpm_drops_unmatched, "each exactly once", "每个恰好出现一次"),
    ("scheduling.aging_order", S.aging_unscaled, "the highest priority first", "优先级最高的排在最前"),
    (
        "paged_attention.decode_torch",
        P.WRONG["paged_attention.decode_torch"][0],
        "not h % kv_heads",
        "而不是 h % kv_heads",
    ),
    ("paged_attention.decode_torch", P.WRONG["paged_attention.decode_torch"][1], "mask the rest", "其余的要屏蔽掉"),
    ("paged_attention.online_softmax", P.softmax_after_keeping_the_blocks, "the last block's alone", "最后一个块单独"),
    (
        "paged_attention.online_softmax",
        P.WRONG["paged_attention.online_softmax"][0],
        "not softmax(scores)",
        "结果不等于",
    ),
    # the Triton kernel runs in Triton's interpreter on a CPU: a few seconds a check
    ("paged_attention.decode", P.WRONG["paged_attention.decode"][1], "not h % kv_heads", "而不是 h % kv_heads"),
]


def test_every_scheduling_and_paged_attention_check_is_covered() -> None:
    assert {m[0] for m in MUTANTS} == set(chapter_ids("scheduling") + chapter_ids("paged_attention"))


def test_the_catalog_has_these_messages() -> None:
    """Without the catalog the Chinese reports would silently fall back to English."""
    assert catalog("zh").get("the waiting queue is empty"), "fill minikv/locale/zh_CN.po (scripts/messages.py)"


@pytest.mark.parametrize(
    ("exercise_id", "fn", "english", "chinese"), MUTANTS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTANTS)]
)
def test_the_report_speaks_the_learners_language(
    exercise_id: str, fn: Callable[..., object], english: str, chinese: str
) -> None:
    assert_reported_in_both_languages(exercise_id, fn, english, chinese)
