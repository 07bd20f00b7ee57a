"""The benchmark scripts still run, and still hold their claims, on a small scale.

Each script is run as a learner would run it, in quick mode, with its results sent to a
temporary folder (``MINIKV_BENCH_RESULTS``) so the committed results are not touched. The
scripts assert what must never go wrong -- the radix cache's hits equal the offline optimum,
the tree passes ``check_integrity``, every stored row landed in its slot -- so a run that
finishes is a check of those claims; the timings themselves are not checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import smollm2_or_skip

REPO = Path(__file__).resolve().parent.parent


def run_benchmark(script: str, args: list[str], results: Path) -> dict:
    env = {**os.environ, "MINIKV_BENCH_RESULTS": str(results), "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = sorted(p.name for p in results.iterdir())
    assert len(written) == 1, written
    return json.loads((results / written[0]).read_text())


def test_replay_quick_meets_the_offline_optimum(tmp_path: Path) -> None:
    doc = run_benchmark("replay", ["--quick", "--repeats", "1"], tmp_path)
    assert doc["quick"] is True
    radix_large = [r for r in doc["rows"] if r["manager"] == "radix" and r["pool"] == "large"]
    assert radix_large and all(r["hit_vs_optimal"] == 1.0 for r in radix_large if r["optimal_hit_rate"] > 0)
    assert any(r["evicted_slots"] > 0 for r in doc["rows"] if r["pool"] == "tight")
    assert all(r["manager_us"] > 0 for r in doc["rows"])


def test_evict_scaling_small(tmp_path: Path) -> None:
    doc = run_benchmark("evict_scaling", ["--max-n", "1000"], tmp_path)
    assert [r["leaves"] for r in doc["rows"]] == [100, 300, 1000]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") not in (None, "1"), reason="needs Triton's interpreter on CPU")
def test_store_quick_writes_every_row(tmp_path: Path) -> None:
    doc = run_benchmark("store", ["--quick", "--device", "cpu"], tmp_path)
    assert doc["quick"] is True and {r["tokens"] for r in doc["rows"]} == {256}
    assert {"memcpy", "store_cache[torch]"} <= {r["variant"] for r in doc["rows"]}


def test_engine_quick_saves_prefill_and_generates_the_same_tokens(tmp_path: Path) -> None:
    doc = run_benchmark("engine", ["--quick"], tmp_path)  # the script asserts identical tokens in every variant
    assert doc["quick"] is True
    rows = {(r["workload"], r["variant"]): r for r in doc["rows"]}
    assert {w for w, _ in rows} == {"shared_prompt", "few_shot", "multi_turn"}
    for workload in ("shared_prompt", "few_shot", "multi_turn"):
        naive, radix = rows[(workload, "naive")], rows[(workload, "radix ps=1")]
        assert naive["hit_rate"] == 0 and radix["prefill_tokens"] < naive["prefill_tokens"]
        assert radix["hit_rate"] <= radix["optimal_hit_rate"]
    assert rows[("shared_prompt", "radix ps=1")]["hit_vs_optimal"] == 1.0
    assert any(r["preemptions"] > 0 for r in doc["rows"] if r["variant"].endswith("tight"))
    assert doc["curve"] and all(0 < r["cache_share"] < 1 for r in doc["rows"])


def test_real_model_quick_saves_prefill_and_generates_the_same_tokens(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="the real model's readers (minikv[models]) are missing")
    smollm2_or_skip()
    doc = run_benchmark("real_model", ["--quick"], tmp_path)  # the script asserts identical tokens in every variant
    rows = {(r["workload"], r["variant"]): r for r in doc["rows"]}
    assert {w for w, _ in rows} == {"shared_system", "multi_turn"}
    for workload in ("shared_system", "multi_turn"):
        naive = rows[(workload, "naive")]
        assert naive["cached_share"] == 0 and naive["prefill_tokens"] == naive["prompt_tokens"]
        for variant in ("radix ps=1", "radix ps=16"):
            assert rows[(workload, variant)]["prefill_tokens"] < naive["prefill_tokens"]
    assert all(r["tokens_per_s"] > 0 for r in doc["rows"])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") not in (None, "1"), reason="needs Triton's interpreter on CPU")
def test_paged_attention_quick_checks_the_kernel_against_the_gather_path(tmp_path: Path) -> None:
    doc = run_benchmark("paged_attention", ["--quick", "--device", "cpu"], tmp_path)
    assert doc["quick"] is True
    assert {r["variant"] for r in doc["rows"]} == {"copy", "gather + attend", "paged kernel"}
    assert all(r["gb_per_s"] > 0 for r in doc["rows"])


def test_scheduling_quick_generates_the_same_tokens_under_every_policy(tmp_path: Path) -> None:
    doc = run_benchmark("scheduling", ["--quick"], tmp_path)  # the script asserts identical tokens per policy
    assert doc["quick"] is True
    rows = {(r["workload"], r["policy"]): r for r in doc["rows"]}
    workloads = {w for w, _ in rows}
    assert workloads == {"shared_prompt", "few_shot", "multi_turn", "many_shared", "many_shared_stream"}
    assert {p for _, p in rows} == {"fcfs", "lpm", "dfs-weight", "aging(1)", "aging(4)"}
    for workload in workloads:
        fcfs = rows[(workload, "fcfs")]
        assert all(rows[(workload, p)]["prompt_tokens"] == fcfs["prompt_tokens"] for _, p in rows)
        assert fcfs["prefill_vs_fcfs"] == 1.0
    assert rows[("many_shared", "lpm")]["prefill_tokens"] < rows[("many_shared", "fcfs")]["prefill_tokens"]
    assert any(r["preemptions"] > 0 for r in doc["rows"])


def test_admission_quick_generates_the_same_tokens_under_every_policy(tmp_path: Path) -> None:
    doc = run_benchmark("admission", ["--quick"], tmp_path)  # the script asserts identical tokens per policy
    assert doc["quick"] is True
    rows = {r["policy"]: r for r in doc["rows"]}
    assert set(rows) == {"optimistic", "full", "retraction", "retraction(fast)"}
    assert rows["full"]["preemptions"] == 0 and rows["full"]["recomputed_tokens"] == 0
    assert rows["optimistic"]["preemptions"] > 0
    assert rows["full"]["max_concurrent"] < rows["optimistic"]["max_concurrent"]
    assert len({r["generated_tokens"] for r in rows.values()}) == 1


def test_chunked_prefill_quick_generates_the_same_tokens_under_every_budget(tmp_path: Path) -> None:
    doc = run_benchmark("chunked_prefill", ["--quick"], tmp_path)  # the script asserts identical tokens per budget
    assert doc["quick"] is True
    rows = {r["budget"]: r for r in doc["rows"]}
    assert list(rows) == ["none", 256, 128, 64, 32]
    assert len({r["prefill_tokens"] for r in rows.values()}) == 1  # chunks compute the same prompt tokens
    assert rows["none"]["mixed_steps"] == 0 and rows["none"]["worst_gap_steps"] >= 2
    assert all(rows[b]["worst_gap_steps"] == 1 for b in (256, 128, 64, 32))  # decode never waits for a prompt
    assert rows[32]["max_step_tokens"] < rows[256]["max_step_tokens"] < rows["none"]["max_step_tokens"]
    assert rows[32]["worst_ttft_long"] > rows["none"]["worst_ttft_long"]
