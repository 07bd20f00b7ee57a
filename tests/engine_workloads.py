"""Drawn serving workloads for the engine's policy tests (test_scheduling.py, test_admission.py).

A workload is plain data: prompts over a few shared prefixes, each with a budget of new tokens
and an arrival step, stop tokens, a page size and a pool that may run dry. ``serve`` plays it on
an engine built with the policy under test, checking the engine after every step; ``reference``
is what a recompute generates for one request.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from minikv.engine import Engine, EngineRequest, make_engine, recompute
from minikv.tiny_model import TinyDecoder

VOCAB = 16
MODEL = TinyDecoder(vocab_size=VOCAB, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=64)

tokens = st.integers(0, VOCAB - 1)


@cache
def reference(prompt: tuple[int, ...], max_new: int, stops: tuple[int, ...]) -> list[int]:
    return recompute(MODEL, list(prompt), max_new, stops)


@st.composite
def workloads(draw: st.DrawFn, vary_insert_after_prefill: bool = False) -> dict:
    """Prompts over a few shared prefixes, arrivals spread over the first steps, a pool that may run dry."""
    prefixes = draw(st.lists(st.lists(tokens, min_size=1, max_size=12), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(2, 7))):
        prompt = draw(st.sampled_from(prefixes)) + draw(st.lists(tokens, min_size=1, max_size=6))
        requests.append((tuple(prompt), draw(st.integers(1, 10)), draw(st.integers(0, 6))))
    page_size = draw(st.sampled_from([1, 4]))
    longest = max(len(p) + n - 1 for p, n, _ in requests)
    fewest = -(-longest // page_size)
    work = {
        "requests": requests,  # (prompt, max_new_tokens, arrival step)
        "stops": tuple(draw(st.lists(tokens, max_size=2, unique=True))),
        "page_size": page_size,
        "num_pages": draw(st.integers(fewest, fewest + 12 // page_size)),
        "max_running": draw(st.integers(1, 4)),
        "overlap": draw(st.booleans()),
    }
    if vary_insert_after_prefill:
        work["insert_after_prefill"] = draw(st.booleans())
    return work


def serve(work: dict, engine_class: type[Engine] = Engine, **choice: Any) -> tuple[Engine, list]:
    """Submit each request at its arrival step, run to the end, checking the engine after every step.

    ``choice`` is the policy under test, as ``make_engine`` takes it (``policy=`` or ``admission=``).
    """
    engine = make_engine(
        MODEL, work["num_pages"], work["page_size"], max_running=work["max_running"], overlap=work["overlap"],
        insert_after_prefill=work.get("insert_after_prefill", True), engine_class=engine_class, **choice,
    )  # fmt: skip
    arrivals = sorted(enumerate(work["requests"]), key=lambda item: (item[1][2], item[0]))
    requests: list[EngineRequest | None] = [None] * len(arrivals)
    step = 0
    while arrivals or engine.has_work():
        while arrivals and arrivals[0][1][2] <= step:
            index, (prompt, max_new, _) = arrivals.pop(0)
            requests[index] = engine.submit(EngineRequest(list(prompt), max_new, work["stops"]))
        engine.step()
        engine.check()
        step += 1
        assert step < 2000
    return engine, requests
