"""The exercise notebooks: generated from the solutions, in step with them, and fair to learners.

* ``scripts/make_exercises.py --check`` says every learner notebook matches its solution;
* every solution passes every check it runs (the solutions are executed here);
* every exercise notebook has a solutions page (``exercises/solved/``, the book's Solutions part)
  made from the same source, whose stored checks all pass;
* every learner notebook starts with the install cell and a title with a Colab badge,
  gives each exercise id a heading, a stub and a check, hides hints in dropdowns,
  and stores, for every stub, a "not written yet" report: a message, not a traceback,
  and no path of the machine that ran it.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import minikv.exercises as exercises
from minikv.exercises import exercise_ids

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import make_exercises  # noqa: E402

NAMES = [
    "ex1_capacity",
    "ex2_lifecycle",
    "ex3_storage",
    "ex4_naive",
    "ex5_radix",
    "ex6_scheduling",
    "ex7_paged_attention",
]
CHECK_CALL = re.compile(r'^check\("(?P<id>[a-z_]+\.[a-z_]+)", (?P<fn>\w+)\)$', re.MULTILINE)


def _learner(name: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "exercises" / f"{name}.ipynb", as_version=4)


def _solved(name: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "exercises" / "solved" / f"{name}.ipynb", as_version=4)


def _output_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        for value in output.get("data", {}).values():
            parts.append(value if isinstance(value, str) else "")
        parts.extend(output.get("traceback", []))
    return "\n".join(parts)


def test_the_solutions_are_the_notebooks_of_the_table_of_contents() -> None:
    assert sorted(p.stem for p in (REPO / "exercises" / "solutions").glob("ex*.py")) == NAMES
    toc = (REPO / "_toc.yml").read_text()
    for name in NAMES:
        assert f"file: exercises/{name}" in toc
        assert f"file: exercises/solved/{name}" in toc
    assert toc.index("caption: Exercises") < toc.index("caption: Solutions") < toc.index("caption: Reference")


def test_learner_notebooks_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_exercises.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_notices_a_stale_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check must be able to fail: a notebook whose stub differs from the solution is reported."""
    stale = _learner("ex1_capacity")
    stale.cells[4].source = stale.cells[4].source.replace("raise NotImplementedError", "return 0")
    monkeypatch.setattr(make_exercises, "EXERCISES", tmp_path)
    nbformat.write(stale, tmp_path / "ex1_capacity.ipynb")
    nbformat.write(_solved("ex1_capacity"), tmp_path / "solved.ipynb")
    (tmp_path / "solved").mkdir()
    (tmp_path / "solved.ipynb").rename(tmp_path / "solved" / "ex1_capacity.ipynb")
    assert make_exercises.out_of_date("ex1_capacity") == ["cell 4 differs from what the solution makes"]
    assert make_exercises.out_of_date("ex2_lifecycle") == [
        "exercises/ex2_lifecycle.ipynb is missing",
        "exercises/solved/ex2_lifecycle.ipynb is missing",
    ]
    stale_solved = _solved("ex1_capacity")
    stale_solved.cells[3].source += "\n# changed"
    nbformat.write(stale_solved, tmp_path / "solved" / "ex1_capacity.ipynb")
    assert make_exercises.out_of_date("ex1_capacity") == [
        "cell 4 differs from what the solution makes",
        "exercises/solved/ex1_capacity.ipynb: cell 3 differs from what the solution makes",
    ]


def test_stubs_replace_exactly_the_marked_lines() -> None:
    source = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n\n\ncheck('a.b', f)"
    stub, stubbed = make_exercises.strip_solutions(source)
    assert stubbed
    assert stub == "def f(x):\n    y = 1\n    # YOUR CODE HERE\n    raise NotImplementedError\n\n\ncheck('a.b', f)"
    kernel, _ = make_exercises.strip_solutions(
        "@jit\ndef k():\n    ### BEGIN SOLUTION pass\n    tl.store(p, 1)\n    ### END SOLUTION"
    )
    assert kernel == "@jit\ndef k():\n    # YOUR CODE HERE\n    pass"
    with pytest.raises(SystemExit):
        make_exercises.strip_solutions("### BEGIN SOLUTION\nx = 1")


