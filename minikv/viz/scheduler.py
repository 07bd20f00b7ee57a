"""Pictures of the scheduler: requests over steps, measures side by side, and the slot table a kernel walks.

* :func:`plot_request_states` -- one row per request, one column per engine step, each
  cell coloured by the request's status after that step (waiting, running,
  finished): the waiting queue over time, and a starved request as a long bar;
* :func:`plot_measures` -- a few counts per variant (policy), one panel per measure;
* :func:`draw_slot_table` -- each request's row of the slot table and the cache rows a
  decode step reads through it, page by page.

Every function draws from values the caller recorded (statuses, counts, the table):
never from timings, so the same run gives the same figure. Figures are made with
pyplot and closed before they are returned, as in :mod:`minikv.viz.plots`; they show as
SVG with their text kept as text (:class:`~minikv.viz.figure.TextFigure`), so the zh
edition translates their labels, and :func:`~minikv.viz.labels.set_language` draws them in
Chinese.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .._validate import as_positive
from ..errors import ArgumentError, ArgumentTypeError
from .figure import TextFigure
from .labels import get_language, text, translate

STATE_COLOURS = {"new": "#ffffff", "waiting": "#f79009", "running": "#1570ef", "finished": "#e4e7ec"}
"""Cell colour of each request status (``Status.value`` of :class:`minikv.engine.EngineRequest`)."""

READER_COLOURS = ("#53b1fd", "#f79009", "#32d583", "#f97066", "#9e77ed", "#fdb022", "#2ed3b7", "#ee46bc")
"""Colour of each request in :func:`draw_slot_table`, in the table's row order."""

SHARED_COLOUR = "#98a2b3"
"""A cache row read by more than one request (a shared prefix)."""


