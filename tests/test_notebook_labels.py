"""The titles and captions the notebooks' code gives its drawings come from the label catalog.

A chapter that wrote ``draw_pool(pool, title="after the notes' step 5")`` drew an English title on
the zh pages and in the zh Colab copies. Such text is written ``title=label("ch2.after_notes_step",
step=5)`` (:func:`minikv.viz.labels.label`): the language of the moment picks the words when the
notebook runs, and the zh build reads the stored English back through the same catalog. These tests
read the code cells (no kernel) and the stored outputs.
"""

from __future__ import annotations

import ast
import html
import json
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from minikv.viz.labels import _NUMBER_FIELDS as NUMBER_FIELDS  # what translate() reads as a number
from minikv.viz.labels import CATALOG, translate_html

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(
    [*REPO.glob("book/*.ipynb"), *REPO.glob("exercises/*.ipynb"), *REPO.glob("exercises/solved/*.ipynb")]
)

PENDING: set[str] = set()
"""Notebooks allowed to keep English literals as titles while they are being rewritten: none today."""

TEXT_KEYWORDS = {"title", "caption", "xlabel", "ylabel", "labels"}
"""Keyword arguments whose text a drawing shows (``labels``: a list, one per row or request)."""
TEXT_METHODS = {"note", "labelled"}
"""TreeRecorder methods whose first argument a frame's caption shows."""


@dataclass(frozen=True)
class LabelCall:
    notebook: str
    key: str
    fields: frozenset[str]
    nested: bool  # a field of another label (its English shows inside that one's)


def code_cells(path: Path) -> Iterator[ast.Module]:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            # IPython's %magics and !shell lines are not Python; the Colab install cell holds them
            lines = [
                line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
                for line in source.splitlines()
            ]
            yield ast.parse("\n".join(lines))


def is_text_literal(node: ast.expr) -> bool:
    """A str literal, an f-string, or literals joined with +, holding a word: English written into the code.

    A name such as ``"B"`` (a request's) is no word of either language.
    """
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return is_text_literal(node.left) or is_text_literal(node.right)
    if isinstance(node, ast.JoinedStr):
        return any(is_text_literal(part) for part in node.values)
    if isinstance(node, ast.List | ast.Tuple):
        return any(is_text_literal(item) for item in node.elts)
    if isinstance(node, ast.ListComp):
        return is_text_literal(node.elt)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(re.search("[A-Za-z]{2}", node.value))


def shown_text_arguments(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg in TEXT_KEYWORDS:
                yield f"{ast.unparse(node.func)}({keyword.arg}=...)", keyword.value
        if isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_METHODS and node.args:
            yield f"{ast.unparse(node.func)}(...)", node.args[0]


def label_calls(path: Path) -> list[LabelCall]:
    calls = []
    for tree in code_cells(path):
        inner: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "label":
                inner |= {id(n) for arg in node.keywords for n in ast.walk(arg.value) if n is not arg.value}
                inner |= {id(arg.value) for arg in node.keywords}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "label":
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path.name}: {ast.unparse(node)}"
                key = node.args[0].value
                fields = frozenset(k.arg for k in node.keywords if k.arg is not None)
                calls.append(LabelCall(path.relative_to(REPO).as_posix(), key, fields, id(node) in inner))
    return calls


def template_fields(english: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(english) if name}


def loose_pattern(template: str) -> re.Pattern[str]:
    """A template's text with any value in its fields (digits in a number's), for finding it in stored outputs."""
    regex = ""
    for fixed, name, _, _ in string.Formatter().parse(template):
        regex += re.escape(fixed)
        if name:
            regex += r"-?\d[\d,.]*" if name in NUMBER_FIELDS else ".+?"
    return re.compile(regex, re.DOTALL)


def stored_pictures(path: Path) -> str:
    """The HTML and SVG a notebook's stored outputs hold: what the book's pages show as drawings."""
    found = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            for kind in ("text/html", "image/svg+xml"):
                if kind in output.get("data", {}):
                    found.append("".join(output["data"][kind]))
    return "\n".join(found)


