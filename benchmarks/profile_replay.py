"""Where a replay spends its time, by function and (when line_profiler is importable) by line.

Replays one workload through :func:`minikv.lifecycle.admit` / ``finish`` as
``replay.py`` does, under cProfile, and reports each minikv function's own time
in µs per request. With ``line_profiler`` on the path (it is not a dependency:
``pip install --target /tmp/lp line_profiler`` and ``PYTHONPATH=/tmp/lp``), it
also times every line of the hot functions. Profilers inflate small calls, so
read the shares, not the absolute figures; ``replay.py`` gives the true totals.

Run: ``.venv/bin/python benchmarks/profile_replay.py [--workload shared_system_prompt|multi_turn_chat|few_shot]
[--pool large|tight] [--page-size N]``. Writes ``benchmarks/results/profile_replay_<workload>_<pool>.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import table, write_results
from replay import pool_pages, workloads

import minikv
from minikv import PagePool, RadixCacheManager, _validate, lifecycle, page_pool, radix_manager
from minikv.lifecycle import admit, finish

PACKAGE = str(Path(minikv.__file__).parent)
WORKLOADS = ("shared_system_prompt", "multi_turn_chat", "few_shot")


def hot_functions() -> list[Callable[..., Any]]:
    """Every function and method defined in the modules a replay runs through."""
    found = []
    for module in (radix_manager, page_pool, lifecycle, _validate):
        for _, obj in inspect.getmembers(module):
            if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                found.append(obj)
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                found += [f for _, f in inspect.getmembers(obj, inspect.isfunction) if f.__module__ == module.__name__]
    # Only code written in the package (dataclasses generate methods whose "file" is "<string>").
    return [f for f in found if f.__code__.co_filename.startswith(PACKAGE) and not hasattr(f, "__wrapped__")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="shared_system_prompt")
    parser.add_argument("--pool", choices=("large", "tight"), default="large")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    ps = args.page_size
    requests = workloads(quick=False)[args.workload]
    pages = pool_pages(requests, ps, args.pool)

    def run() -> None:
        manager, pool = RadixCacheManager(page_size=ps), PagePool(pages, ps)
        for ids in requests:
            finish(manager, pool, admit(manager, pool, ids))

    run()  # warm-up
    profiler = cProfile.Profile()
    profiler.runcall(run)
    stats = pstats.Stats(profiler)
    n = len(requests)
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if filename.startswith(PACKAGE) or "{" in filename or filename == "~":
            where = f"{Path(filename).name}:{line}" if filename.startswith(PACKAGE) else "builtin"
            rows.append({"function": f"{where} {name}", "calls_per_request": calls / n,
                         "own_us_per_request": tottime / n * 1e6, "cum_us_per_request": cumtime / n * 1e6})  # fmt: skip
    rows.sort(key=lambda r: -r["own_us_per_request"])
    rows = rows[: args.top]
    print(f"cProfile, {args.workload}, {args.pool} pool, page_size {ps}, {n} requests (µs per request):")
    print(table(rows, ["function", "calls_per_request", "own_us_per_request", "cum_us_per_request"],
                {"calls_per_request": ".2f", "own_us_per_request": ".2f", "cum_us_per_request": ".2f"}))  # fmt: skip

    lines: list[dict[str, Any]] = []
    try:
        from line_profiler import LineProfiler  # type: ignore[import-not-found]
    except ImportError:
        print("\nline_profiler is not importable: no per-line figures (see the module docstring).")
    else:
        line_profiler = LineProfiler()
        for function in hot_functions():
            line_profiler.add_function(function)
        line_profiler.runcall(run)
        timings = line_profiler.get_stats()
        for (filename, _, function), entries in timings.timings.items():
            source = Path(filename).read_text().splitlines()
            for lineno, hits, time_units in entries:
                us = time_units * timings.unit / n * 1e6
                if us >= 0.3:
                    lines.append({"line": f"{Path(filename).name}:{lineno}", "function": function,
                                  "hits_per_request": hits / n, "us_per_request": us,
                                  "code": source[lineno - 1].strip()[:90]})  # fmt: skip
        lines.sort(key=lambda r: -r["us_per_request"])
        print("\nline_profiler: lines costing >= 0.3 µs per request (inclusive of the calls they make):")
        print(table(lines[:40], ["line", "function", "hits_per_request", "us_per_request", "code"],
                    {"hits_per_request": ".2f", "us_per_request": ".2f"}))  # fmt: skip
    name = f"profile_replay_{args.workload}_{args.pool}" + (f"_ps{ps}" if ps > 1 else "")
    path = write_results(name, {"workload": args.workload, "pool": args.pool, "page_size": ps, "requests": n,
                                "pool_pages": pages, "functions": rows, "lines": lines})  # fmt: skip
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
