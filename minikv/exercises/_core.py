"""How a check runs: a registry of exercises, each a list of cases, and a
careful way of calling the learner's code.

A case is a small function that builds its own inputs (fresh managers, pools,
tensors), calls the learner's function through :func:`call`, and raises
:class:`Mismatch` when the answer differs from minikv's own. Whatever the
learner's code does -- raise, loop forever, return the wrong type -- becomes a
failed case with a sentence saying why, never an exception out of ``check``.

What ``check`` promises (the exercises' introduction says the same to learners):

* **Every exception is a report.** Whatever the learner's code raises -- ``sys.exit()``,
  a ``BaseException`` subclass, an error whose message is a megabyte long (cut to
  :data:`MESSAGE_LIMIT` characters) -- becomes a failed case. Only Ctrl-C
  (``KeyboardInterrupt`` itself) stops ``check``, as it stops any cell.
* **A time limit that holds.** A case that runs longer than :data:`CASE_TIME_LIMIT_S` is
  stopped (:class:`_Stopper`), even when the learner's loop catches every exception with a
  bare ``except:``; after one case ran out of time the remaining cases are not run, so a
  function that never returns costs the limit once per check, not once per case. (Where
  there is no ``SIGALRM`` -- Windows -- or ``check`` runs outside the main thread, there
  is no limit.)
* **The process as it was.** When ``check`` returns, minikv's functions, classes and module
  attributes are the ones it started with (:class:`_ProcessState` puts back whatever the
  learner's code rebound or patched), and so are the signal handlers, the interval timer
  and ``sys.gettrace()``/``sys.getprofile()``.

There is no guard against minikv's own answers: the exercises are for learning, and a
class that inherits from minikv's answer is told so in one sentence (``radix``, ``naive``).
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import random
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType, FunctionType, TracebackType
from typing import Any, Generic, TypeVar

from ..errors import ArgumentError, ArgumentTypeError
from ..language import get_language, tr
from ._report import CaseResult, CheckResult

CASE_TIME_LIMIT_S = 20.0
"""A case that takes longer than this is stopped: the learner's code probably loops forever.

Every case takes well under a second with a correct answer; after one case ran out of
time, the check stops, so a function that never returns costs this once per check."""

MESSAGE_LIMIT = 500
"""An error message from the learner's code is cut to this many characters in a report."""
REPORT_LIMIT = 6000
"""And every part of a report (the problem, expected, got) to this many."""


