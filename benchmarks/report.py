"""Rewrite the "Latest results" section of ``benchmarks/README.md`` from ``benchmarks/results/*.json``.

The README's tables are never typed by hand: run the benchmarks, then this.
Run: ``.venv/bin/python benchmarks/report.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _common import BREAKDOWN_COLUMNS, BREAKDOWN_FORMATS, REPLAY_COLUMNS, REPLAY_FORMATS, RESULTS, table

README = Path(__file__).resolve().parent / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def machine_line(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    load = f", load average {m['load_average_1min']:.1f}" if "load_average_1min" in m else ""
    gpu = f", GPU {m['cuda']}" if m.get("cuda") else ""
    return (
        f"_{doc['created']}: {m['cpu_count']} CPUs ({m['cpu']}), torch {m['torch']} with {m['torch_threads']} "
        f"thread(s), Python {m['python']}{gpu}{load}._"
    )


def replay_section(doc: dict[str, Any]) -> list[str]:
    rows = doc["rows"]
    out = ["### replay.py", "", machine_line(doc), ""]
    if doc.get("quick"):
        out += ["**Quick run (a tenth of the requests): a smoke test, not a result.**", ""]
    out.append(table(rows, REPLAY_COLUMNS, REPLAY_FORMATS))
    out += ["", "Where the time goes (µs per request, instrumented passes, each figure the minimum of five):", ""]
    out.append(table(doc["breakdown_us"], BREAKDOWN_COLUMNS, BREAKDOWN_FORMATS))
    return out


def evict_section(doc: dict[str, Any]) -> list[str]:
    g = doc["growth"]
    return [
        "### evict_scaling.py",
        "",
        machine_line(doc),
        "",
        table(
            doc["rows"],
            ["leaves", "heap_us", "full_scan_us", "ratio"],
            {"heap_us": ".2f", "full_scan_us": ".1f", "ratio": ".0f"},
        ),
        "",
        f"Growth: slope of log(cost) against log(n) is {g['heap_loglog_slope']:.2f} for the heap and "
        f"{g['full_scan_loglog_slope']:.2f} for the full scan (1 = linear); the full scan costs "
        f"≈ {g['full_scan_us_per_leaf'] * 1000:.0f} ns per leaf, the heap +{g['heap_us_per_doubling']:.2f} µs "
        "per doubling of n.",
    ]


STORE_COLUMNS = ["slots", "tokens", "variant", "us", "us_min", "gb_per_s", "vs_memcpy", "vs_memcpy_min"]
OVERHEAD_COLUMNS = ["tokens", "variant", "us_per_call", "us_per_call_min", "vs_bare", "vs_bare_min"]


def store_section(doc: dict[str, Any], title: str) -> list[str]:
    shape = ["heads"] if "heads" in doc["rows"][0] else []
    formats = {"us": ".1f", "us_min": ".1f", "gb_per_s": ".2f", "vs_memcpy": ".2f", "vs_memcpy_min": ".2f"}
    parts = [f"### {title}", "", machine_line(doc), "", table(doc["rows"], [*shape, *STORE_COLUMNS], formats)]
    if doc.get("overhead"):
        formats = {"us_per_call": ".1f", "us_per_call_min": ".1f", "vs_bare": ".2f", "vs_bare_min": ".2f"}
        parts += ["", "Host time per call, decode-sized stores:", "", table(doc["overhead"], OVERHEAD_COLUMNS, formats)]
    return parts


def main() -> None:
    parts: list[str] = []
    for name, render in (("replay", replay_section), ("evict_scaling", evict_section)):
        doc = load(name)
        if doc:
            parts += [*render(doc), ""]
    for name, title in (("store", "store.py (CPU)"), ("store_cuda", "store.py (CUDA)")):
        doc = load(name)
        if doc:
            parts += [*store_section(doc, title), ""]
    text = README.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + START + "\n\n" + "\n".join(parts) + "\n" + END + tail)
    print(f"updated {README}")


if __name__ == "__main__":
    main()