@pytest.mark.parametrize("name", NAMES)
def test_every_check_in_the_solution_passes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    real = exercises.check

    def recording_check(exercise_id, fn):
        result = real(exercise_id, fn)
        results.append(result)
        return result

    monkeypatch.setattr(exercises, "check", recording_check)
    runpy.run_path(str(REPO / "exercises" / "solutions" / f"{name}.py"), run_name="solution")
    assert results, f"{name} runs no check"
    for result in results:
        assert result.passed, str(result)
    ids = [r.exercise_id for r in results]
    assert len(ids) == len(set(ids))
    assert 3 <= len(ids) <= 11  # exercise 5: ten tasks and the optional 5.6b


def test_the_triton_solution_runs_from_a_notebook_cell(tmp_path: Path) -> None:
    """In Jupyter a kernel's source comes from the cell, not a file: the store kernel must still be found and run."""
    from nbclient import NotebookClient

    nb = make_exercises.learner_notebook("ex3_storage", keep_solutions=True)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    reports = [_output_text(cell) for cell in nb.cells if cell.cell_type == "code" and CHECK_CALL.search(cell.source)]
    assert len(reports) == 5
    for report in reports:
        assert "✓ storage." in report and "cases passed." in report and "✗" not in report, report


def test_every_exercise_id_belongs_to_exactly_one_notebook() -> None:
    seen: dict[str, str] = {}
    for name in NAMES:
        for cell in _learner(name).cells:
            for call in CHECK_CALL.finditer(cell.source if cell.cell_type == "code" else ""):
                assert call["id"] not in seen, f"{call['id']} is checked in {seen.get(call['id'])} and {name}"
                seen[call["id"]] = name
    assert sorted(seen) == sorted(exercise_ids())


@pytest.mark.parametrize("name", NAMES)
def test_learner_notebook_layout(name: str) -> None:
    nb = _learner(name)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.cells[0].cell_type == "code" and nb.cells[0].source == make_exercises.install_cell(name).source
    # The exercises that load the real model install its extra and its weights on Colab.
    uses_model = "load_smollm2" in (REPO / "exercises" / "solutions" / f"{name}.py").read_text()
    assert (nb.cells[0].source == make_exercises.MODELS_INSTALL_CELL) == uses_model
    title = nb.cells[1]
    assert title.cell_type == "markdown"
    assert re.match(r"# Exercises \d: \S", title.source)
    assert (
        sum(
            line.startswith("# ")
            for cell in nb.cells
            if cell.cell_type == "markdown"
            for line in cell.source.splitlines()
        )
        == 1
    )
    badge = f"https://colab.research.google.com/github/minikv-course/minikv/blob/main/colab/exercises/{name}.ipynb"
    assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({badge})" in title.source
    setup = next(
        cell for cell in nb.cells if cell.cell_type == "code" and "from minikv.exercises import check" in cell.source
    )
    assert "GPU:" in setup.source and "torch.cuda.is_available()" in setup.source
    # A learner's own kernel runs in Triton's interpreter on a CPU only if it is switched on before
    # the kernel is defined: `import minikv` alone changes nothing.
    kernels = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and any(line.startswith("@triton.jit") for line in cell.source.splitlines())
    ]
    if kernels:
        switch = [i for i, cell in enumerate(nb.cells) if "use_interpreter_without_cuda()" in cell.source]
        assert switch and switch[0] < kernels[0], "the interpreter switch must come before the first @triton.jit"
        # Where Triton has no build (macOS, Windows) the kernel task says so in one line, and the other
        # tasks still run: Triton comes from require_triton() in the kernel's cell, never from `import triton`.
        code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
        assert not any(re.search(r"^\s*(import|from) triton\b", source, re.MULTILINE) for source in code)
        assert "triton, tl = require_triton()" in nb.cells[kernels[0]].source


