"""minikv.viz.scheduler: the pictures of chapter 8 show what was recorded, the same way every time."""

from __future__ import annotations

import io

import matplotlib
import pytest

matplotlib.use("Agg")

import torch
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from minikv.engine import EngineRequest, make_engine
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.tiny_model import TinyDecoder
from minikv.viz import draw_slot_table, plot_measures, plot_request_states
from minikv.viz.scheduler import READER_COLOURS, SHARED_COLOUR, STATE_COLOURS


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def recorded_states() -> list[list[str]]:
    """Statuses of three requests after every step of a real engine with one running request."""
    engine = make_engine(TinyDecoder(seed=0), num_pages=64, max_running=1)
    requests = [EngineRequest([1, 2, 3, i], 2) for i in range(3)]
    for request in requests:
        engine.submit(request)
    states = []
    while engine.has_work():
        engine.step()
        states.append([r.status.value for r in requests])
    return states


def test_request_states_draw_one_cell_per_request_and_step() -> None:
    states = recorded_states()
    fig = plot_request_states({"fcfs": states, "again": states}, highlight=2)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (3, len(states))  # requests x steps
    order = list(STATE_COLOURS)
    assert [order[int(v)] for v in image[:, 0]] == states[0]
    assert states[-1] == ["finished"] * 3 and "waiting" in states[0]
    outline = fig.axes[0].patches[0]
    assert outline.get_y() == 2 and outline.get_width() == len(states)
    assert png(fig) == png(plot_request_states({"fcfs": states, "again": states}, highlight=2))
    assert len(plot_request_states(states).axes) == 1


@pytest.mark.parametrize(
    ("runs", "error"),
    [({}, ArgumentError), ({"a": []}, ArgumentTypeError), ({"a": [["waiting"], ["waiting", "new"]]}, ArgumentError),
     ({"a": [["sleeping"]]}, ArgumentError), ({1: [["new"]]}, ArgumentTypeError), ("waiting", ArgumentTypeError)],
)  # fmt: skip
def test_bad_records_are_refused(runs: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="runs"):
        plot_request_states(runs)  # type: ignore[arg-type]


def test_highlight_outside_the_requests_is_refused() -> None:
    with pytest.raises(ArgumentError, match="highlight"):
        plot_request_states([["new", "waiting"]], highlight=2)


def test_measures_draw_one_bar_per_variant_at_its_value() -> None:
    rows = {"fcfs": {"steps": 55, "preemptions": 7}, "lpm": {"steps": 40, "preemptions": 4.5}}
    fig = plot_measures(rows, ["steps", "preemptions"], title="t")
    assert [ax.get_title() for ax in fig.axes] == ["steps", "preemptions"]
    assert [b.get_height() for b in fig.axes[1].patches] == [7, 4.5]
    assert [t.get_text() for t in fig.axes[1].texts] == ["7", "4.5"]
    assert png(fig) == png(plot_measures(rows, ["steps", "preemptions"], title="t"))
    with pytest.raises(ArgumentError, match="waits"):
        plot_measures(rows, ["waits"])
    with pytest.raises(ArgumentTypeError, match="measures"):
        plot_measures(rows, "steps")
    with pytest.raises(ArgumentTypeError, match="rows"):
        plot_measures({}, ["steps"])


def cache_cells(fig: Figure) -> dict[int, str]:
    """Slot -> the colour of its cell in the cache panel (read from the drawn rectangles and labels)."""
    bottom = fig.axes[1]
    cells = [p for p in bottom.patches if p.get_fill() and p.get_width() == 1 and p.get_height() == 1]
    labels = {(round(t.get_position()[0] - 0.5), round(t.get_position()[1] - 0.5)): int(t.get_text())
              for t in bottom.texts}  # fmt: skip
    return {labels[(round(c.get_x()), round(c.get_y()))]: to_hex(c.get_facecolor()) for c in cells}


def test_slot_table_colours_each_cache_row_by_who_reads_it() -> None:
    table = torch.tensor([[0, 1, 2, 3, 8, 9, 0], [0, 1, 2, 3, 12, 13, 14]])
    fig = draw_slot_table(table, [6, 7], page_size=4, num_pages=4, labels=["a", "b"])
    cells = cache_cells(fig)
    assert len(cells) == 16
    assert {cells[s] for s in (0, 1, 2, 3)} == {SHARED_COLOUR}  # the shared first page
    assert cells[8] == cells[9] == READER_COLOURS[0] and cells[12] == cells[14] == READER_COLOURS[1]
    assert cells[10] == cells[4] == "#ffffff"  # nobody reads them
    top_labels = [t.get_text() for t in fig.axes[0].texts]
    assert top_labels == ["0", "1", "2", "3", "8", "9", "0", "1", "2", "3", "12", "13", "14"]  # lens respected
    assert png(fig) == png(draw_slot_table(table, [6, 7], page_size=4, num_pages=4, labels=["a", "b"]))


def test_slot_table_draws_a_live_engine_row() -> None:
    engine = make_engine(TinyDecoder(seed=0), num_pages=8, page_size=4)
    request = engine.submit(EngineRequest(list(range(6)), 3))
    engine.step()
    engine.step()
    row = engine.req_to_token[request.row : request.row + 1]
    fig = draw_slot_table(row, [request.kv_len], 4, 8)
    read = {s for s, colour in cache_cells(fig).items() if colour != "#ffffff"}
    assert read == set(row[0, : request.kv_len].tolist()) and len(read) == 7


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [(([[0, 1]], [3], 4, 2), ArgumentError, "lens"), (([[0, 9]], [2], 4, 2), ArgumentError, "table"),
     (([[0, 1]], [1, 1], 4, 2), ArgumentError, "lens"), (([[0, 1]], [2], 0, 2), ArgumentError, "page_size"),
     (([], [], 4, 2), ArgumentError, "table"), (("ab", [1], 4, 2), ArgumentTypeError, "table")],
)  # fmt: skip
def test_a_bad_slot_table_is_refused_naming_the_argument(args: tuple, error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        draw_slot_table(*args)
