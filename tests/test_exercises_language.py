"""The exercise checker speaks the learner's language: ``check(..., lang="zh")`` reports in Chinese.

For every exercise of the chapters listed in :data:`CHAPTERS`, a plausible wrong answer
(the chapter's first registered mutant, or the one :data:`WRONG_FOR` names) and the
reference solution are checked in Chinese: the report (text and HTML) must hold Chinese
and no English sentence, every message the checker looked up must be in the Chinese
catalog, and the same checks in English must stay English. Further tests cover the
checker's own paths (a stub, a learner's exception, a time limit, minikv's own answer),
a language that is refused, and a result shown after the language changed.

To cover another chapter, add its prefix to :data:`CHAPTERS` (its mutants come from
``tests/test_exercises_<chapter>.py``), and list in :data:`WRONG_FOR` any exercise whose
first mutant is not a good wrong answer to read.
"""

from __future__ import annotations

import contextlib
import functools
import html
import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest
from exercise_helpers import S, chapter_ids, solution_for

import minikv.language as language_module
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.exercises import CaseResult, CheckResult, _core, check
from minikv.language import get_language, set_language

CHAPTERS: tuple[str, ...] = ("capacity", "lifecycle", "storage", "naive", "blocks", "scheduling", "paged_attention")
"""The chapters whose checks are translated and tested here (exercise 5's radix checks have their
own test, ``test_exercises_radix_zh.py``)."""

WRONG_FOR: dict[str, Callable[..., object]] = {}
"""Exercise id -> the wrong answer to check it with, where the chapter's first mutant will not do."""

IDS = [exercise_id for chapter in CHAPTERS for exercise_id in chapter_ids(chapter)]


def wrong_answer(exercise_id: str) -> Callable[..., object]:
    if exercise_id in WRONG_FOR:
        return WRONG_FOR[exercise_id]
    module = importlib.import_module(f"test_exercises_{exercise_id.split('.', 1)[0]}")
    return module.WRONG[exercise_id][0]


# -- telling Chinese from English ----------------------------------------------------------------

_CJK = re.compile(r"[\u4e00-\u9fff]")
_CODE = re.compile(r"`[^`\n]*`")
_LEARNERS_ERROR = re.compile(r"\b\w*(?:Error|Exception|Exit|Interrupt)[：:][^。\n]*")
"""A learner's exception and its message (``TypeError：f() got an unexpected ...``): the learner's words."""
_ENGLISH_RUN = re.compile(r"(?<![A-Za-z0-9_.'])[A-Za-z]+(?: [A-Za-z]+){3,}(?![A-Za-z0-9_.(])")
"""Four or more plain words in a row, none part of an identifier (``size_info``, ``torch.int32``, ``f(``)."""


def english_runs(text: str) -> list[str]:
    """The runs of English words in ``text`` outside code spans and the learner's own error messages."""
    prose = _LEARNERS_ERROR.sub("", _CODE.sub("", text))
    return _ENGLISH_RUN.findall(prose)


def has_chinese(text: str) -> bool:
    return bool(_CJK.search(text))


def html_text(result: CheckResult) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", result._repr_html_()))


def test_the_detector_finds_an_english_sentence_and_spares_code() -> None:
    assert english_runs("最小的失败用例：the smallest model of all: one layer") == ["the smallest model of all"]
    assert english_runs("用例the cases are waiting") == ["the cases are waiting"]
    assert english_runs("哪里出错：`return budgets[memory]  # this is the line` 不对") == []
    assert english_runs("你的函数抛出了 TypeError：f() got an unexpected keyword argument 'x'。") == []
    assert english_runs("size_info (evictable_size, protected_size) 不对，dtype torch.int32") == []


# -- recording what the checker looks up --------------------------------------------------------


