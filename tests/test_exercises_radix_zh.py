"""Exercise 5's reports in the learner's language (issue 27): every ``radix.*`` check, run on a plausible
wrong answer inside ``minikv.language.language("zh")``, reports in Chinese, and the same check in English
reports exactly what it reported before.

"Chinese" is tested as: the report holds Chinese text, and no English sentence is left in it. An English
sentence is a run of ``exercise_helpers.MIN_ENGLISH_RUN`` or more plain English words (identifiers, code in
backticks, numbers and lists break a run). Nothing the checker writes is forgiven, the shared modules'
frame and tree comparison included; the other chapters' Chinese-report tests use the same detector, which
is tested here.
"""

from __future__ import annotations

import pytest
from exercise_helpers import chinese_chars, english_runs
from test_exercises_radix import WRONG

import minikv.exercises as exercises
from minikv.exercises import check, radix_history
from minikv.exercises import radix as radix_checks
from minikv.language import catalog, get_language, language

# -- the detector itself ------------------------------------------------------------------------------


def test_the_detector_finds_english_sentences_and_spares_code() -> None:
    assert english_runs("match_len([1, 2], [1, 3]) is wrong.") == []
    assert english_runs("节点 [1, 2] 的 ref_count 是 2，但 `the whole cache is here` 不算") == []
    assert english_runs("RadixTreeNode must return the deepest node") == ["must return the deepest node"]
    assert english_runs("walk([1]) must return the deepest matched node.") == ["must return the deepest matched node."]
    assert english_runs("a cache with page_size 2 and a pool of 10 pages") == ["and a pool of"]
    assert english_runs("走 (the root, for an empty match)") == ["(the root, for an empty match)"]
    assert english_runs("the expected tree") == []


def test_the_detector_spares_what_the_learner_raised() -> None:
    assert english_runs("你的函数抛出了 ValueError: the page is not free at all") == []
    assert english_runs("你的代码 wrote outside the cache's memory。") == ["wrote outside the cache's memory。"]
    assert english_runs("页池 `pool.allocate(n, evict_from=manager) is the call` 很紧") == []


# -- every radix check, wrong, in Chinese ------------------------------------------------------------------


WRONG_IN_ZH: list[tuple[str, int, str]] = [
    ("radix.match_len", 0, "match_len([4294967303, 1], [7, 1]) is wrong."),
    ("radix.split_at", 2, "split_at(the node [1, 2, 3, 4], 1) returned the node it was given."),
    ("radix.walk", 5, "walk([1, 2, 3]) did not tick the clock: a walk is a use"),
    ("radix.match_prefix", 6, "the handle names a node that is not in your tree, though it spells the same prefix"),
    ("radix.insert_prefix", 3, "must return how many of its tokens were already cached."),
    ("radix.lock_handle", 1, "the calls has 1; at call 1: after locking the match of [1, 2, 3]"),
    ("radix.harden_lock", 4, "unlocking the match of [1, 2, 3, 4], whose node holds no lock of its own"),
    ("radix.evict", 6, "evict(-1): a negative size is a mistake, so raise ValueError before changing anything."),
    ("radix.evict", 9, "evict(0) evicted 4 slots, but 0 were needed"),
    ("radix.check_integrity", 1, "the tree is corrupted (a node whose parent link points elsewhere: an interior node"),
    ("radix.page_aligned_insert", 0, "after insert_prefix([1, 2, 3], slots [2000, 2001, 2002]) with page_size 4"),
    ("radix.cache", 9, "minikv's cache matched 0 tokens in slots [] (torch.int32); yours matched 0 tokens"),
    ("radix.cache", 12, "At step 1: after reset(): your reset replaced root_node with a new node."),
]
"""A check, the index of one of its wrong answers in ``test_exercises_radix.WRONG``, and a piece of the
English report it gives, which must stay as it is (and must not be left in the Chinese one)."""


def test_every_radix_check_has_a_wrong_answer_here() -> None:
    assert {e for e, _, _ in WRONG_IN_ZH} == {e for e in exercises.exercise_ids() if e.startswith("radix.")}


def _translated() -> bool:
    return bool(catalog("zh").get("{what} must return the deepest matched node."))


@pytest.mark.skipif(not _translated(), reason="the catalog lacks radix's messages (scripts/messages.py fill)")
@pytest.mark.parametrize(("exercise_id", "index", "english"), WRONG_IN_ZH, ids=[f"{e}-{i}" for e, i, _ in WRONG_IN_ZH])
def test_a_wrong_answer_is_reported_inchinese_chars(exercise_id: str, index: int, english: str) -> None:
    cls = WRONG[exercise_id][index]
    before = check(exercise_id, cls)
    with language("zh"):
        result = check(exercise_id, cls)
        text = str(result)
    assert not result.passed and not before.passed
    assert english in str(before), str(before)
    assert get_language() == "en" and english in str(before), "the language did not go back to English"
    failure = result.smallest_failure
    assert failure is not None
    assert chinese_chars(failure.problem) >= 4, failure.problem
    assert chinese_chars(failure.description) >= 2, failure.description
    assert english not in text, text
    assert english_runs(text) == [], text


# -- the pieces a report is made of ---------------------------------------------------------------------


@pytest.mark.skipif(not _translated(), reason="the catalog lacks radix's messages (scripts/messages.py fill)")
def test_every_corruption_is_named_inchinese_chars() -> None:
    with language("zh"):
        names = {name: radix_checks.corruption_name(name) for name in radix_checks.CORRUPTIONS}
    for english, chinese in names.items():
        assert chinese_chars(chinese) >= 2 and not english_runs(chinese, 2), (english, chinese)
    assert all(radix_checks.corruption_name(name) == name for name in radix_checks.CORRUPTIONS)


@pytest.mark.skipif(not _translated(), reason="the catalog lacks radix's messages (scripts/messages.py fill)")
def test_a_history_is_told_inchinese_chars() -> None:
    history = (*radix_history.fork_history(2), radix_history.Op("match", ids=(1, 2)), radix_history.Op("abort", "C"))
    english = radix_history.describe_history(history, 2, failed_at=3)
    with language("zh"):
        text = radix_history.describe_history(history, 2, failed_at=3)
    assert english.startswith("a cache with page_size 2 and a pool of 10 pages, then:")
    assert "admit request A with prompt [1, 2, 3, 4, 7, 7, 9]" in english and "<- fails here" in english
    assert text.startswith("一个 page_size 为 2 的缓存和一个有 10 页的页池，然后：")
    assert "接纳请求 A" in text and "在此失败" in text and "中止请求 C" in text
    assert english_runs(text) == [], text


@pytest.mark.skipif(not _translated(), reason="the catalog lacks radix's messages (scripts/messages.py fill)")
def test_explain_errors_speakschinese_chars(capsys: pytest.CaptureFixture[str]) -> None:
    def walk(self: object, input_ids: list[int]) -> None:
        raise NotImplementedError

    with language("zh"), radix_checks.explain_errors():
        walk(None, [1])
    out = capsys.readouterr().out
    assert out.startswith("✗ walk 还是桩函数（任务 5.3）"), out
    assert english_runs(out) == [], out
