"""Words, cells and helper definitions per notebook: the numbers the chapter-size limits are about.

Words are the whitespace-separated tokens of the markdown cells (prose, headings and the
directives written in markdown); code cells count as cells but not as words. ``defs`` are the
functions and classes the notebook's code cells define.

    python scripts/chapter_stats.py [NOTEBOOK ...]     # default: every chapter and exercise
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NotebookStats:
    path: str
    cells: int
    code_cells: int
    words: int
    defs: tuple[str, ...]


def _code(source: str) -> str:
    """The cell's Python, with IPython's ``%`` and ``!`` lines blanked so ``ast`` can parse it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def definitions(source: str) -> list[str]:
    """Top-level and nested ``def``/``class`` names in one code cell."""
    try:
        tree = ast.parse(_code(source))
    except SyntaxError:
        return []
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [node.name for node in ast.walk(tree) if isinstance(node, kinds)]


def stats(path: Path) -> NotebookStats:
    notebook = nbformat.read(path, as_version=4)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    return NotebookStats(
        path=str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        cells=len(notebook.cells),
        code_cells=len(code),
        words=sum(len(text.split()) for text in markdown),
        defs=tuple(name for text in code for name in definitions(text)),
    )


def main(argv: list[str]) -> None:
    paths = [Path(a).resolve() for a in argv] or sorted((REPO / "book").glob("*.ipynb")) + sorted(
        (REPO / "exercises").glob("*.ipynb")
    )
    print(f"{'notebook':36} {'cells':>5} {'code':>5} {'words':>6}  defs")
    for path in paths:
        s = stats(path)
        print(f"{s.path:36} {s.cells:5} {s.code_cells:5} {s.words:6}  {', '.join(s.defs)}")


if __name__ == "__main__":
    main(sys.argv[1:])
