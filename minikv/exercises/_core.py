"""How a check runs: a registry of exercises, each a list of cases, and a
careful way of calling the learner's code.

A case is a small function that builds its own inputs (fresh managers, pools,
tensors), calls the learner's function through :func:`call`, and raises
:class:`Mismatch` when the answer differs from minikv's own. Whatever the
learner's code does -- raise, loop forever, return the wrong type -- becomes a
failed case with a sentence saying why, never an exception out of ``check``.
"""

from __future__ import annotations

import contextlib
import linecache
import signal
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import ArgumentError, ArgumentTypeError
from ._report import CaseResult, CheckResult

CASE_TIME_LIMIT_S = 60.0
"""A case that takes longer than this is stopped: the learner's code probably loops forever."""


class Mismatch(Exception):
    """Raised by a case: the learner's answer is wrong. Carries the explanation."""

    def __init__(self, problem: str, expected: str = "", got: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.expected = expected
        self.got = got


class LearnerRaised(Exception):
    """The learner's function raised ``error``; ``where`` names the line, without any file path."""

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.where = where

    def describe(self) -> str:
        message = str(self.error).strip()
        text = f"your function raised {type(self.error).__name__}" + (f": {message}" if message else "")
        return text + (f" ({self.where})" if self.where else "")


class _TimedOut(BaseException):
    """A BaseException so that a learner's ``except Exception`` cannot swallow it."""


@dataclass(frozen=True)
class Case:
    """One test: ``run(fn)`` returns if ``fn`` behaved, raises :class:`Mismatch` if not."""

    description: str
    size: int
    run: Callable[[Callable[..., Any]], None]


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    make_cases: Callable[[], list[Case]]
    forbidden: tuple[tuple[object, str], ...] = field(default_factory=tuple)
    """Reference functions the learner must not call while their function runs: ``(owner, attribute)``."""


REGISTRY: dict[str, Exercise] = {}


def exercise(
    exercise_id: str, title: str, forbid: tuple[tuple[object, str], ...] = ()
) -> Callable[[Callable[[], list[Case]]], Callable[[], list[Case]]]:
    """Register a function that builds the cases of ``exercise_id``."""

    def register(make_cases: Callable[[], list[Case]]) -> Callable[[], list[Case]]:
        if exercise_id in REGISTRY:
            raise ArgumentError(f"exercise id {exercise_id!r} is registered twice")
        REGISTRY[exercise_id] = Exercise(exercise_id, title, make_cases, tuple(forbid))
        return make_cases

    return register


_active: list[Exercise] = []

_LEARNER_ERRORS = (Exception, SystemExit, GeneratorExit)
"""What a learner's code may raise and ``check`` still reports as a failed case. ``sys.exit()``
and a stray ``GeneratorExit`` are mistakes to report too; only Ctrl-C (``KeyboardInterrupt``)
and the checker's own time limit go through."""


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; whatever it raises comes back as :class:`LearnerRaised`."""
    with _forbidding(_active[-1].forbidden if _active else ()):
        try:
            return fn(*args, **kwargs)
        except _LEARNER_ERRORS as error:  # the learner's exception, whatever it is, is data here
            raise LearnerRaised(error, _where(error.__traceback__)) from None


def raised(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
    """Like :func:`call`, for cases where raising may be the right answer: ``(result, error)``.

    A stub's ``NotImplementedError`` is still passed on as :class:`LearnerRaised`,
    so that an unwritten function is reported as unwritten.
    """
    try:
        return call(fn, *args, **kwargs), None
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            raise
        _where_of[id(learner.error)] = (learner.error, learner.where)
        return None, learner.error


_where_of: dict[int, tuple[BaseException, str]] = {}


def outcome(error: BaseException | None, result: object = None, returned: str = "") -> str:
    """What the learner's function did, in words: what it returned, or what it raised and where."""
    if error is None:
        return returned or f"returned {result!r}"
    kept = _where_of.get(id(error))
    where = kept[1] if kept is not None and kept[0] is error else ""
    message = str(error).strip()
    return f"raised {type(error).__name__}" + (f": {message}" if message else "") + (f" ({where})" if where else "")


def unexpected(error: BaseException) -> LearnerRaised:
    """Turn an error that :func:`raised` returned, and that was not the right answer, back into a report."""
    kept = _where_of.pop(id(error), None)
    return LearnerRaised(error, kept[1] if kept is not None and kept[0] is error else "")


def run_check(exercise_id: str, fn: Callable[..., Any]) -> CheckResult:
    if not isinstance(exercise_id, str) or exercise_id not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise ArgumentError(f"exercise_id: unknown exercise {exercise_id!r}; the exercises are {known}")
    if not callable(fn):
        raise ArgumentTypeError(f"fn: pass your function (or class) itself, got {type(fn).__name__}")
    ex = REGISTRY[exercise_id]
    results = []
    _active.append(ex)
    try:
        for case in ex.make_cases():
            results.append(_run_case(case, fn))
    finally:
        _active.pop()
        _where_of.clear()
    return CheckResult(ex.id, ex.title, tuple(results))


def _run_case(case: Case, fn: Callable[..., Any]) -> CaseResult:
    def failed(problem: str, expected: str = "", got: str = "", not_written: bool = False) -> CaseResult:
        return CaseResult(case.description, case.size, False, problem, expected, got, not_written)

    try:
        with _time_limit(CASE_TIME_LIMIT_S):
            case.run(fn)
    except Mismatch as mismatch:
        return failed(mismatch.problem, mismatch.expected, mismatch.got)
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            return failed("your function still raises NotImplementedError: it is the stub.", not_written=True)
        return failed(learner.describe() + ".")
    except _TimedOut:
        return failed(
            f"this case took longer than {CASE_TIME_LIMIT_S:.0f} s, so it was stopped; is there a loop that never ends?"
        )
    except _LEARNER_ERRORS as error:  # the checker could not make sense of what the learner's code returned
        return failed(
            "the checker could not use what your function returned "
            f"({type(error).__name__}: {error}); check the return type in the task's description."
        )
    return CaseResult(case.description, case.size, True)


# -- learner-facing helpers -------------------------------------------------


def expect_equal(what: str, expected: Any, got: Any) -> None:
    """The simplest comparison: equal values, reported with their reprs."""
    if type(got) is bool or type(expected) is bool:
        same = type(got) is type(expected) and got == expected
    else:
        try:
            same = bool(got == expected)
        except Exception:  # e.g. comparing a tensor with an int
            same = False
    if not same:
        raise Mismatch(f"{what} is wrong.", repr(expected), repr(got))


def expect_int(what: str, got: Any) -> int:
    """Accept Python and NumPy ints (not bools, floats or tensors)."""
    try:
        import numpy as np

        ok = isinstance(got, (int, np.integer)) and not isinstance(got, bool)
    except ImportError:  # pragma: no cover - numpy is a dependency
        ok = isinstance(got, int) and not isinstance(got, bool)
    if not ok:
        raise Mismatch(f"{what} must be an int.", "an int", f"{type(got).__name__}: {got!r}")
    return int(got)


# -- the machinery ------------------------------------------------------------


def _where(tb: TracebackType | None) -> str:
    """The learner's line that was running when the error happened, without its file path."""
    frames = [frame for frame in traceback.extract_tb(tb) if _is_learner_file(frame.filename)]
    if not frames:
        return ""
    frame = frames[-1]
    line = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return f"in {frame.name}, at `{line}`" if line else f"in {frame.name}"


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
_LIBRARY_DIRS = tuple(
    {
        str(Path(path).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)


def _is_learner_file(filename: str) -> bool:
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith(_PACKAGE_DIR) and not resolved.startswith(_LIBRARY_DIRS)


@contextlib.contextmanager
def _forbidding(forbidden: tuple[tuple[object, str], ...]) -> Iterator[None]:
    """Replace reference functions by ones that explain they are the answer, while the learner's code runs."""
    saved = []
    for owner, name in forbidden:
        # vars(), not getattr(): a staticmethod or an inherited method must come back exactly as it was.
        own = name in vars(owner)
        saved.append((owner, name, vars(owner)[name] if own else None, own))
        setattr(owner, name, _refusal(owner, name))
    try:
        yield
    finally:
        for owner, name, original, own in reversed(saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def _refusal(owner: object, name: str) -> Callable[..., Any]:
    owner_name = getattr(owner, "__name__", type(owner).__name__)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{owner_name}.{name} is minikv's own answer to this exercise; write it yourself")

    return refuse


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Stop a case that runs too long (only where SIGALRM exists and we are on the main thread)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise _TimedOut()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
