"""The overlap loop drawn as time: what the CPU plans while the device runs, from a real engine run.

With ``overlap=True`` (:class:`~minikv.engine.Engine`) the scheduler plans batch N+1
while the device runs batch N, and collects N's results only afterwards: one step late.
Record a run, then draw it::

    engine = make_engine(model, num_pages=64, overlap=True)
    recording = record_overlap(engine)      # before the first submit
    engine.generate(prompts, 3)
    draw_overlap(recording)                 # two lanes: "CPU: schedule" and "device: run"

The clock is the engine's step, cut in two halves: first the scheduler *plans* (and
launches) the step's batch, then the results of the batch in flight are *collected*.
A batch's box on the device lane runs from its launch, or from the end of the batch
before it (one device runs one batch at a time), to the collection of its results.
Without overlap each batch is collected in the step that planned it, so the two
lanes never hold a box at the same time; with overlap, batch N+1's plan sits over
batch N's run. A third lane marks when a finished request's memory is released
(after the batch that reads its row is collected) and each preemption.

How it records: like :func:`~minikv.viz.timeline.record_timeline`, by wrapping a few of
one engine's own methods (``submit``, ``step``, ``_schedule``, ``_collect``,
``_release``, ``_preempt``); the engine's code is not touched and does the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from xml.sax.saxutils import escape

from ..engine import Batch, Engine, EngineRequest
from ..engine_stats import _bind
from ..errors import ArgumentError, ArgumentTypeError
from ..language import tr
from .labels import text
from .timeline import COLOURS as _TIMELINE_COLOURS

KINDS = ("prefill", "decode", "mixed")
"""The kinds of batch (``mixed``: a prefill and a decode batch in one step, with chunked prefill)."""

COLOURS = {"prefill": _TIMELINE_COLOURS["prefill"], "decode": _TIMELINE_COLOURS["decode"], "mixed": "#7a5af8"}
RELEASE_COLOUR, HAZARD_COLOUR, PREEMPT_COLOUR = "#101828", "#d92d20", "#b42318"

_LANE, _BOX, _LABEL, _TOP, _MARGIN = 46, 34, 128, 34, 12


@dataclass(frozen=True)
class OverlapEvent:
    """One thing the engine did inside a step, in order: ``launch`` or ``collect`` a batch,
    ``release`` a finished request's memory, ``preempt`` a request."""

    kind: str
    value: int
    """``launch``, ``collect``: the batch's number; ``release``, ``preempt``: the request's ``uid``."""
    planning: bool
    """Whether it happened while the scheduler planned (before the step's batch was launched)."""


@dataclass(frozen=True)
class OverlapBatch:
    """A batch the engine scheduled: numbered by the step that planned and launched it."""

    number: int
    kind: str
    """One of :data:`KINDS`."""
    uids: tuple[int, ...]
    """Its requests, in batch order."""
    collected: int | None = None
    """The step whose engine collected its results (None: still in flight)."""


@dataclass(frozen=True)
class OverlapStep:
    """One engine step: the batch planned (N+1), the batch in flight meanwhile (N), and what happened in order."""

    step: int
    """Counting from 1 (the first step after recording started)."""
    planned: int | None
    """The number of the batch this step planned and launched (``step``), or None when it planned nothing."""
    in_flight: int | None
    """The batch on the device while this step planned (launched by an earlier step), or None."""
    events: tuple[OverlapEvent, ...]
    finished: tuple[int, ...]
    """Requests whose last token came back in this step."""

    def _values(self, kind: str) -> tuple[int, ...]:
        return tuple(e.value for e in self.events if e.kind == kind)

    @property
    def collected(self) -> tuple[int, ...]:
        """Batches whose results were collected in this step, in order."""
        return self._values("collect")

    @property
    def released(self) -> tuple[int, ...]:
        """Requests (``uid``) whose memory was released in this step, preemptions apart."""
        return self._values("release")

    @property
    def preempted(self) -> tuple[int, ...]:
        return self._values("preempt")


