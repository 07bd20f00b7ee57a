"""What Colab opens: the copies in ``colab/`` (scripts/colab_copy.py) are current, hold no raw MyST,
keep every hint and answer folded, run the same code, and every Colab link leads to them.

Colab and plain Jupyter render markdown without MyST: a ``{admonition}`` dropdown shows its answer in
full, roles and ``(label)=`` targets show as text. The book keeps MyST; Colab gets the copies.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import colab_copy  # noqa: E402
import set_repository  # noqa: E402

RAW_MYST = {
    "a role": re.compile(r"\{[a-z][\w:-]*\}`"),
    "a directive": re.compile(r"^\s*(?:`{3,}|~{3,}|:{3,})\s*\{", re.M),
    "a colon fence": re.compile(r"^\s*:{3,}", re.M),
    "a directive option": re.compile(r"^:[\w-]+:", re.M),
    "a (label)= target": re.compile(r"^\s*\([\w.-]+\)=\s*$", re.M),
    "a substitution": re.compile(r"\{\{[^}]*\}\}"),
}
GPU_PAGES = {"book/03_store_kernel.ipynb", "exercises/ex3_storage.ipynb", "exercises/solved/ex3_storage.ipynb"}


def raw_myst(markdown: str) -> list[str]:
    """Each piece of MyST in ``markdown`` that Colab would show raw, as ``kind: text``."""
    return [f"{kind}: {m.group(0).strip()!r}" for kind, pattern in RAW_MYST.items() for m in pattern.finditer(markdown)]


def pages() -> list[str]:
    found = [path for _title, path in set_repository.notebook_pages(REPO)]
    assert len(found) >= 19, found
    return found


def read(path: str) -> dict:
    return json.loads((REPO / path).read_text(encoding="utf-8"))


def markdown_cells(notebook: dict) -> list[str]:
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"]


def test_the_copies_are_current() -> None:
    assert colab_copy.problems(REPO) == [], "run: .venv/bin/python scripts/colab_copy.py"


@pytest.mark.parametrize("page", pages())
def test_what_colab_opens_has_no_raw_myst(page: str) -> None:
    copy = read(colab_copy.colab_path(page))
    found = [f"cell {i}: {hit}" for i, text in enumerate(markdown_cells(copy)) for hit in raw_myst(text)]
    assert found == [], f"{colab_copy.colab_path(page)} shows MyST raw on Colab:\n" + "\n".join(found)


@pytest.mark.parametrize("page", pages())
def test_every_dropdown_stays_folded_and_the_code_is_the_same(page: str) -> None:
    source, copy = read(page), read(colab_copy.colab_path(page))
    dropdowns = sum(text.count(":class: dropdown") for text in markdown_cells(source))
    folded = [text.count("<details>") for text in markdown_cells(copy)]
    assert sum(folded) == dropdowns, f"{page}: {dropdowns} dropdowns, {sum(folded)} <details> in the copy"
    assert sum(text.count("</details>") for text in markdown_cells(copy)) == dropdowns
    code = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in source["cells"] if c["cell_type"] == "code"]
    copied = [("".join(c["source"]), c["metadata"].get("tags", [])) for c in copy["cells"] if c["cell_type"] == "code"]
    assert code == copied, f"{page}: the copy's code differs from the book's"
    assert all(c.get("outputs", []) == [] for c in copy["cells"]), "a copy carries no stored outputs"


def test_the_sources_do_use_myst_so_the_scan_can_fail() -> None:
    """The scan finds the MyST of the sources: chapters' answers, exercises' hints, roles, labels."""
    found = [hit for page in pages() for text in markdown_cells(read(page)) for hit in raw_myst(text)]
    kinds = {hit.split(":", 1)[0] for hit in found}
    assert {"a role", "a directive", "a directive option", "a (label)= target"} <= kinds, kinds
    assert sum(hit.startswith("a directive:") for hit in found) >= 60


def test_roles_become_links_and_glued_values() -> None:
    text = "".join(markdown_cells(read("colab/book/05_radix.ipynb")))
    assert "With room for one request (280 slots)" in text  # {glue:}`smallest_pool`, the stored output's value
    assert re.search(r"no-eviction rate, \d+%", text)  # {glue:text}`optimal_rate:.0%`
    chapter2 = "".join(markdown_cells(read("colab/book/02_two_layers.ipynb")))
    site = set_repository.pages_url(set_repository.read_repository(REPO))
    assert f"[slot index]({site}book/glossary.html#term-slot)" in chapter2
    assert f"({site}book/02_two_layers.html#seven-steps)" in chapter2  # {ref}`section 2.4 <seven-steps>`


def test_a_reference_to_a_markdown_page_links_to_its_published_anchor() -> None:
    """Chapter 3b's {ref} to the GPU note of "Run it on Colab" (book/colab.md) leads to that section."""
    text = "".join(markdown_cells(read("colab/book/03_store_kernel.ipynb")))
    site = set_repository.pages_url(set_repository.read_repository(REPO))
    assert f"[Run it on Colab]({site}book/colab.html#gpu-status)" in text


