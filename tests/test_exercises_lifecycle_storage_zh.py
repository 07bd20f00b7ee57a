"""Exercises 2 and 3's checks report in the learner's language (issue 27).

Each check runs a plausible wrong answer (a mutant of ``test_exercises_lifecycle.py`` or
``test_exercises_storage.py``) once in English and once in Chinese. The Chinese report must
carry the Chinese form of the message this mutant triggers, and no run of English prose
that the lifecycle and storage checks write; the English report must stay English, word
for word the messages the other tests read; and both must give the same verdict, case by case.

The search for English (``exercise_helpers.english_runs``) spares nothing the checker
writes: the report's frame, the random-case and diff sentences and the tree comparison of
the shared modules are Chinese too. Only an error message the learner's code raised is
left out, since those are the learner's own words.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import test_exercises_lifecycle as lifecycle_tests
import test_exercises_storage as storage_tests
from exercise_helpers import assert_reported_in_both_languages, chapter_ids

from minikv.language import catalog

L, S = lifecycle_tests, storage_tests

# (exercise id, wrong answer, English words of the message it should trigger, their Chinese form)
MUTANTS: list[tuple[str, Callable[..., object], str, str]] = [
    ("lifecycle.slots_to_free", L.free_the_notes_way, "the request matched that token", "第 1 步匹配到了那个 token"),
    ("lifecycle.slots_to_free", L.free_without_tail, "what does insert_prefix do with the rest?", "怎样处理余下的部分"),
    ("lifecycle.admit", L.admit_keeps_lock_on_failure, "the match is still locked", "匹配仍被锁定"),
    ("lifecycle.admit", L.admit_without_evict_from, "without evict_from the pool cannot evict", "页池什么也驱逐不了"),
    ("lifecycle.admit", L.admit_matching_the_whole_prompt, "match input_ids[:-1]", "请匹配 input_ids[:-1]"),
    ("lifecycle.admit", L.admit_into_one_buffer, "share memory with the first call's", "与第一次调用的共享内存"),
    ("lifecycle.finish", L.WRONG["lifecycle.finish"][0], "they leaked", "它们泄漏了"),
    ("lifecycle.serve", L.serve_in_the_notes_order, "after that slot had gone back", "已回到页池之后"),
    ("lifecycle.serve", L.serve_stores_one_layer, "but nothing was stored into it", "没有往其中写入任何内容"),
    ("lifecycle.serve", L.WRONG["lifecycle.serve"][1], "every lock needs its unlock", "每次锁定都需要对应的解锁"),
    ("lifecycle.serve", L.WRONG["lifecycle.serve"][6], "which holds a cached prefix", "存放着树所保留的已缓存前缀"),
    ("storage.tp_head_range", S.heads_interleaved, "must raise ValueError", "必须抛出 ValueError"),
    ("storage.page_first_view", S.view_by_reshape, "the layers and pages must swap places", "层和页都必须互换位置"),
    ("storage.page_first_view", S.view_that_copies, "is a copy, not a view", "是副本而不是视图"),
    ("storage.slot_mapping", S.slots_from_page_ids, "are wrong", "的槽位不对"),
    ("storage.slot_mapping", S.slots_through_float32, "slots next to the int32 limit", "贴近 int32 上限的槽位"),
    ("storage.store_torch", S.store_torch_swaps_k_and_v, "'s V row", " 的 V 行"),
    ("storage.store_torch", S.store_torch_trusts_indices, "raise IndexError", "并抛出 IndexError"),
    # the Triton kernel runs in Triton's interpreter on a CPU: about a second a check
    ("storage.store", S.WRONG["storage.store"][2], "outside the cache's memory", "缓存的内存之外"),
    ("storage.store", S.triton_store(bug=6), "computed in 32 bits", "用 32 位计算时"),
]


def test_every_lifecycle_and_storage_check_is_covered() -> None:
    assert {m[0] for m in MUTANTS} == set(chapter_ids("lifecycle") + chapter_ids("storage"))


def test_the_catalog_has_these_messages() -> None:
    """Without the catalog the Chinese reports would silently fall back to English."""
    assert catalog("zh").get("a request on an empty cache"), "fill minikv/locale/zh_CN.po (scripts/messages.py)"


@pytest.mark.parametrize(
    ("exercise_id", "fn", "english", "chinese"), MUTANTS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTANTS)]
)
def test_the_report_speaks_the_learners_language(
    exercise_id: str, fn: Callable[..., object], english: str, chinese: str
) -> None:
    assert_reported_in_both_languages(exercise_id, fn, english, chinese)
