"""What the exercise-checker tests share: the solutions, the wrong-answer registry, the two chapter tests.

Each exercise chapter has one test file, ``tests/test_exercises_<chapter>.py``, named after
the prefix of its exercise ids (``radix.evict`` -> ``test_exercises_radix.py``). The file
registers its plausible wrong implementations (mutants) in a :class:`WrongAnswers` and ends
with :func:`chapter_tests`, which adds the two tests every chapter runs: each solution from
``exercises/solutions/`` passes its check, and each wrong answer fails it with a readable
report. ``test_exercises_core.py`` tests the checker machinery itself.
"""

from __future__ import annotations

import html
import importlib
import re
import runpy
from collections.abc import Callable
from pathlib import Path

import pytest

import minikv.exercises as exercises
from minikv.exercises import check, exercise_ids

REPO = Path(__file__).resolve().parent.parent
SOLUTION_FILES = sorted((REPO / "exercises" / "solutions").glob("ex*.py"))


def _load_solutions() -> dict[str, dict]:
    """Run every solution file with ``check`` switched off, keeping what each defines."""
    real = exercises.check
    exercises.check = lambda exercise_id, fn: None
    try:
        return {path.stem: runpy.run_path(str(path), run_name="solution") for path in SOLUTION_FILES}
    finally:
        exercises.check = real


SOLUTIONS = _load_solutions()
S = {name: value for namespace in SOLUTIONS.values() for name, value in namespace.items() if not name.startswith("_")}
"""Every public name the solution files define, e.g. ``S["admit"]``, ``S["NaiveManager"]``."""


def solution_for(exercise_id: str) -> Callable:
    if exercise_id.startswith("radix."):  # exercise 5 grades one class, method by method
        paged = exercise_id in ("radix.page_aligned_insert", "radix.cache")
        hardened = exercise_id == "radix.harden_lock"
        return SOLUTIONS["ex5_radix"][
            "MyPagedRadixCache" if paged else "MyHardenedRadixCache" if hardened else "MyRadixCache"
        ]
    name = {"naive.manager": "NaiveManager"}.get(exercise_id, exercise_id.split(".", 1)[1])
    return S[name]


class WrongAnswers(dict[str, list[Callable]]):
    """One chapter's wrong answers: exercise id -> the implementations its check must fail.

    Register with the decorator ``@wrong(exercise_id)`` (``wrong = WRONG.register``) or
    assign a list, ``WRONG[exercise_id] = [variant(bug=1), ...]``.
    """

    def register(self, exercise_id: str) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            self.setdefault(exercise_id, []).append(fn)
            return fn

        return add


def chapter_ids(chapter: str) -> list[str]:
    """The exercise ids of one chapter (``"radix"`` -> ``radix.match_len``, ...), in registry order."""
    return [exercise_id for exercise_id in exercise_ids() if exercise_id.split(".", 1)[0] == chapter]


def all_wrong_answers() -> dict[str, list[Callable]]:
    """Every chapter file's wrong answers together (each file imported by its chapter's name)."""
    merged: dict[str, list[Callable]] = {}
    for chapter in dict.fromkeys(exercise_id.split(".", 1)[0] for exercise_id in exercise_ids()):
        module = importlib.import_module(f"test_exercises_{chapter}")
        for exercise_id, fns in module.WRONG.items():
            merged.setdefault(exercise_id, []).extend(fns)
    return merged


def assert_not_self_contradictory(result) -> None:
    """No failed case says "expected X, got X": its expected and got parts differ (issue 15)."""
    for case in result.cases:
        if not case.passed and (case.expected or case.got):
            assert case.expected != case.got, f"{result.exercise_id}: {case.description}: expected == got\n{case}"


def count_wrong_answers() -> dict[str, int]:
    """Wrong answers per exercise id, over every chapter file (the number the issue asks to report)."""
    return {exercise_id: len(fns) for exercise_id, fns in all_wrong_answers().items()}


