"""Matplotlib pictures of what the cache did: a request's seven steps, slot counts over a replay, hit rates.

:func:`plot_recomputed` draws the prompt tokens each request recomputes, with and without a prefix
cache (chapter 4). :func:`plot_hit_rate_sweep` draws the hit rate of one request stream against the pool size
(:func:`minikv.course.workloads.hit_rate_sweep`), with the no-eviction rate as a dashed line.

Every function draws from recorded values only (a request's ``trace``, a
recorder's frames, match lengths) -- never from timings -- so the same run
always gives the same figure. Each returns the :class:`~matplotlib.figure.Figure`.

Figures are made with pyplot and closed before they are returned: a notebook
then shows each one exactly once (as the cell's value), and pyplot keeps no
reference to it. (A bare ``Figure()`` made without pyplot shows only as text
in a fresh Jupyter kernel: the inline backend registers its image formatter
when pyplot is imported.)
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch
from matplotlib.ticker import PercentFormatter

from ..base import SizeInfo
from ..errors import ArgumentError, ArgumentTypeError
from ..snapshot import VocabLike, token_namer, words
from .figure import TextFigure
from .labels import get_language, text, translate
from .recorder import Frame, TreeRecorder
from .tree import LOOKS

PHASES = {
    1: ("admit", "#53b1fd"),
    2: ("admit", "#53b1fd"),
    3: ("admit", "#53b1fd"),
    6: ("forward pass", "#d0d5dd"),
    4: ("finish", "#32d583"),
    5: ("finish", "#32d583"),
    7: ("finish", "#32d583"),
}
"""Step number -> (phase, colour). Step 6 runs between admission and finish, as in a real server."""

_PHASE_LABELS = {"admit": "plot.admit", "forward pass": "plot.forward", "finish": "plot.finish"}

BAND_COLOURS = {
    "protected": "#f97066",
    "evictable": "#32d583",
    "requests": "#53b1fd",
    "free": LOOKS["free"].border,
}
"""Colours of the slot bands, the saturated cousins of the tree drawing's fills."""


def plot_lifecycle(requests: Any, *, labels: Sequence[str] | None = None, vocab: VocabLike = None) -> Figure:
    """One row per request, one box per step of its ``trace``, in the order the steps ran.

    ``requests`` is a :class:`~minikv.lifecycle.Request` or a sequence of them.
    Box numbers are the notes' step numbers, so the row reads 1 2 3 6 4 5 7:
    step 6 (store K/V) runs before step 4 (insert), as the lifecycle module explains.
    """
    reqs = _requests(requests)
    names = _labels(reqs, labels, vocab)
    width = max(3, max(len(r.trace) for r in reqs))
    fig, ax = plt.subplots(FigureClass=TextFigure, figsize=(1.55 * width + 2.2, 1.05 * len(reqs) + 1.3))
    plt.close(fig)
    for row, request in enumerate(reqs):
        y = len(reqs) - 1 - row
        for col, step in enumerate(request.trace):
            _, colour = PHASES.get(step.number, ("other", "#f2f4f7"))
            ax.add_patch(
                FancyBboxPatch(
                    (col + 0.05, y - 0.38), 0.9, 0.76, boxstyle="round,pad=0,rounding_size=0.08",
                    facecolor=colour, edgecolor="#344054", linewidth=0.8, alpha=0.9,
                )
            )  # fmt: skip
            ax.text(col + 0.5, y + 0.2, f"{step.number}. {step.name}", ha="center", va="center", fontsize=8.5,
                    fontweight="bold")  # fmt: skip
            ax.text(col + 0.5, y - 0.1, textwrap.fill(step.detail, 20), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, width)
    ax.set_ylim(-0.6, len(reqs) - 0.4)
    ax.set_yticks(range(len(reqs)))
    ax.set_yticklabels(list(reversed(names)))
    ax.set_xticks([i + 0.5 for i in range(width)])
    ax.set_xticklabels([f"{i + 1}" for i in range(width)])
    ax.set_xlabel(text("plot.lifecycle_x"))
    ax.set_title(text("plot.lifecycle_title"))
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    handles = [
        Patch(facecolor=c, edgecolor="#344054", label=text(_PHASE_LABELS[p])) for p, c in dict(PHASES.values()).items()
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22 if len(reqs) < 3 else -0.12),
              ncol=3, frameon=False, fontsize=8)  # fmt: skip
    fig.tight_layout()
    return fig


