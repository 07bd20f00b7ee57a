"""The timeline drawing: what it draws is what the engine did, step by step.

Each drawn run is checked three ways: the SVG's segments (read back from the ``data-``
attributes of its rectangles) are the timeline's segments; the timeline's events agree with
what the engine recorded on its own (each token's step in ``engine.stats``, the prompt
tokens computed, every preemption, the finishing step); and the picture is deterministic
text (no addresses, no timings, text as ``<text>``). Random workloads, with and without
chunked prefill and under memory pressure, then the named errors.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from helpers import REPRODUCIBLE
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minikv.engine import Engine, EngineRequest, make_engine
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.tiny_model import TinyDecoder
from minikv.viz import Timeline, TimelineSegment, record_timeline

VOCAB = 16
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)
SVG = "{http://www.w3.org/2000/svg}"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def drawn_segments(svg: str) -> list[TimelineSegment]:
    root = ET.fromstring(svg)
    return [
        TimelineSegment(int(r.get("data-uid", "")), r.get("data-kind", ""), int(r.get("data-start", "")),
                        int(r.get("data-stop", "")), int(r.get("data-tokens", "")))
        for r in root.iter(f"{SVG}rect") if r.get("data-kind")
    ]  # fmt: skip


def drawn_marks(svg: str, kind: str) -> list[tuple[int, int]]:
    root = ET.fromstring(svg)
    return sorted(
        (int(e.get("data-step", "")), int(e.get("data-uid", ""))) for e in root.iter() if e.get("data-kind") == kind
    )


def check_against_engine(timeline: Timeline, engine: Engine, requests: list[EngineRequest]) -> None:
    """The timeline's events tell what the engine's own records tell."""
    stats = engine.stats
    assert timeline.steps == stats.steps
    chunks = [e for e in timeline.events if e.kind == "prefill"]
    assert sum(e.tokens for e in chunks) == stats.prefill_tokens
    finished = timeline.finished_at()
    for request in requests:
        mine = [e for e in timeline.events if e.uid == request.uid and e.kind != "finished"]
        arrived = stats.requests[request.uid].submitted
        # one state per step, from the step after it arrived to the step it finished in
        assert [e.step for e in mine] == list(range(arrived + 1, finished[request.uid] + 1))
        token_steps = stats.requests[request.uid].token_steps
        assert finished[request.uid] == token_steps[-1]
        decode = {e.step for e in mine if e.kind == "decode"}
        prefill = {e.step for e in mine if e.kind == "prefill"}
        assert decode <= set(token_steps)  # no overlap: every decode step gives a token
        assert set(token_steps) - decode <= prefill  # the other tokens came from a prompt's last chunk
        assert mine[0].kind in ("waiting", "prefill")
        assert sum(1 for _, uid in timeline.preemptions if uid == request.uid) == request.num_preemptions
        if not request.num_preemptions:
            assert all(e.kind != "preempted" for e in mine)
    assert len(timeline.preemptions) == stats.preemptions


def check_drawing(timeline: Timeline) -> str:
    svg = timeline.svg(title="a run")
    assert drawn_segments(svg) == timeline.segments()
    assert drawn_marks(svg, "finished") == sorted((s, u) for u, s in timeline.finished_at().items())
    assert drawn_marks(svg, "preemption") == sorted(timeline.preemptions)
    assert svg == timeline.svg(title="a run")  # deterministic
    assert not re.search(r"0x[0-9a-f]{6,}", svg)
    assert timeline._repr_svg_() == timeline.svg()
    return svg


@st.composite
def runs(draw: st.DrawFn) -> dict:
    prefix = draw(st.lists(st.integers(0, VOCAB - 1), max_size=16))
    requests = [
        (prefix + draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=16)), draw(st.integers(1, 10)),
         draw(st.integers(0, 4)))
        for _ in range(draw(st.integers(1, 5)))
    ]  # fmt: skip
    page_size = draw(st.sampled_from([1, 2, 4]))
    fewest = -(-max(len(p) + n - 1 for p, n, _ in requests) // page_size)
    return {
        "requests": requests,
        "page_size": page_size,
        "num_pages": draw(st.integers(fewest, fewest + 12 // page_size)),
        "max_running": draw(st.integers(1, 4)),
        "budget": draw(st.one_of(st.none(), st.integers(1, 16))),
    }


@settings(REPRODUCIBLE, max_examples=40)
@given(runs())
def test_the_drawn_segments_are_what_the_engine_did(work: dict) -> None:
    engine = make_engine(
        MODEL, work["num_pages"], work["page_size"], max_running=work["max_running"], prefill_budget=work["budget"]
    )
    timeline = record_timeline(engine)
    pending = sorted(work["requests"], key=lambda r: r[2])
    requests = []
    while pending or engine.has_work():
        while pending and pending[0][2] <= engine.stats.steps:
            prompt, new, _ = pending.pop(0)
            requests.append(engine.submit(EngineRequest(prompt, new)))
        engine.step()
    check_against_engine(timeline, engine, requests)
    check_drawing(timeline)
    kinds = {e.kind for e in timeline.events}
    for kind in ("stalled", "preempted"):
        event(kind if kind in kinds else f"no {kind}")


def long_prompt_run(budget: int | None) -> tuple[Timeline, Engine, list[EngineRequest]]:
    """Two requests decoding, a 32-token prompt arriving, a pool that runs dry: a preemption and a resume."""
    rng = np.random.default_rng(7)
    engine = make_engine(MODEL, num_pages=15, page_size=4, max_running=3, prefill_budget=budget)
    timeline = record_timeline(engine)
    requests = [engine.submit(EngineRequest(rng.integers(0, VOCAB, 5), 20)) for _ in range(2)]
    engine.step()
    requests.append(engine.submit(EngineRequest(rng.integers(0, VOCAB, 32), 2)))
    engine.run()
    return timeline, engine, requests


def test_chunked_prefill_preemption_and_resume_are_drawn() -> None:
    timeline, engine, requests = long_prompt_run(budget=4)
    check_against_engine(timeline, engine, requests)
    svg = check_drawing(timeline)
    long = requests[2]
    mine = [s for s in timeline.segments() if s.uid == long.uid]
    kinds = [s.kind for s in mine]
    first_preempted = kinds.index("preempted")
    assert kinds[0] == "waiting" and set(kinds[1:first_preempted]) == {"prefill"}  # chunks, one segment each
    assert all(s.tokens <= 4 and s.stop == s.start + 1 for s in mine if s.kind == "prefill")
    assert "prefill" in kinds[first_preempted + 1 :]  # resumed: its prompt's remaining chunks
    assert timeline.preemptions == [(mine[first_preempted].start, long.uid)]
    # beside the chunks, the others decode in the same steps
    chunk_steps = {s.start for s in mine if s.kind == "prefill"}
    decode_steps = {e.step for e in timeline.events if e.kind == "decode" and e.uid != long.uid}
    assert chunk_steps & decode_steps
    assert "<text" in svg and "prefill chunk (tokens)" in svg and "request 2: 32 + 2" in svg


def test_without_a_budget_a_prefill_step_stalls_the_decoders() -> None:
    timeline, engine, requests = long_prompt_run(budget=None)
    check_against_engine(timeline, engine, requests)
    check_drawing(timeline)
    long = requests[2]
    prefill_step = next(e.step for e in timeline.events if e.uid == long.uid and e.kind == "prefill")
    others = {e.uid: e.kind for e in timeline.events if e.step == prefill_step and e.uid != long.uid}
    assert others == {requests[0].uid: "stalled", requests[1].uid: "stalled"}


def test_repr_names_the_counts() -> None:
    timeline, _, _ = long_prompt_run(budget=4)
    assert repr(timeline) == (
        f"<Timeline: 3 requests over {timeline.steps} steps, 3 finished, {len(timeline.preemptions)} preemptions>"
    )


def test_wrong_inputs_are_refused_by_name() -> None:
    with pytest.raises(ArgumentTypeError, match="engine"):
        record_timeline("an engine")  # type: ignore[arg-type]
    engine = make_engine(MODEL, num_pages=16)
    engine.submit(EngineRequest([1, 2, 3], 2))
    step, submit = engine.step, engine.submit
    with pytest.raises(ArgumentError, match="engine"):
        record_timeline(engine)  # a request already arrived: its row would start in the middle
    assert engine.step is step and engine.submit is submit  # nothing was attached
    fresh = make_engine(MODEL, num_pages=16)
    timeline = record_timeline(fresh)
    with pytest.raises(ArgumentTypeError, match="title"):
        timeline.svg(title=3)  # type: ignore[arg-type]
