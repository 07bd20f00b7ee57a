"""What a check hands back: one verdict per case, and a report a learner can read.

The report leads with the verdict, then the *smallest* failing case (fewest
tokens, nodes or slots), because the smallest counter-example is the easiest to
debug by hand. Text and HTML say the same thing; both are deterministic, so a
notebook that stores them stays comparable by nbval.

A result speaks the language it was made in (:attr:`CheckResult.language`): the
cases' sentences were written in it when the check ran, so the headings around
them are rendered in it too, whatever :func:`minikv.set_language` says later.
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..language import checked_language, language, tr


@dataclass(frozen=True)
class CaseResult:
    """The verdict on one case."""

    description: str
    size: int
    passed: bool
    problem: str = ""
    """What went wrong, in plain words (empty when the case passed)."""
    expected: str = ""
    got: str = ""
    not_written: bool = False
    """The learner's function raised ``NotImplementedError``: it is still the stub."""


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise: ``passed`` is True only if every case passed."""

    exercise_id: str
    title: str
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)
    language: str = "en"
    """The language the check ran in (``"en"`` or ``"zh"``): the report is rendered in it."""

    def __post_init__(self) -> None:
        checked_language(self.language, "language")

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(case.passed for case in self.cases)

    @property
    def num_passed(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def not_written(self) -> bool:
        """Every case stopped at the stub's ``NotImplementedError``."""
        return bool(self.cases) and all(case.not_written for case in self.cases)

    @property
    def smallest_failure(self) -> CaseResult | None:
        failures = [case for case in self.cases if not case.passed]
        return min(failures, key=lambda case: case.size) if failures else None

    def __bool__(self) -> bool:
        return self.passed

    def headline(self) -> str:
        with language(self.language):
            verdict, advice = self._verdict()
        return f"{verdict} {advice}".rstrip()

    def _verdict(self) -> tuple[str, str]:
        """The verdict, and what to do about it."""
        total = len(self.cases)
        if self.passed:
            return tr("✓ {exercise}: all {total} cases passed.", exercise=self.exercise_id, total=total), ""
        if self.not_written:
            named = self.cases[0].problem if self.cases[0].problem.startswith("`") else ""
            not_yet = tr("✗ {exercise}: not written yet.", exercise=self.exercise_id)
            if named:  # a function or method it calls is the stub, not the one under check
                return not_yet, tr("{named} ({total} cases are waiting.)", named=named, total=total)
            return (
                not_yet,
                tr(
                    "Your function still raises NotImplementedError; replace the stub with your code "
                    "and run the cell again ({total} cases are waiting).",
                    total=total,
                ),
            )
        return tr(
            "✗ {exercise}: {passed} of {total} cases passed.",
            exercise=self.exercise_id,
            passed=self.num_passed,
            total=total,
        ), ""

    def __str__(self) -> str:
        with language(self.language):
            return self._text()

    def _text(self) -> str:
        lines = [self.headline()]
        failure = self.smallest_failure
        if failure is not None and not self.not_written:
            lines.append("")
            lines.append(tr("Smallest failing case: {description}", description=failure.description))
            lines.extend(_indent(tr("What went wrong: {problem}", problem=failure.problem), "  "))
            if failure.expected or failure.got:
                lines.extend(_labelled(tr("expected:"), failure.expected))
                lines.extend(_labelled(tr("got:"), failure.got))
        if not self.not_written:
            lines.append("")
            lines.append(tr("Cases:"))
            lines.extend(f"  {'✓' if case.passed else '✗'} {case.description}" for case in self.cases)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        with language(self.language):
            return self._html()

    def _html(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        parts = [
            '<div class="minikv-check" style="border-left: 4px solid ' + colour + '; padding: 0.3em 0.8em;">',
            f'<p style="margin: 0.2em 0;"><strong style="color: {colour};">{_esc(self._verdict()[0])}</strong> '
            f"{_esc(self._verdict()[1])}</p>",
        ]
        failure = self.smallest_failure
        if failure is not None and not self.not_written:
            parts.append(
                '<p style="margin: 0.4em 0 0.2em;"><strong>'
                + _esc(tr("Smallest failing case:"))
                + f"</strong> {_esc(failure.description)}</p>"
            )
            parts.append(
                '<p style="margin: 0.2em 0;"><strong>'
                + _esc(tr("What went wrong:"))
                + f"</strong> {_esc(failure.problem)}</p>"
            )
            if failure.expected or failure.got:
                parts.append(
                    "<pre>"
                    + _esc("\n".join(_labelled(tr("expected:"), failure.expected) + _labelled(tr("got:"), failure.got)))
                    + "</pre>"
                )
        if not self.not_written:
            items = "".join(f"<li>{'✓' if case.passed else '✗'} {_esc(case.description)}</li>" for case in self.cases)
            parts.append(
                f"<details><summary>{_esc(tr('All {total} cases', total=len(self.cases)))}</summary>"
                f'<ul style="list-style: none; padding-left: 0.5em;">{items}</ul></details>'
            )
        parts.append("</div>")
        return "\n".join(parts)


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in text.splitlines()] or [prefix]