def plot_sizes(source: Any, *, num_slots: int | None = None) -> Figure:
    """Stacked bars, one per recorded frame: protected, evictable, held by running requests, free.

    ``source`` is a :class:`~minikv.viz.recorder.TreeRecorder`, a sequence of its frames,
    or a sequence of :class:`~minikv.SizeInfo`. Free and request-held slots
    appear when the recorder was given a pool (``num_slots`` then defaults to
    the pool's size); request-held = total - free - cached. Frames are taken at
    manager calls, so slots that ``evict`` just returned count as request-held
    in that frame: the pool has not taken them back yet.
    """
    infos, frees, ops, known_total = _size_series(source)
    if num_slots is None:
        num_slots = known_total
    elif isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 0:
        raise ArgumentError(f"num_slots must be a non-negative int, got {num_slots!r}")
    protected = [i.protected_size for i in infos]
    evictable = [i.evictable_size for i in infos]
    bands: list[tuple[str, list[int]]] = [
        (text("plot.band_protected"), protected),
        (text("plot.band_evictable"), evictable),
    ]
    if frees is not None and num_slots is not None:
        held = [num_slots - f - i.total_size for f, i in zip(frees, infos, strict=True)]
        if min(held) < 0:
            raise ArgumentError(f"num_slots: {num_slots} is smaller than cached + free slots in some frame")
        bands.append((text("plot.band_requests"), held))
    if frees is not None:
        bands.append((text("plot.band_free"), list(frees)))
    colours = [BAND_COLOURS["protected"], BAND_COLOURS["evictable"], BAND_COLOURS["requests"], BAND_COLOURS["free"]]
    if len(bands) == 3:  # no request band: free takes the last colour
        colours = colours[:2] + colours[3:]
    fig, ax = plt.subplots(FigureClass=TextFigure, figsize=(max(6.0, 0.32 * len(infos) + 2.5), 3.6))
    plt.close(fig)
    x = list(range(len(infos)))
    bottom = [0] * len(infos)
    for (name, values), colour in zip(bands, colours, strict=False):
        ax.bar(x, values, bottom=bottom, width=0.8, color=colour, edgecolor="#344054", linewidth=0.4, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if ops is not None and len(ops) <= 40:
        ax.set_xticks(x)
        ax.set_xticklabels([text(f"op.{op}") for op in ops], rotation=60, ha="right", fontsize=8)
        ax.set_xlabel(text("plot.frame_op"))
    else:
        ax.set_xlabel(text("plot.frame"))
    ax.set_ylabel(text("plot.slots"))
    ax.set_title(text("plot.sizes_title"))
    ax.margins(x=0.01)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_hit_rate(requests: Any, *, labels: Sequence[str] | None = None, vocab: VocabLike = None) -> Figure:
    """Per request, the share of prompt tokens found in the cache; the line is the running total.

    The running total weighs requests by length: total cached tokens over
    total prompt tokens so far, which is what saves prefill compute.
    """
    reqs = _requests(requests)
    names = _labels(reqs, labels, vocab)
    cached = [int(r.cached_len) for r in reqs]
    totals = [len(r.input_ids) for r in reqs]
    rates = [c / t if t else 0.0 for c, t in zip(cached, totals, strict=True)]
    running, c_sum, t_sum = [], 0, 0
    for c, t in zip(cached, totals, strict=True):
        c_sum, t_sum = c_sum + c, t_sum + t
        running.append(c_sum / t_sum if t_sum else 0.0)
    fig, ax = plt.subplots(FigureClass=TextFigure, figsize=(max(5.0, 0.7 * len(reqs) + 2.0), 3.6))
    plt.close(fig)
    x = list(range(len(reqs)))
    ax.bar(x, rates, width=0.7, color=BAND_COLOURS["evictable"], edgecolor="#344054", linewidth=0.5,
           label=text("plot.this_request"))  # fmt: skip
    ax.plot(x, running, color="#344054", marker="o", markersize=3.5, linewidth=1.2, label=text("plot.all_requests"))
    if len(reqs) <= 30:
        for xi, c, t, rate in zip(x, cached, totals, rates, strict=True):
            ax.text(xi, rate + 0.02, f"{c}/{t}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, 1.12)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xticks(x)
    slanted = len(reqs) > 6 or max(len(n) for n in names) > 14
    ax.set_xticklabels(names if len(reqs) <= 30 else [str(i + 1) for i in x], rotation=30 if slanted else 0,
                       ha="right" if slanted else "center", fontsize=8)  # fmt: skip
    ax.set_ylabel(text("plot.cached_share"))
    ax.set_title(text("plot.hit_rate_title"))
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_recomputed(prompts: Mapping[str, Sequence[Any]], cached: Mapping[str, Sequence[int]]) -> Figure:
    """Per workload, the prompt tokens each request recomputes: all of them with no cache, the uncached part with one.

    ``prompts`` maps a workload's name to its requests' token ids, in the order they were served;
    ``cached`` maps the same names to each request's cached length (``cached_len``) under a prefix
    cache. One panel per workload: the no-cache line is the prompt length, the cached line the
    prompt length minus what the cache supplied. A workload's name that is a label of
    :mod:`minikv.viz.labels` (``"few-shot"``) is drawn in the language of the moment.
    """
    if not isinstance(prompts, Mapping) or not isinstance(cached, Mapping) or not prompts:
        raise ArgumentTypeError("prompts and cached must be non-empty mappings from a workload name")
    if list(prompts) != list(cached):
        raise ArgumentError(f"cached must have the workloads of prompts, in order: {list(prompts)}")
    lengths, uncached = {}, {}
    for name, requests in prompts.items():
        lengths[name] = [len(ids) for ids in requests]
        if len(cached[name]) != len(requests):
            raise ArgumentError(f"cached[{name!r}]: {len(cached[name])} lengths for {len(requests)} requests")
        uncached[name] = [n - int(c) for n, c in zip(lengths[name], cached[name], strict=True)]
    fig, axes = plt.subplots(1, len(prompts), FigureClass=TextFigure, figsize=(7.5, 2.8), squeeze=False)
    plt.close(fig)
    for ax, name in zip(axes[0], prompts, strict=True):
        ax.plot(lengths[name], lw=0.8, label=text("plot.no_cache_line"))
        ax.plot(uncached[name], lw=0.8, label=text("plot.radix_line"))
        ax.set_title(translate(name, get_language()), fontsize=9)
        ax.set_xlabel(text("plot.request_axis"))
    axes[0][0].set_ylabel(text("plot.recomputed"))
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


SWEEP_COLOURS = ("#1570ef", "#079455", "#d92d20", "#7f56d9", "#f79009")
"""Line colours of the series of :func:`plot_hit_rate_sweep`, in order."""


def plot_hit_rate_sweep(sweeps: Any, *, title: str | None = None) -> Figure:
    """Hit rate (cached prompt tokens / prompt tokens) against pool size, one line per series.

    ``sweeps`` is what :func:`minikv.course.workloads.hit_rate_sweep` returns (a sequence of
    :class:`~minikv.course.workloads.ReplayResult`), or a mapping from a series name (a workload,
    a page size) to one. Each series also gets its no-eviction rate (``optimal_rate``) as a
    dashed line: the rate an unlimited pool would reach.
    """
    series = _sweep_series(sweeps)
    fig, ax = plt.subplots(FigureClass=TextFigure, figsize=(6.4, 3.8))
    plt.close(fig)
    for i, (name, results) in enumerate(series.items()):
        colour = SWEEP_COLOURS[i % len(SWEEP_COLOURS)]
        sizes = [r.num_slots for r in results]
        ax.plot(sizes, [r.hit_rate for r in results], color=colour, marker="o", markersize=4, linewidth=1.4,
                label=name or text("plot.hit_rate"))  # fmt: skip
        no_eviction = text("plot.series_no_eviction", name=name) if name else text("plot.no_eviction")
        ax.axhline(results[0].optimal_rate, color=colour, linestyle="--", linewidth=0.9, alpha=0.8,
                   label=no_eviction)  # fmt: skip
    all_sizes = [r.num_slots for results in series.values() for r in results]
    logarithmic = max(all_sizes) > 20 * min(all_sizes)
    if logarithmic:
        ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(text("plot.pool_size_log" if logarithmic else "plot.pool_size"))
    ax.set_ylabel(text("plot.cached_share"))
    ax.set_title(title or text("plot.sweep_title"))
    ax.legend(loc="lower right", frameon=False, fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


# -- inputs ---------------------------------------------------------------------


def _sweep_series(sweeps: Any) -> dict[str, list[Any]]:
    """``{name: results}`` from one sweep (name ``""``) or a mapping of them; every result checked."""
    named = dict(sweeps) if isinstance(sweeps, Mapping) else {"": sweeps}
    if not named:
        raise ArgumentError("sweeps must not be empty")
    series: dict[str, list[Any]] = {}
    for name, results in named.items():
        if not isinstance(name, str):
            raise ArgumentTypeError(f"sweeps: series names must be str, got {type(name).__name__}")
        if isinstance(results, (str, bytes)) or not isinstance(results, Sequence) or not results:
            raise ArgumentTypeError("sweeps: each series must be a non-empty sequence of ReplayResult")
        for r in results:
            if not all(hasattr(r, a) for a in ("num_slots", "hit_rate", "optimal_rate")):
                raise ArgumentTypeError(f"sweeps: {type(r).__name__} is not a ReplayResult")
        series[name] = list(results)
    return series


def _requests(requests: Any) -> list[Any]:
    reqs = [requests] if hasattr(requests, "trace") else requests
    if isinstance(reqs, (str, bytes)) or not isinstance(reqs, Sequence):
        raise ArgumentTypeError(f"requests must be a Request or a sequence of them, got {type(requests).__name__}")
    reqs = list(reqs)
    if not reqs:
        raise ArgumentError("requests must not be empty")
    for i, r in enumerate(reqs):
        if not (hasattr(r, "trace") and hasattr(r, "input_ids") and hasattr(r, "cached_len")):
            raise ArgumentTypeError(f"requests[{i}] must be a minikv.lifecycle.Request, got {type(r).__name__}")
    return reqs


def _labels(reqs: Sequence[Any], labels: Sequence[str] | None, vocab: VocabLike) -> list[str]:
    if labels is not None:
        if isinstance(labels, str) or len(labels) != len(reqs) or not all(isinstance(x, str) for x in labels):
            raise ArgumentError(f"labels must be {len(reqs)} strings, one per request")
        return list(labels)
    if vocab is None:
        return [text("plot.request", n=i + 1) for i in range(len(reqs))]
    namer = token_namer(vocab)
    return [f"[{words([int(t) for t in r.input_ids], namer, limit=5)}]" for r in reqs]


def _size_series(source: Any) -> tuple[list[SizeInfo], list[int] | None, list[str] | None, int | None]:
    """(size infos, free slots or None, operation names or None, pool size or None) from any accepted source."""
    total = None
    if isinstance(source, TreeRecorder):
        if source.pool is not None:
            total = int(source.pool.num_slots)
        source = source.frames
    if isinstance(source, (str, bytes)) or not isinstance(source, Sequence) or not source:
        raise ArgumentTypeError("source must be a TreeRecorder, or a non-empty sequence of frames or SizeInfo")
    if all(isinstance(item, Frame) for item in source):
        infos = [f.size_info for f in source]
        frees = [f.free_slots for f in source]
        return infos, (frees if all(v is not None for v in frees) else None), [f.operation for f in source], total
    if all(isinstance(item, SizeInfo) for item in source):
        return list(source), None, None, total
    raise ArgumentTypeError("source must be a TreeRecorder, or a non-empty sequence of frames or SizeInfo")
