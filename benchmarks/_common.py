"""What every benchmark here shares: timing, a plain-text table, and writing results as data.

Timings are wall-clock (``time.perf_counter``) medians over a few repeats after
a warm-up, so one noisy neighbour on a shared machine moves the median less
than it moves the mean. Every result file records the machine it came from.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from minikv.tiny_model import TinyDecoder

RESULTS = Path(os.environ.get("MINIKV_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
"""Where results are written; the smoke tests point it at a temporary folder."""


def median_seconds(run: Callable[[], object], repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time of ``run()`` and every sample; ``warmup`` runs are discarded first."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), samples


def serving_setup(doc: str | None, vocab_size: int) -> tuple[bool, TinyDecoder]:
    """The serving-policy benchmarks' shared start: their one flag and their model.

    Returns whether ``--quick`` was given (fewer requests: a smoke test) and a seeded one-layer
    ``TinyDecoder`` on one thread. Their figures are counts (tokens, steps, preemptions), so the
    model only has to be small and deterministic.
    """
    import argparse

    from minikv.tiny_model import TinyDecoder

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke test)")
    quick = parser.parse_args().quick
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyDecoder(
        vocab_size=vocab_size, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, max_positions=512
    )
    return quick, model


def machine() -> dict[str, Any]:
    """Enough about the machine to tell two result files apart."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["load_average_1min"] = os.getloadavg()[0]
    return info


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` (atomically: a reader never sees half a file)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    document = {"benchmark": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), **payload}
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)
    return path


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], formats: dict[str, str] | None = None) -> str:
    """Rows as a Markdown table (readable in a terminal, pasteable into the README)."""
    formats = formats or {}

    def cell(row: dict[str, Any], column: str) -> str:
        value = row.get(column, "")
        if value is None:
            return "-"
        if column in formats and isinstance(value, (int, float)):
            return format(value, formats[column])
        return str(value)

    cells = [[cell(row, c) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join(lines)


# The replay tables, as replay.py prints them and report.py writes them into the README.
REPLAY_COLUMNS = [
    "workload",
    "variant",
    "requests",
    "us_per_request",
    "us_per_request_min",
    "vs_naive",
    "manager_us",
    "target_us",
    "hit_rate",
    "optimal_hit_rate",
    "hit_vs_optimal",
    "evicted_slots",
]
REPLAY_FORMATS = {
    "us_per_request": ".1f",
    "us_per_request_min": ".1f",
    "vs_naive": ".2f",
    "hit_rate": ".3f",
    "optimal_hit_rate": ".3f",
    "hit_vs_optimal": ".3f",
    "manager_us": ".1f",
    "target_us": ".1f",
}
BREAKDOWN_COLUMNS = [
    "workload",
    "variant",
    "manager_total",
    "manager.match_prefix",
    "manager.lock_handle",
    "manager.insert_prefix",
    "manager.evict",
    "pool_total",
    "lifecycle_glue",
    "instrumented_total",
]
BREAKDOWN_FORMATS = dict.fromkeys(BREAKDOWN_COLUMNS[2:], ".1f")
