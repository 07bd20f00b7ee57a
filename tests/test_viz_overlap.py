"""The overlap drawing: what it records and draws is what the engine's loop did, step by step.

A recording is checked against the engine's own records (steps, batches, preemptions, the
requests that finished) and against the rule of the overlap loop: batch N+1 is launched
before batch N is collected, and a finished request is released only once no batch that
reads its row is in flight (``EarlyFreeEngine`` breaks that rule, and the recording says
so). The picture is checked by reading its boxes back: without overlap the two lanes never
hold a box at the same moment, with overlap each plan sits over the run before it. Then
determinism, both languages, and the named errors.
"""

from __future__ import annotations

import html
import itertools
import re
import string
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from helpers import REPRODUCIBLE
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv.engine import EarlyFreeEngine, Engine, EngineRequest, make_engine
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.tiny_model import TinyDecoder
from minikv.viz import OverlapRecording, draw_overlap, record_overlap
from minikv.viz.labels import CATALOG, language, translate_html
from minikv.viz.overlap import KINDS

VOCAB = 16
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
SVG = "{http://www.w3.org/2000/svg}"
PROMPTS = [[1, 2, 3, 4, 5], [1, 2, 3, 6], [7, 8, 9, 10, 11, 12]]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def three_requests(overlap: bool, engine_class: type[Engine] = Engine, **kwargs: object) -> OverlapRecording:
    engine = make_engine(MODEL, num_pages=64, overlap=overlap, engine_class=engine_class, **kwargs)  # type: ignore[arg-type]
    recording = record_overlap(engine)
    engine.generate(PROMPTS, 3)
    return recording


def drawn_boxes(svg: str) -> dict[str, dict[int, tuple[float, float]]]:
    """Each lane's boxes, read back from the SVG: batch number -> (start, stop) in half steps."""
    lanes: dict[str, dict[int, tuple[float, float]]] = {"cpu": {}, "device": {}}
    for rect in ET.fromstring(svg).iter(f"{SVG}rect"):
        if rect.get("data-lane"):
            lanes[rect.get("data-lane", "")][int(rect.get("data-batch", ""))] = (
                float(rect.get("data-start", "")),
                float(rect.get("data-stop", "")),
            )
    return lanes


def drawn_marks(svg: str, kind: str) -> list[tuple[int, int]]:
    return sorted(
        (int(e.get("data-step", "")), int(e.get("data-uid", "")))
        for e in ET.fromstring(svg).iter()
        if e.get("data-kind") == kind
    )


def check_against_engine(recording: OverlapRecording, engine: Engine) -> None:
    """The recording tells what the engine's own records tell, and the loop's rules hold in it."""
    assert len(recording.steps) == engine.stats.steps
    assert [s.step for s in recording.steps] == list(range(1, engine.stats.steps + 1))
    assert all(batch.kind in KINDS for batch in recording.batches.values())
    parts = sum(2 if b.kind == "mixed" else 1 for b in recording.batches.values())
    assert parts == engine.stats.prefill_batches + engine.stats.decode_batches
    assert sum(len(s.preempted) for s in recording.steps) == engine.stats.preemptions
    finished = [uid for s in recording.steps for uid in s.finished]
    assert sorted(finished) == sorted(r.uid for r in engine.finished)
    # every batch collected once, in launch order
    collected = [number for s in recording.steps for number in s.collected]
    assert collected == sorted(recording.batches) and not engine.has_work()
    for step in recording.steps:
        kinds = [e.kind for e in step.events]
        assert kinds.count("launch") == (step.planned is not None)
        if engine.overlap:
            # N+1 is launched before N is collected, unless decode short of room drained N while planning
            assert step.collected == ((step.in_flight,) if step.in_flight is not None else ())
            if step.planned is not None and step.in_flight is not None:
                drained = next(e.planning for e in step.events if e.kind == "collect")
                assert (kinds.index("collect") < kinds.index("launch")) == drained
        else:
            assert step.in_flight is None and step.collected == ((step.planned,) if step.planned else ())
    for number, batch in recording.batches.items():
        assert batch.collected == number + engine.overlap
    # a finished request is released once, after every batch that reads its row is collected
    assert recording.hazards() == []
    released = [uid for s in recording.steps for uid in s.released]
    assert sorted(released) == sorted(finished)
    for step in recording.steps:
        for uid in step.released:
            last = max(n for n, b in recording.batches.items() if uid in b.uids)
            assert recording.batches[last].collected == step.step


