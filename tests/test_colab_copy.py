"""What Colab opens: the copies in ``colab/`` (scripts/colab_copy.py) are current, hold no raw MyST,
keep every hint and answer folded, run the same code, and every Colab link leads to them.

The Chinese copies (``colab/zh/``) too: one for every page, prose in Chinese in every markdown cell,
the English code token for token (only comments translated), every catalog block and comment
translated, and the zh edition's Colab links and buttons open them.

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
import colab_zh  # noqa: E402
import i18n  # noqa: E402
import set_repository  # noqa: E402

RAW_MYST = {
    "a role": re.compile(r"\{[a-z][\w:-]*\}`"),
    "a directive": re.compile(r"^\s*(?:`{3,}|~{3,}|:{3,})\s*\{", re.M),
    "a colon fence": re.compile(r"^\s*:{3,}", re.M),
    "a directive option": re.compile(r"^:[\w-]+:", re.M),
    "a (label)= target": re.compile(r"^\s*\([\w.-]+\)=\s*$", re.M),
    "a substitution": re.compile(r"\{\{[^}]*\}\}"),
}
CJK = re.compile(r"[\u3400-\u9fff]")
LANGUAGES = colab_copy.LANGUAGES
GPU_PAGES = {
    "book/03_store_kernel.ipynb",
    "exercises/ex3_storage.ipynb",
    "exercises/solved/ex3_storage.ipynb",
    "exercises/ex7_paged_attention.ipynb",
    "exercises/solved/ex7_paged_attention.ipynb",
}


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


def test_there_is_a_chinese_copy_of_every_page() -> None:
    copies = {p.relative_to(REPO).as_posix() for p in (REPO / "colab" / "zh").rglob("*.ipynb")}
    assert copies == {colab_copy.colab_path(page, "zh") for page in pages()}


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("page", pages())
def test_what_colab_opens_has_no_raw_myst(page: str, lang: str) -> None:
    copy = read(colab_copy.colab_path(page, lang))
    found = [f"cell {i}: {hit}" for i, text in enumerate(markdown_cells(copy)) for hit in raw_myst(text)]
    assert found == [], f"{colab_copy.colab_path(page, lang)} shows MyST raw on Colab:\n" + "\n".join(found)


def chinese_code(notebook: dict) -> list[dict]:
    """The zh copy's code cells, without the setup cell that turns minikv.viz's Chinese on (when it has one)."""
    return [c for c in notebook["cells"] if c["cell_type"] == "code" and c.get("id") != colab_copy.ZH_SETUP_ID]


@pytest.mark.parametrize("page", pages())
def test_the_chinese_copy_runs_the_english_code_and_reads_in_chinese(page: str) -> None:
    source, copy = read(page), read(colab_copy.colab_path(page, "zh"))
    english = [c for c in source["cells"] if c["cell_type"] == "code"]
    chinese = chinese_code(copy)
    translations = colab_zh.load_catalog(colab_zh.COMMENTS)  # "2 GiB" stays "2 GiB"
    assert [c["metadata"].get("tags", []) for c in english] == [c["metadata"].get("tags", []) for c in chinese]
    for number, (old, new) in enumerate(zip(english, chinese, strict=True)):
        old_code, new_code = "".join(old["source"]), "".join(new["source"])
        assert colab_zh.code_tokens(old_code) == colab_zh.code_tokens(new_code), f"{page}: code cell {number} differs"
        english_comments = {c.text for c in colab_zh.comments(old_code) if c.text != translations.get(c.text)}
        left = [c.text for c in colab_zh.comments(new_code) if c.text in english_comments]
        assert left == [], f"{page}: code cell {number} keeps English comments {left}"
    assert all(c.get("outputs", []) == [] for c in copy["cells"]), "a copy carries no stored outputs"
    # prose in Chinese in every markdown cell (code, links and addresses aside)
    for number, text in enumerate(markdown_cells(copy)):
        prose = re.sub(r"```.*?```|`[^`]*`|\]\([^)]*\)|<[^>]*>", "", text, flags=re.S)
        if re.search(r"[A-Za-z]{3,}", prose):
            assert CJK.search(prose), f"{page}: markdown cell {number} has no Chinese:\n{text[:300]}"
    folded = sum(text.count("<details>") for text in markdown_cells(copy))
    assert folded == sum(text.count(":class: dropdown") for text in markdown_cells(source))


def test_the_chinese_copies_turn_minikvs_chinese_on_only_where_minikv_can() -> None:
    """The setup line is there exactly when minikv offers set_language (no stub, no dead call), and it
    is minikv's one setting (drawings, checker reports, errors), not the drawings' alone."""
    import minikv

    can = hasattr(minikv, "set_language")
    assert colab_copy.minikv_speaks_chinese(REPO) == can
    for page in ("book/05_radix.ipynb", "exercises/ex5_radix.ipynb"):
        setup = [c for c in read(colab_copy.colab_path(page, "zh"))["cells"] if c.get("id") == colab_copy.ZH_SETUP_ID]
        assert len(setup) == int(can), page
        for cell in setup:
            code = "".join(cell["source"])
            assert "import minikv\n" in code and 'minikv.set_language("zh")' in code, code
            assert "minikv.viz" not in code, code


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


@pytest.mark.parametrize("page", ["book/06_forward_pass.ipynb", "book/07_real_model.ipynb", "book/08_scheduler.ipynb"])
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
    languages = LANGUAGES if (html / "zh" / "book" / "glossary.html").is_file() else ("en",)
    for page in pages():
        for lang in languages:
            for text in markdown_cells(read(colab_copy.colab_path(page, lang))):
                links |= set(re.findall(rf"\(({re.escape(site)}[^)\s]+)\)", text))
    assert len(links) >= 20 * len(languages), links
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


# -- the Chinese copies ---------------------------------------------------------------------------


def test_every_block_of_every_notebook_is_translated() -> None:
    """Every paragraph, heading, list item, table cell and admonition title finds its catalog message."""
    converter = colab_copy.Converter(REPO, "zh")
    for page in pages():
        converter.notebook(page)
    assert converter.untranslated == {}
    assert converter.blocks_translated >= 1000, converter.blocks_translated


def test_an_untranslated_block_is_reported_and_fails_the_check(tmp_path: Path) -> None:
    lookup = {"A heading": "一个标题", "First item": "第一项", "cell": "单元格", "Hint": "提示", "Body.": "正文。"}.get
    tally = colab_zh.Tally()
    markdown = (
        "## A heading\n\n- First item\n- A new item\n  on two lines\n\n| cell | cell |\n|---|---|\n| cell | x |\n\n"
        "```{admonition} Hint\n:class: dropdown\nBody.\n```\n\nA paragraph nobody translated."
    )
    made = colab_zh.translate_markdown(markdown, lookup, tally)
    assert sorted(tally.missing) == ["A new item on two lines", "A paragraph nobody translated.", "x"]
    assert tally.translated == 7
    table = "| 单元格 | 单元格 |\n|---|---|\n| 单元格 | x |"
    assert made.startswith(f"## 一个标题\n\n- 第一项\n- A new item on two lines\n\n{table}")
    assert "```{admonition} 提示\n:class: dropdown\n正文。\n```" in made
    assert colab_zh.translate_markdown("3. Item", {"Item": "1\\. 项"}.get, colab_zh.Tally()) == "3. 1\\. 项"

    # the same in a notebook: colab_copy.py --check names it (a tiny book: one page, its catalog)
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    root = tmp_path / "repo"
    for name in ("pyproject.toml", "book/glossary.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes((REPO / name).read_bytes())
    (root / "_toc.yml").write_text("root: book/page\n")
    cells = [
        {"cell_type": "code", "metadata": {}, "source": "x = 1  # the slot", "outputs": [], "execution_count": None},
        {"cell_type": "markdown", "metadata": {}, "source": "# A page\n\nA paragraph the English just got."},
    ]
    (root / "book" / "page.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))
    catalog = Catalog(locale="zh_CN")
    catalog.add("A page", "一页")
    catalogs = root / colab_zh.CATALOGS.relative_to(REPO) / "book"
    catalogs.mkdir(parents=True)
    with (catalogs / "page.po").open("wb") as handle:
        write_po(handle, catalog)
    assert colab_copy.extract_comments(root) == 1  # the comment is new: untranslated
    found = [line for line in colab_copy.problems(root) if "untranslated" in line]
    assert len(found) == 1, found
    assert "block: 'A paragraph the English just got.'" in found[0] and "comment: 'the slot'" in found[0]


def test_comments_are_translated_in_place_and_nothing_else_changes() -> None:
    code = (
        "%pip install x  # not Python\n"
        "# A long comment that the\n# translator reads as one.\nx = 1  # the slot\n"
        "    # indented, alone\ny = [  # noqa: E501\n    2,\n]\n# ---\n"
    )
    found = colab_zh.comments(code)
    assert [(c.text, c.inline) for c in found] == [
        ("A long comment that the translator reads as one.", False),
        ("the slot", True),
        ("indented, alone", False),
    ]
    chinese = {
        "A long comment that the translator reads as one.": "译者把它当作一句来读的一条很长的注释。" * 4,
        "the slot": "槽位",
        "indented, alone": "缩进的，单独一行",
    }
    missing: list[str] = []
    made = colab_zh.translate_code(code, chinese.get, missing)
    assert missing == [] and colab_zh.code_tokens(made) == colab_zh.code_tokens(code)
    lines = made.split("\n")
    assert lines[0] == "%pip install x  # not Python"  # a magic line is not Python: left as it is
    assert lines[1].startswith("# 译者") and lines[2].startswith("# ") and lines[3].startswith("# ")
    assert all(colab_zh.width(line) <= 62 for line in lines[1:4])
    assert "x = 1  # 槽位" in lines and "    # 缩进的，单独一行" in lines and "y = [  # noqa: E501" in lines
    assert colab_zh.translate_code("z = 0  # new", {}.get, missing) == "z = 0  # new" and missing == ["new"]


def test_the_comment_catalog_is_complete_current_and_uses_the_glossarys_terms() -> None:
    entries = i18n.read_catalog(colab_zh.COMMENTS, "code_comments")
    assert len(entries) >= 150
    assert [e.msgid for e in entries if e.fuzzy or not e.msgstr.strip()] == []
    assert all(CJK.search(e.msgstr) for e in entries if re.search(r"[a-z]{3,}", e.msgid)), "a comment kept English"
    assert i18n.key_term_problems({"code_comments": entries}) == []
    notebooks = {page: read(page) for page in pages()}
    assert colab_zh.comment_catalog_problems(notebooks) == []


def test_the_chinese_editions_colab_links_and_buttons_open_chinese_copies() -> None:
    site_colab = set_repository.colab_url(set_repository.read_repository(REPO), "")
    for page in pages():
        for lang in LANGUAGES:
            for text in markdown_cells(read(colab_copy.colab_path(page, lang))):
                for match in set_repository.COLAB.finditer(text):
                    target = match["path"]
                    assert (REPO / target).is_file(), target
                    assert target.startswith("colab/zh/") == (lang == "zh"), f"{page} ({lang}) opens {target}"
    # the zh build: launch buttons read path_to_docs, the badges are rewritten by _ext/zh_colab.py
    from jupyter_book.config import get_final_config

    config, _ = get_final_config(
        user_yaml=REPO / "_config.yml", cli_config={**i18n.zh_overrides(), "latex_individualpages": False},
        sourcedir=REPO,
    )  # fmt: skip
    assert config["html_theme_options"]["path_to_docs"] == "colab/zh"
    assert config["html_theme_options"]["search_bar_text"] == i18n.ZH_SEARCH_TEXT
    assert "zh_colab" in config["extensions"]
    sys.path.insert(0, str(REPO / "_ext"))
    import zh_colab

    english = site_colab + "colab/exercises/ex5_radix.ipynb"
    assert zh_colab.chinese_copy(english) == site_colab + "colab/zh/exercises/ex5_radix.ipynb"
    for unchanged in (site_colab + "colab/zh/book/05_radix.ipynb", "https://colab.research.google.com"):
        assert zh_colab.chinese_copy(unchanged) == unchanged
    built = REPO / "_build" / "html" / "zh" / "exercises" / "ex5_radix.html"
    if built.is_file():  # after `make book`
        html = built.read_text(encoding="utf-8")
        assert site_colab + "colab/zh/exercises/ex5_radix.ipynb" in html
        assert site_colab + "colab/exercises/" not in html, "a zh page opens an English copy"
