"""Timelines of a serving run: one row per request, the engine's steps across, drawn as SVG.

Record a run, then show it (a notebook displays the timeline itself)::

    engine = make_engine(model, num_pages=64, prefill_budget=16)
    timeline = record_timeline(engine)      # before the first submit
    engine.generate(prompts, 8)
    timeline                                # the SVG: waiting, prefill chunks, decode, preempted, finished

The clock is the engine's step, never a timing, so the same run always draws the
same picture. Each row shows, step by step, what its request did:

* ``waiting`` -- queued, not yet admitted;
* ``prefill`` -- one chunk of its prompt computed (without a ``prefill_budget``, the whole
  prompt in one step); the chunk's token count is written on it when there is room;
* ``decode`` -- one token generated;
* ``stalled`` -- running (it holds its memory) but not in this step's batch: without
  chunked prefill, a step that prefills makes every decoding request wait;
* ``preempted`` -- put back in the queue after a preemption, until it is admitted again
  (a triangle marks the step of each preemption);
* ``finished`` -- a dot at the end of the step that gave its last token.

How it records: like :class:`~minikv.engine_stats.StatsRecorder`, by wrapping a few of
the engine's own methods on that one engine (``submit``, ``step``, ``_preempt``); the
engine's code is not touched. After each step it reads the batch the step returned
and each request's status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

from ..engine import Batch, Engine, EngineRequest, Status
from ..engine_stats import _bind
from ..errors import ArgumentError, ArgumentTypeError
from .labels import text

STATES = ("waiting", "prefill", "decode", "stalled", "preempted")
"""What a request can do in one step (one segment kind each)."""

COLOURS = {
    "waiting": "#d0d5dd",
    "prefill": "#2e90fa",
    "decode": "#32d583",
    "stalled": "#fedf89",
    "preempted": "#f97066",
}
LEGEND = {  # a state -> the catalog key of its legend entry (minikv.viz.labels)
    "waiting": "timeline.legend.waiting",
    "prefill": "timeline.legend.prefill",
    "decode": "timeline.legend.decode",
    "stalled": "timeline.legend.stalled",
    "preempted": "timeline.legend.preempted",
}

_ROW, _BAR, _LABEL, _TOP, _MARGIN = 24, 16, 132, 34, 12


@dataclass(frozen=True)
class TimelineEvent:
    """What one request did in one step: a state of :data:`STATES`, or ``"finished"``."""

    step: int
    """The engine step, counting from 1 (the first step after recording started)."""
    uid: int
    kind: str
    tokens: int = 0
    """``prefill``: the prompt tokens of the chunk; otherwise 0."""


@dataclass(frozen=True)
class TimelineSegment:
    """Consecutive steps of one request in one state (a prefill chunk is always a segment of its own)."""

    uid: int
    kind: str
    start: int
    """First step."""
    stop: int
    """One past the last step."""
    tokens: int = 0


class Timeline:
    """The steps of one engine's requests, recorded as they run (:func:`record_timeline` makes one).

    ``events`` holds one event per request per step from its arrival to the step
    it finished, plus a ``finished`` event then; ``preemptions`` the ``(step, uid)``
    of each preemption. Display it in a notebook, or take :meth:`svg`.
    """

    def __init__(self) -> None:
        self.events: list[TimelineEvent] = []
        self.preemptions: list[tuple[int, int]] = []
        self.steps = 0
        """Steps recorded so far."""
        self.requests: dict[int, EngineRequest] = {}
        """Every request submitted since recording began, by ``uid``."""

    def segments(self) -> list[TimelineSegment]:
        """The events of every request merged into segments, request by request, in step order."""
        segments: list[TimelineSegment] = []
        for uid in self.requests:
            current: TimelineSegment | None = None
            for event in (e for e in self.events if e.uid == uid and e.kind != "finished"):
                extends = current is not None and current.kind == event.kind and current.stop == event.step
                if extends and event.kind != "prefill":
                    assert current is not None
                    current = TimelineSegment(uid, current.kind, current.start, event.step + 1)
                    segments[-1] = current
                else:
                    current = TimelineSegment(uid, event.kind, event.step, event.step + 1, event.tokens)
                    segments.append(current)
        return segments

    def finished_at(self) -> dict[int, int]:
        """The step each finished request finished in, by ``uid``."""
        return {e.uid: e.step for e in self.events if e.kind == "finished"}

    def svg(self, *, title: str | None = None) -> str:
        """The timeline as an SVG document (text as ``<text>``, every number from the step clock)."""
        if title is not None and not isinstance(title, str):
            raise ArgumentTypeError(f"title must be a str or None, got {type(title).__name__}")
        return _draw(self, title)

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        return (
            f"<Timeline: {len(self.requests)} requests over {self.steps} steps, "
            f"{len(self.finished_at())} finished, {len(self.preemptions)} preemptions>"
        )

    # -- recording ----------------------------------------------------------------------------------

    def _record_step(self, batch: Batch | None, preempted: set[int]) -> None:
        self.steps += 1
        step = self.steps
        chunks, decoding = _batch_members(batch)
        finished = self.finished_at()
        for uid, request in self.requests.items():
            if uid in finished:
                continue
            if uid in chunks:
                self.events.append(TimelineEvent(step, uid, "prefill", chunks[uid]))
            elif uid in decoding:
                self.events.append(TimelineEvent(step, uid, "decode"))
            elif uid in preempted or (request.status is Status.WAITING and request.num_preemptions):
                self.events.append(TimelineEvent(step, uid, "preempted"))
            elif request.status is Status.WAITING:
                self.events.append(TimelineEvent(step, uid, "waiting"))
            elif request.status is Status.RUNNING:
                self.events.append(TimelineEvent(step, uid, "stalled"))
            if request.finished:
                self.events.append(TimelineEvent(step, uid, "finished"))
        self.preemptions.extend((step, uid) for uid in sorted(preempted))


def record_timeline(engine: Engine) -> Timeline:
    """Start recording ``engine``'s steps; returns the :class:`Timeline` they fill.

    Call it on a fresh engine, before the first ``submit``: a timeline shows each
    request from its arrival. Recording wraps a few of this engine's methods (see
    the module docstring) and never changes what the engine does.
    """
    if not isinstance(engine, Engine):
        raise ArgumentTypeError(f"engine must be a minikv.engine.Engine, got {type(engine).__name__}")
    if engine.has_work() or engine.finished or engine.stats.steps:
        raise ArgumentError("engine: start recording the timeline before the first submit (a fresh engine)")
    timeline = Timeline()
    preempted: set[int] = set()

    def submit(call: Callable[..., EngineRequest], request: EngineRequest) -> EngineRequest:
        submitted = call(request)
        timeline.requests[submitted.uid] = submitted
        return submitted

    def preempt(call: Callable[..., None], request: EngineRequest) -> None:
        call(request)
        preempted.add(request.uid)

    def step(call: Callable[[], Batch | None]) -> Batch | None:
        preempted.clear()
        batch = call()
        timeline._record_step(batch, preempted)
        return batch

    wrappers: dict[str, Callable[..., Any]] = {"submit": submit, "_preempt": preempt, "step": step}
    for name, wrapper in wrappers.items():
        setattr(engine, name, _bind(wrapper, getattr(engine, name)))
    return timeline


def _batch_members(batch: Batch | None) -> tuple[dict[int, int], set[int]]:
    """The prompt tokens each request's chunk holds, and the requests decoding, in one step's batch."""
    if batch is None:
        return {}, set()
    chunks: dict[int, int] = {}
    decoding: set[int] = set()
    for part in batch.parts or (batch,):
        for request, start, end in zip(part.requests, part.starts, part.ends, strict=True):
            if part.kind == "prefill":
                chunks[request.uid] = end - start
            else:
                decoding.add(request.uid)
    return chunks, decoding


# -- drawing ---------------------------------------------------------------------------------------


def _draw(timeline: Timeline, title: str | None) -> str:
    steps = max(timeline.steps, 1)
    width_per_step = max(4.0, min(28.0, 760.0 / steps))
    plot_width = width_per_step * steps
    rows = list(timeline.requests.values())
    top = _TOP if title else 12
    height = top + _ROW * len(rows) + 54
    width = max(_LABEL + plot_width + 2 * _MARGIN, 780)  # room for the legend

    def x(step: int) -> float:  # the left edge of a step (steps count from 1)
        return _LABEL + _MARGIN + (step - 1) * width_per_step

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    if title:
        parts.append(f'<text x="{_MARGIN}" y="20" font-size="13" font-weight="bold">{escape(title)}</text>')
    row_of = {request.uid: index for index, request in enumerate(rows)}
    for request in rows:
        baseline = top + row_of[request.uid] * _ROW + _ROW / 2 + 4
        row = text("timeline.row", uid=request.uid, prompt_len=len(request.prompt), new_len=request.max_new_tokens)
        parts.append(f'<text x="{_MARGIN}" y="{baseline:.1f}">{escape(row)}</text>')
    for segment in timeline.segments():
        y = top + row_of[segment.uid] * _ROW + (_ROW - _BAR) / 2
        left, right = x(segment.start), x(segment.stop)
        last = segment.stop - 1
        what = (
            text("timeline.chunk", chunk=segment.tokens)
            if segment.kind == "prefill"
            else text(f"timeline.kind.{segment.kind}")
        )
        span = (
            text("timeline.one_step", step=last)
            if segment.start == last
            else text("timeline.steps", first=segment.start, last=last)
        )
        tip = escape(text("timeline.tip", uid=segment.uid, what=what, span=span))
        parts.append(
            f'<rect x="{left:.1f}" y="{y:.1f}" width="{right - left:.1f}" height="{_BAR}" '
            f'fill="{COLOURS[segment.kind]}" stroke="#ffffff" stroke-width="{int(segment.kind == "prefill")}" '
            f'data-uid="{segment.uid}" data-kind="{segment.kind}" data-start="{segment.start}" '
            f'data-stop="{segment.stop}" data-tokens="{segment.tokens}"><title>{tip}</title></rect>'
        )
        if segment.kind == "prefill" and len(str(segment.tokens)) * 6.5 + 2 <= right - left:
            parts.append(
                f'<text x="{(left + right) / 2:.1f}" y="{y + _BAR - 4:.1f}" text-anchor="middle" font-size="9" '
                f'fill="#ffffff">{segment.tokens}</text>'
            )
    for uid, step in timeline.finished_at().items():
        cy = top + row_of[uid] * _ROW + _ROW / 2
        tip = escape(text("timeline.finished_tip", uid=uid, step=step))
        parts.append(
            f'<circle cx="{x(step + 1):.1f}" cy="{cy:.1f}" r="4" fill="#101828" data-uid="{uid}" '
            f'data-kind="finished" data-step="{step}"><title>{tip}</title></circle>'
        )
    for step, uid in timeline.preemptions:
        cx, cy = x(step) + width_per_step / 2, top + row_of[uid] * _ROW + (_ROW - _BAR) / 2
        parts.append(
            f'<path d="M{cx - 4:.1f},{cy - 5:.1f} L{cx + 4:.1f},{cy - 5:.1f} L{cx:.1f},{cy + 1:.1f} Z" fill="#b42318" '
            f'data-uid="{uid}" data-kind="preemption" data-step="{step}"/>'
        )
    parts.extend(_axis(top + _ROW * len(rows), steps, x, width_per_step))
    parts.extend(_legend(top + _ROW * len(rows) + 38))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _axis(y: float, steps: int, x: Callable[[int], float], width_per_step: float) -> list[str]:
    every = next(n for n in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if n * width_per_step >= 28)
    lines = [f'<line x1="{x(1):.1f}" y1="{y + 4:.1f}" x2="{x(steps + 1):.1f}" y2="{y + 4:.1f}" stroke="#667085"/>']
    for step in [1, *range(every, steps + 1, every)] if every > 1 else range(1, steps + 1):
        centre = x(step) + width_per_step / 2
        lines.append(f'<line x1="{centre:.1f}" y1="{y + 4:.1f}" x2="{centre:.1f}" y2="{y + 8:.1f}" stroke="#667085"/>')
        lines.append(f'<text x="{centre:.1f}" y="{y + 19:.1f}" text-anchor="middle" font-size="9">{step}</text>')
    lines.append(f'<text x="{_MARGIN}" y="{y + 19:.1f}" font-size="9">{escape(text("timeline.axis"))}</text>')
    return lines


def _legend(y: float) -> list[str]:
    items: list[str] = []
    left = float(_MARGIN)
    for kind, key in LEGEND.items():
        words = text(key)
        items.append(f'<rect x="{left:.1f}" y="{y - 9:.1f}" width="12" height="10" fill="{COLOURS[kind]}"/>')
        items.append(f'<text x="{left + 16:.1f}" y="{y:.1f}" font-size="10">{escape(words)}</text>')
        left += 24 + 5.6 * len(text(key, lang="en"))
    items.append(f'<circle cx="{left + 5:.1f}" cy="{y - 4:.1f}" r="4" fill="#101828"/>')
    items.append(f'<text x="{left + 14:.1f}" y="{y:.1f}" font-size="10">{escape(text("timeline.finished"))}</text>')
    left += 70
    triangle = f"M{left:.1f},{y - 9:.1f} L{left + 8:.1f},{y - 9:.1f} L{left + 4:.1f},{y - 3:.1f} Z"
    items.append(f'<path d="{triangle}" fill="#b42318"/>')
    items.append(f'<text x="{left + 12:.1f}" y="{y:.1f}" font-size="10">{escape(text("timeline.preemption"))}</text>')
    return items


__all__ = ["STATES", "Timeline", "TimelineEvent", "TimelineSegment", "record_timeline"]