class Mismatch(Exception):
    """Raised by a case: the learner's answer is wrong. Carries the explanation."""

    def __init__(self, problem: str, expected: str = "", got: str = "", size: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.expected = expected
        self.got = got
        self.size = size
        """The size of the failing input, where it is not the case's own (a shrunk random case)."""


def explain_a_kernel_compiled_for_no_gpu(error: BaseException | None) -> None:
    """Triton's error for a ``@triton.jit`` kernel launched on a machine without a GPU, in plain words
    (the kernel exercises, 3 and 7, call it on what the learner's launch raised)."""
    import torch

    if error is not None and "active drivers" in str(error) and not torch.cuda.is_available():
        raise Mismatch(
            tr(
                "your kernel was set up to be compiled for a GPU, and this machine has none. Triton decides "
                "when @triton.jit runs: call minikv.kernels.use_interpreter_without_cuda() before defining "
                "the kernel (the notebook's first cell does), then run the kernel's cell again."
            ),
            tr("a kernel that runs in Triton's interpreter"),
            f"{type(error).__name__}: {error}",
        )


class LearnerRaised(Exception):
    """The learner's function raised ``error``; ``where`` names the line, without any file path."""

    def __init__(self, error: BaseException, where: str, function: str = "") -> None:
        self.message = message_of(error)
        super().__init__(f"{type(error).__name__}: {self.message}")
        self.error = error
        self.where = where
        self.function = function
        """The learner's function or method that raised (``NaiveManager.evict``), empty if unknown."""

    def describe(self) -> str:
        return _raised_in_words(
            tr("your function raised {error}", error=type(self.error).__name__), self.message, self.where
        )


class _TimedOut(BaseException):
    """A BaseException so that a learner's ``except Exception`` cannot swallow it (and :class:`_Stopper`
    raises it again on the learner's next line, so that a bare ``except:`` cannot either)."""


def is_learners(error: BaseException) -> bool:
    """Whether ``error`` is the learner's to report: anything but Ctrl-C and the checker's own time limit."""
    return type(error) is not KeyboardInterrupt and not isinstance(error, _TimedOut)


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text``, cut after ``limit`` characters with a note of how much was left out."""
    return text if len(text) <= limit else text[:limit] + tr(" … ({n:,} more characters)", n=len(text) - limit)


def message_of(error: BaseException) -> str:
    """An exception's message, stripped and clipped; one whose ``str()`` itself fails is said so."""
    try:
        text = str(error)
    except BaseException as failure:
        if not is_learners(failure):
            raise
        return tr("(its message could not be shown: str() raised {error})", error=type(failure).__name__)
    return clip(text.strip())


@dataclass(frozen=True)
class Case:
    """One test: ``run(fn)`` returns if ``fn`` behaved, raises :class:`Mismatch` if not."""

    description: str
    size: int
    run: Callable[[Callable[..., Any]], None]


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str | Callable[[], str]
    """The title, or a function that says it in the current language (``lambda: tr("...")``)."""
    make_cases: Callable[[], list[Case]]

    def title_now(self) -> str:
        """The title in the current language: a registry is filled at import, its titles are said at check time."""
        return self.title() if callable(self.title) else self.title


REGISTRY: dict[str, Exercise] = {}


def exercise(
    exercise_id: str, title: str | Callable[[], str]
) -> Callable[[Callable[[], list[Case]]], Callable[[], list[Case]]]:
    """Register a function that builds the cases of ``exercise_id``.

    ``title`` is best a function, ``lambda: tr("the title")``: the registry is filled
    when the module is imported, and a title translated then would keep that language.
    The cases are built by ``make_cases`` at check time, so their descriptions can
    be ``tr(...)`` calls written where the cases are made.
    """

    def register(make_cases: Callable[[], list[Case]]) -> Callable[[], list[Case]]:
        if exercise_id in REGISTRY:
            raise ArgumentError(f"exercise id {exercise_id!r} is registered twice")
        REGISTRY[exercise_id] = Exercise(exercise_id, title, make_cases)
        return make_cases

    return register


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; whatever it raises comes back as :class:`LearnerRaised`."""
    try:
        return fn(*args, **kwargs)
    except BaseException as error:  # the learner's exception, whatever it is, is data here
        if not is_learners(error):
            raise
        raise LearnerRaised(error, _where(error.__traceback__), _raising_function(error.__traceback__)) from None


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
        return returned or tr("returned {result}", result=repr(result))
    kept = _where_of.get(id(error))
    where = kept[1] if kept is not None and kept[0] is error else ""
    return _raised_in_words(tr("raised {error}", error=type(error).__name__), message_of(error), where)


def _raised_in_words(raised: str, message: str, where: str) -> str:
    """``raised ValueError: its message (in f, at `line`)``: the error, its message if any, where if known."""
    text = tr("{raised}: {message}", raised=raised, message=message) if message else raised
    return tr("{text} ({where})", text=text, where=where) if where else text


def unexpected(error: BaseException) -> LearnerRaised:
    """Turn an error that :func:`raised` returned, and that was not the right answer, back into a report."""
    kept = _where_of.pop(id(error), None)
    return LearnerRaised(error, kept[1] if kept is not None and kept[0] is error else "")


def run_check(exercise_id: str, fn: Callable[..., Any]) -> CheckResult:
    if not isinstance(exercise_id, str) or exercise_id not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise ArgumentError(
            tr(
                "exercise_id: unknown exercise {exercise_id}; the exercises are {known}",
                exercise_id=repr(exercise_id),
                known=known,
            )
        )
    if not callable(fn):
        raise ArgumentTypeError(tr("fn: pass your function (or class) itself, got {type}", type=type(fn).__name__))
    ex = REGISTRY[exercise_id]
    cases = ex.make_cases()
    title, lang = ex.title_now(), get_language()
    own = minikv_own(fn)
    if own is not None:
        return CheckResult(ex.id, title, tuple(CaseResult(c.description, c.size, False, own) for c in cases), lang)
    results: list[CaseResult] = []
    state = _ProcessState()
    try:
        for case in cases:
            try:
                result, timed_out = _run_case(case, fn)
                results.append(result)
            finally:
                state.restore()
            if timed_out:
                skipped = tr("not run: an earlier case ran past the time limit.")
                results.extend(CaseResult(c.description, c.size, False, skipped) for c in cases[len(results) :])
                break
    finally:
        _where_of.clear()
        state.restore()
    return CheckResult(ex.id, title, tuple(results), lang)


def minikv_own(fn: object) -> str | None:
    """One sentence if ``fn`` is minikv's own answer (a function of minikv, or a class that inherits from
    one of minikv's managers), else None. Not a guard, a courtesy: such code passes nothing worth passing."""
    from ..base import BaseCacheManager

    target = getattr(fn, "func", fn) if type(fn).__name__ == "partial" else fn
    target = getattr(target, "__func__", target)
    if isinstance(target, type):
        managers = [k for k in target.__mro__ if issubclass(k, BaseCacheManager) and k is not BaseCacheManager]
        theirs = [k for k in managers if k.__module__.startswith("minikv.")]
        if theirs:
            return tr(
                "{cls} inherits from minikv's {theirs}, so it runs minikv's own answer. "
                "Derive it from BaseCacheManager, as the skeleton does, and write the methods yourself.",
                cls=target.__name__,
                theirs=theirs[0].__name__,
            )
        for klass in target.__mro__:  # a method of minikv's manager, set on the learner's class
            for name, value in vars(klass).items() if klass.__module__ != "builtins" else ():
                method = minikv_own(value) if isinstance(value, FunctionType) else None
                if method is not None and klass not in (BaseCacheManager, object):
                    return f"{target.__name__}.{name}: {method}"
        return None
    code = getattr(target, "__code__", None)
    if isinstance(code, CodeType) and not _is_learner_code(code):
        name = getattr(target, "__qualname__", "a function")
        return tr("this is minikv's own answer, {name}: write your own and check that.", name=name)
    return None


def _run_case(case: Case, fn: Callable[..., Any]) -> tuple[CaseResult, bool]:
    """The verdict on one case, and whether it ran past the time limit (then the check stops)."""

    def failed(
        problem: str, expected: str = "", got: str = "", not_written: bool = False, size: int = -1
    ) -> CaseResult:
        return CaseResult(
            case.description,
            case.size if size < 0 else size,
            False,
            clip(problem, REPORT_LIMIT),
            clip(expected, REPORT_LIMIT),
            clip(got, REPORT_LIMIT),
            not_written,
        )

    _ON_INPUT[0] = None
    try:
        with _time_limit(CASE_TIME_LIMIT_S):
            case.run(fn)
    except Mismatch as mismatch:
        got = mismatch.got
        if got and got == mismatch.expected:  # the difference does not show in this rendering: say so
            got = tr("the same, as shown here: the difference is the one named above")
        size = -1 if mismatch.size is None else mismatch.size
        return failed(mismatch.problem, mismatch.expected, got, size=size), False
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            return failed(_stub_sentence(learner.function, fn), not_written=True), False
        return failed(tr("{what}.", what=learner.describe())), False
    except _TimedOut:
        on = _input_in_words()
        if on:
            return failed(
                tr(
                    "this case took longer than {limit:.0f} s on the random input {input}, "
                    "so it was stopped; is there a loop that never ends?",
                    limit=CASE_TIME_LIMIT_S,
                    input=on,
                )
            ), True
        return failed(
            tr(
                "this case took longer than {limit:.0f} s, so it was stopped; is there a loop that never ends?",
                limit=CASE_TIME_LIMIT_S,
            )
        ), True
    except BaseException as error:  # the checker could not make sense of what the learner's code returned
        if not is_learners(error):
            raise
        on = _input_in_words()
        return failed(
            tr(
                "the checker could not use what your function returned ({error}: {message}); "
                "check the return type in the task's description.",
                error=type(error).__name__,
                message=message_of(error),
            )
            + (tr("\nThe input: {input}", input=on) if on else "")
        ), False
    finally:
        _ON_INPUT[0] = None
    return CaseResult(case.description, case.size, True), False


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
        if isinstance(expected, list) and isinstance(got, list) and max(len(expected), len(got)) > 12:
            from ._report import diff

            where, expected_text, got_text = diff(expected, got)
            raise Mismatch(tr("{what} is wrong: {where}.", what=what, where=where), expected_text, got_text)
        raise Mismatch(tr("{what} is wrong.", what=what), repr(expected), repr(got))


def expect_int(what: str, got: Any) -> int:
    """Accept Python and NumPy ints (not bools, floats or tensors)."""
    try:
        import numpy as np

        ok = isinstance(got, (int, np.integer)) and not isinstance(got, bool)
    except ImportError:  # pragma: no cover - numpy is a dependency
        ok = isinstance(got, int) and not isinstance(got, bool)
    if not ok:
        raise Mismatch(tr("{what} must be an int.", what=what), tr("an int"), f"{type(got).__name__}: {got!r}")
    return int(got)


def expect_slot_tensor(message: str, got: Any) -> None:
    """``got`` must be a 1-D int32 tensor, as every slot list the managers return is; else ``message``."""
    import torch

    if not isinstance(got, torch.Tensor) or got.dtype != torch.int32 or got.dim() != 1:
        shown = f"dtype {got.dtype}, shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)[:120]
        raise Mismatch(message, tr("a 1-D int32 tensor"), shown)


# -- randomised cases, shrunk to the smallest failing input --------------------------

T = TypeVar("T")

RANDOM_CASES = 24
"""How many inputs a randomised case draws (sizes growing from 1 to its largest size)."""
SHRINK_TRIES = 300
"""At most this many extra runs of the learner's function to shrink a failing input."""
SHRINK_SECONDS = 15.0
"""And at most this long: a slow function gets a less shrunk input rather than the case's time limit."""


class Invalid(Exception):
    """Raised by a randomised case's run for an input outside the contract (a shrink went too far): skip it."""


@dataclass(frozen=True)
class Draw(Generic[T]):
    """How a randomised case draws its inputs and runs one of them.

    ``draw(rng, size)`` returns an input of about ``size`` (tokens, slots,
    operations): plain immutable data (tuples, ints, dtypes), from which
    ``run(fn, input)`` builds fresh managers and tensors each time, so that a
    run cannot change the input of the next. ``run`` raises :class:`Mismatch`
    (or lets :class:`LearnerRaised` out) when the learner's answer differs from
    minikv's, and :class:`Invalid` for an input the contract does not allow.
    ``shrink(input)`` (optional) yields smaller inputs to try: fewer items,
    smaller values; ``show(input)`` says the input in words, for the report.
    """

    draw: Callable[[random.Random, int], T]
    run: Callable[[Callable[..., Any], T], None]
    show: Callable[[T], str] = repr
    shrink: Callable[[T], Iterable[T]] | None = None
    size_of: Callable[[T], int] | None = None
    classes: tuple[tuple[str, Callable[[random.Random, int], T]], ...] = ()
    """Named generators of the inputs a plain draw meets rarely (``("a pool that runs short", draw)``):
    the draws take turns, ``draw`` first, so that every class gets its share of the ``count`` inputs."""


def random_case(
    description: str, spec: Draw[Any], *, seed: int, max_size: int, count: int = RANDOM_CASES, weight: int = 10**6
) -> Case:
    """A case that draws ``count`` inputs of growing size from ``spec`` and compares each with minikv's answer.

    The seeds are ``seed, seed + 1, ...``: the same every run, so a failure
    shows again. On the first failing input it shrinks: the same seed at every
    smaller size first (the first one that still fails is kept), then the
    spec's own ``shrink`` greedily, keeping any smaller input that still fails.
    The report shows the smallest failing input, its seed and size.
    ``weight`` ranks the case among the hand-made ones (larger: reported only
    if no hand-made case fails).
    """

    draws = [("", spec.draw), *spec.classes]

    def run(fn: Callable[..., Any]) -> None:
        for i in range(count):
            size = 1 + (i * max_size) // max(count - 1, 1) if count > 1 else max_size
            case_seed = seed + i
            kind, draw = draws[i % len(draws)]
            value = draw(random.Random(case_seed), size)
            failure = _failure(spec, fn, value)
            if failure is None:
                continue
            value, size, case_seed, failure = _shrink(spec, draw, fn, value, size, case_seed, failure)
            shown = spec.show(value)
            measured = spec.size_of(value) if spec.size_of is not None else size
            if isinstance(failure, Mismatch) and failure.size is not None:  # the run ranked its failure itself
                measured = failure.size
            drawn = tr("seed {seed}, size {size}", seed=case_seed, size=size)
            if kind:
                drawn = tr("{drawn}, drawn as {kind}", drawn=drawn, kind=kind)
            if isinstance(failure, LearnerRaised):
                if type(failure.error) is NotImplementedError:
                    raise failure
                raise Mismatch(
                    tr(
                        "on a random input, {what}.\nThe smallest input found that fails ({drawn}): {shown}",
                        what=failure.describe(),
                        drawn=drawn,
                        shown=shown,
                    ),
                    size=measured,
                )
            raise Mismatch(
                tr(
                    "{problem}\nThe smallest random input found that fails ({drawn}): {shown}",
                    problem=failure.problem,
                    drawn=drawn,
                    shown=shown,
                ),
                failure.expected,
                failure.got,
                size=measured,
            )

    return Case(description, weight, run)


def _failure(spec: Draw[Any], fn: Callable[..., Any], value: Any) -> Mismatch | LearnerRaised | None:
    _ON_INPUT[0] = lambda: spec.show(value)
    try:
        spec.run(fn, value)
    except (Mismatch, LearnerRaised) as failure:
        return failure
    return None


_ON_INPUT: list[Callable[[], str] | None] = [None]
"""What the random case now running is on, in words, for a time-limit report (None: a hand-made case)."""


def _input_in_words() -> str:
    shown = _ON_INPUT[0]
    if shown is None:
        return ""
    try:
        return clip(shown(), 600)
    except Exception:  # the input could not be shown: the report says the rest
        return ""


def _still_fails(spec: Draw[Any], fn: Callable[..., Any], value: Any) -> Mismatch | LearnerRaised | None:
    try:
        return _failure(spec, fn, value)
    except Invalid:
        return None


def _shrink(
    spec: Draw[Any],
    draw: Callable[[random.Random, int], Any],
    fn: Callable[..., Any],
    value: Any,
    size: int,
    seed: int,
    failure: Mismatch | LearnerRaised,
) -> tuple[Any, int, int, Mismatch | LearnerRaised]:
    """A random case's failing input, shrunk: first the same draw at every smaller size (with the
    same seed and two others), the smallest that still fails kept; then the spec's own ``shrink``."""

    def smaller(drawn: tuple[Any, int, int, bool], _: object) -> Iterator[tuple[Any, int, int, bool]]:
        value, size, seed, scanned = drawn
        if not scanned:
            for other_size in range(1, size):
                for other_seed in (seed, seed + 7919, seed + 104729):
                    yield draw(random.Random(other_seed), other_size), other_size, other_seed, True
        for candidate in spec.shrink(value) if spec.shrink is not None else ():
            yield candidate, size, seed, True

    (value, size, seed, _), failure = shrink(
        (value, size, seed, False), failure, lambda drawn: _still_fails(spec, fn, drawn[0]), smaller
    )
    return value, size, seed, failure


F = TypeVar("F")


def shrink(
    value: T,
    failure: F,
    fails: Callable[[T], F | None],
    smaller: Callable[[T, F], Iterable[T]],
    *,
    tries: int = SHRINK_TRIES,
    seconds: float = SHRINK_SECONDS,
) -> tuple[T, F]:
    """The one shrinker: the smallest failing input it finds, and its failure.

    Greedy: ``smaller(value, failure)`` lists smaller inputs, most promising first;
    the first that still fails (``fails`` returns its failure, ``None`` if it passes)
    replaces ``value`` and is shrunk again, until none fails or ``tries`` runs or
    ``seconds`` are spent (a slow function gets a less shrunk input rather than the
    case's time limit).
    """
    deadline = time.monotonic() + seconds
    progress = True
    while progress:
        progress = False
        for candidate in smaller(value, failure):
            if tries <= 0 or time.monotonic() > deadline:
                return value, failure
            tries -= 1
            found = fails(candidate)
            if found is not None:
                value, failure, progress = candidate, found, True
                break
    return value, failure


def shrink_tuple(items: tuple[Any, ...], minimum: int = 0) -> Iterator[tuple[Any, ...]]:
    """Smaller tuples: halves first, then one item fewer (from the end first)."""
    n = len(items)
    if n > minimum and n >= 2:
        yield items[: max(n // 2, minimum)]
        yield items[n // 2 :] if n - n // 2 >= minimum else items
    for i in reversed(range(n)):
        if n - 1 >= minimum:
            yield items[:i] + items[i + 1 :]


def shrink_int(value: int, lowest: int = 0) -> Iterator[int]:
    """Smaller ints, smallest first: ``lowest``, then closer to ``value`` (halving the step), ``value - 1`` last."""
    step = value - lowest
    while step > 0:
        yield value - step
        step //= 2


# -- side effects ------------------------------------------------------------------


def keep(value: Any) -> Any:
    """A copy of a caller's argument, to compare with after the learner's function ran (tensors cloned)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(keep(v) for v in value) if isinstance(value, list) else tuple(keep(v) for v in value)
    if isinstance(value, dict):
        return {k: keep(v) for k, v in value.items()}
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is not watched
        return value


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types: tensors by dtype, shape and every element; containers item by item."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) or isinstance(b, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:
        return a is b


def short(value: Any, limit: int = 12) -> str:
    """A value in words, long tensors and lists cut after ``limit`` items."""
    import torch

    if isinstance(value, torch.Tensor):
        items = value.flatten().tolist()
        more = tr(", ... ({n} values)", n=len(items)) if len(items) > limit else ""
        body = ", ".join(map(str, items[:limit])) + more
        return f"tensor([{body}], dtype={value.dtype}, shape {tuple(value.shape)})"
    if isinstance(value, (list, tuple)) and len(value) > limit:
        return repr(list(value[:limit]))[:-1] + tr(", ... ({n} items)]", n=len(value))
    return repr(value)


def expect_unchanged(names: Iterable[str], before: Iterable[Any], after: Iterable[Any]) -> None:
    """The caller's arguments are as they were: raise a Mismatch naming the first one the learner changed."""
    for name, old, new in zip(names, before, after, strict=True):
        if not same(old, new):
            raise Mismatch(
                tr(
                    "your function changed its argument `{name}`; the caller still needs it as it was, "
                    "so read it without writing to it (work on a copy if you must change something).",
                    name=name,
                ),
                short(old),
                short(new),
            )


def call_watching(fn: Callable[..., Any], names: tuple[str, ...], *args: Any) -> Any:
    """:func:`call`, then check that the last ``len(names)`` of ``args`` (named ``names``) did not change.

    The arguments before them (a pool or manager the function is meant to change) are not watched.
    """
    watched = args[len(args) - len(names) :]
    before = [keep(a) for a in watched]
    result = call(fn, *args)
    expect_unchanged(names, before, watched)
    return result


# -- the machinery ------------------------------------------------------------


def _where(tb: TracebackType | None) -> str:
    """The learner's line that was running when the error happened, without its file path."""
    frames = [frame for frame in traceback.extract_tb(tb) if is_learner_file(frame.filename)]
    if not frames:
        return ""
    frame = frames[-1]
    line = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
    return (
        tr("in {function}, at `{line}`", function=frame.name, line=line)
        if line
        else tr("in {function}", function=frame.name)
    )


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
_LIBRARY_DIRS = tuple(
    {
        str(Path(path).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)


def is_learner_file(filename: str) -> bool:
    """Whether code in ``filename`` is the learner's: neither minikv's nor a library's (a notebook cell is).

    Python's own generated code (``<string>``: a dataclass's ``__init__``; ``<frozen ...>``) is not.
    """
    if filename == "<string>" or filename.startswith("<frozen "):
        return False
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith(_PACKAGE_DIR) and not resolved.startswith(_LIBRARY_DIRS)


def _raising_function(tb: TracebackType | None) -> str:
    """The qualified name of the learner's function that was running when the error happened."""
    name = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_learner_file(code.co_filename):
            name = getattr(code, "co_qualname", code.co_name)
        tb = tb.tb_next
    return name


def _stub_sentence(function: str, fn: object) -> str:
    """Which stub stopped the case: the function under check, or one it calls, or one of the class's methods."""
    own = getattr(fn, "__qualname__", getattr(fn, "__name__", ""))
    if not function or function == own or function.endswith(">"):
        return tr("your function still raises NotImplementedError: it is the stub.")
    if isinstance(fn, type) and function.startswith(f"{own}."):
        return tr(
            "`{function}` still raises NotImplementedError: that method is still the stub; write it next.",
            function=function,
        )
    return tr(
        "`{function}` still raises NotImplementedError: your code calls it, and it is still the stub.",
        function=function,
    )


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Stop a case that runs too long (only where SIGALRM exists and we are on the main thread).

    The alarm goes off after ``seconds`` and then every :data:`_RETRY_S` until the case ends;
    each time it arms a :class:`_Stopper`.
    """
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    stopper = _Stopper()
    previous = signal.signal(signal.SIGALRM, stopper.on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, _RETRY_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        stopper.disarm()


_RETRY_S = 0.05


class _Stopper:
    """Stops the learner's code once the time limit passed, even code that catches every exception.

    Raising once is not enough: a bare ``except:`` in a loop would swallow it and go
    on. So once armed, the stopper raises :class:`_TimedOut` again at *every line* of
    the learner's code (a trace function, ``sys.settrace``; minikv's and the libraries'
    lines run on, so their cleanup still happens). Python switches a trace function off
    when it raises, so a profile function (``sys.setprofile``), which sees every call
    and return, arms it again, and so does the alarm every :data:`_RETRY_S`. The
    exception thus climbs out of one ``except`` after another until it leaves the
    learner's code. :meth:`disarm` puts the previous trace and profile functions back.
    """

    def __init__(self) -> None:
        self.trace, self.profile = sys.gettrace(), sys.getprofile()
        self.frames: dict[int, FrameType] = {}
        self.armed = False

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        self.arm(frame)
        if frame is not None and _is_learner_code(frame.f_code):
            raise _TimedOut()  # raised here, not by the trace function, it leaves the trace function on

    def arm(self, frame: FrameType | None) -> None:
        self.armed = True
        sys.settrace(self.on_trace)
        sys.setprofile(self.on_profile)
        while frame is not None:  # the frames already running: a trace function only sees new ones
            if _is_learner_code(frame.f_code):
                frame.f_trace = self.on_trace
                self.frames[id(frame)] = frame
            frame = frame.f_back

    def on_trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if not _is_learner_code(frame.f_code):
            return None
        if event == "line":
            raise _TimedOut()
        return self.on_trace

    def on_profile(self, frame: FrameType, event: str, arg: object) -> None:
        if sys.gettrace() != self.on_trace:
            self.arm(frame)

    def disarm(self) -> None:
        if not self.armed:
            return
        sys.settrace(self.trace)
        sys.setprofile(self.profile)
        for frame in self.frames.values():
            frame.f_trace = None
        self.frames.clear()
        self.armed = False


_LEARNER_CODE: dict[CodeType, bool] = {}


def _is_learner_code(code: CodeType) -> bool:
    found = _LEARNER_CODE.get(code)
    if found is None:
        found = _LEARNER_CODE[code] = is_learner_file(code.co_filename)
    return found


class _ProcessState:
    """What ``check`` puts back after every case: whatever the learner's code rebound or patched.

    minikv's module attributes, its classes' attributes and its functions' code and
    defaults; the signal handlers and the interval timer; the trace and profile
    functions. (Attributes the learner's code *added* are left: importing a submodule
    adds one too.)
    """

    def __init__(self) -> None:
        self.modules = {name: m for name, m in sys.modules.items() if name == "minikv" or name.startswith("minikv.")}
        self.namespaces: list[tuple[object, dict[str, Any]]] = []
        self.functions: list[tuple[FunctionType, tuple[Any, ...]]] = []
        classes: list[type] = []
        for module in self.modules.values():
            self.namespaces.append((module, dict(vars(module))))
            classes += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
        for cls in classes:
            self.namespaces.append((cls, dict(vars(cls))))
        for _, namespace in self.namespaces:
            for value in namespace.values():
                for fn in _functions_in(value):
                    self.functions.append((fn, _function_parts(fn)))
        self.trace, self.profile = sys.gettrace(), sys.getprofile()
        self.main_thread = threading.current_thread() is threading.main_thread()
        self.handlers = {}
        if self.main_thread:
            for number in signal.valid_signals():
                with contextlib.suppress(OSError, ValueError):
                    self.handlers[number] = signal.getsignal(number)
        self.timer = signal.getitimer(signal.ITIMER_REAL) if hasattr(signal, "getitimer") else None

    def restore(self) -> None:
        for owner, namespace in self.namespaces:
            now = vars(owner)
            for name, value in namespace.items():
                if now.get(name, _MISSING) is not value:
                    with contextlib.suppress(AttributeError, TypeError):
                        type.__setattr__(owner, name, value) if isinstance(owner, type) else setattr(owner, name, value)
        for fn, parts in self.functions:
            if _function_parts(fn) != parts:
                fn.__code__, fn.__defaults__, fn.__kwdefaults__ = parts
        if sys.gettrace() is not self.trace:
            sys.settrace(self.trace)
        if sys.getprofile() is not self.profile:
            sys.setprofile(self.profile)
        if self.main_thread:
            for number, handler in self.handlers.items():
                if handler is not None and signal.getsignal(number) is not handler:
                    with contextlib.suppress(OSError, ValueError, TypeError):
                        signal.signal(number, handler)
            if self.timer is not None and signal.getitimer(signal.ITIMER_REAL) != self.timer:
                signal.setitimer(signal.ITIMER_REAL, *self.timer)


_MISSING = object()


def _functions_in(value: object) -> list[FunctionType]:
    """The plain functions behind a namespace entry: a function, a static or class method, a property."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, FunctionType)]
    return [value] if isinstance(value, FunctionType) else []


def _function_parts(fn: FunctionType) -> tuple[Any, ...]:
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)
