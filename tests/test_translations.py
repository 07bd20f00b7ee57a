"""The Chinese edition's catalogs (locale/zh_CN/LC_MESSAGES/**.po), checked with scripts/i18n.py.

* complete: no required message untranslated or fuzzy, listed per file. In book/api.po only the
  messages whose text appears in book/api.md itself are required (title, headings, intro); the
  others come from the package's docstrings, which stay English;
* up to date: a fresh extraction from the English sources has exactly the catalogs' messages (an
  English change not carried into the catalogs fails, naming `scripts/i18n.py extract`);
* no translation starts a Markdown block ("1. " must be "1\\. "), which would drop a heading;
* glue roles in a translation name their notebook ({glue:}`05_radix.ipynb::key`);
* the glossary fixes the terms: each entry's heading uses its "**Notes:**" term, and no catalog uses
  a known wrong rendering of a key term.

The zh build itself (warnings as errors) runs in `make test` before pytest; the browser tests
(tests/test_book_browser.py) read it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import i18n  # noqa: E402


@pytest.fixture(scope="module")
def catalogs() -> dict[str, list[i18n.Entry]]:
    return i18n.read_catalogs()


def test_there_is_one_catalog_per_page(catalogs) -> None:
    import yaml

    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    pages = {toc["root"]} | {c["file"] for part in toc["parts"] for c in part["chapters"]}
    assert set(catalogs) == pages, "run `.venv/bin/python scripts/i18n.py extract`"
    assert sum(map(len, catalogs.values())) > 1000


def test_catalogs_are_complete(catalogs) -> None:
    missing = i18n.missing(catalogs)
    count = sum(map(len, missing.values()))
    report = "\n".join(
        f"{page}.po: {len(lines)} missing\n  " + "\n  ".join(lines[:40]) for page, lines in missing.items()
    )
    assert missing == {}, f"{count} messages untranslated or fuzzy (locale/zh_CN/LC_MESSAGES/):\n{report}"


def test_catalogs_match_the_english_sources(tmp_path: Path) -> None:
    i18n.extract_pot(tmp_path)
    changes = i18n.stale(i18n.CATALOGS, tmp_path)
    report = "\n".join(f"{page}:\n  " + "\n  ".join(lines[:20]) for page, lines in changes.items())
    assert changes == {}, (
        "the catalogs are out of date with the English sources: run `.venv/bin/python scripts/i18n.py extract`, "
        f"then translate the new and fuzzy entries\n{report}"
    )


def test_api_catalog_requires_only_the_pages_own_prose(catalogs) -> None:
    entries = catalogs[i18n.DOCSTRING_PAGE]
    needed = {e.msgid for e in entries if i18n.required(e)}
    assert {"API reference", "Storage layer", "Management layer"} <= needed
    assert len(needed) < 30 < len(entries), (len(needed), len(entries))
    assert all(i18n.required(e) for page, es in catalogs.items() if page != i18n.DOCSTRING_PAGE for e in es)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("1. 为什么要管理 KV 缓存？", True),
        ("12) 第十二", True),
        ("- 一项", True),
        ("* 一项", True),
        ("# 标题", True),
        ("> 引用", True),
        ("第一行\n- 第二行是列表", True),
        ("第一行\n1. 第二行是列表", True),
        ("1\\. 为什么要管理 KV 缓存？", False),
        ("5.3 小节标题", False),
        ("2026. 不是", True),
        ("**粗体** 开头", False),
        ("*斜体* 开头", False),
        ("第一行\n2. 不打断段落", False),
        ("`code` 开头", False),
    ],
)
def test_block_marker_rule(text: str, bad: bool) -> None:
    assert (i18n.block_marker(text) is not None) == bad


def test_no_translation_starts_a_markdown_block(catalogs) -> None:
    found = i18n.marker_problems(catalogs)
    assert found == [], "a translation Markdown reads as a list, heading or quote:\n" + "\n".join(found)


def test_a_numbered_heading_translated_unescaped_is_caught() -> None:
    entry = i18n.Entry("book/01_why_manage", "1. Why manage the KV cache?", "1. 为什么要管理 KV 缓存？", False)
    escaped = i18n.Entry("book/01_why_manage", "1. Why manage the KV cache?", "1\\. 为什么要管理 KV 缓存？", False)
    assert len(i18n.marker_problems({"p": [entry]})) == 1
    assert i18n.marker_problems({"p": [escaped]}) == []
    same = i18n.Entry("book/guarantees", "-", "-", False)  # Sphinx keeps the English node
    assert i18n.marker_problems({"p": [same]}) == []


def test_glue_roles_in_translations_name_their_notebook(catalogs) -> None:
    found = i18n.glue_problems(catalogs)
    assert found == [], "\n".join(found)
    msgid = "from {glue:}`reached_pool` slots, {glue:text}`optimal_rate:.0%`"
    short = i18n.Entry("book/05_radix", msgid, "从 {glue:}`reached_pool` 个槽位起", False)
    long = i18n.Entry("book/05_radix", msgid, "从 {glue:}`05_radix.ipynb::reached_pool` 个槽位起", False)
    (problem,) = i18n.glue_problems({"book/05_radix": [short]})
    assert "05_radix.ipynb::reached_pool" in problem
    assert i18n.glue_problems({"book/05_radix": [long]}) == []


def test_glossary_entries_and_their_chinese_terms() -> None:
    entries = {item.terms[0]: item for item in i18n.glossary_entries()}
    assert len(entries) >= 30
    assert entries["eviction"].chinese == ("驱逐",)
    assert entries["evictable"].terms == ("evictable", "protected")
    assert entries["evictable"].chinese == ("可驱逐", "受保护")
    assert entries["cache manager"].chinese[0] == "管理层"
    assert entries["radix tree"].chinese == ("基数树",)
    assert entries["Feynman challenge"].chinese == ("费曼挑战",)
    assert entries["preemption"].chinese == ("抢占",)  # "no term (usually 抢占)"
    assert entries["KV cache"].chinese == ()  # "KV Cache (kept in English)"
    assert entries["bytes per token"].chinese == ()  # "no term (the skill card: ...)"


def test_glossary_headings_use_the_glossarys_terms(catalogs) -> None:
    found = i18n.glossary_problems(catalogs)
    assert found == [], "\n".join(found)


def test_glossary_rule_catches_a_wrong_heading() -> None:
    entries = [
        i18n.Entry("book/glossary", "eviction", "淘汰（eviction）", False),
        i18n.Entry("book/glossary", "radix tree", "基数树（radix tree）", False),
    ]
    found = i18n.glossary_problems({"book/glossary": entries})
    assert len(found) == 1 and "'驱逐'" in found[0], found


def test_no_catalog_uses_another_rendering_of_a_key_term(catalogs) -> None:
    found = i18n.key_term_problems(catalogs)
    assert found == [], "\n".join(found)
    planted = i18n.Entry("book/05_radix", "Evict the leaf.", "淘汰这个叶子节点。", False)
    assert len(i18n.key_term_problems({"p": [planted]})) == 1
    caller = i18n.Entry("book/03_storage", "The caller frees them.", "调用方释放它们。", False)
    assert len(i18n.key_term_problems({"p": [caller]})) == 1


def test_no_catalog_leaves_an_english_term_in_its_prose(catalogs) -> None:
    found = i18n.english_leftover_problems(catalogs)
    assert found == [], "\n".join(found)
    leftover = i18n.Entry("book/05_radix", "Compare its key.", "比较它的 key。", False)
    code = i18n.Entry("book/05_radix", "Compare its `key`.", "比较它的 `key`（key）。", False)
    assert len(i18n.english_leftover_problems({"p": [leftover, code]})) == 1


def test_chinese_search_fallback_indexes_short_pieces_of_chinese() -> None:
    sys.path.insert(0, str(REPO / "_ext"))
    import zh_search

    grams = zh_search.chinese_ngrams("先做前缀匹配 then `evict`")
    assert {"前缀", "前缀匹配", "做前缀匹"} <= set(grams) and "先做前缀匹配" not in grams
    # a longer query becomes overlapping 4-character pieces, every one of which the index holds
    assert zh_search.query_pieces("完整性检查 evict") == ["完整性检", "整性检查", "evict"]
    assert zh_search.query_pieces("每 token") == ["token"]
    assert set(zh_search.query_pieces("请求生命周期")) <= set(zh_search.chinese_ngrams("一个请求生命周期"))
    assert "淘汰" in zh_search.synonyms_of("驱逐一个叶子节点") and zh_search.synonyms_of("前缀") == []
    assert not any("e" in g for g in grams)
    words = zh_search.SearchChineseWithoutJieba({}).split("前缀匹配 RadixCacheManager")
    assert "RadixCacheManager" in words and "前缀匹配" in words


def test_both_editions_are_built_with_warnings_as_errors() -> None:
    makefile = (REPO / "Makefile").read_text()
    for target in ("book: setup", "test: $(TEST_FIRST)"):
        recipe = makefile.split(target, 1)[1].split("\n\n", 1)[0]
        assert "jupyter-book build . -W -n --keep-going" in recipe, target
        assert "scripts/i18n.py build" in recipe, f"{target}: the Chinese edition is not built"
    source = (REPO / "scripts" / "i18n.py").read_text()
    assert "strict=True" in source.split("def build(", 1)[1].split("\ndef ", 1)[0]
    overrides = i18n.zh_overrides()
    assert overrides["language"] == "zh_CN" and overrides["gettext_compact"] is False
    assert i18n.ZH_HTML == REPO / "_build" / "html" / "zh"


def test_the_zh_toc_has_chinese_part_captions(tmp_path: Path) -> None:
    """The sidebar's part captions come from the translated toc the zh build reads."""
    import yaml

    toc = yaml.safe_load(i18n.translated_toc(tmp_path / "toc.yml").read_text(encoding="utf-8"))
    english = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    captions = [part["caption"] for part in toc["parts"]]
    assert captions == ["课程", "练习", "参考解答", "参考"]
    assert [part["chapters"] for part in toc["parts"]] == [part["chapters"] for part in english["parts"]]
    built = REPO / "_build" / "html" / "zh" / "book" / "01_why_manage.html"
    if built.exists():  # after `make book`: the sidebar shows them
        html = built.read_text(encoding="utf-8")
        assert all(f'caption-text">{caption}<' in html for caption in captions)