def plot_request_states(
    runs: Mapping[str, Sequence[Sequence[str]]] | Sequence[Sequence[str]],
    *,
    highlight: int | None = None,
    title: str | None = None,
) -> Figure:
    """Each request's status after every step, one panel per run.

    ``runs`` maps a name (a policy) to its record: one list per step, holding each
    request's status after that step (``"new"``, ``"waiting"``, ``"running"`` or
    ``"finished"``), requests in the same order at every step. A single record is
    drawn as one unnamed panel. ``highlight`` outlines one request's row (by position).
    """
    named = _runs(runs)
    if highlight is not None and (
        isinstance(highlight, bool) or not isinstance(highlight, int) or highlight < 0 or highlight >= named.width
    ):
        raise ArgumentError(f"highlight must be a request position in [0, {named.width}), got {highlight!r}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    states = list(STATE_COLOURS)
    longest = max(len(record) for record in named.records.values())
    fig, axes = plt.subplots(
        len(named.records),
        1,
        figsize=(7.2, 0.6 + (0.12 * named.width + 0.5) * len(named.records)),
        squeeze=False,
        FigureClass=TextFigure,
    )
    plt.close(fig)
    colours = ListedColormap([STATE_COLOURS[s] for s in states])
    for ax, (name, record) in zip(axes[:, 0], named.records.items(), strict=True):
        grid = np.array([[states.index(s) for s in step] for step in record]).T  # (requests, steps)
        ax.imshow(grid, cmap=colours, vmin=0, vmax=len(states) - 1, aspect="auto", interpolation="nearest",
                  extent=(0, len(record), named.width, 0))  # fmt: skip
        if highlight is not None:
            ax.add_patch(Rectangle((0, highlight), len(record), 1, fill=False, edgecolor="#d92d20", linewidth=1.6))
        ax.set_xlim(0, longest)
        ax.set_ylabel(text("plot.request_axis"), fontsize=8)
        ax.set_yticks([])
        ax.tick_params(labelsize=8)
        if name:
            ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(text("sched.engine_step"), fontsize=8)
    handles = [Patch(facecolor=STATE_COLOURS[s], edgecolor="#667085", label=text(f"sched.{s}")) for s in states[1:]]
    fig.legend(handles=handles, loc="upper right", ncols=3, frameon=False, fontsize=8)
    fig.suptitle(title or text("sched.states_title"), fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def plot_measures(
    rows: Mapping[str, Mapping[str, float]], measures: Sequence[str], *, title: str | None = None
) -> Figure:
    """One bar panel per measure, one bar per variant, each bar labelled with its value.

    ``rows`` maps a variant's name (a policy) to its measures by name; every
    variant must have every name in ``measures``. A measure's name that is a label of
    :mod:`minikv.viz.labels` (``"preemptions"``) is drawn in the language of the moment.
    """
    if not isinstance(rows, Mapping) or not rows:
        raise ArgumentTypeError("rows must be a non-empty mapping of variant name -> measures")
    if isinstance(measures, str) or not isinstance(measures, Sequence) or not measures:
        raise ArgumentTypeError("measures must be a non-empty list of measure names")
    for name, row in rows.items():
        if not isinstance(name, str) or not isinstance(row, Mapping):
            raise ArgumentTypeError("rows must map a str to a mapping of measures")
        missing = [m for m in measures if m not in row]
        if missing:
            raise ArgumentError(f"rows: {name!r} has no measure {missing[0]!r}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    names = list(rows)
    fig, axes = plt.subplots(
        1, len(measures), figsize=(2.0 * len(measures) + 0.6, 2.9), squeeze=False, FigureClass=TextFigure
    )
    plt.close(fig)
    for ax, measure in zip(axes[0], measures, strict=True):
        values = [float(rows[n][measure]) for n in names]
        bars = ax.bar(range(len(names)), values, color=[READER_COLOURS[i % len(READER_COLOURS)] for i in
                                                       range(len(names))])  # fmt: skip
        for bar, value in zip(bars, values, strict=True):
            text = f"{value:.0f}" if value == int(value) else f"{value:.1f}"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
        ax.set_title(translate(measure, get_language()), fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(0, max(values) * 1.18 or 1)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_slot_table(
    table: torch.Tensor | Sequence[Sequence[int]],
    lens: Sequence[int] | torch.Tensor,
    page_size: int,
    num_pages: int,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """What a decode step reads: each request's row of the slot table, and the cache rows it names.

    ``table[b, :lens[b]]`` are the slots of request ``b``'s tokens in order (a row of
    ``req_to_token``). Top: one strip per request, one cell per token position,
    labelled with its slot; a bold line every ``page_size`` positions. Bottom: the
    cache, one column per page and one cell per row of the page (slot ``s`` is row
    ``s % page_size`` of page ``s // page_size``), coloured by the request that reads
    it, grey where several do (a shared prefix), white where nobody does.
    """
    page_size = as_positive(page_size, "page_size")
    num_pages = as_positive(num_pages, "num_pages")
    rows_of = _table_rows(table, lens, page_size * num_pages)
    if labels is None:
        labels = [text("plot.request", n=b) for b in range(len(rows_of))]
    elif isinstance(labels, str) or len(labels) != len(rows_of) or not all(isinstance(x, str) for x in labels):
        raise ArgumentError(f"labels must be {len(rows_of)} strings, one per request")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    readers: dict[int, list[int]] = {}
    for b, slots in enumerate(rows_of):
        for slot in slots:
            readers.setdefault(slot, []).append(b)
    width = max(len(s) for s in rows_of)
    columns = max(width, num_pages)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(5.0, 0.36 * columns + 1.6), 0.5 * len(rows_of) + 0.42 * page_size + 1.9),
        height_ratios=(len(rows_of) + 0.6, page_size + 1.0), FigureClass=TextFigure,
    )  # fmt: skip
    plt.close(fig)
    for b, slots in enumerate(rows_of):
        y = len(rows_of) - 1 - b
        for position, slot in enumerate(slots):
            top.add_patch(Rectangle((position, y + 0.1), 1, 0.8, facecolor=_reader_colour(readers[slot], b),
                                    edgecolor="#344054", linewidth=0.5))  # fmt: skip
            top.text(position + 0.5, y + 0.5, str(slot), ha="center", va="center", fontsize=6.5)
        for edge in range(0, len(slots) + 1, page_size):
            top.plot([edge, edge], [y + 0.05, y + 0.95], color="black", linewidth=1.6)
    top.set_xlim(0, width)
    top.set_ylim(0, len(rows_of))
    top.set_yticks([len(rows_of) - 0.5 - b for b in range(len(rows_of))])
    top.set_yticklabels(labels, fontsize=8)
    top.set_xticks([])
    top.set_title(text("sched.table_title", page_size=page_size), fontsize=8)
    for p in range(num_pages):
        for r in range(page_size):
            slot = p * page_size + r
            who = readers.get(slot, [])
            colour = "#ffffff" if not who else _reader_colour(who, who[0])
            bottom.add_patch(Rectangle((p, page_size - 1 - r), 1, 1, facecolor=colour, edgecolor="#667085",
                                       linewidth=0.5))  # fmt: skip
            bottom.text(p + 0.5, page_size - 0.5 - r, str(slot), ha="center", va="center", fontsize=6.5)
        bottom.add_patch(Rectangle((p, 0), 1, page_size, fill=False, edgecolor="black", linewidth=1.4))
    bottom.set_xlim(0, columns)
    bottom.set_ylim(0, page_size)
    bottom.set_xticks([p + 0.5 for p in range(num_pages)])
    bottom.set_xticklabels([str(p) for p in range(num_pages)], fontsize=7)
    bottom.set_xlabel(text("sched.pages_axis"), fontsize=8)
    bottom.set_yticks([])
    for ax in (top, bottom):
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(length=0)
    handles = [Patch(facecolor=READER_COLOURS[b % 8], label=labels[b]) for b in range(len(rows_of))]
    handles += [Patch(facecolor=SHARED_COLOUR, label=text("sched.shared")), Patch(facecolor="white",
                edgecolor="#667085", label=text("sched.not_read"))]  # fmt: skip
    bottom.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncols=min(len(handles), 4),
                  frameon=False, fontsize=7)  # fmt: skip
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# -- inputs ---------------------------------------------------------------------


class _Runs:
    def __init__(self, records: dict[str, list[list[str]]], width: int) -> None:
        self.records, self.width = records, width


def _runs(runs: Any) -> _Runs:
    named = dict(runs) if isinstance(runs, Mapping) else {"": runs}
    if not named:
        raise ArgumentError("runs must not be empty")
    records: dict[str, list[list[str]]] = {}
    width = None
    for name, record in named.items():
        if not isinstance(name, str):
            raise ArgumentTypeError(f"runs: names must be str, got {type(name).__name__}")
        if isinstance(record, (str, bytes)) or not isinstance(record, Sequence) or not record:
            raise ArgumentTypeError("runs: each record must be a non-empty list of steps")
        steps = []
        for step in record:
            if isinstance(step, (str, bytes)) or not isinstance(step, Sequence):
                raise ArgumentTypeError("runs: each step must be a list of statuses, one per request")
            unknown = [s for s in step if s not in STATE_COLOURS]
            if unknown:
                raise ArgumentError(f"runs: unknown status {unknown[0]!r}; expected one of {sorted(STATE_COLOURS)}")
            if width is None:
                width = len(step)
            if len(step) != width or width == 0:
                raise ArgumentError(f"runs: every step must list the same requests, got {len(step)} and {width}")
            steps.append(list(step))
        records[name] = steps
    assert width is not None
    return _Runs(records, width)


def _table_rows(table: Any, lens: Any, num_slots: int) -> list[list[int]]:
    try:
        rows = torch.as_tensor(table).tolist()
        lengths = [int(n) for n in torch.as_tensor(lens).tolist()]
    except (TypeError, ValueError, RuntimeError):
        raise ArgumentTypeError("table must be a 2-D table of slots and lens a list of lengths") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise ArgumentError("table must be a non-empty 2-D table of slots")
    if len(lengths) != len(rows):
        raise ArgumentError(f"lens must hold one length per row of table ({len(rows)}), got {len(lengths)}")
    used = []
    for b, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        if not 1 <= n <= len(row):
            raise ArgumentError(f"lens[{b}] must be in [1, {len(row)}], got {n}")
        slots = [int(s) for s in row[:n]]
        outside = [s for s in slots if not 0 <= s < num_slots]
        if outside:
            raise ArgumentError(f"table: slot {outside[0]} of row {b} is outside the cache's [0, {num_slots})")
        used.append(slots)
    return used


def _reader_colour(who: list[int], own: int) -> str:
    return SHARED_COLOUR if len(set(who)) > 1 else READER_COLOURS[own % len(READER_COLOURS)]
