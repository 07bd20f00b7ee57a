"""Scheduling policies side by side: which waiting request to admit first, on a tight pool.

Every workload but the last is a burst: all requests submitted at once to an engine with 8
rows and a pool with room for about three of its longest requests, so a queue
forms and admission has a choice. Each policy of :mod:`minikv.scheduling` serves
the same requests on the same model (a ``TinyDecoder``, vocabulary 256, one
layer: the figures here are counts, not times):

* ``shared_prompt`` -- :func:`minikv.course.workloads.shared_system_prompt`: four 96-token
  system prompts, each request one of them and its own 8-24-token question;
* ``few_shot`` -- :func:`minikv.course.workloads.few_shot`: a template, two of six
  example blocks, a question;
* ``multi_turn`` -- :func:`minikv.course.workloads.multi_turn_chat`: conversations whose
  turns repeat the previous turn's prompt (its answer is new tokens);
* ``many_shared`` -- the trace with many shared prompts: eight 64-token prompts,
  each asked by several requests in shuffled order, so FCFS keeps switching
  between them;
* ``many_shared_stream`` -- the same trace arriving one request per step instead
  of in one burst: requests keep joining the queue while others wait, which is
  where longest-prefix-first can make a request wait longest and aging matters.

Reported per (workload, policy): prompt tokens submitted, prefill tokens
computed, preemptions, steps, and the worst and mean number of steps a request
spent waiting (:attr:`~minikv.engine.EngineRequest.waited_steps`, after a
preemption too). The script **asserts** that every policy generates exactly
FCFS's tokens for every request (the tests prove FCFS equals ``recompute``)
and that ``Engine.check`` passes at the end of every run.

Run: ``.venv/bin/python benchmarks/scheduling.py [--quick]``.
Writes ``benchmarks/results/scheduling.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from _common import machine, serving_setup, table, write_results

from minikv.course.workloads import few_shot, multi_turn_chat, shared_system_prompt
from minikv.engine import EngineRequest, make_engine
from minikv.scheduling import FCFS, Aging, DFSWeight, LongestPrefixMatch, SchedulingPolicy
from minikv.tiny_model import TinyDecoder

VOCAB = 256
MAX_NEW = 8
MAX_RUNNING = 8
ROOM = 3
"""The pool holds about this many of the workload's longest requests."""
POLICIES: dict[str, Callable[[], SchedulingPolicy]] = {
    "fcfs": FCFS,
    "lpm": LongestPrefixMatch,
    "dfs-weight": DFSWeight,
    "aging(1)": lambda: Aging(1),
    "aging(4)": lambda: Aging(4),
}


def many_shared(num_requests: int, num_prompts: int = 8, seed: int = 0) -> list[np.ndarray]:
    """``num_prompts`` 64-token prompts, each request one of them (shuffled) plus 4-12 tokens of its own."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, VOCAB, 64) for _ in range(num_prompts)]
    picks = rng.permutation(np.arange(num_requests) % num_prompts)
    return [np.concatenate([prompts[p], rng.integers(0, VOCAB, int(rng.integers(4, 13)))]) for p in picks]


def workloads(quick: bool) -> dict[str, tuple[list[np.ndarray], int]]:
    """Each workload's prompts, and the steps between two arrivals (0: all at once)."""
    n = 16 if quick else 48
    return {
        "shared_prompt": (shared_system_prompt(n, 4, 96, (8, 24), VOCAB, seed=0), 0),
        "few_shot": (few_shot(n, 2, 24, 6, 2, (16, 32), (4, 12), VOCAB, seed=0), 0),
        "multi_turn": (multi_turn_chat(4 if quick else 8, 4 if quick else 6, 48, (8, 16), (8, 24), VOCAB, seed=0), 0),
        "many_shared": (many_shared(n), 0),
        "many_shared_stream": (many_shared(n), 1),
    }


def serve(model: TinyDecoder, prompts: list[np.ndarray], gap: int, policy: SchedulingPolicy) -> dict[str, Any]:
    longest = max(len(p) for p in prompts) + MAX_NEW
    engine = make_engine(model, ROOM * longest, max_running=MAX_RUNNING, policy=policy)
    arrivals = [EngineRequest(p, MAX_NEW) for p in prompts]
    requests, step = [], 0
    while arrivals or engine.has_work():
        while arrivals and len(requests) * gap <= step:
            requests.append(engine.submit(arrivals.pop(0)))
        engine.step()
        step += 1
    engine.check()
    waits = [r.waited_steps for r in requests]
    stats = engine.stats
    return {
        "pool_slots": engine.pool.num_slots,
        "prompt_tokens": stats.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "preemptions": stats.preemptions,
        "steps": stats.steps,
        "worst_wait": max(waits),
        "mean_wait": float(np.mean(waits)),
        "outputs": [r.output for r in requests],
    }


def main() -> None:
    quick, model = serving_setup(__doc__, VOCAB)
    rows = []
    for name, (prompts, gap) in workloads(quick).items():
        fcfs_outputs = None
        for policy_name, make in POLICIES.items():
            result = serve(model, prompts, gap, make())
            outputs = result.pop("outputs")
            if fcfs_outputs is None:
                fcfs_outputs, fcfs_prefill = outputs, result["prefill_tokens"]
            assert outputs == fcfs_outputs, f"{name}: {policy_name} generated other tokens than fcfs"
            result["prefill_vs_fcfs"] = result["prefill_tokens"] / fcfs_prefill
            rows.append({"workload": name, "policy": policy_name, "requests": len(prompts), **result})
    columns = ["workload", "policy", "requests", "prompt_tokens", "prefill_tokens", "prefill_vs_fcfs",
               "preemptions", "steps", "worst_wait", "mean_wait"]  # fmt: skip
    print(table(rows, columns, {"prefill_vs_fcfs": ".2f", "mean_wait": ".1f"}))
    path = write_results(
        "scheduling",
        {"quick": quick, "machine": machine(), "max_new_tokens": MAX_NEW, "max_running": MAX_RUNNING,
         "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
