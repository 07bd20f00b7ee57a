"""Chunked prefill side by side: what a per-step prompt-token budget does to steps and latency.

One stream of requests on one model (a ``TinyDecoder``, vocabulary 256, one layer: the
figures are counts, not times): a short chat request (16-32 prompt tokens, 32 new tokens)
arrives every second step, and every sixth request is instead a long document (384-448 prompt
tokens, 8 new tokens), so long prefills keep landing on a batch that is decoding. At most 16
run at once, on a pool roomy enough that nothing is preempted. The same requests are served
with no budget (each admitted prompt prefilled whole, in a step of its own, while every decode
waits) and with budgets of 256, 128, 64 and 32 prompt tokens per step (``Engine(prefill_budget=N)``:
the chunks run beside the decode of every request whose prompt is done).

The clock is the engine's step. A step that prefills 400 tokens costs far more than a decode
step, so steps alone flatter the unchunked engine; the table also gives the most tokens one step
computed (prefill + decode: what a step's duration grows with) and the worst inter-token gap
counted in tokens computed meanwhile (the sum over the steps between two tokens of one request).

Reported per budget: steps, mixed steps (prefill and decode in one), prompt tokens computed,
the most tokens in one step, time to first token in steps (mean, and worst, over all requests
and over the long ones), and the worst inter-token gap in steps and in tokens computed. The
script **asserts** that every budget generates the unchunked engine's tokens (the tests prove
those equal ``recompute``), that no step computes more prompt tokens than its budget, and that
``Engine.check`` passes after every step.

Run: ``.venv/bin/python benchmarks/chunked_prefill.py [--quick]``.
Writes ``benchmarks/results/chunked_prefill.json``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from _common import machine, serving_setup, table, write_results

from minikv.engine import Batch, EngineRequest, make_engine
from minikv.tiny_model import TinyDecoder

VOCAB = 256
MAX_RUNNING = 16
BUDGETS: list[int | None] = [None, 256, 128, 64, 32]
SHORT = ((16, 32), 32)
"""Prompt length range and new tokens of a chat request."""
LONG = ((384, 448), 8)
"""Prompt length range and new tokens of a long document."""
LONG_EVERY = 6
ARRIVAL_GAP = 2
"""Steps between two arrivals."""


def stream(num_requests: int, seed: int = 0) -> list[tuple[np.ndarray, int, bool]]:
    """Each request's prompt, new-token budget and whether it is a long document, in order of arrival."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(num_requests):
        long = i % LONG_EVERY == LONG_EVERY - 1
        (low, high), new = LONG if long else SHORT
        requests.append((rng.integers(0, VOCAB, int(rng.integers(low, high + 1))), new, long))
    return requests


def step_tokens(batch: Batch | None) -> tuple[int, int]:
    """Prompt tokens and decode tokens one step computed."""
    if batch is None:
        return 0, 0
    parts = batch.parts or (batch,)
    prefill = sum(sum(b.ends) - sum(b.starts) for b in parts if b.kind == "prefill")
    return prefill, sum(len(b.requests) for b in parts if b.kind == "decode")


def serve(model: TinyDecoder, work: list[tuple[np.ndarray, int, bool]], budget: int | None) -> dict[str, Any]:
    longest = max(len(p) + n for p, n, _ in work)
    engine = make_engine(model, 4 * longest + MAX_RUNNING * 64, max_running=MAX_RUNNING, prefill_budget=budget)
    pending = list(work)
    requests: list[tuple[EngineRequest, bool]] = []
    work_per_step = [0]  # tokens computed in step s (steps count from 1)
    mixed = 0
    while pending or engine.has_work():
        if pending and engine.stats.steps % ARRIVAL_GAP == 0:
            prompt, new, long = pending.pop(0)
            requests.append((engine.submit(EngineRequest(prompt, new)), long))
        batch = engine.step()
        engine.check()
        prefill, decode = step_tokens(batch)
        assert budget is None or prefill <= budget, f"budget {budget}: a step computed {prefill} prompt tokens"
        work_per_step.append(prefill + decode)
        mixed += batch is not None and batch.kind == "mixed"
    stats = engine.stats
    ttft = {r.uid: stats.requests[r.uid].time_to_first_token for r, _ in requests}
    long_ttft = [ttft[r.uid] for r, long in requests if long]
    done = np.cumsum(work_per_step)  # tokens computed by the end of each step
    token_steps = [stats.requests[r.uid].token_steps for r, _ in requests]
    gap_tokens = [int(done[b] - done[a]) for steps in token_steps for a, b in itertools.pairwise(steps)]
    return {
        "steps": stats.steps,
        "mixed_steps": mixed,
        "prefill_tokens": stats.prefill_tokens,
        "preemptions": stats.preemptions,
        "max_step_tokens": max(work_per_step),
        "mean_ttft": float(np.mean(list(ttft.values()))),
        "worst_ttft": max(ttft.values()),
        "mean_ttft_long": float(np.mean(long_ttft)),
        "worst_ttft_long": max(long_ttft),
        "worst_gap_steps": max(stats.inter_token_gaps()),
        "worst_gap_tokens": max(gap_tokens),
        "ttft_steps": [ttft[r.uid] for r, _ in requests],
        "outputs": [r.output for r, _ in requests],
    }


def main() -> None:
    quick, model = serving_setup(__doc__, VOCAB)
    work = stream(18 if quick else 48)
    rows, reference = [], None
    for budget in BUDGETS:
        result = serve(model, work, budget)
        outputs = result.pop("outputs")
        if reference is None:
            reference = outputs
        assert outputs == reference, f"budget {budget} generated other tokens than the unchunked engine"
        rows.append({"budget": "none" if budget is None else budget, "requests": len(work), **result})
    columns = ["budget", "requests", "steps", "mixed_steps", "prefill_tokens", "preemptions", "max_step_tokens",
               "mean_ttft", "worst_ttft", "mean_ttft_long", "worst_ttft_long", "worst_gap_steps",
               "worst_gap_tokens"]  # fmt: skip
    print(table(rows, columns, {"mean_ttft": ".2f", "mean_ttft_long": ".2f"}))
    path = write_results(
        "chunked_prefill",
        {"quick": quick, "machine": machine(), "max_running": MAX_RUNNING, "arrival_gap": ARRIVAL_GAP,
         "short": {"prompt": list(SHORT[0]), "new": SHORT[1]}, "long": {"prompt": list(LONG[0]), "new": LONG[1]},
         "long_every": LONG_EVERY, "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
