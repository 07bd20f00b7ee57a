"""The guarantees page (``book/guarantees.md``) names only what exists.

Every error class it names is in :mod:`minikv.errors` (and derives from the built-in the page
pairs it with), every call in its table is a public name of the package, every test file it
cites is in ``tests/``, and each row cites a test file that mentions the row's calls. The
chapters and the API page link to it.
"""

from __future__ import annotations

import builtins
import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

import minikv
from minikv import errors

REPO = Path(__file__).resolve().parent.parent
PAGE = (REPO / "book" / "guarantees.md").read_text(encoding="utf-8")
ERROR_NAME = re.compile(r"`(\w*Error)`")
TEST_FILE = re.compile(r"`(?:tests/)?(test_\w+\.py)`")
BUILTINS = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}
BUILTINS |= {"RuntimeError": RuntimeError, "NotImplementedError": NotImplementedError}
BUILTINS |= {"FileNotFoundError": FileNotFoundError, "ModuleNotFoundError": ModuleNotFoundError}


def table_rows() -> list[list[str]]:
    """The cells of the main table's rows (header and rule excluded)."""
    lines = [line for line in PAGE.splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]
    assert rows and rows[0][0] == "Call", "the page's table must start with a 'Call' column"
    return [row for row in rows[1:] if not row[0].startswith("---")]


def calls_of(row: list[str]) -> list[str]:
    return re.findall(r"`([\w.]+)`", row[0])


def public_modules() -> list[ModuleType]:
    """``minikv`` and its public top-level modules, where the page's first names are looked up."""
    names = [m.name for m in pkgutil.iter_modules(minikv.__path__) if not m.name.startswith("_")]
    return [minikv, *(importlib.import_module(f"minikv.{name}") for name in names)]


def resolve(dotted: str) -> object:
    """``Class.method``, ``function`` or ``module.function``, public names of ``minikv``: the object."""
    parts = dotted.split(".")
    assert not any(p.startswith("_") for p in parts), f"{dotted}: a private name"
    homes = [m for m in public_modules() if hasattr(m, parts[0])]
    homes += [m for m in public_modules() if m.__name__ == f"minikv.{parts[0]}"]
    assert homes, f"{parts[0]} is neither a public module of minikv nor a name in one"
    home = homes[0]
    value: object = home if home.__name__ == f"minikv.{parts[0]}" else getattr(home, parts[0])
    for part in parts[1:]:
        assert hasattr(value, part), f"{dotted}: {part} does not exist"
        value = getattr(value, part)
    return value


def test_every_error_the_page_names_is_a_minikv_error() -> None:
    names = {name for name in ERROR_NAME.findall(PAGE) if not hasattr(builtins, name)} - {"MiniKVError"}
    assert names, "the page names no error"
    for name in sorted(names):
        error = getattr(errors, name, None)
        assert isinstance(error, type) and issubclass(error, errors.MiniKVError), name


def test_every_error_class_of_the_package_is_on_the_page_with_its_builtin() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.MiniKVError)]
    for error in classes:
        if error is errors.MiniKVError:
            continue
        assert f"`{error.__name__}`" in PAGE, f"{error.__name__} is not on the page"
        paired = re.search(rf"`{error.__name__}` \(`(\w+)`\)", PAGE)
        if paired:  # the list of errors pairs each direct subclass with its built-in
            assert issubclass(error, BUILTINS[paired.group(1)]), (error, paired.group(1))


@pytest.mark.parametrize("row", table_rows(), ids=lambda row: calls_of(row)[0] if calls_of(row) else "?")
def test_each_row_names_public_calls_and_tests_that_exist_and_mention_them(row: list[str]) -> None:
    assert len(row) == 5, row
    calls = calls_of(row)
    assert calls, f"a row with no call: {row[0]}"
    for call in calls:
        resolve(call)
    cited = TEST_FILE.findall(row[-1])
    assert cited, f"{calls}: no test file cited"
    texts = []
    for name in cited:
        path = REPO / "tests" / name
        assert path.is_file(), f"{name} is cited but does not exist"
        texts.append(path.read_text(encoding="utf-8"))
    for call in calls:
        method = call.split(".")[-1]
        if method[0].isupper():  # a constructor: the class name is what the tests call
            method = call.split(".")[0]
        assert any(method in text for text in texts), f"no cited test file mentions {method}"


def test_every_test_file_the_page_cites_exists() -> None:
    cited = set(TEST_FILE.findall(PAGE))
    assert cited
    missing = sorted(name for name in cited if not (REPO / "tests" / name).is_file())
    assert missing == []


def test_the_page_is_in_the_reference_part_and_the_chapters_link_to_it() -> None:
    toc = (REPO / "_toc.yml").read_text(encoding="utf-8")
    reference = toc.split("caption: Reference", 1)[1]
    assert "file: book/guarantees" in reference
    assert "[guarantees](guarantees.md)" in (REPO / "book" / "api.md").read_text(encoding="utf-8")
    for chapter in ("02_two_layers", "04_naive", "05_radix"):
        notebook = nbformat.read(REPO / "book" / f"{chapter}.ipynb", as_version=4)
        prose = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
        assert "[guarantees](guarantees.md)" in prose, chapter
