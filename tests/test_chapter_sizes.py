"""The chapters stay short enough to read: words and cells per chapter, and no stray helpers.

Course 2.0 (issue 14) set the limits: chapters 2 and 5 at most about 3,000 words of prose and
60 cells each, chapter 3 at most 65 cells and 4,000 words (it was 83 and 5,341), and no other
chapter longer than it was when they were set. Course 3.0 (issue 28) split chapter 3 (63 cells,
3,983 words) into two pages, storage and the store kernel, each within 60 cells and 3,000 words, and
moved its validation and device syncs to the appendix. Words are counted by
``scripts/chapter_stats.py`` (the whitespace-separated tokens of the markdown cells). A chapter
may define only the functions its lesson is about; everything else comes from the package
(``minikv.course.demo``, ``minikv.viz``), so ``TAUGHT`` lists each definition a chapter keeps, and why.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

_spec = importlib.util.spec_from_file_location("chapter_stats", REPO / "scripts" / "chapter_stats.py")
assert _spec is not None and _spec.loader is not None
chapter_stats = importlib.util.module_from_spec(_spec)
sys.modules["chapter_stats"] = chapter_stats
_spec.loader.exec_module(chapter_stats)

# notebook -> (most cells, most markdown words)
LIMITS: dict[str, tuple[int, int]] = {
    "book/00_introduction.ipynb": (9, 1035),  # 1,009 before its lines on chapters 8 and 9
    "book/01_why_manage.ipynb": (41, 1667),
    "book/02_two_layers.ipynb": (60, 3000),
    "book/03_storage.ipynb": (50, 2800),  # 63 / 3,983 before the split of Course 3.0, 83 / 5,341 before 2.0
    "book/03_store_kernel.ipynb": (15, 1000),  # the second page of chapter 3
    "book/04_naive.ipynb": (38, 1625),  # challenge 15 measured (Course 3.0)
    "book/05_radix.ipynb": (60, 3000),
    "book/06_forward_pass.ipynb": (34, 2340),  # + timelines of preemption and of the overlap loop (Course 3.0)
    "book/07_real_model.ipynb": (24, 1500),
    "book/08_scheduler.ipynb": (60, 3000),
    "book/09_bridge.ipynb": (20, 1300),
    "book/under_the_hood.ipynb": (30, 1500),  # chapter 3b's validation and device syncs included
    "book/questions.ipynb": (20, 1500),
}

# notebook -> the functions and classes its cells may define: each is what the lesson is about
TAUGHT: dict[str, dict[str, str]] = {
    "book/questions.ipynb": {
        "extra_recompute": "the partial-page answer: what one cached prompt of a given length costs again",
        "salted": "the side-channel answer: a per-tenant salt is one token in front of the key",
    },
    "book/03_storage.ipynb": {
        "attention": "the small softmax attention that challenge 7 splits by heads and by head_dim",
    },
}


def chapters() -> list[Path]:
    return sorted((REPO / "book").glob("*.ipynb"))


def test_every_chapter_has_a_limit() -> None:
    assert sorted(str(p.relative_to(REPO)) for p in chapters()) == sorted(LIMITS)


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.name)
def test_chapter_is_within_its_limits(path: Path) -> None:
    stats = chapter_stats.stats(path)
    most_cells, most_words = LIMITS[stats.path]
    assert stats.cells <= most_cells, f"{stats.path}: {stats.cells} cells, the limit is {most_cells}"
    assert stats.words <= most_words, f"{stats.path}: {stats.words} words, the limit is {most_words}"


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.name)
def test_chapter_defines_only_what_it_teaches(path: Path) -> None:
    stats = chapter_stats.stats(path)
    allowed = TAUGHT.get(stats.path, {})
    stray = sorted(set(stats.defs) - set(allowed))
    assert not stray, (
        f"{stats.path} defines {stray}: move them into minikv.course.demo, or list them in TAUGHT with why"
    )


def test_the_counter_counts_what_it_says(tmp_path: Path) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Title\n\nthree more words"),
        nbformat.v4.new_code_cell("def helper():\n    class Inner: ...\n%time x = 1\nprint('not words')"),
    ]
    path = tmp_path / "n.ipynb"
    nbformat.write(notebook, path)
    stats = chapter_stats.stats(path)
    assert (stats.cells, stats.code_cells, stats.words) == (2, 1, 5)
    assert stats.defs == ("helper", "Inner")


# Pages whose displayed code fits the book's 690-px text column (about 88 characters of code):
# the code cells, the sources they list with show_source, and what they print (issue 28, item 7).
FITS_THE_COLUMN = ("book/03_storage.ipynb", "book/03_store_kernel.ipynb")
COLUMN_CHARACTERS = 88


def displayed_lines(path: Path) -> list[str]:
    import nbformat

    lines = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or "remove-cell" in cell.metadata.get("tags", []):
            continue
        lines += cell.source.splitlines()
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            lines += (output.get("text", "") + data.get("text/markdown", "")).splitlines()
    return lines


@pytest.mark.parametrize("page", FITS_THE_COLUMN)
def test_displayed_code_fits_the_column(page: str) -> None:
    lines = displayed_lines(REPO / page)
    assert any(line.startswith("def store_") for line in lines), "the listings were not found"
    wide = [line for line in lines if len(line) > COLUMN_CHARACTERS]
    assert not wide, f"{page}: {len(wide)} lines wider than {COLUMN_CHARACTERS} characters, e.g. {wide[0]!r}"