def test_the_zh_edition_names_collapsed_cells_in_chinese() -> None:
    overrides = i18n.zh_overrides()
    assert overrides["nb_code_prompt_show"] == "显示单元格内容"
    built = REPO / "_build" / "html" / "zh" / "book" / "05_radix.html"
    if built.exists():  # after `make book`
        html = built.read_text(encoding="utf-8")
        assert "显示单元格内容" in html and "Show code cell" not in html


def test_the_zh_build_translates_drawings_and_names_the_answer_hint(tmp_path: Path) -> None:
    """_ext/zh_drawings.py: after the zh build, pages and SVG images carry Chinese labels."""
    sys.path.insert(0, str(REPO / "_ext"))
    import zh_drawings

    overrides = i18n.zh_overrides()
    assert (overrides["togglebutton_hint"], overrides["togglebutton_hint_hide"]) == ("点击显示", "点击隐藏")
    (tmp_path / "_images").mkdir()
    svg = '<svg><text font-family="Helvetica,sans-Serif">just inserted</text><text>Hello</text></svg>'
    (tmp_path / "_images" / "tree.svg").write_text(svg, encoding="utf-8")
    page = '<p>just inserted</p><figcaption class="mkp-caption">3. nothing to do</figcaption>'
    (tmp_path / "page.html").write_text(page, encoding="utf-8")
    (tmp_path / "other.html").write_text("<p>no drawing here</p>", encoding="utf-8")
    assert zh_drawings.translate_outputs(tmp_path) == 2
    assert ">刚插入</text><text>Hello</text>" in (tmp_path / "_images" / "tree.svg").read_text(encoding="utf-8")
    translated = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert translated == '<p>just inserted</p><figcaption class="mkp-caption">3. 无事可做</figcaption>'
    built = REPO / "_build" / "html" / "zh" / "book" / "05_radix.html"
    if built.exists():  # after `make book`
        assert "受保护" in built.read_text(encoding="utf-8")