@pytest.mark.parametrize(
    ("markdown", "message"),
    [
        ("```{figure} x.png\n```", "no Colab form for the {figure} directive"),
        ("{term}`no such term`", "names no entry of book/glossary.md"),
        ("{ref}`seven-steps`", "needs its own text"),
        ("{doc}`glossary`", "no Colab form for the {doc} role"),
        ("```{admonition} Hint\n:class: dropdown\nnever closed", "never closed"),
        ("[x](no_such_page.ipynb)", "leads to no notebook"),
    ],
)
def test_markup_without_a_colab_form_stops_the_script(markdown: str, message: str) -> None:
    converter = colab_copy.Converter(REPO)
    with pytest.raises(colab_copy.MarkupError, match=re.escape(message)):
        converter.markdown(markdown, "book/02_two_layers.ipynb", {}, "planted")


def test_a_dropdown_becomes_details_and_a_note_a_block_quote() -> None:
    converter = colab_copy.Converter(REPO)
    made = converter.markdown(
        "````{admonition} Hint 1: `x` first\n:class: dropdown\nUse **this**:\n```python\nx = 1\n```\n````\n"
        "```{note}\nSee [chapter 5](05_radix.ipynb).\n```",
        "book/02_two_layers.ipynb", {}, "planted",
    )  # fmt: skip
    url = set_repository.read_repository(REPO)
    assert made == (
        "<details>\n<summary>Hint 1: <code>x</code> first</summary>\n\nUse **this**:\n```python\nx = 1\n```\n\n"
        f"</details>\n> **Note**\n>\n> See [chapter 5]({set_repository.colab_url(url, 'colab/book/05_radix.ipynb')})."
    )
    assert raw_myst(made) == []


def test_every_colab_link_and_launch_button_opens_a_copy() -> None:
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    assert config["repository"]["path_to_book"] == colab_copy.COLAB_DIR  # the launch buttons' prefix
    assert colab_copy.COLAB_DIR in config["exclude_patterns"]  # the book builds from the sources only
    wrong = []
    for path in set_repository.tracked_files(REPO):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(("locale/", "exercises/solutions/")):  # translated copies; the markup source
            continue
        for match in set_repository.COLAB.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if match["path"].endswith(".ipynb") and not match["path"].startswith(f"{colab_copy.COLAB_DIR}/"):
                wrong.append(f"{relative}: {match.group(0)}")
    assert wrong == [], "\n".join(wrong)


def test_gpu_runtime_where_it_helps() -> None:
    for page in pages():
        metadata = read(colab_copy.colab_path(page))["metadata"]
        wants_gpu = metadata.get("accelerator") == "GPU" and metadata["colab"].get("gpuType") == "T4"
        assert wants_gpu == (page in GPU_PAGES), page


@pytest.mark.parametrize("page", ["book/06_forward_pass.ipynb", "book/07_real_model.ipynb"])
def test_token_equality_with_a_recompute_runs_on_the_cpu_on_every_runtime(page: str) -> None:
    """Batched and one-by-one matmuls round alike on the CPU (nbval checks it), not always on CUDA."""
    code = "\n".join("".join(c["source"]) for c in read(page)["cells"] if c["cell_type"] == "code")
    assert "recompute(" in code
    assert re.search(r"^# The CPU on every runtime.*\n(?:#.*\n)*device = \"cpu\"$", code, re.M), page
    assert "cuda" not in code.replace("# on CUDA", "").replace("CUDA", ""), f"{page} picks a device elsewhere"


def test_every_link_to_the_book_lands_on_a_built_page_and_anchor() -> None:
    """Terms, references and pages the copies link to exist in the book ``make test`` builds first."""
    html = REPO / "_build" / "html"
    if not (html / "book" / "glossary.html").is_file():
        pytest.skip("the book is not built (make test builds it before the tests)")
    site = set_repository.pages_url(set_repository.read_repository(REPO))
    links = set()
    for page in pages():
        for text in markdown_cells(read(colab_copy.colab_path(page))):
            links |= set(re.findall(rf"\(({re.escape(site)}[^)\s]+)\)", text))
    assert len(links) >= 20, links
    broken = []
    for link in sorted(links):
        path, _, anchor = link.removeprefix(site).partition("#")
        built = html / path
        if not built.is_file() or (anchor and f'id="{anchor}"' not in built.read_text(encoding="utf-8")):
            broken.append(link)
    assert broken == [], broken
    launch = (html / "book" / "05_radix.html").read_text(encoding="utf-8")
    url = set_repository.colab_url(set_repository.read_repository(REPO), "colab/book/05_radix.ipynb")
    assert url in launch, "the launch button does not open the Colab copy"