def shown_strings(page: str) -> set[str]:
    """Every text between tags and every tooltip attribute, unescaped, and the parts of a labelled caption."""
    texts = {html.unescape(t).replace("\xa0", " ").strip() for t in re.findall(r">([^<>]+)<", page)}
    texts |= {html.unescape(t) for t in re.findall(r'xlink:title="([^"]*)"', page)}
    texts = {re.sub(r"^\d+\. ", "", t) for t in texts}  # a player's caption starts with the frame number
    return texts | {part for t in texts for part in t.split(" · ")}


NOTEBOOK_IDS = [p.relative_to(REPO).as_posix() for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_no_drawing_text_is_an_english_literal(path: Path) -> None:
    name = path.relative_to(REPO).as_posix()
    literals = [
        f"{where}: {ast.unparse(value)}"
        for tree in code_cells(path)
        for where, value in shown_text_arguments(tree)
        if is_text_literal(value)
    ]
    if name in PENDING:
        pytest.skip(f"{len(literals)} literal titles left, edited elsewhere: {literals}")
    assert not literals, f"{name}: pass these through label(key, ...) with a catalog key: {literals}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_every_label_call_names_a_key_and_its_fields(path: Path) -> None:
    for call in label_calls(path):
        assert call.key in CATALOG, f"{call.notebook}: no label {call.key!r} in minikv.viz.labels"
        english = CATALOG[call.key]
        assert call.fields == template_fields(english.en), f"{call.notebook}: {call.key} takes {english.en!r}"


def drawn_notebooks() -> list[Path]:
    """Notebooks whose stored outputs show their drawings: the chapters and the solved exercises."""
    return [p for p in NOTEBOOKS if label_calls(p) and p.parent.name != "exercises"]


@pytest.mark.parametrize("path", drawn_notebooks(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_zh_build_translates_every_notebook_label_in_the_stored_outputs(path: Path) -> None:
    english_page = stored_pictures(path)
    chinese_page = translate_html(english_page)
    english_shown, chinese_shown = shown_strings(english_page), shown_strings(chinese_page)
    for call in label_calls(path):
        label = CATALOG[call.key]
        english = [loose_pattern(t) for t in dict.fromkeys((label.en, label.en_other or label.en))]
        if not call.nested:
            assert any(p.fullmatch(t) for p in english for t in english_shown), (
                f"{call.notebook}: {call.key} ({label.en!r}) shows in no stored drawing: re-run the notebook?"
            )
            chinese = loose_pattern(label.zh)
            assert any(chinese.fullmatch(t) for t in chinese_shown), f"{call.notebook}: {call.key} not in Chinese"
        left = [t for t in chinese_shown for p in english if p.fullmatch(t)]
        assert not left, f"{call.notebook}: {call.key} left in English on the zh page: {left}"


def test_the_check_finds_an_english_title() -> None:
    code = "\n".join(
        [
            'draw_pool(pool, title=f"after step {n}")',
            'rec.note("memory " + "is short")',
            "x(title=t)",
            'r.labelled("B")',
            'f(labels=[f"request {u}" for u in us])',
        ]
    )
    tree = ast.parse(code)
    assert [is_text_literal(value) for _, value in shown_text_arguments(tree)] == [True, True, False, False, True]


UNITS = {"GB", "KiB"}
"""Words a Chinese table header keeps in English."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_the_zh_build_translates_every_table_header(path: Path) -> None:
    """Tables a notebook shows (``html_table``) get their headers from the catalog: in Chinese on the zh pages."""
    chinese_page = translate_html(stored_pictures(path))
    headers = [html.unescape(h) for h in re.findall(r"<th\b[^>]*>(.*?)</th>", chinese_page, re.DOTALL)]
    english = [
        h for h in headers if not re.search(r"[\u4e00-\u9fff]", h) and set(re.findall(r"[A-Za-z]{2,}", h)) - UNITS
    ]
    assert not english, f"{path.relative_to(REPO).as_posix()}: table headers left in English: {english}"