class _Recording(Mapping[str, str]):
    """A catalog that notes every message id looked up and not found."""

    def __init__(self, table: Mapping[str, str], missed: set[str]) -> None:
        self.table, self.missed = table, missed

    def __getitem__(self, msgid: str) -> str:
        return self.table[msgid]

    def get(self, msgid: str, default: object = None) -> object:  # type: ignore[override]
        if msgid not in self.table:
            self.missed.add(msgid)
        return self.table.get(msgid, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


@contextlib.contextmanager
def recording_misses() -> Iterator[set[str]]:
    """Inside: every message id ``tr`` looks up in a catalog that lacks it is added to the set yielded."""
    missed: set[str] = set()
    real = language_module.catalog

    def catalog(lang: str) -> Mapping[str, str]:
        return _Recording(real(lang), missed)

    # This file is the learner's as far as the checker can tell (neither minikv's nor a library's), so
    # the time limit would stop these helpers too, when a message is written after it: mark them the checker's.
    for code in (catalog.__code__, *(vars(_Recording)[name].__code__ for name in ("__init__", "get", "__getitem__"))):
        _core._LEARNER_CODE[code] = False
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(language_module, "catalog", catalog)
        yield missed


def test_the_recording_catalog_notes_a_message_without_chinese() -> None:
    from minikv.language import tr

    with recording_misses() as missed:
        assert tr("no such message {n}", lang="zh", n=1) == "no such message 1"
        tr("✓ {exercise}: all {total} cases passed.", lang="zh", exercise="x", total=1)
    assert missed == {"no such message {n}"}


@dataclass(frozen=True)
class Checked:
    wrong_zh: CheckResult
    right_zh: CheckResult
    wrong_en: CheckResult
    missed: frozenset[str]


@functools.cache
def checked(exercise_id: str) -> Checked:
    """The checks of one exercise, each run once for all the tests below."""
    wrong, right = wrong_answer(exercise_id), solution_for(exercise_id)
    with recording_misses() as missed:
        wrong_zh, right_zh = check(exercise_id, wrong, lang="zh"), check(exercise_id, right, lang="zh")
    return Checked(wrong_zh, right_zh, check(exercise_id, wrong, lang="en"), frozenset(missed))


# -- every exercise, in Chinese -------------------------------------------------------------------


@pytest.mark.parametrize("exercise_id", IDS)
def test_a_wrong_answer_is_reported_in_chinese(exercise_id: str) -> None:
    result = checked(exercise_id).wrong_zh
    assert not result.passed and result.language == "zh"
    for text in (str(result), html_text(result)):
        assert has_chinese(text), text
        assert english_runs(text) == [], text
    assert has_chinese(result.title) and has_chinese(result.smallest_failure.problem)
    descriptions = [case.description for case in result.cases]  # some are all code and numbers ("block_size 1")
    assert sum(map(has_chinese, descriptions)) >= len(descriptions) / 2, descriptions
    assert [english_runs(d) for d in descriptions if english_runs(d)] == [], descriptions


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_solution_is_reported_in_chinese(exercise_id: str) -> None:
    result = checked(exercise_id).right_zh
    assert result.passed, str(result)
    for text in (str(result), html_text(result)):
        assert has_chinese(text) and english_runs(text) == [], text


@pytest.mark.parametrize("exercise_id", IDS)
def test_every_message_looked_up_is_in_the_chinese_catalog(exercise_id: str) -> None:
    assert checked(exercise_id).missed == frozenset(), "messages without a Chinese form (scripts/messages.py todo)"


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_same_check_in_english_stays_english(exercise_id: str) -> None:
    both = checked(exercise_id)
    result = both.wrong_en
    assert result.language == "en" and not has_chinese(str(result)) and not has_chinese(html_text(result))
    assert [case.passed for case in result.cases] == [case.passed for case in both.wrong_zh.cases]
    assert get_language() == "en"


# -- the checker's own paths ----------------------------------------------------------------------


def stub(*args: object, **kwargs: object) -> object:
    raise NotImplementedError


def raises_index_error(memory: int, per_token: int) -> int:
    budgets: list[int] = []
    return budgets[memory]


def loops(memory: int, per_token: int) -> int:
    while True:
        pass


class StubbedEvict(S["NaiveManager"]):  # type: ignore[misc]
    def evict(self, size: int) -> object:
        raise NotImplementedError


def _own_answer() -> Callable[..., object]:
    from minikv.capacity import tokens_that_fit

    return tokens_that_fit


PATHS: dict[str, tuple[str, Callable[[], Callable[..., object]], str]] = {
    "a stub": ("capacity.tokens_that_fit", lambda: stub, "还没有编写"),
    "a stubbed method": ("naive.manager", lambda: StubbedEvict, "还是桩函数"),
    "a learner's exception": ("capacity.tokens_that_fit", lambda: raises_index_error, "在 raises_index_error 中"),
    "minikv's own answer": ("capacity.tokens_that_fit", _own_answer, "minikv 自己的答案"),
    "a time limit": ("capacity.tokens_that_fit", lambda: loops, "是不是有一个永远不会结束的循环"),
    "a changed argument": (
        "capacity.cached_tokens_with_sharing",
        lambda: importlib.import_module("test_exercises_capacity").sharing_sorts_the_callers_list,
        "调用者还需要它保持原样",
    ),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_the_checkers_own_sentences_are_chinese(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exercise_id, make, sentence = PATHS[path]
    if path == "a time limit":
        monkeypatch.setattr(_core, "CASE_TIME_LIMIT_S", 0.3)
    with recording_misses() as missed:
        result = check(exercise_id, make(), lang="zh")
    assert not result.passed
    text = str(result)
    assert sentence in text, text
    assert english_runs(text) == [] and english_runs(html_text(result)) == [], text
    assert missed == set()
    if path == "a time limit":
        assert any(case.problem.startswith("未运行") for case in result.cases[1:]), text


def test_a_stub_says_not_written_in_chinese_for_every_exercise() -> None:
    for exercise_id in IDS:
        result = check(exercise_id, stub, lang="zh")
        assert result.not_written and "还没有编写" in str(result), exercise_id
        assert english_runs(str(result)) == [], str(result)


# -- the language argument and the result's own language ---------------------------------------------


def test_a_language_not_spoken_is_refused_by_name_before_anything_runs() -> None:
    calls: list[object] = []

    def tokens_that_fit(memory: int, per_token: int) -> int:
        calls.append(memory)
        return memory // per_token

    with pytest.raises(ArgumentError, match=r"^lang must be one of"):
        check("capacity.tokens_that_fit", tokens_that_fit, lang="fr")
    with pytest.raises(ArgumentTypeError, match=r"^lang must be a str"):
        check("capacity.tokens_that_fit", tokens_that_fit, lang=["zh"])  # type: ignore[arg-type]
    assert calls == [] and get_language() == "en"


def test_lang_leaves_the_language_setting_as_it_was() -> None:
    try:
        set_language("zh")
        result = check("capacity.tokens_that_fit", stub, lang="en")
        assert result.language == "en" and get_language() == "zh"
        assert check("capacity.tokens_that_fit", stub).language == "zh"  # no lang: the current language
    finally:
        set_language("en")


def test_a_result_renders_in_the_language_it_was_made_in() -> None:
    made_in_zh = check("capacity.tokens_that_fit", raises_index_error, lang="zh")
    text, page = str(made_in_zh), made_in_zh._repr_html_()
    try:
        set_language("en")
        assert str(made_in_zh) == text and made_in_zh._repr_html_() == page
        assert "最小的失败用例" in text and "用例：" in text and "最小的失败用例" in page
        set_language("zh")
        made_in_en = check("capacity.tokens_that_fit", raises_index_error, lang="en")
        assert "Smallest failing case" in str(made_in_en) and not has_chinese(str(made_in_en))
        assert not has_chinese(made_in_en._repr_html_()) and not has_chinese(made_in_en.headline())
    finally:
        set_language("en")


def test_a_check_result_keeps_its_positional_fields_and_checks_its_language() -> None:
    case = CaseResult("a case", 1, True)
    assert CheckResult("x.y", "a title", (case,)).language == "en"
    assert CheckResult("x.y", "a title", (case,), "zh").headline() == "✓ x.y：全部 1 个用例通过。"
    with pytest.raises(ArgumentError, match=r"^language must be one of"):
        CheckResult("x.y", "a title", (case,), "fr")