def check_drawing(recording: OverlapRecording) -> str:
    svg = draw_overlap(recording).svg()
    assert svg == draw_overlap(recording).svg()  # deterministic
    assert not re.search(r"0x[0-9a-f]{6,}", svg)
    boxes = drawn_boxes(svg)
    assert set(boxes["cpu"]) == set(boxes["device"]) == set(recording.batches)
    for number in recording.batches:
        plan, run = boxes["cpu"][number], boxes["device"][number]
        assert plan == (2 * number - 2, 2 * number - 1)  # the first half of the step that planned it
        collected = recording.batches[number].collected
        assert collected is not None and run[0] >= plan[1]
        assert run[1] == 2 * collected or 2 * collected - 2 < run[1] < 2 * collected - 1  # at the end, or drained
    device = sorted(boxes["device"].values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(device))  # one batch runs at a time

    def overlapping(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] < b[1] and b[0] < a[1]

    pairs = [(p, r) for p in boxes["cpu"].values() for r in boxes["device"].values()]
    if recording.overlap:
        for number in recording.batches:
            if number + 1 in recording.batches:  # batch N+1 planned while batch N runs
                assert overlapping(boxes["cpu"][number + 1], boxes["device"][number])
    else:
        assert not any(overlapping(p, r) for p, r in pairs)  # the lanes never overlap
    releases = [(s.step, uid) for s in recording.steps for uid in s.released]
    assert drawn_marks(svg, "release") == sorted(releases)
    assert drawn_marks(svg, "preemption") == sorted((s.step, u) for s in recording.steps for u in s.preempted)
    return svg


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    prefix = draw(st.lists(st.integers(0, VOCAB - 1), max_size=8))
    requests = [
        (prefix + draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)), draw(st.integers(1, 6)))
        for _ in range(draw(st.integers(1, 4)))
    ]
    page_size = draw(st.sampled_from([1, 2, 4]))
    fewest = -(-max(len(p) + n - 1 for p, n in requests) // page_size)
    return {
        "requests": requests,
        "page_size": page_size,
        "num_pages": draw(st.integers(fewest, fewest + 12 // page_size)),
        "max_running": draw(st.integers(1, 3)),
        "budget": draw(st.one_of(st.none(), st.integers(1, 8))),
        "overlap": draw(st.booleans()),
    }


@settings(REPRODUCIBLE, max_examples=30)
@given(runs())
def test_the_recording_is_what_the_engine_did(work: dict[str, Any]) -> None:
    engine = make_engine(
        MODEL,
        work["num_pages"],
        work["page_size"],
        max_running=work["max_running"],
        prefill_budget=work["budget"],
        overlap=work["overlap"],
    )
    recording = record_overlap(engine)
    for prompt, new in work["requests"]:
        engine.submit(EngineRequest(prompt, new))
    engine.run()
    engine.check()
    check_against_engine(recording, engine)
    check_drawing(recording)


@pytest.mark.parametrize("overlap", [True, False])
def test_three_requests_one_step_late_or_not(overlap: bool) -> None:
    engine = make_engine(MODEL, num_pages=64, max_running=2, overlap=overlap)
    recording = record_overlap(engine)
    outputs = engine.generate(PROMPTS, 3)
    check_against_engine(recording, engine)
    svg = check_drawing(recording)
    assert outputs == make_engine(MODEL, num_pages=64, max_running=2).generate(PROMPTS, 3)  # same tokens
    first = recording.batches[1]
    assert (first.kind, first.uids) == ("prefill", (0, 1))
    # the first two requests finish in the same batch; overlapping, they are released one step later
    finished = next(s for s in recording.steps if 0 in s.finished)
    released = next(s for s in recording.steps if 0 in s.released)
    assert released.step == finished.step
    last_batch = max(n for n, b in recording.batches.items() if 0 in b.uids)
    assert finished.step == last_batch + overlap
    assert ("overlap=True" in svg) == overlap and "CPU: schedule" in svg and "device: run" in svg


def test_releasing_early_shows_as_a_hazard() -> None:
    recording = three_requests(True, EarlyFreeEngine, max_running=1)
    hazards = recording.hazards()
    # each released in the step that collects the batch reading its row, but before collecting it
    assert hazards and all(recording.batches[batch].collected == step for step, _, batch in hazards)
    svg = draw_overlap(recording).svg()
    assert drawn_marks(svg, "hazard") == sorted((step, uid) for step, uid, _ in hazards)
    assert "which reads its row, is in flight" in svg
    assert three_requests(True, max_running=1).hazards() == []


def test_both_languages() -> None:
    keys = [key for key in CATALOG if key.startswith("overlap.")]
    assert len(keys) >= 15
    for key in keys:
        assert re.search(r"[\u4e00-\u9fff]", CATALOG[key].zh), key
    recording = three_requests(True, max_running=2)
    english = draw_overlap(recording).svg()
    with language("zh"):
        chinese = draw_overlap(recording).svg()
    assert "CPU：调度" in chinese and "批次 1" in chinese and not re.search(r"[\u4e00-\u9fff]", english)

    def shown(svg: str) -> list[str]:
        found = re.findall(r"<text\b[^>]*>([^<]*)</text>", svg) + re.findall(r"<title>([^<]*)</title>", svg)
        return [html.unescape(t) for t in found]

    assert shown(translate_html(english)) == shown(chinese)  # what the zh build does to stored outputs
    for key in keys:  # every overlap label's fields are read back (none is left as English)
        names = [n for _, n, _, _ in string.Formatter().parse(CATALOG[key].en) if n]
        assert all(n in ("batch", "step", "uid", "uids", "work", "first", "last") for n in names), key


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ArgumentTypeError, match="engine"):
        record_overlap("engine")  # type: ignore[arg-type]
    engine = make_engine(MODEL, num_pages=64, overlap=True)
    engine.generate([[1, 2, 3]], 2)
    with pytest.raises(ArgumentError, match="engine"):
        record_overlap(engine)
    with pytest.raises(ArgumentTypeError, match="recording"):
        draw_overlap(engine)  # type: ignore[arg-type]
    recording = three_requests(True)
    with pytest.raises(ArgumentTypeError, match="title"):
        draw_overlap(recording, title=3)  # type: ignore[arg-type]
    assert "a run" in draw_overlap(recording, title="a run").svg()
    assert recording._repr_svg_() == draw_overlap(recording).svg()
    assert repr(recording).startswith("<OverlapRecording: overlap=True, ")
    assert "0x" not in repr(draw_overlap(recording))


def test_a_tight_pool_drains_and_preempts_by_the_rules() -> None:
    """Decode short of room collects the batch in flight first (a drain), then preempts if it must."""
    engine = make_engine(MODEL, num_pages=24, max_running=4, overlap=True)
    recording = record_overlap(engine)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, c] for c in range(4)]
    engine.generate(prompts, 12)
    check_against_engine(recording, engine)
    check_drawing(recording)
    drained = [s for s in recording.steps if any(e.kind == "collect" and e.planning for e in s.events)]
    assert drained and engine.stats.preemptions
