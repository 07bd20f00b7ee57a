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
import copy
import linecache
import random
import signal
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FunctionType, TracebackType
from typing import Any, Generic, TypeVar

from ..errors import ArgumentError, ArgumentTypeError
from ._report import CaseResult, CheckResult

CASE_TIME_LIMIT_S = 60.0
"""A case that takes longer than this is stopped: the learner's code probably loops forever."""


class Mismatch(Exception):
    """Raised by a case: the learner's answer is wrong. Carries the explanation."""

    def __init__(self, problem: str, expected: str = "", got: str = "", size: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.expected = expected
        self.got = got
        self.size = size
        """The size of the failing input, where it is not the case's own (a shrunk random case)."""


class LearnerRaised(Exception):
    """The learner's function raised ``error``; ``where`` names the line, without any file path."""

    def __init__(self, error: BaseException, where: str, function: str = "") -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.where = where
        self.function = function
        """The learner's function or method that raised (``NaiveManager.evict``), empty if unknown."""

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
    forbidden = _active[-1].forbidden if _active else ()
    if forbidden:
        _refuse_copies(fn, forbidden)
    with _forbidding(forbidden):
        try:
            return fn(*args, **kwargs)
        except _LEARNER_ERRORS as error:  # the learner's exception, whatever it is, is data here
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
        got = mismatch.got
        if got and got == mismatch.expected:  # the difference does not show in this rendering: say so
            got = "the same, as shown here: the difference is the one named above"
        if mismatch.size is not None:
            return CaseResult(case.description, mismatch.size, False, mismatch.problem, mismatch.expected, got, False)
        return failed(mismatch.problem, mismatch.expected, got)
    except LearnerRaised as learner:
        if type(learner.error) is NotImplementedError:
            return failed(_stub_sentence(learner.function, fn), not_written=True)
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
        if isinstance(expected, list) and isinstance(got, list) and max(len(expected), len(got)) > 12:
            from ._report import diff

            where, expected_text, got_text = diff(expected, got)
            raise Mismatch(f"{what} is wrong: {where}.", expected_text, got_text)
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


def expect_slot_tensor(message: str, got: Any) -> None:
    """``got`` must be a 1-D int32 tensor, as every slot list the managers return is; else ``message``."""
    import torch

    if not isinstance(got, torch.Tensor) or got.dtype != torch.int32 or got.dim() != 1:
        shown = f"dtype {got.dtype}, shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)[:120]
        raise Mismatch(message, "a 1-D int32 tensor", shown)


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

    def run(fn: Callable[..., Any]) -> None:
        for i in range(count):
            size = 1 + (i * max_size) // max(count - 1, 1) if count > 1 else max_size
            case_seed = seed + i
            value = spec.draw(random.Random(case_seed), size)
            failure = _failure(spec, fn, value)
            if failure is None:
                continue
            value, size, case_seed, failure = _shrink(spec, fn, value, size, case_seed, failure)
            shown = spec.show(value)
            measured = spec.size_of(value) if spec.size_of is not None else size
            if isinstance(failure, LearnerRaised):
                if type(failure.error) is NotImplementedError:
                    raise failure
                raise Mismatch(
                    f"on a random input, {failure.describe()}.\nThe smallest input found that fails "
                    f"(seed {case_seed}, size {size}): {shown}",
                    size=measured,
                )
            raise Mismatch(
                f"{failure.problem}\nThe smallest random input found that fails (seed {case_seed}, size {size}): "
                f"{shown}",
                failure.expected,
                failure.got,
                size=measured,
            )

    return Case(description, weight, run)


def _failure(spec: Draw[Any], fn: Callable[..., Any], value: Any) -> Mismatch | LearnerRaised | None:
    try:
        spec.run(fn, value)
    except (Mismatch, LearnerRaised) as failure:
        return failure
    return None


def _still_fails(spec: Draw[Any], fn: Callable[..., Any], value: Any) -> Mismatch | LearnerRaised | None:
    try:
        return _failure(spec, fn, value)
    except Invalid:
        return None


def _shrink(
    spec: Draw[Any], fn: Callable[..., Any], value: Any, size: int, seed: int, failure: Mismatch | LearnerRaised
) -> tuple[Any, int, int, Mismatch | LearnerRaised]:
    tries = 0
    deadline = time.monotonic() + SHRINK_SECONDS
    for smaller in range(1, size):
        if time.monotonic() > deadline:
            break
        for other_seed in (seed, seed + 7919, seed + 104729):
            tries += 1
            candidate = spec.draw(random.Random(other_seed), smaller)
            found = _still_fails(spec, fn, candidate)
            if found is not None:
                value, size, seed, failure = candidate, smaller, other_seed, found
                break
        else:
            continue
        break
    if spec.shrink is None:
        return value, size, seed, failure
    progress = True
    while progress and tries < SHRINK_TRIES:
        progress = False
        for candidate in spec.shrink(value):
            tries += 1
            if tries >= SHRINK_TRIES or time.monotonic() > deadline:
                tries = SHRINK_TRIES
                break
            found = _still_fails(spec, fn, candidate)
            if found is not None:
                value, failure, progress = candidate, found, True
                break
    return value, size, seed, failure


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
        body = ", ".join(map(str, items[:limit])) + (f", ... ({len(items)} values)" if len(items) > limit else "")
        return f"tensor([{body}], dtype={value.dtype}, shape {tuple(value.shape)})"
    if isinstance(value, (list, tuple)) and len(value) > limit:
        return repr(list(value[:limit]))[:-1] + f", ... ({len(value)} items)]"
    return repr(value)


def expect_unchanged(names: Iterable[str], before: Iterable[Any], after: Iterable[Any]) -> None:
    """The caller's arguments are as they were: raise a Mismatch naming the first one the learner changed."""
    for name, old, new in zip(names, before, after, strict=True):
        if not same(old, new):
            raise Mismatch(
                f"your function changed its argument `{name}`; the caller still needs it as it was, "
                "so read it without writing to it (work on a copy if you must change something).",
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
    return f"in {frame.name}, at `{line}`" if line else f"in {frame.name}"


_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
_LIBRARY_DIRS = tuple(
    {
        str(Path(path).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)


def is_learner_file(filename: str) -> bool:
    """Whether code in ``filename`` is the learner's: neither minikv's nor a library's (a notebook cell is)."""
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return True
    return not resolved.startswith(_PACKAGE_DIR) and not resolved.startswith(_LIBRARY_DIRS)


def _reference_functions(forbidden: tuple[tuple[object, str], ...]) -> list[tuple[object, str, FunctionType | None]]:
    """Each forbidden ``(owner, name)`` with the plain function behind it (unwrapping static and class methods)."""
    found = []
    for owner, name in forbidden:
        value = vars(owner).get(name) if name in vars(owner) else getattr(owner, name, None)
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        found.append((owner, name, value if isinstance(value, FunctionType) else None))
    return found


_ORIGINAL_CODE: dict[int, CodeType] = {}
"""id(reference function) -> its own code, while it is switched off (the code it is running then is a refusal)."""


@contextlib.contextmanager
def _forbidding(forbidden: tuple[tuple[object, str], ...]) -> Iterator[None]:
    """Switch minikv's own answers off while the learner's code runs, under every name they have.

    A reference function is switched off at its *code object*: its ``__code__``
    is replaced by one that raises "this is minikv's own answer". A function
    object is the same object under every name it is bound to, so this catches
    ``from minikv.lifecycle import admit as my_admit`` done before ``check``
    runs, a ``functools.partial`` of it, a wrapper that calls it, a class that
    inherits it, and ``check(id, minikv.admit)`` itself -- which replacing the
    attribute on its module (what the forbid-list did before) did not. A *copy*
    of the function (a new function object around the same code) is refused by
    :func:`_refuse_copies` before the learner's function runs. Only a function
    with a closure, whose code cannot be swapped, falls back to replacing the
    attribute. Everything is restored when the learner's function returns.
    """
    swapped: list[tuple[FunctionType, CodeType]] = []
    replaced: list[tuple[object, str, object, bool]] = []
    seen: set[int] = set()
    for owner, name, function in _reference_functions(forbidden):
        if function is not None and not function.__code__.co_freevars:
            if id(function) in seen:
                continue
            seen.add(id(function))
            swapped.append((function, function.__code__))
            _ORIGINAL_CODE.setdefault(id(function), function.__code__)
            function.__code__ = _refusal_code(owner, name)
            continue
        own = name in vars(owner)
        replaced.append((owner, name, vars(owner)[name] if own else None, own))
        setattr(owner, name, _refusal(owner, name))
    try:
        yield
    finally:
        for function, code in reversed(swapped):
            function.__code__ = code
            if _ORIGINAL_CODE.get(id(function)) is code:
                del _ORIGINAL_CODE[id(function)]
        for owner, name, original, own in reversed(replaced):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def _owner_name(owner: object) -> str:
    return str(getattr(owner, "__name__", type(owner).__name__))


def _refusal_message(owner: object, name: str) -> str:
    return f"{_owner_name(owner)}.{name} is minikv's own answer to this exercise; write it yourself"


def _refusal_code(owner: object, name: str) -> CodeType:
    """A code object that accepts any arguments and raises the refusal (no closure, so it fits any function)."""
    namespace: dict[str, Any] = {}
    source = f"def refuse(*args, **kwargs):\n    raise RuntimeError({_refusal_message(owner, name)!r})"
    exec(compile(source, __file__, "exec"), namespace)  # our own source: one constant message
    code: CodeType = namespace["refuse"].__code__
    return code.replace(co_name=name)


def _refusal(owner: object, name: str) -> Callable[..., Any]:
    message = _refusal_message(owner, name)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return refuse


def _refuse_copies(fn: object, forbidden: tuple[tuple[object, str], ...]) -> None:
    """Refuse a learner's function that *is* a reference's code under a new function object.

    Looks at ``fn`` (a function, a bound method, a class's own methods, a
    ``functools.partial``), the functions it closes over, and the module-level
    functions its code names, two levels deep: if one of them runs a
    reference's own code object, the learner handed in minikv's answer.
    """
    codes = {}
    for owner, name, function in _reference_functions(forbidden):
        if function is not None:
            code = _ORIGINAL_CODE.get(id(function), function.__code__)
            codes[code] = f"{_owner_name(owner)}.{name}"
    if not codes:
        return
    seen: set[int] = set()

    def visit(obj: object, depth: int) -> str | None:
        if depth < 0 or id(obj) in seen:
            return None
        seen.add(id(obj))
        target = getattr(obj, "func", None) if type(obj).__name__ == "partial" else obj
        target = getattr(target, "__func__", target)
        if isinstance(target, type):
            for klass in target.__mro__:
                if klass.__module__.startswith("minikv.") or klass is object:
                    continue
                for value in vars(klass).values():
                    found = visit(getattr(value, "__func__", value), depth)
                    if found:
                        return found
            return None
        if not isinstance(target, FunctionType):
            return None
        if target.__code__ in codes:
            return codes[target.__code__]
        inner = [cell.cell_contents for cell in target.__closure__ or () if _cell_is_set(cell)]
        inner += [target.__globals__[n] for n in target.__code__.co_names if n in target.__globals__]
        for value in inner:
            found = visit(value, depth - 1)
            if found:
                return found
        return None

    found = visit(fn, 2)
    if found:
        raise LearnerRaised(
            RuntimeError(
                f"this runs the code of {found}, which is minikv's own answer to this exercise; write it yourself"
            ),
            "",
        )


def _cell_is_set(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


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
        return "your function still raises NotImplementedError: it is the stub."
    if isinstance(fn, type) and function.startswith(f"{own}."):
        return f"`{function}` still raises NotImplementedError: that method is still the stub; write it next."
    return f"`{function}` still raises NotImplementedError: your code calls it, and it is still the stub."


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