def test_a_link_titled_in_english_gets_the_zh_pages_title(tmp_path: Path) -> None:
    """The introduction's table links each chapter by its English title; on the zh site, by the Chinese one."""
    sys.path.insert(0, str(REPO / "_ext"))
    import zh_drawings

    zh = tmp_path / "zh"
    for edition, title in ((tmp_path, "1. Why manage?"), (zh, "1. 为何管理？")):
        (edition / "book").mkdir(parents=True)
        (edition / "book" / "ch1.html").write_text(f'<h1>{title}<a class="headerlink" href="#x">#</a></h1>')
    page = (
        '<td><a href="ch1.html">1. Why manage?</a><br><a href="ch1.html#x">exercises</a>'
        '<a href="https://example.com/ch1.html">1. Why manage?</a><a href="ch2.html">2. Gone</a></td>'
    )
    translated = zh_drawings.translate_page_links(page, zh / "book" / "intro.html", zh)
    assert translated == page.replace(">1. Why manage?</a><br>", ">1. 为何管理？</a><br>", 1)
    built = REPO / "_build" / "html" / "zh" / "book" / "00_introduction.html"
    if built.exists():  # after `make book`
        text = built.read_text(encoding="utf-8")
        assert ">1. 为什么要管理 KV 缓存？</a>" in text and ">1. Why manage the KV cache?</a>" not in text
        chapters = re.findall(r'<a href="0\d_\w+\.html">([^<]*)</a>', text)
        assert len(chapters) >= 9 and not [t for t in chapters if not re.search("[\u4e00-\u9fff]", t)], chapters
        headers = re.findall(r"<th\b[^>]*>([^<]*)</th>", text)
        assert headers[:2] == ["章节", "笔记"], headers