class OverlapRecording:
    """What one engine planned, ran, collected and released, step by step (:func:`record_overlap` makes one)."""

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        """The engine's ``overlap`` setting."""
        self.steps: list[OverlapStep] = []
        self.batches: dict[int, OverlapBatch] = {}
        """Every batch launched since recording began, by number."""

    def hazards(self) -> list[tuple[int, int, int]]:
        """``(step, uid, batch)`` for each release of a request while a batch that reads its row was in flight.

        Empty for :class:`~minikv.engine.Engine`; :class:`~minikv.engine.EarlyFreeEngine` has one per
        request it frees too early.
        """
        found = []
        in_flight: set[int] = set()
        for step in self.steps:
            for event in step.events:
                if event.kind == "launch":
                    in_flight.add(event.value)
                elif event.kind == "collect":
                    in_flight.discard(event.value)
                elif event.kind == "release":
                    found += [
                        (step.step, event.value, number)
                        for number in sorted(in_flight)
                        if event.value in self.batches[number].uids
                    ]
        return found

    def __repr__(self) -> str:
        return (
            f"<OverlapRecording: overlap={self.overlap}, {len(self.batches)} batches over {len(self.steps)} steps, "
            f"{sum(len(s.released) for s in self.steps)} releases>"
        )

    def _repr_svg_(self) -> str:
        return draw_overlap(self).svg()


def record_overlap(engine: Engine) -> OverlapRecording:
    """Start recording what ``engine`` plans, runs, collects and releases; returns the recording they fill.

    Call it on a fresh engine, before the first ``submit``. It works with ``overlap`` on or off
    (off, each batch is collected in the step that planned it). Recording wraps a few of this
    engine's methods (see the module docstring) and never changes what the engine does.
    """
    if not isinstance(engine, Engine):
        raise ArgumentTypeError(tr("engine must be a minikv.engine.Engine, got {name}", name=type(engine).__name__))
    if engine.has_work() or engine.finished or engine.stats.steps:
        raise ArgumentError(tr("engine: start recording the overlap before the first submit (a fresh engine)"))
    recording = OverlapRecording(engine.overlap)
    requests: dict[int, EngineRequest] = {}
    launched: list[tuple[Batch, int]] = []  # batches not collected yet (kept alive: identity is their key)
    events: list[OverlapEvent] = []
    now = {"planning": False, "preempting": False}

    def number_of(batch: Batch | None) -> int | None:
        return next((number for b, number in launched if b is batch), None)

    def submit(call: Callable[..., EngineRequest], request: EngineRequest) -> EngineRequest:
        submitted = call(request)
        requests[submitted.uid] = submitted
        return submitted

    def step(call: Callable[[], Batch | None]) -> Batch | None:
        number = len(recording.steps) + 1
        in_flight = number_of(engine._in_flight)
        done_before = {uid for uid, r in requests.items() if r.finished}
        events.clear()
        batch = call()
        finished = tuple(uid for uid, r in requests.items() if r.finished and uid not in done_before)
        planned = number if batch is not None else None
        recording.steps.append(OverlapStep(number, planned, in_flight, tuple(events), finished))
        return batch

    def schedule(call: Callable[[], Batch | None]) -> Batch | None:
        now["planning"] = True
        try:
            batch = call()
        finally:
            now["planning"] = False
        if batch is not None:
            number = len(recording.steps) + 1
            launched.append((batch, number))
            recording.batches[number] = OverlapBatch(number, batch.kind, tuple(r.uid for r in batch.requests))
            events.append(OverlapEvent("launch", number, True))
        return batch

    def collect(call: Callable[..., None], batch: Batch) -> None:
        number = number_of(batch)  # None for the parts of a mixed batch: the whole was recorded
        if number is not None:
            launched[:] = [(b, n) for b, n in launched if n != number]
            recording.batches[number] = replace(recording.batches[number], collected=len(recording.steps) + 1)
            events.append(OverlapEvent("collect", number, now["planning"]))
        call(batch)

    def release(call: Callable[..., None], request: EngineRequest) -> None:
        if not now["preempting"]:
            events.append(OverlapEvent("release", request.uid, now["planning"]))
        call(request)

    def preempt(call: Callable[..., None], request: EngineRequest) -> None:
        events.append(OverlapEvent("preempt", request.uid, now["planning"]))
        now["preempting"] = True
        try:
            call(request)
        finally:
            now["preempting"] = False

    wrappers: dict[str, Callable[..., Any]] = {
        "submit": submit,
        "step": step,
        "_schedule": schedule,
        "_collect": collect,
        "_release": release,
        "_preempt": preempt,
    }
    for name, wrapper in wrappers.items():
        setattr(engine, name, _bind(wrapper, getattr(engine, name)))
    return recording


