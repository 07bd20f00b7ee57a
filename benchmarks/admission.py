"""Admission policies side by side: how much room to keep for decode when admitting.

One burst of requests (:func:`minikv.course.workloads.shared_system_prompt`: four 96-token
system prompts, each request one of them and its own 8-24-token question), each
with a budget of ``MAX_NEW`` new tokens and a few stop tokens, so most requests end
well before their budget -- as real requests do. A ``TinyDecoder`` (vocabulary 256,
one layer: the figures are counts, not times), at most 16 running, a pool with room
for about four of the longest requests at their whole budget. Each policy of
:mod:`minikv.admission` serves the same requests:

* ``optimistic`` -- nano-vllm: the prompt fits plus one page per running request;
  preempt the newest when decode runs dry (the default);
* ``full`` -- mini-sglang: prompt plus the whole budget reserved; never preempts;
* ``retraction`` -- SGLang: budgets counted at ``new_token_ratio`` (0.7, decaying
  by 0.01 per decode step to 0.1, reset after a retraction); ``retraction(fast)``
  starts at 0.5 and decays by 0.05 per step to 0.05, so it retracts.

Reported per policy: steps, prefill and decode batches, requests admitted per
prefill batch, the most and the mean requests decoding at once, preemptions,
prefill tokens computed and, of those, recomputed (computed again after a
preemption: prompt and generated tokens whose K/V had existed). The script
**asserts** that every policy generates exactly the optimistic policy's tokens
(the tests prove those equal ``recompute``), that ``full`` preempts nothing, and
that ``Engine.check`` passes after every step.

Run: ``.venv/bin/python benchmarks/admission.py [--quick]``.
Writes ``benchmarks/results/admission.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from _common import machine, serving_setup, table, write_results

from minikv.admission import AdmissionPolicy, FullReservation, Optimistic, Retraction
from minikv.course.workloads import shared_system_prompt
from minikv.engine import EngineRequest, make_engine
from minikv.tiny_model import TinyDecoder

VOCAB = 256
MAX_NEW = 48
STOPS = (3, 17, 101, 200, 251)
"""Five of 256 token ids end a request: most stop well before ``MAX_NEW``."""
MAX_RUNNING = 16
ROOM = 4
"""The pool holds about this many of the longest requests at their whole budget."""
POLICIES: dict[str, Callable[[], AdmissionPolicy]] = {
    "optimistic": Optimistic,
    "full": FullReservation,
    "retraction": Retraction,
    "retraction(fast)": lambda: Retraction(0.5, 0.05, 0.05),
}


def serve(model: TinyDecoder, prompts: list[np.ndarray], admission: AdmissionPolicy) -> dict[str, Any]:
    longest = max(len(p) for p in prompts) + MAX_NEW
    engine = make_engine(model, ROOM * longest, max_running=MAX_RUNNING, admission=admission)
    requests = [engine.submit(EngineRequest(p, MAX_NEW, STOPS)) for p in prompts]
    admitted, decoding = [], []
    while engine.has_work():
        batch = engine.step()
        engine.check()
        if batch is not None and batch.kind == "prefill":
            admitted.append(len(batch.requests))
        elif batch is not None:
            decoding.append(len(batch.requests))
    stats = engine.stats
    first = sum(len(r.prompt) - r.admissions[0] for r in requests)  # what a first admission computes
    return {
        "pool_slots": engine.pool.num_slots,
        "steps": stats.steps,
        "prefill_batches": stats.prefill_batches,
        "decode_batches": stats.decode_batches,
        "admitted_per_prefill": float(np.mean(admitted)),
        "max_concurrent": max(decoding),
        "mean_concurrent": float(np.mean(decoding)),
        "preemptions": stats.preemptions,
        "prefill_tokens": stats.prefill_tokens,
        "recomputed_tokens": stats.prefill_tokens - first,
        "generated_tokens": sum(len(r.output) for r in requests),
        "outputs": [r.output for r in requests],
    }


def main() -> None:
    quick, model = serving_setup(__doc__, VOCAB)
    prompts = shared_system_prompt(16 if quick else 48, 4, 96, (8, 24), VOCAB, seed=0)
    rows, reference = [], None
    for name, make in POLICIES.items():
        result = serve(model, prompts, make())
        outputs = result.pop("outputs")
        if reference is None:
            reference = outputs
        assert outputs == reference, f"{name} generated other tokens than optimistic"
        rows.append({"policy": name, "requests": len(prompts), **result})
    assert rows[1]["preemptions"] == 0, "full reservation preempted"
    columns = ["policy", "requests", "steps", "admitted_per_prefill", "max_concurrent", "mean_concurrent",
               "preemptions", "prefill_tokens", "recomputed_tokens", "generated_tokens"]  # fmt: skip
    print(table(rows, columns, {"admitted_per_prefill": ".2f", "mean_concurrent": ".2f"}))
    path = write_results(
        "admission",
        {"quick": quick, "machine": machine(), "max_new_tokens": MAX_NEW, "stop_tokens": list(STOPS),
         "max_running": MAX_RUNNING, "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