def chapter_tests(chapter: str, wrong: WrongAnswers) -> tuple[Callable, Callable]:
    """The two tests of a chapter file; call it at the end of the file, after every wrong answer.

    Use as ``test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report =
    chapter_tests("radix", WRONG)``: pytest collects them under those names, parametrized by
    the chapter's exercise ids and by ``<exercise id>-<index in its list>``.
    """

    @pytest.mark.parametrize("exercise_id", chapter_ids(chapter))
    def test_the_solution_passes(exercise_id: str) -> None:
        result = check(exercise_id, solution_for(exercise_id))
        assert result.passed, str(result)
        assert str(result).startswith(f"✓ {exercise_id}: all ")

    cases = [(exercise_id, fn) for exercise_id, fns in wrong.items() for fn in fns]

    @pytest.mark.parametrize(
        ("exercise_id", "fn"), cases, ids=[f"{e}-{i}" for e, fns in wrong.items() for i in range(len(fns))]
    )
    def test_a_wrong_answer_fails_with_a_readable_report(exercise_id: str, fn: Callable) -> None:
        result = check(exercise_id, fn)
        assert not result.passed, f"{exercise_id}: the checker passed a wrong answer ({getattr(fn, '__name__', fn)})"
        assert not result.not_written
        failure = result.smallest_failure
        assert failure is not None and failure.problem
        assert "the checker could not use" not in failure.problem, failure.problem
        text, page = str(result), result._repr_html_()
        assert "Smallest failing case:" in text and failure.description in text
        assert "Smallest failing case:" in page
        assert str(REPO) not in text and str(REPO) not in page
        assert_not_self_contradictory(result)

    return test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report


# -- reports in Chinese (issue 27) ---------------------------------------------------------------------

MIN_ENGLISH_RUN = 4
"""This many plain English words in a row make an English sentence in a Chinese report (three would
flag names such as ``the expected tree``; four catches every sentence the checks write)."""

_CODE = re.compile(r"`[^`]*`")
_PLAIN_WORD = re.compile(r"^[\"'(]*([A-Za-z]+(?:'[a-z]+)?)[\"'),.;:!?，。；：！？）]*$")
_LEARNER_ERROR = re.compile(r"\b[A-Z]\w*(Error|Exception)\b: .*")


def chinese_chars(text: str) -> int:
    """How many Chinese characters ``text`` holds."""
    return sum("\u4e00" <= c <= "\u9fff" for c in text)


def _is_plain_word(token: str) -> bool:
    """A word as prose uses it: letters only (an apostrophe inside), not an identifier such as
    ``RadixTreeNode`` (capitals inside), ``ref_count`` or ``match_prefix([1, 2])``."""
    match = _PLAIN_WORD.match(token)
    return match is not None and not any(c.isupper() for c in match.group(1)[1:])


def english_runs(text: str, min_run: int = MIN_ENGLISH_RUN) -> list[str]:
    """The English sentences left in a report meant to be Chinese: runs of ``min_run`` or more plain
    English words. Code in backticks, identifiers, numbers and lists break a run, and the message of
    an exception the learner's code raised (``ValueError: ...``) is the learner's own words, so it
    is left out."""
    runs: list[str] = []
    for line in _CODE.sub(" ` ", text).splitlines():
        current: list[str] = []
        for token in [*_LEARNER_ERROR.sub(" ", line).split(), ""]:
            if token and _is_plain_word(token):
                current.append(token)
                continue
            if len(current) >= min_run:
                runs.append(" ".join(current))
            current = []
    return runs


def page_text(page: str) -> str:
    """The words of a report's HTML (``_repr_html_``), tags dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "\n", page))


def assert_reported_in_both_languages(exercise_id: str, fn: Callable, english: str, chinese: str) -> None:
    """Check ``fn`` (a wrong answer) in English and in Chinese and compare the two reports.

    Both give the same verdict, case by case. The English report holds ``english`` (the message
    this wrong answer triggers) and no Chinese; the Chinese one holds ``chinese`` instead, every
    case is described in Chinese (a bare name such as ``float16`` reads the same in both), and no
    English sentence is left in its text or its HTML.
    """
    from minikv.language import language

    with language("en"):
        en = check(exercise_id, fn)
        en_text, en_page = str(en), en._repr_html_()
    with language("zh"):
        zh = check(exercise_id, fn)
        zh_text, zh_page = str(zh), page_text(zh._repr_html_())

    assert not en.passed and not zh.passed
    assert [(c.passed, c.size) for c in en.cases] == [(c.passed, c.size) for c in zh.cases]

    assert english in en_text, en_text
    assert not chinese_chars(en_text) and not chinese_chars(en_page), en_text

    assert chinese in zh_text and english not in zh_text, zh_text
    for en_case, zh_case in zip(en.cases, zh.cases, strict=True):
        if re.fullmatch(r"[\w.]+", en_case.description):
            assert zh_case.description == en_case.description
            continue
        assert chinese_chars(zh_case.description) and zh_case.description != en_case.description, zh_case
        assert not english_runs(zh_case.description), zh_case.description
    failure = zh.smallest_failure
    assert failure is not None and chinese_chars(failure.problem), zh_text
    assert english_runs(zh_text) == [], zh_text
    assert chinese in zh_page and english_runs(zh_page) == [], english_runs(zh_page)
