"""No chapter, exercise, benchmark or test outside a module's own tests uses a private name of minikv.

The rule, checked on the parsed code (``ast``) of the chapters' and exercises' code cells
(IPython ``%`` and ``!`` lines skipped), the exercise solutions, the benchmark scripts and the tests:

* ``X._name`` (a single leading underscore, not a dunder) is refused when ``_name`` is a private
  name minikv defines, and also when the file does not define ``_name`` itself (so a private of
  another library, or one minikv has since renamed, is refused too); so are ``getattr(x, "_name")``
  and its kin (``setattr``, ``hasattr``, ``delattr``, ``monkeypatch.setattr``) with a literal name;
* ``from minikv... import _name``, and any import of a private minikv module (``minikv._validate``).

A test file may use the privates of the module it is named after: ``tests/test_radix_manager.py``
those of ``minikv.radix_manager``, ``tests/test_viz_tree.py`` those of ``minikv.viz.tree``,
``tests/test_exercises.py`` those of the ``minikv.exercises`` package. ``TEST_SUBJECTS`` names the
few whose file name does not say it. Names that only look private are allowed everywhere:
IPython's display hooks (``_repr_html_``: a leading and a trailing underscore) and the public
API of named tuples (``_fields``, ``_asdict``, ``_replace``, ``_make``). ``ALLOWED`` lists the rest,
each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "minikv"

NAMED_TUPLE_API = frozenset({"_fields", "_field_defaults", "_asdict", "_replace", "_make"})

TEST_SUBJECTS: dict[str, tuple[str, ...]] = {
    # test file stem -> the minikv modules it is the own test of (when its name does not say it)
    "test_store_kernel": ("minikv.kernels.store", "minikv.kernels.checks"),
    "test_kernel_compile": ("minikv.kernels",),
    "test_integrity_mutations": ("minikv.radix_manager", "minikv.integrity"),  # corrupts a tree's internals on purpose
    "test_base_and_naive": ("minikv.base", "minikv.naive_manager"),
    # keeps the engine's admission loop as it was before policies, to prove FCFS left it unchanged
    "test_scheduling": ("minikv.scheduling", "minikv.engine"),
    # the same for the admission policies: Optimistic must leave the loop as it was
    "test_admission": ("minikv.admission", "minikv.engine"),
}

ALLOWED: dict[tuple[str, str], str] = {
    # (file, private name) -> why it is legitimate
    ("benchmarks/evict_scaling.py", "_heap"): (
        "the old-scan variant subclasses RadixCacheManager and rebuilds its parent's eviction heap on "
        "purpose: the benchmark measures exactly that internal against the shipped one"
    ),
    ("tests/test_kernel_compile.py", "_pack_args"): (
        "Triton's own launch internals: the test rebuilds a launch offline "
        "(and skips where this Triton lays them out otherwise)"
    ),
    ("tests/test_notebook_labels.py", "_NUMBER_FIELDS"): (
        "the catalog's own reading rule: a label() call in a notebook must give numbers where translate() "
        "reads numbers back, or the zh edition cannot translate its stored title"
    ),
}


def is_private(name: str) -> bool:
    """A single leading underscore: not a dunder, not a display hook (``_repr_html_``), not named-tuple API."""
    return (
        name.startswith("_")
        and not name.startswith("__")
        and not (name.endswith("_") and len(name) > 2)
        and name not in NAMED_TUPLE_API
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def names_defined(tree: ast.AST) -> set[str]:
    """Every name a piece of code defines: functions, classes, parameters, assigned names and attributes."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


def minikv_privates() -> dict[str, set[str]]:
    """Each private name minikv defines -> the modules that define it (a private module counts as one)."""
    owners: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        names = {n for n in names_defined(ast.parse(path.read_text(encoding="utf-8"))) if is_private(n)}
        names |= {part for part in module.split(".") if is_private(part)}
        for name in names:
            owners.setdefault(name, set()).add(module)
    return owners


OWNERS = minikv_privates()
MODULES = sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def subjects(path: Path) -> tuple[str, ...]:
    """The minikv modules a test file is the own test of: from TEST_SUBJECTS, else from its name."""
    if path.parent.name != "tests" or not path.stem.startswith("test_"):
        return ()
    if path.stem in TEST_SUBJECTS:
        return TEST_SUBJECTS[path.stem]
    stem = path.stem.removeprefix("test_")
    keys = {m: m.removeprefix("minikv.").replace(".", "_") for m in MODULES if m != "minikv"}
    matching = [m for m, key in keys.items() if stem == key or stem.startswith(key + "_")]
    longest = max((len(keys[m]) for m in matching), default=0)
    return tuple(m for m in matching if len(keys[m]) == longest)  # the most specific module only


def is_own(module: str, own: tuple[str, ...]) -> bool:
    """Whether ``module``'s privates are the own privates of a test of ``own``.

    A module's own test may use the privates of the module (or package) itself and, for a module
    of a subpackage, those of the subpackage's internals: its ``__init__`` and its private modules
    (``tests/test_exercises_radix.py`` may import ``minikv.exercises._core``).
    """
    package = module.rpartition(".")[0]
    for subject in own:
        subject_package = subject.rpartition(".")[0]
        if module == subject or module.startswith(subject + "."):
            return True
        if subject_package == "minikv":
            continue  # minikv's own private modules (minikv._validate) belong to no one test
        if module == subject_package or (package == subject_package and is_private(module.rpartition(".")[2])):
            return True
    return False


