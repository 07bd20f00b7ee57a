"""Serve request streams through ``minikv.engine`` with and without the radix cache, on the CPU.

Three workloads, seeded, sized for a CPU and a ``TinyDecoder`` (vocabulary 256,
4 layers, 4 query heads and 2 KV heads of 64 dims, fp32, one torch thread):

* ``shared_prompt`` -- :func:`minikv.course.workloads.shared_system_prompt`: two 96-token
  system prompts, each request one of them plus its own 8-24-token question;
* ``few_shot`` -- :func:`minikv.course.workloads.few_shot`: a template, two of six
  example blocks, a question;
* ``multi_turn`` -- conversations driven in a closed loop: turn ``k + 1``'s
  prompt is turn ``k``'s prompt, the tokens the engine *generated* for it, and a
  new user message, submitted when turn ``k`` finishes. The generated tokens are
  in the tree by then (a finished request inserts them), so they are hits.

Every request generates 16 tokens (greedy). Variants: the naive manager (the
control), the radix cache with page sizes 1, 4 and 16 on a pool that never
runs dry, the same with prompts inserted only when their request finishes
(``insert_after_prefill=False``: requests running side by side share nothing),
and the radix cache (page size 1) on a *tight* pool, a third of the peak the
large pool used, where eviction and preemption run.

Reported per run: prompt tokens, prefill tokens computed, the hit rate (prompt
tokens matched at each request's first admission) against the offline optimum
(for each request, the longest prefix of ``prompt[:-1]`` shared with the
prompt + generated tokens of any request submitted before it, page-aligned:
what a cache that never evicts and inserts at once could serve), preemptions,
evicted slots, steps, wall time against the naive control (the minimum of the
repeats, the best estimate on a shared machine), the same for the time the
model spent in prefill batches (what a prefix cache saves), and the share of a
step's host time spent in cache management (match, lock, allocate with
eviction, insert, free). A curve of hit rate against pool size follows.

The script **asserts** that every variant generates exactly the naive
control's tokens, and that ``Engine.check`` passes at the end of every run.

Run: ``.venv/bin/python benchmarks/engine.py [--quick] [--repeats N]``.
Writes ``benchmarks/results/engine.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from _common import table, write_results

from minikv.course.workloads import few_shot, shared_system_prompt
from minikv.engine import Engine, EngineRequest, make_engine
from minikv.tiny_model import TinyDecoder

VOCAB = 256
MAX_NEW = 16
MAX_RUNNING = 8
TIGHT_FRACTION = 1 / 3
MODEL = {"num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64}
"""Big enough that a prefill's cost grows with its tokens (a smaller one is all per-call overhead on a CPU)."""
QUICK_MODEL = {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
"""``--quick`` is a smoke test: the smallest model that exercises everything."""
ARRIVAL_GAP = 2
"""Steps between arrivals for the open workloads: a request takes ~17 steps, so ~8 overlap."""


@dataclass
class Workload:
    """First requests to submit, and what to submit when one finishes (the next turn of a chat)."""

    name: str
    first: Callable[[], list[EngineRequest]]
    follow_up: Callable[[EngineRequest], EngineRequest | None]
    arrival_gap: int = 0
    """The first requests arrive one every ``arrival_gap`` steps (0: all at once)."""


def no_follow_up(_: EngineRequest) -> None:
    return None


def multi_turn(conversations: int, turns: int, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, 48)
    messages = [[rng.integers(0, VOCAB, int(rng.integers(8, 17))) for _ in range(turns)] for _ in range(conversations)]
    turn_of: dict[int, tuple[int, int]] = {}

    def first() -> list[EngineRequest]:
        turn_of.clear()
        requests = []
        for c in range(conversations):
            request = EngineRequest(np.concatenate([system, messages[c][0]]), MAX_NEW)
            turn_of[id(request)] = (c, 0)
            requests.append(request)
        return requests

    def follow_up(done: EngineRequest) -> EngineRequest | None:
        c, t = turn_of[id(done)]
        if t + 1 == turns:
            return None
        history = np.concatenate([done.prompt, np.asarray(done.output, dtype=np.int64), messages[c][t + 1]])
        request = EngineRequest(history, MAX_NEW)
        turn_of[id(request)] = (c, t + 1)
        return request

    return Workload("multi_turn", first, follow_up)


def workloads(quick: bool) -> list[Workload]:
    n = 8 if quick else 32
    shared = shared_system_prompt(n, num_prompts=2, prompt_len=96, question_len=(8, 24), vocab_size=VOCAB, seed=0)
    shots = few_shot(
        n, num_templates=2, template_len=24, num_examples=6, shots=2, example_len=(16, 32),
        question_len=(4, 12), vocab_size=VOCAB, seed=0,
    )  # fmt: skip
    return [
        Workload("shared_prompt", lambda: [EngineRequest(p, MAX_NEW) for p in shared], no_follow_up, ARRIVAL_GAP),
        Workload("few_shot", lambda: [EngineRequest(p, MAX_NEW) for p in shots], no_follow_up, ARRIVAL_GAP),
        multi_turn(3 if quick else 8, 3 if quick else 4),
    ]


def drive(engine: Engine, workload: Workload) -> tuple[list[EngineRequest], int]:
    """Run the workload to the end; the requests in submission order, and the peak of slots in use."""
    arrivals = workload.first()
    submitted: list[EngineRequest] = []
    seen, peak, step = 0, 0, 0
    while arrivals or engine.has_work():
        while arrivals and len(submitted) * workload.arrival_gap <= step:
            submitted.append(engine.submit(arrivals.pop(0)))
        engine.step()
        step += 1
        peak = max(peak, engine.pool.num_slots - engine.pool.num_free_slots)
        while seen < len(engine.finished):
            follow = workload.follow_up(engine.finished[seen])
            seen += 1
            if follow is not None:
                submitted.append(engine.submit(follow))
    engine.check()
    return submitted, peak


def optimal_hits(requests: list[EngineRequest], page_size: int) -> int:
    """Sum over requests of the longest page-aligned prefix of ``prompt[:-1]`` shared with an earlier sequence."""
    total = 0
    for i, request in enumerate(requests):
        query = request.prompt[:-1]
        best = 0
        for earlier in requests[:i]:
            written = earlier.token_ids[:-1]  # prompt + generated tokens whose K/V exist
            n = min(len(query), len(written))
            differ = np.flatnonzero(query[:n] != written[:n])
            best = max(best, int(differ[0]) if differ.size else n)
        total += best - best % page_size
    return total


@dataclass
class Variant:
    name: str
    manager: str
    page_size: int
    num_pages: int
    insert_after_prefill: bool = True


@dataclass
class Run:
    """One run of a variant: the engine it ended with, the requests in submission order, and timings."""

    engine: Engine
    requests: list[EngineRequest]
    peak: int
    seconds: float


def run_once(model: TinyDecoder, workload: Workload, variant: Variant) -> Run:
    engine = make_engine(
        model,
        variant.num_pages,
        variant.page_size,
        variant.manager,
        MAX_RUNNING,
        insert_after_prefill=variant.insert_after_prefill,
    )
    start = time.perf_counter()
    requests, peak = drive(engine, workload)
    return Run(engine, requests, peak, time.perf_counter() - start)


def outputs_of(run: Run) -> list[list[int]]:
    """Each request's tokens, ordered by prompt (submission order may differ between variants)."""
    return [r.output for r in sorted(run.requests, key=lambda r: r.prompt.tobytes())]


def row_of(workload: Workload, variant: Variant, runs: list[Run]) -> dict[str, Any]:
    last = runs[-1]
    stats, requests = last.engine.stats, last.requests
    prompt_tokens = sum(len(r.prompt) for r in requests)
    hits = sum(r.cached_tokens for r in requests)
    optimum = optimal_hits(requests, variant.page_size)
    return {
        "workload": workload.name,
        "variant": variant.name,
        "pool_pages": variant.num_pages,
        "requests": len(requests),
        "prompt_tokens": prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "hit_rate": hits / prompt_tokens,
        "optimal_hit_rate": optimum / prompt_tokens,
        "hit_vs_optimal": hits / optimum if optimum else None,
        "preemptions": stats.preemptions,
        "evicted_slots": stats.evicted_slots,
        "steps": stats.steps,
        "decode_tokens": stats.decode_tokens,
        "seconds": statistics.median(r.seconds for r in runs),
        "seconds_min": min(r.seconds for r in runs),
        "prefill_seconds_min": min(r.engine.stats.prefill_seconds for r in runs),
        "cache_share": stats.cache_seconds / stats.step_seconds,
        "model_share": stats.model_seconds / stats.step_seconds,
        "cache_ms_per_step": 1000 * stats.cache_seconds / stats.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a quarter of the requests, two curve points, a smaller model"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant (median and minimum)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend
    repeats = 1 if args.quick else args.repeats
    shape = QUICK_MODEL if args.quick else MODEL
    model = TinyDecoder(vocab_size=VOCAB, max_positions=512, **shape)
    large = 4096  # slots: more than any workload here ever holds
    rows, curve = [], []
    for workload in workloads(args.quick):
        # An untimed run first: the reference tokens, the peak of slots in use, the longest request.
        first = run_once(model, workload, Variant("naive", "naive", 1, large))
        reference = outputs_of(first)
        peak = run_once(model, workload, Variant("radix", "radix", 1, large)).peak
        longest = max(len(r.prompt) for r in first.requests) + MAX_NEW - 1
        variants = [
            Variant("naive", "naive", 1, large),
            *(Variant(f"radix ps={ps}", "radix", ps, large // ps) for ps in (1, 4, 16)),
            Variant("radix ps=1 at finish", "radix", 1, large, insert_after_prefill=False),
            Variant("radix ps=1 tight", "radix", 1, max(int(peak * TIGHT_FRACTION), longest)),
        ]
        # Repeats go round the variants, so a burst of load on a shared machine hits them all alike.
        runs: dict[str, list[Run]] = {v.name: [] for v in variants}
        for _ in range(repeats):
            for variant in variants:
                run = run_once(model, workload, variant)
                assert outputs_of(run) == reference, f"{workload.name}: {variant.name} generated other tokens"
                runs[variant.name].append(run)
        found = [row_of(workload, v, runs[v.name]) for v in variants]
        naive = found[0]
        for row in found:
            # The minimum: on a shared machine it is the best estimate of the cost itself.
            row["time_vs_naive"] = row["seconds_min"] / naive["seconds_min"]
            row["prefill_vs_naive"] = row["prefill_tokens"] / naive["prefill_tokens"]
            row["prefill_time_vs_naive"] = row["prefill_seconds_min"] / naive["prefill_seconds_min"]
        rows += found
        fractions = (0.25, 1.0) if args.quick else (0.15, 0.2, 0.25, 0.33, 0.5, 0.75, 1.0)
        for fraction in fractions:
            pages = int(peak * fraction)
            if pages < longest:  # the engine refuses a request the pool could never hold
                continue
            variant = Variant("radix ps=1", "radix", 1, pages)
            run = run_once(model, workload, variant)
            assert outputs_of(run) == reference
            curve.append({"workload": workload.name, "pool_fraction": fraction, **row_of(workload, variant, [run])})
    columns = [
        "workload", "variant", "pool_pages", "requests", "prompt_tokens", "prefill_tokens", "prefill_vs_naive",
        "hit_rate", "optimal_hit_rate", "hit_vs_optimal", "preemptions", "evicted_slots", "steps", "seconds_min",
        "time_vs_naive", "prefill_time_vs_naive", "cache_share",
    ]  # fmt: skip
    formats = {
        "prefill_vs_naive": ".2f", "hit_rate": ".3f", "optimal_hit_rate": ".3f", "hit_vs_optimal": ".3f",
        "seconds_min": ".2f", "prefill_time_vs_naive": ".2f", "time_vs_naive": ".2f", "cache_share": ".3f",
    }  # fmt: skip
    print(table(rows, columns, formats))
    print()
    print(table(curve, ["workload", "pool_fraction", "pool_pages", "hit_rate", "prefill_tokens", "preemptions",
                        "evicted_slots", "steps"], {"hit_rate": ".3f"}))  # fmt: skip
    write_results(
        "engine",
        {
            "quick": args.quick,
            "repeats": repeats,
            "max_new_tokens": MAX_NEW,
            "max_running": MAX_RUNNING,
            "model": {"vocab_size": VOCAB, **shape},
            "rows": rows,
            "curve": curve,
        },
    )


if __name__ == "__main__":
    main()