# -- drawing ---------------------------------------------------------------------------------------


class OverlapDrawing:
    """The SVG of an :class:`OverlapRecording` (:func:`draw_overlap`); a notebook displays it."""

    def __init__(self, svg: str, summary: str) -> None:
        self._svg = svg
        self.summary = summary

    def svg(self) -> str:
        """The drawing as SVG text (text as ``<text>``, every position from the step clock)."""
        return self._svg

    def _repr_svg_(self) -> str:
        return self._svg

    def __repr__(self) -> str:
        return f"<OverlapDrawing: {self.summary}>"


def draw_overlap(recording: OverlapRecording, *, title: str | None = None) -> OverlapDrawing:
    """Draw ``recording`` as two lanes over the steps: the batches the CPU planned, and the device ran.

    Boxes carry the batch's number and its requests' ``uid``; an upward arrow marks each
    collection of results, a third lane each release and preemption (red where a request
    was released while a batch that reads its row was still in flight). ``title`` defaults
    to one line saying which loop ran.
    """
    if not isinstance(recording, OverlapRecording):
        raise ArgumentTypeError(tr("recording must be an OverlapRecording, got {name}", name=type(recording).__name__))
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(tr("title must be a str or None, got {name}", name=type(title).__name__))
    if title is None:
        title = text("overlap.title_on" if recording.overlap else "overlap.title_off")
    summary = f"overlap={recording.overlap}, {len(recording.batches)} batches over {len(recording.steps)} steps"
    return OverlapDrawing(_draw(recording, title), summary)


def _positions(recording: OverlapRecording) -> dict[tuple[int, int], float]:
    """Where each event lies, in half steps: step s plans in [2s-2, 2s-1] and collects at 2s.

    Events while planning are spread over the planning half; the others happen at the end of the step.
    """
    at: dict[tuple[int, int], float] = {}
    for step in recording.steps:
        planning = [i for i, e in enumerate(step.events) if e.planning and e.kind != "launch"]
        for index, event in enumerate(step.events):
            if event.kind == "launch":
                at[step.step, index] = 2 * step.step - 1
            elif event.planning:
                at[step.step, index] = 2 * step.step - 2 + (planning.index(index) + 1) / (len(planning) + 1)
            else:
                at[step.step, index] = 2 * step.step
    return at


