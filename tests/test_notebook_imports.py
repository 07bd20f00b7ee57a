"""Every notebook runs with only what Google Colab has: no import of a build tool (myst_nb, jupyter_book).

A chapter or exercise that imports a module Colab lacks stops there with ModuleNotFoundError (as
chapter 5 did with ``from myst_nb import glue``, now :func:`minikv.course.demo.glue`). So the code cells of
the book's and the exercises' notebooks, and the exercise solutions they are made from, may import
only: minikv, the standard library (``sys.stdlib_module_names``), IPython, and minikv's declared
runtime dependencies (``[project].dependencies`` in pyproject.toml, whose distribution names are
also their import names). Colab has more (pandas, ipywidgets), but ``pip install minikv`` anywhere
else brings only these. Cells are parsed with ``ast``, IPython ``%`` and ``!`` lines made ``pass``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parent.parent


def declared_dependencies() -> set[str]:
    """The import names of minikv's runtime dependencies: ``torch>=2.6; ...`` -> ``torch``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, f"pyproject.toml: cannot read the dependency {requirement!r}"
        names.add(match[0].lower().replace("-", "_").replace(".", "_"))
    return names


ALLOWED = {"minikv", "IPython"} | set(sys.stdlib_module_names) | declared_dependencies()


def sources() -> list[Path]:
    found = [
        *sorted((REPO / "book").glob("*.ipynb")),
        *sorted((REPO / "exercises").glob("*.ipynb")),
        *sorted((REPO / "exercises" / "solved").glob("*.ipynb")),
        *sorted((REPO / "exercises" / "solutions").glob("*.py")),
    ]
    assert found
    return found


def code_cells(path: Path) -> Iterator[tuple[str, str]]:
    """``(where, Python source)`` for each code cell (a ``.py`` file is one); magic and shell lines made ``pass``."""
    if path.suffix == ".py":
        yield "", path.read_text(encoding="utf-8")
        return
    for number, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):  # a cell magic: not Python
            continue
        lines = []
        for line in cell.source.splitlines():
            stripped = line.lstrip()
            lines.append(line[: len(line) - len(stripped)] + "pass" if stripped.startswith(("%", "!")) else line)
        yield f"cell {number}", "\n".join(lines)


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """``(line, top-level module)`` for each absolute import in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def refused(path: Path, root: Path = REPO) -> list[str]:
    """Each import in ``path`` of a module outside ``ALLOWED``, as ``file (cell n, line m): imports x``."""
    found = []
    for where, source in code_cells(path):
        for line, module in imported_modules(source):
            if module not in ALLOWED:
                place = f"{where}, line {line}" if where else f"line {line}"
                found.append(f"{path.relative_to(root).as_posix()} ({place}): imports {module!r}")
    return found


def test_dependencies_are_read_from_pyproject() -> None:
    assert {"torch", "triton", "numpy", "matplotlib", "graphviz"} <= declared_dependencies()


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_notebook_imports_only_what_colab_has(path: Path) -> None:
    problems = refused(path)
    assert not problems, (
        "a notebook imports a module that Colab (or a plain `pip install minikv`) does not have; allowed are "
        "minikv, the standard library, IPython and minikv's dependencies in pyproject.toml:\n  " + "\n  ".join(problems)
    )


def test_the_scan_finds_a_build_tool_import(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%pip install -q minikv\nif True:\n    !echo hi\nimport sys, torch.nn as nn"),
        nbformat.v4.new_markdown_cell("import pandas"),
        nbformat.v4.new_code_cell("%%bash\nimport nothing"),
        nbformat.v4.new_code_cell("import numpy as np\nfrom myst_nb import glue\nfrom minikv.course.demo import say"),
    ]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(notebook, path)
    assert refused(path, tmp_path) == ["chapter.ipynb (cell 3, line 2): imports 'myst_nb'"]