def test_the_zh_build_translates_the_checkers_stored_reports() -> None:
    """A report stored in English on an exercise page reads as the checker writes it in Chinese."""
    sys.path.insert(0, str(REPO / "_ext"))
    sys.path.insert(0, str(REPO / "tests"))
    import zh_drawings
    from exercise_helpers import solution_for

    from minikv.exercises import check

    for exercise_id in ("capacity.kv_bytes_per_token", "blocks.allocate", "naive.manager"):
        passed = check(exercise_id, solution_for(exercise_id))
        assert (
            zh_drawings.translate_reports(passed._repr_html_())
            == check(exercise_id, solution_for(exercise_id), lang="zh")._repr_html_()
        )

    def stub(*args: object) -> None:
        raise NotImplementedError

    not_written = zh_drawings.translate_reports(check("lifecycle.slots_to_free", stub)._repr_html_())
    assert not_written == check("lifecycle.slots_to_free", stub, lang="zh")._repr_html_()
    # a sentence the catalog cannot read back whole stays English rather than half translated
    odd = (
        '<div class="minikv-check"><li>✓ a random tree from 10 prompts (seed 301, random slots scattered over'
        " the pool), 40 calls</li></div>"
    )
    assert zh_drawings.translate_reports(odd) == odd
    assert zh_drawings.translate_reports("<p>✓ lifecycle.admit: all 7 cases passed.</p>") == (
        "<p>✓ lifecycle.admit: all 7 cases passed.</p>"
    )  # outside a report nothing changes
    built = REPO / "_build" / "html" / "zh" / "exercises" / "solved" / "ex1_capacity.html"
    if built.exists():  # after `make book`
        assert "个用例通过" in built.read_text(encoding="utf-8")