def private_uses(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """``(line, private name, minikv module it is imported from or None)`` for each private use."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            yield node.lineno, node.attr, None
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            name = node.args[1]
            by_name = called in ("getattr", "setattr", "hasattr", "delattr") and isinstance(name, ast.Constant)
            if by_name and isinstance(name.value, str) and is_private(name.value):
                yield node.lineno, name.value, None
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "minikv":
            for part in node.module.split("."):
                if is_private(part):
                    yield node.lineno, part, node.module
            for alias in node.names:
                if is_private(alias.name):
                    submodule = f"{node.module}.{alias.name}"  # `from minikv.exercises import _core`
                    yield node.lineno, alias.name, submodule if submodule in MODULES else node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "minikv":
                    for part in parts:
                        if is_private(part):
                            yield node.lineno, part, alias.name


def notebook_code(path: Path) -> str:
    """The notebook's code cells as one module, each cell marked, magics and shell lines made ``pass``."""
    notebook = nbformat.read(path, as_version=4)
    lines: list[str] = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        lines.append(f"# -- cell {number}")
        for line in cell.source.splitlines():
            stripped = line.lstrip()
            indent = line[: len(line) - len(stripped)]
            lines.append(f"{indent}pass" if stripped.startswith(("%", "!")) else line)
    return "\n".join(lines)


def cell_of(source: str, line: int) -> str:
    marks = [text for text in source.splitlines()[:line] if text.startswith("# -- cell ")]
    return marks[-1].removeprefix("# -- ") if marks else "?"


def sources() -> list[Path]:
    found = [
        *sorted((REPO / "book").glob("*.ipynb")),
        *sorted((REPO / "exercises").glob("*.ipynb")),
        *sorted((REPO / "exercises" / "solutions").glob("*.py")),
        *sorted((REPO / "benchmarks").glob("*.py")),
        *sorted((REPO / "tests").glob("*.py")),
    ]
    assert found
    return found


def violations(path: Path, root: Path = REPO) -> list[str]:
    """Each private use in ``path`` the rule refuses, as ``file (where): name (whose)``."""
    source = notebook_code(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
    relative = path.relative_to(root).as_posix()
    try:
        tree = ast.parse(source)
    except SyntaxError as error:  # a cell that is not Python must not hide what it uses
        return [f"{relative}: cannot parse ({error})"]
    own, local = subjects(path), names_defined(tree)
    found = []
    for line, name, module in private_uses(tree):
        if (relative, name) in ALLOWED:
            continue
        if module is not None:  # imported from minikv: the module says whose it is
            if is_own(module, own):
                continue
        elif name in OWNERS:  # a private minikv defines: allowed in its own tests only
            if any(is_own(m, own) for m in OWNERS[name]):
                continue
        elif name in local:  # a private the file defines itself (its own helper class)
            continue
        where = cell_of(source, line) if path.suffix == ".ipynb" else f"line {line}"
        whose = f"minikv: {', '.join(sorted(OWNERS[name]))}" if name in OWNERS else "not minikv's"
        found.append(f"{relative} ({where}): {name} ({whose})")
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_private_name_of_another_module(path: Path) -> None:
    assert violations(path) == []


def test_the_rule_sees_each_kind_of_private_use(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    probe = tests / "test_page_pool.py"
    code = (
        "import minikv._validate\n"
        "from minikv._validate import as_token_ids\n"
        "from minikv.radix_manager import _values_from_root\n"
        "m._heap\n"  # a radix_manager private, in page_pool's own test
        "getattr(m, '_clock', None)\n"
        "pool._free_stack\n"  # page_pool's own private: allowed here
        "obj._not_defined_anywhere\n"
        "class Local:\n    def __init__(self):\n        self._mine = 1\n    def f(self):\n        return self._mine\n"
        "x._repr_html_(); t._fields; m.__dict__\n"
    )
    probe.write_text(code)
    found = violations(probe, root=tmp_path)
    names = [entry.split(": ", 1)[1].split(" (")[0] for entry in found]
    assert names == ["_validate", "_validate", "_values_from_root", "_heap", "_clock", "_not_defined_anywhere"], found


def test_test_files_are_the_own_tests_of_the_module_they_are_named_after() -> None:
    tests = REPO / "tests"
    assert subjects(tests / "test_radix_manager.py") == ("minikv.radix_manager",)
    assert subjects(tests / "test_viz_tree.py") == ("minikv.viz.tree",)
    assert subjects(tests / "test_exercises.py") == ("minikv.exercises",)
    assert subjects(tests / "test_store_kernel.py") == ("minikv.kernels.store", "minikv.kernels.checks")
    assert subjects(tests / "test_exercises_radix.py") == ("minikv.exercises.radix",)
    assert subjects(tests / "helpers.py") == ()
    assert is_own("minikv.exercises._core", ("minikv.exercises.radix",))  # its package's internals
    assert is_own("minikv.exercises._core", ("minikv.exercises",))
    assert not is_own("minikv.exercises.blocks", ("minikv.exercises.radix",))  # a sibling's are not
    assert not is_own("minikv._validate", ("minikv.page_pool",))  # nor the top package's private modules
    for stem, modules in TEST_SUBJECTS.items():
        assert (tests / f"{stem}.py").is_file(), stem
        assert all(m in MODULES for m in modules), modules


def test_every_allowed_use_is_still_there() -> None:
    for (file, name), reason in ALLOWED.items():
        assert reason
        tree = ast.parse((REPO / file).read_text(encoding="utf-8"))
        assert any(used == name for _, used, _ in private_uses(tree)), f"{file} no longer uses {name}: drop it"
