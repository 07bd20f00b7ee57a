"""The checker under hostile learner code (issue 25): every submission is a failed case, the time limit
holds against code that catches everything, and ``check`` leaves the process as it found it.

The battery runs each hostile submission through ``check``, then checks that correct code still
passes and that minikv's own functions, module attributes, signal handlers and trace/profile
functions are what they were before.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable

import pytest

import minikv
from minikv import capacity, radix_manager
from minikv.exercises import _core, check

EXERCISE = "capacity.tokens_that_fit"


def correct(memory, per_token):
    return memory // per_token


class LearnersOwnStop(BaseException):
    """A learner's BaseException subclass: it must not escape check()."""


class LikeCtrlC(KeyboardInterrupt):
    """A subclass of KeyboardInterrupt raised by the learner's code: a mistake, not Ctrl-C."""


def loops(memory, per_token):
    while True:
        pass


def loops_catching_everything(memory, per_token):
    n = 0
    while True:
        try:
            while True:
                n += 1
        except:  # noqa: E722 - the point of the test
            n -= 1


def loops_catching_base_exception(memory, per_token):
    while True:
        try:
            loops(memory, per_token)
        except BaseException:
            continue


def catches_twice(memory, per_token):
    while True:
        try:  # noqa: SIM105 - the point of the test
            loops_catching_everything(memory, per_token)
        except:  # noqa: E722
            pass


def raises_its_own_base_exception(memory, per_token):
    raise LearnersOwnStop("mine")


def exits(memory, per_token):
    sys.exit(3)


def raises_like_ctrl_c(memory, per_token):
    raise LikeCtrlC()


def huge_message(memory, per_token):
    raise ValueError("x" * 1_000_000)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def unprintable(memory, per_token):
    raise _Unprintable()


def recurses(memory, per_token):
    return recurses(memory, per_token) + 1


def patches_minikv(memory, per_token):
    capacity.tokens_that_fit = lambda m, p: 0
    radix_manager.RadixCacheManager.evict = lambda self, size: None
    radix_manager.match_len.__code__ = (lambda a, b: 0).__code__
    minikv.exercises._core.CASE_TIME_LIMIT_S = 0.0
    return memory // per_token


def changes_signal_handlers(memory, per_token):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)
    return memory // per_token


def leaves_a_tracer(memory, per_token):
    sys.settrace(lambda *args: None)
    sys.setprofile(lambda *args: None)
    return memory // per_token


HOSTILE: list[Callable] = [
    loops,
    loops_catching_everything,
    loops_catching_base_exception,
    catches_twice,
    raises_its_own_base_exception,
    exits,
    raises_like_ctrl_c,
    huge_message,
    unprintable,
    recurses,
    patches_minikv,
    changes_signal_handlers,
    leaves_a_tracer,
]

SIDE_EFFECTS_ONLY = (patches_minikv, changes_signal_handlers, leaves_a_tracer)
LIMIT_S = 0.3


def _process_state() -> dict[str, object]:
    """What check() must leave as it found it."""
    functions = {
        "tokens_that_fit": capacity.tokens_that_fit,
        "tokens_that_fit.__code__": capacity.tokens_that_fit.__code__,
        "evict": vars(radix_manager.RadixCacheManager)["evict"],
        "match_len.__code__": radix_manager.match_len.__code__,
        "limit": _core.CASE_TIME_LIMIT_S,
    }
    handlers = {f"signal {s}": signal.getsignal(s) for s in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM)}
    hooks = {"trace": sys.gettrace(), "profile": sys.getprofile(), "timer": signal.getitimer(signal.ITIMER_REAL)}
    return functions | handlers | hooks


@pytest.mark.parametrize("fn", HOSTILE, ids=lambda fn: fn.__name__)
def test_a_hostile_submission_is_a_failed_case_and_changes_nothing(
    fn: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_core, "CASE_TIME_LIMIT_S", LIMIT_S)
    before = _process_state()
    start = time.monotonic()
    result = check(EXERCISE, fn)
    elapsed = time.monotonic() - start
    assert _process_state() == before
    if fn not in SIDE_EFFECTS_ONLY:  # these answer right; only what they leave behind is wrong
        assert not result.passed and result.smallest_failure is not None
    cases = len(result.cases)
    assert elapsed < 10 * LIMIT_S + cases, f"{fn.__name__}: {elapsed:.1f} s; the time limit is paid once per check"
    text = str(result)
    assert len(text) < 20_000, len(text)
    if fn in (loops, loops_catching_everything, loops_catching_base_exception, catches_twice):
        problems = [case.problem for case in result.cases]
        assert "took longer than" in problems[0] and problems[1].startswith("not run: an earlier case ran past")
    if fn is huge_message:
        assert "more characters" in result.smallest_failure.problem
    # correct code still passes, and minikv's own answer still works
    assert check(EXERCISE, correct).passed
    assert capacity.tokens_that_fit(10, 3) == 3
    manager = minikv.RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    assert manager.evict(3).tolist() == [0, 1, 2]


def test_ctrl_c_itself_still_stops_a_check_and_changes_nothing() -> None:
    def interrupted(memory, per_token):
        raise KeyboardInterrupt

    before = _process_state()
    with pytest.raises(KeyboardInterrupt):
        check(EXERCISE, interrupted)
    assert _process_state() == before


def test_the_checks_of_every_exercise_survive_a_loop_that_catches_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A class or a function: whatever the exercise calls loops, catching every exception."""
    monkeypatch.setattr(_core, "CASE_TIME_LIMIT_S", LIMIT_S)

    def anything(*args, **kwargs):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass

    before = _process_state()
    for exercise_id in ("lifecycle.admit", "blocks.deallocate", "storage.slot_mapping"):
        start = time.monotonic()
        result = check(exercise_id, anything)
        assert not result.passed and any("took longer than" in c.problem for c in result.cases), exercise_id
        assert time.monotonic() - start < 5, exercise_id
    assert _process_state() == before