def _labelled(label: str, text: str) -> list[str]:
    """``expected: first line`` with later lines aligned under it (``label`` ends with its colon)."""
    head = f"  {label:<10}"
    lines = text.splitlines() or [""]
    return [head + lines[0]] + [" " * len(head) + line for line in lines[1:]]


def diff(expected: Sequence[object], got: Sequence[object], context: int = 2) -> tuple[str, str, str]:
    """Two sequences side by side as a diff: ``(sentence, expected, got)``, long equal runs cut out.

    The sentence says where they first differ and how (an item wrong, missing
    or extra); the two texts keep ``context`` items around each difference,
    mark the differing items with ``>…<``, and replace each run of equal
    items in between by ``…``, so that a 500-slot list shows as a few items.
    """
    exp, got_ = list(expected), list(got)
    matcher = difflib.SequenceMatcher(a=exp, b=got_, autojunk=False)
    opcodes = matcher.get_opcodes()
    first = next((op for op in opcodes if op[0] != "equal"), None)
    if first is None:
        return tr("they are equal"), _items(exp, set(), context), _items(got_, set(), context)
    tag, i1, i2, j1, j2 = first
    if tag == "replace":
        sentence = tr(
            "they first differ at position {i}: expected {expected}, got {got}",
            i=i1,
            expected=repr(exp[i1]),
            got=repr(got_[j1]),
        )
    elif tag == "delete":
        sentence = tr(
            "from position {i} on, {n} item(s) are missing: {items}", i=i1, n=i2 - i1, items=repr(exp[i1:i2][:6])
        )
    else:
        sentence = tr("at position {i}, {n} item(s) are extra: {items}", i=i1, n=j2 - j1, items=repr(got_[j1:j2][:6]))
    if len(exp) != len(got_):
        sentence += tr(" ({expected} items expected, {got} got)", expected=len(exp), got=len(got_))
    marked_exp = {i for op in opcodes if op[0] != "equal" for i in range(op[1], op[2])}
    marked_got = {j for op in opcodes if op[0] != "equal" for j in range(op[3], op[4])}
    return sentence, _items(exp, marked_exp, context), _items(got_, marked_got, context)


def _items(items: list[object], marked: set[int], context: int) -> str:
    if len(items) <= 12 and not marked:
        return repr(items)
    near = {k for m in marked for k in range(m - context, m + context + 1)} if marked else set(range(6))
    out: list[str] = []
    skipped = False
    for k, item in enumerate(items):
        if k in near or len(items) <= 12:
            out.append(f">{item!r}<" if k in marked else repr(item))
            skipped = False
        elif not skipped:
            out.append("…")
            skipped = True
    return "[" + ", ".join(out) + "]" + (tr("  ({n} items)", n=len(items)) if len(items) > 12 else "")