@pytest.mark.parametrize("name", NAMES)
def test_each_task_has_a_heading_a_stub_a_check_and_hints(name: str) -> None:
    nb = _learner(name)
    cells = nb.cells
    for i, cell in enumerate(cells):
        call = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if call is None:
            continue
        exercise_id = call["id"]
        task = next(c for c in reversed(cells[:i]) if c.cell_type == "markdown" and c.source.startswith("## "))
        assert f"`{exercise_id}`" in task.source.splitlines()[0], f"the heading before the check of {exercise_id}"
        assert "```{admonition} Hint" in task.source and ":class: dropdown" in task.source, (
            f"{exercise_id} has no hint dropdown"
        )
        assert "# YOUR CODE HERE" in cell.source and "BEGIN SOLUTION" not in cell.source
        # check() reports a stub instead of raising, so a cell that ends with it never raises
        assert "raises-exception" not in cell.metadata.get("tags", [])
        assert cell.source.rstrip().endswith(call.group(0)), (
            "the check must be the cell's last line, so its report shows"
        )
        report = _output_text(cell)
        assert f"✗ {exercise_id}: not written yet" in report, report
        assert "Traceback" not in report


@pytest.mark.parametrize("name", NAMES)
def test_stored_outputs_have_no_errors_and_no_machine_paths(name: str) -> None:
    for cell in _learner(name).cells:
        if cell.cell_type != "code":
            continue
        assert cell.get("execution_count") is not None
        assert all(output.output_type != "error" for output in cell.get("outputs", []))
        text = _output_text(cell)
        for path in {str(REPO), str(Path.home()), "/tmp/", "ipykernel_"}:
            assert path not in text, f"{name}: a stored output mentions {path!r}"


def test_no_solution_leaks_into_a_learner_notebook() -> None:
    for name in NAMES:
        learner_cells = [cell.source for cell in _learner(name).cells if cell.cell_type == "code"]
        assert not any("BEGIN SOLUTION" in source or "END SOLUTION" in source for source in learner_cells)
        learner_lines = {line.strip() for source in learner_cells for line in source.splitlines()}
        solution = (REPO / "exercises" / "solutions" / f"{name}.py").read_text()
        pattern = r"### BEGIN SOLUTION[^\n]*\n(.*?)### END SOLUTION"
        hidden = {line.strip() for block in re.findall(pattern, solution, re.DOTALL) for line in block.splitlines()}
        visible = {line.strip() for line in re.sub(pattern, "", solution, flags=re.DOTALL).splitlines()}
        assert hidden
        leaked = sorted(line for line in hidden - visible if len(line) > 12 and line in learner_lines)
        assert not leaked, f"{name}: solution lines in the learner notebook: {leaked}"


def test_stub_tags_only_where_a_cell_can_raise() -> None:
    nb = make_exercises.learner_notebook("ex1_capacity")
    assert not any("raises-exception" in cell.metadata.get("tags", []) for cell in nb.cells)
    assert make_exercises.ends_with_check('def f():\n    pass\n\n\ncheck("a.b", f)\n')
    assert not make_exercises.ends_with_check('check("a.b", f)\nf()')


@pytest.mark.parametrize("name", NAMES)
def test_the_solutions_page_shows_every_solution_passing(name: str) -> None:
    """The Solutions part: the same code cells as the exercise, solutions in place, each check's report a pass."""
    fresh = make_exercises.solved_notebook(name)
    assert fresh.cells[0].source == make_exercises.install_cell(name).source
    title = fresh.cells[1].source
    assert title.startswith("# Solutions") and f"../{name}.ipynb" in title
    code = [cell.source for cell in fresh.cells if cell.cell_type == "code"]
    assert not any("SOLUTION" in source or "# YOUR CODE HERE" in source for source in code)
    learner_code = [cell for cell in make_exercises.learner_notebook(name).cells if cell.cell_type == "code"]
    assert len(code) == len(learner_code)
    stored = _solved(name)
    assert [cell.source for cell in stored.cells] == [cell.source for cell in fresh.cells]
    checked = 0
    for cell in stored.cells:
        call = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if call is None:
            continue
        checked += 1
        report = _output_text(cell)
        assert f"✓ {call['id']}: all " in report and "✗" not in report, report
    assert checked >= 3
    for cell in stored.cells:
        assert cell.cell_type != "code" or cell.get("execution_count") is not None
        assert all(output.output_type != "error" for output in cell.get("outputs", []))


def test_solutions_stay_out_of_the_book() -> None:
    assert "exercises/solutions/*" in (REPO / "_config.yml").read_text()