def _draw(recording: OverlapRecording, title: str) -> str:
    steps = max(len(recording.steps), 1)
    half = max(6.0, min(56.0, 760.0 / (2 * steps)))
    width = max(_LABEL + 2 * half * steps + 2 * _MARGIN, 720)
    lanes = {"cpu": _TOP, "device": _TOP + _LANE, "memory": _TOP + 2 * _LANE}
    height = _TOP + 3 * _LANE + 82  # the axis, and a legend of two lines
    roomy = half >= 46

    def x(t: float) -> float:
        return _LABEL + _MARGIN + t * half

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="{_MARGIN}" y="20" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for boundary in range(steps + 1):  # between steps
        parts.append(
            f'<line x1="{x(2 * boundary):.1f}" y1="{_TOP - 2}" x2="{x(2 * boundary):.1f}" y2="{_TOP + 3 * _LANE - 6}" '
            f'stroke="#eaecf0"/>'
        )
    for lane, key in (("cpu", "overlap.cpu"), ("device", "overlap.device"), ("memory", "overlap.memory")):
        baseline = lanes[lane] + _BOX / 2 + 4
        parts.append(f'<text x="{_MARGIN}" y="{baseline:.1f}">{escape(text(key))}</text>')

    at = _positions(recording)
    collected_at: dict[int, float] = {}
    launched_at: dict[int, float] = {}
    for step in recording.steps:
        for index, event in enumerate(step.events):
            if event.kind == "collect":
                collected_at[event.value] = at[step.step, index]
            elif event.kind == "launch":
                launched_at[event.value] = at[step.step, index]

    def box(lane: str, number: int, left: float, right: float, tip: str, open_end: bool = False) -> None:
        batch = recording.batches[number]
        y = lanes[lane] + (_LANE - _BOX) / 2 - 6
        dash = ' stroke-dasharray="4 3"' if open_end else ""
        parts.append(
            f'<rect x="{x(left):.1f}" y="{y:.1f}" width="{x(right) - x(left):.1f}" height="{_BOX}" '
            f'fill="{COLOURS[batch.kind]}" stroke="#ffffff"{dash} data-lane="{lane}" data-batch="{number}" '
            f'data-kind="{batch.kind}" data-start="{left:g}" data-stop="{right:g}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        if roomy or x(right) - x(left) >= 46:
            centre = (x(left) + x(right)) / 2
            label = escape(text("overlap.batch", batch=number))
            parts.append(
                f'<text x="{centre:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-size="10" fill="#ffffff">'
                f"{label}</text>"
            )
            parts.append(
                f'<text x="{centre:.1f}" y="{y + 27:.1f}" text-anchor="middle" font-size="10" fill="#ffffff">'
                f"{escape(', '.join(map(str, batch.uids)))}</text>"
            )

    device_free = 0.0  # one device: a batch starts once the one before it is collected
    for number in sorted(recording.batches):
        batch = recording.batches[number]
        work, uids = text(f"overlap.kind.{batch.kind}"), ", ".join(map(str, batch.uids))
        planned = launched_at[number]
        box("cpu", number, planned - 1, planned, text("overlap.planned_tip", batch=number, work=work,
                                                      step=number, uids=uids))  # fmt: skip
        start = max(planned, device_free)
        end = collected_at.get(number)
        last = batch.collected if batch.collected is not None else len(recording.steps)
        tip = text("overlap.run_tip", batch=number, work=work, first=number, last=last, uids=uids)
        box("device", number, start, end if end is not None else 2 * steps, tip, open_end=end is None)
        device_free = end if end is not None else 2 * steps
        device_top = lanes["device"] + (_LANE - _BOX) / 2 - 6
        parts.append(  # launch: from the plan down to the device
            f'<line x1="{x(planned):.1f}" y1="{device_top - _LANE + _BOX:.1f}" x2="{x(planned):.1f}" '
            f'y2="{device_top:.1f}" stroke="#475467" stroke-dasharray="3 2" data-kind="launch" '
            f'data-batch="{number}"/>'
        )

    hazards = {(step, uid): batch for step, uid, batch in recording.hazards()}
    for step in recording.steps:
        marks = [at[step.step, i] for i, e in enumerate(step.events) if e.kind in ("release", "preempt")]
        taken: dict[float, int] = {}
        for index, event in enumerate(step.events):
            t = at[step.step, index]
            if event.kind == "collect":
                cx = x(t)
                top, bottom = lanes["cpu"] + _BOX - 4, lanes["device"] + (_LANE - _BOX) / 2 - 6 + _BOX
                tip = escape(text("overlap.collect_tip", batch=event.value, step=step.step))
                parts.append(
                    f'<g data-kind="collect" data-batch="{event.value}" data-step="{step.step}" data-at="{t:g}">'
                    f"<title>{tip}</title>"
                    f'<line x1="{cx:.1f}" y1="{bottom:.1f}" x2="{cx:.1f}" y2="{top + 6:.1f}" stroke="#101828" '
                    f'stroke-width="2"/><path d="M{cx - 4:.1f},{top + 7:.1f} L{cx + 4:.1f},{top + 7:.1f} '
                    f'L{cx:.1f},{top:.1f} Z" fill="#101828"/></g>'
                )
            elif event.kind in ("release", "preempt"):
                taken[t] = taken.get(t, 0) + 1  # marks at one moment stand side by side, the last at it
                cx, cy = x(t) - 14 * (marks.count(t) - taken[t]), lanes["memory"] + _BOX / 2 - 2
                hazard = hazards.get((step.step, event.value))
                parts.append(_mark(event, step.step, cx, cy, hazard))
    parts.extend(_axis(lanes["memory"] + _LANE - 8, steps, x))
    parts.extend(_legend(lanes["memory"] + _LANE + 32, width))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _mark(event: OverlapEvent, step: int, cx: float, cy: float, hazard: int | None) -> str:
    """A release (red when ``hazard`` names a batch in flight that reads the request's row) or a preemption."""
    uid = event.value
    if event.kind == "preempt":
        tip = text("overlap.preempt_tip", uid=uid, step=step)
        shape = f'<path d="M{cx - 5:.1f},{cy - 5:.1f} L{cx + 5:.1f},{cy - 5:.1f} L{cx:.1f},{cy + 4:.1f} Z" '
        shape += f'fill="{PREEMPT_COLOUR}"/>'
        kind = "preemption"
    else:
        colour = RELEASE_COLOUR if hazard is None else HAZARD_COLOUR
        tip = text("overlap.release_tip", uid=uid, step=step)
        if hazard is not None:
            tip = text("overlap.hazard_tip", uid=uid, step=step, batch=hazard)
        shape = f'<path d="M{cx:.1f},{cy - 6:.1f} L{cx + 5:.1f},{cy:.1f} L{cx:.1f},{cy + 6:.1f} '
        shape += f'L{cx - 5:.1f},{cy:.1f} Z" fill="{colour}"/>'
        kind = "release" if hazard is None else "hazard"
    return (
        f'<g data-kind="{kind}" data-uid="{uid}" data-step="{step}"><title>{escape(tip)}</title>{shape}'
        f'<text x="{cx:.1f}" y="{cy + 18:.1f}" text-anchor="middle" font-size="9">{uid}</text></g>'
    )


def _axis(y: float, steps: int, x: Callable[[float], float]) -> list[str]:
    every = next(n for n in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if 2 * n * (x(1) - x(0)) >= 24)
    lines = [f'<line x1="{x(0):.1f}" y1="{y:.1f}" x2="{x(2 * steps):.1f}" y2="{y:.1f}" stroke="#667085"/>']
    for step in [1, *range(every, steps + 1, every)] if every > 1 else range(1, steps + 1):
        centre = x(2 * step - 1)
        lines.append(f'<text x="{centre:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-size="9">{step}</text>')
    lines.append(f'<text x="{_MARGIN}" y="{y + 14:.1f}" font-size="9">{escape(text("overlap.step"))}</text>')
    return lines


def _legend(y: float, width: float) -> list[str]:
    """The legend, wrapped onto a second line when the first is full."""
    items: list[str] = []
    left = float(_MARGIN)

    def words(key: str) -> None:
        nonlocal left
        label = text(key)
        items.append(f'<text x="{left + 16:.1f}" y="{y:.1f}" font-size="10">{escape(label)}</text>')
        left += 28 + _text_width(label)

    def room(key: str) -> None:  # wrap before a symbol whose words would not fit
        nonlocal left, y
        if left + 28 + _text_width(text(key)) > width - _MARGIN:
            left, y = float(_MARGIN), y + 20

    for kind in KINDS:
        room(f"overlap.kind.{kind}")
        items.append(f'<rect x="{left:.1f}" y="{y - 9:.1f}" width="12" height="10" fill="{COLOURS[kind]}"/>')
        words(f"overlap.kind.{kind}")
    room("overlap.launch")
    items.append(f'<line x1="{left + 6:.1f}" y1="{y - 10:.1f}" x2="{left + 6:.1f}" y2="{y + 1:.1f}" stroke="#475467" '
                 f'stroke-dasharray="3 2"/>')  # fmt: skip
    words("overlap.launch")
    room("overlap.collect")
    items.append(f'<path d="M{left + 2:.1f},{y - 4:.1f} L{left + 10:.1f},{y - 4:.1f} L{left + 6:.1f},{y - 11:.1f} Z" '
                 f'fill="#101828"/>')  # fmt: skip
    words("overlap.collect")
    for colour, key in ((RELEASE_COLOUR, "overlap.release"), (HAZARD_COLOUR, "overlap.hazard")):
        room(key)
        items.append(f'<path d="M{left + 6:.1f},{y - 10:.1f} L{left + 11:.1f},{y - 4:.1f} L{left + 6:.1f},'
                     f'{y + 2:.1f} L{left + 1:.1f},{y - 4:.1f} Z" fill="{colour}"/>')  # fmt: skip
        words(key)
    room("overlap.preempt")
    items.append(f'<path d="M{left + 1:.1f},{y - 9:.1f} L{left + 11:.1f},{y - 9:.1f} L{left + 6:.1f},{y:.1f} Z" '
                 f'fill="{PREEMPT_COLOUR}"/>')  # fmt: skip
    words("overlap.preempt")
    return items


def _text_width(words: str) -> float:
    """About how wide ``words`` are at font size 10 (a Chinese character about twice a Latin one)."""
    return sum(10.5 if "\u2e80" <= c <= "\uffef" else 5.6 for c in words)


__all__ = [
    "KINDS",
    "OverlapBatch",
    "OverlapDrawing",
    "OverlapEvent",
    "OverlapRecording",
    "OverlapStep",
    "draw_overlap",
    "record_overlap",
]
