"""minikv.viz.plots: figures drawn from recorded values only, byte-identical on a rerun."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from viz_scenario import (
    one_request,
    run_scenario,
)

from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.viz import (
    TreeRecorder,
    plot_hit_rate,
    plot_lifecycle,
    plot_recomputed,
    plot_sizes,
)


def test_plots_are_deterministic_figures(scenario: TreeRecorder) -> None:
    import io

    from matplotlib.figure import Figure

    def png(fig) -> bytes:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        return buffer.getvalue()

    fig = plot_sizes(scenario)
    assert isinstance(fig, Figure) and png(fig) == png(plot_sizes(run_scenario()))
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(scenario.frames)  # no pool: protected and evictable only
    evictable = [f.size_info.evictable_size for f in scenario.frames]
    assert [b.get_height() for b in bars[len(scenario.frames) :]] == evictable
    infos = plot_sizes([f.size_info for f in scenario.frames])
    assert len(infos.axes[0].patches) == len(bars)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:3] == ["start", "insert", "insert"]


def test_plot_arguments_are_checked(scenario: TreeRecorder) -> None:
    with pytest.raises(ArgumentTypeError):
        plot_sizes([1, 2, 3])
    with pytest.raises(ArgumentTypeError):
        plot_hit_rate([object()])
    with pytest.raises(ArgumentError, match="labels"):
        plot_lifecycle(one_request(), labels=["a", "b"])
    with pytest.raises(ArgumentError, match="empty"):
        plot_hit_rate([])


def test_plot_recomputed_draws_prompt_and_uncached_lengths() -> None:
    prompts = {"chat": [[1, 2, 3], [1, 2, 3, 4, 5]], "one-off": [[7, 8]]}
    fig = plot_recomputed(prompts, {"chat": [0, 3], "one-off": [0]})
    chat, one_off = fig.axes
    assert [list(line.get_ydata()) for line in chat.get_lines()] == [[3, 5], [3, 2]]
    assert [list(line.get_ydata()) for line in one_off.get_lines()] == [[2], [2]]
    assert [chat.get_title(), one_off.get_title()] == ["chat", "one-off"]
    assert fig._repr_svg_() == plot_recomputed(prompts, {"chat": [0, 3], "one-off": [0]})._repr_svg_()
    with pytest.raises(ArgumentError, match="cached"):
        plot_recomputed(prompts, {"one-off": [0], "chat": [0, 3]})
    with pytest.raises(ArgumentError, match="cached"):
        plot_recomputed(prompts, {"chat": [0], "one-off": [0]})
    with pytest.raises(ArgumentTypeError):
        plot_recomputed({}, {})
