"""The exercise checker's machinery: check(), its reports, stubs, the forbid-list, bad arguments.

The per-exercise wrong answers live in one file per chapter, ``test_exercises_<chapter>.py``
(the prefix of the exercise id); ``exercise_helpers.py`` holds what they share.
"""

from __future__ import annotations

import pytest
from exercise_helpers import REPO, all_wrong_answers, solution_for

from minikv.exercises import _core, check, exercise_ids


def test_every_exercise_has_a_solution_and_wrong_answers() -> None:
    ids = exercise_ids()
    assert len(ids) >= 20
    wrong = all_wrong_answers()
    for exercise_id in ids:
        assert solution_for(exercise_id) is not None
        assert len(wrong.get(exercise_id, [])) >= 2, f"{exercise_id} needs at least two wrong implementations"
    assert set(wrong) <= set(ids)


def test_a_stub_is_reported_as_not_written_without_paths() -> None:
    def stub(*args, **kwargs):
        raise NotImplementedError

    for exercise_id in exercise_ids():
        result = check(exercise_id, stub)
        assert result.not_written, exercise_id
        assert "not written yet" in str(result)
        assert "/" not in str(result)


def test_a_learner_exception_names_the_line_not_the_file() -> None:
    def evict(manager, size):
        leaves = []
        return leaves[size]  # IndexError

    result = check("radix.evict", evict)
    problem = result.smallest_failure.problem
    assert "IndexError" in problem and "in evict, at `return leaves[size]  # IndexError`" in problem
    assert str(REPO) not in str(result)


@pytest.mark.parametrize("error", [SystemExit(3), GeneratorExit()], ids=["sys.exit", "GeneratorExit"])
def test_exits_from_the_learners_code_are_failed_cases(error: BaseException) -> None:
    """check survives whatever the learner's code does, sys.exit() included (issue 12)."""

    def learner(*args, **kwargs):
        raise error

    for exercise_id in ("radix.evict", "capacity.kv_bytes_per_token"):
        result = check(exercise_id, learner)
        assert not result.passed and not result.not_written
        assert type(error).__name__ in result.smallest_failure.problem


def test_ctrl_c_still_stops_a_check() -> None:
    def evict(manager, size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check("radix.evict", evict)


def test_calling_the_reference_is_refused() -> None:
    result = check("radix.evict", lambda manager, size: manager.evict(size))
    assert not result.passed
    assert "minikv's own answer" in result.smallest_failure.problem
    # and the reference works again afterwards
    from minikv import RadixCacheManager

    manager = RadixCacheManager()
    manager.insert_prefix([1, 2], [0, 1])
    assert manager.evict(1).tolist() == [0, 1]


def test_a_function_that_never_returns_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "CASE_TIME_LIMIT_S", 0.2)

    def match_len(key, input_ids):
        while True:
            pass

    result = check("radix.match_len", match_len)
    assert not result.passed
    assert "took longer than" in result.smallest_failure.problem


def test_a_wrong_return_type_is_a_failure_not_a_crash() -> None:
    for exercise_id in exercise_ids():
        result = check(exercise_id, lambda *args, **kwargs: "nonsense")
        assert not result.passed, exercise_id


def test_bad_arguments_to_check_raise() -> None:
    from minikv.errors import ArgumentError, ArgumentTypeError

    with pytest.raises(ArgumentError, match=r"unknown exercise 'radix\.nope'"):
        check("radix.nope", lambda: None)
    with pytest.raises(ArgumentTypeError, match="fn"):
        check("radix.evict", 42)
