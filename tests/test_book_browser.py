"""The built book, as a reader sees it: every page in headless Chromium, in both editions.

`make test` builds the book (English in `_build/html`, Chinese in `_build/html/zh`, see
scripts/i18n.py) before running pytest; run alone without them, these tests skip and say how to
build them. The Chinese edition must have every heading of the English one (a translated heading
that Markdown reads as a list item would silently disappear), and each page's language switch must
lead to the same page in the other edition. Debian's Chromium is driven through Playwright for
Python with the system browser (no browser download).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from headless import chromium, needs_chromium, serve

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
ZH = "zh"  # the Chinese edition's folder inside the English one
EDITIONS = ["en", "zh"]
# Paths of the machine that executed the notebooks (the book's own examples, such as
# "/home/user/doc1.txt" in chapter 5, are fine). The checkout's own folder is named too, so a
# path into it is caught wherever the repository was cloned.
MACHINE_PATHS = re.compile(
    r"(/work/|/root/|site-packages|\.venv/|/tmp/tmp|/usr/lib/python|" + re.escape(str(REPO)) + ")"
)

pytestmark = needs_chromium


def toc_pages() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [chapter["file"] for chapter in part["chapters"]]
    return pages


def notebook_pages() -> list[str]:
    return [page for page in toc_pages() if (REPO / f"{page}.ipynb").exists()]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if not (HTML / "index.html").exists():
        pytest.skip(
            "the book is not built: run `make book` (or `.venv/bin/jupyter-book build .`) first; `make test` builds it"
        )
    with serve(HTML) as address:
        yield address


def edition_root(server: str, edition: str) -> str:
    if edition == "en":
        return server
    if not (HTML / ZH / "index.html").exists():
        pytest.skip("the Chinese edition is not built: run `make book` (or `.venv/bin/python scripts/i18n.py build`)")
    return f"{server}/{ZH}"


@pytest.fixture(params=EDITIONS)
def site(request: pytest.FixtureRequest, server: str) -> str:
    """The address of one edition: the English one at the root, the Chinese one under zh/."""
    return edition_root(server, request.param)


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture()
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    tab = context.new_page()
    yield tab
    context.close()


@pytest.mark.parametrize("name", toc_pages())
def test_page_loads_with_title_images_and_no_leaks(page, site: str, name: str) -> None:
    response = page.goto(f"{site}/{name}.html", wait_until="load")
    assert response is not None and response.ok, f"{name}: HTTP {response and response.status}"
    heading = page.locator("main h1").first
    assert heading.inner_text().strip(), f"{name}: no title"
    # Images from the site itself must load; external ones (the Colab badge) cannot load on
    # this offline machine, so for those only the address is checked.
    images = page.evaluate(
        """() => [...document.querySelectorAll('main img')].map(img => ({
                 src: img.src, local: new URL(img.src).origin === location.origin,
                 ok: img.complete && img.naturalWidth > 0}))"""
    )
    broken = [img["src"] for img in images if img["local"] and not img["ok"]]
    assert broken == [], f"{name}: broken images {broken}"
    external = [img["src"] for img in images if not img["local"]]
    assert all(src.startswith("https://colab.research.google.com/assets/") for src in external), external
    # Everything a page needs to render (scripts, styles: MathJax was one) comes from the site itself,
    # so the book reads the same offline and wherever a CDN is slow or blocked.
    remote = page.evaluate(
        """() => [...document.querySelectorAll('script[src], link[rel=stylesheet][href]')]
                 .map(e => e.src || e.href).filter(u => new URL(u).origin !== location.origin)"""
    )
    assert remote == [], f"{name}: loads {remote} from another site"
    text = page.locator("main").inner_text()
    assert "Traceback (most recent call last)" not in text, f"{name}: shows a traceback"
    leak = MACHINE_PATHS.search(text)
    assert leak is None, f"{name}: shows a machine path near {text[max(0, leak.start() - 60) : leak.end() + 60]!r}"


@pytest.mark.parametrize("name", notebook_pages())
def test_colab_link_points_at_the_notebook_on_main(page, site: str, name: str) -> None:
    """The launch button and badges open the Colab copy (colab/, scripts/colab_copy.py) on main.

    The Chinese edition's open the Chinese copy (colab/zh/).
    """
    page.goto(f"{site}/{name}.html", wait_until="load")
    hrefs = page.eval_on_selector_all("a[href*='colab.research.google.com']", "links => links.map(a => a.href)")
    assert hrefs, f"{name}: no Colab launch link"
    folder = f"colab/{ZH}" if site.rstrip("/").endswith(f"/{ZH}") else "colab"
    assert all(href.endswith(f"/blob/main/{folder}/{name}.ipynb") for href in hrefs), hrefs


@pytest.mark.parametrize("name", toc_pages())
def test_players_render_and_dropdown_answers_open(page, site: str, name: str) -> None:
    page.goto(f"{site}/{name}.html", wait_until="load")
    players = page.locator("main [data-minikv-player]")
    for i in range(players.count()):
        player = players.nth(i)
        player.scroll_into_view_if_needed()
        assert player.get_attribute("data-ready") == "1", f"{name}: player {i} did not start"
        visible_svgs = player.locator("svg:visible")
        assert visible_svgs.count() >= 1, f"{name}: player {i} shows no frame"
    dropdowns = page.locator("main .admonition.dropdown")
    for i in range(dropdowns.count()):
        dropdown = dropdowns.nth(i)
        body = dropdown.locator(":scope > :not(.admonition-title):not(button)").first
        if body.count() == 0:
            continue
        dropdown.scroll_into_view_if_needed()
        assert not body.is_visible(), f"{name}: answer {i} is visible before it is opened"
        dropdown.locator(".admonition-title").first.click()
        body.wait_for(state="visible", timeout=3000)


def test_book_has_answers_and_players(page, site: str) -> None:
    """The course promises hidden answers and tree players; make sure the pages really have them."""
    answers = players = 0
    for name in toc_pages():
        page.goto(f"{site}/{name}.html", wait_until="load")
        answers += page.locator("main .admonition.dropdown").count()
        players += page.locator("main [data-minikv-player]").count()
    assert answers >= 20, f"only {answers} dropdown answers in the whole book (20 challenges)"
    assert players >= 1, "no tree player anywhere in the book"


def plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").split())


def translated_headings(name: str) -> set[str]:
    """The English texts of the page's messages that have a translation of their own."""
    catalog = REPO / "locale" / "zh_CN" / "LC_MESSAGES" / f"{name}.po"
    if not catalog.exists():
        return set()
    sys.path.insert(0, str(REPO / "scripts"))
    import i18n

    return {
        plain(e.msgid) for e in i18n.read_catalog(catalog, name) if e.msgstr and e.msgstr != e.msgid and not e.fuzzy
    }


HEADINGS = """() => [...document.querySelectorAll('main h1, main h2, main h3')]
    .map(h => ({level: h.tagName, text: h.innerText.replace(/[#\\s]+$/, '').trim()}))"""


@pytest.mark.parametrize("name", toc_pages())
def test_chinese_page_has_every_heading_and_the_switch_leads_there_and_back(page, server: str, name: str) -> None:
    """Same h1/h2/h3 sequence in both editions (a translation Markdown re-reads as a list drops its
    heading), and the language switch goes to the same page in the other edition and back."""
    zh = edition_root(server, "zh")
    page.goto(f"{server}/{name}.html", wait_until="load")
    english = page.evaluate(HEADINGS)
    switch = page.locator("a[data-minikv-language-switch]")
    assert switch.count() == 1 and switch.inner_text().strip() == "中文", f"{name}: no switch to 中文"
    switch.click()
    page.wait_for_load_state("load")
    assert page.url == f"{zh}/{name}.html", page.url
    assert page.evaluate("document.documentElement.lang") == "zh-CN", f"zh/{name}: not marked as Chinese"
    chinese = page.evaluate(HEADINGS)
    assert [h["level"] for h in chinese] == [h["level"] for h in english], (
        f"zh/{name}: headings differ from the English page (a heading dropped or added?)\n"
        f"en: {[h['level'] + ' ' + h['text'] for h in english]}\nzh: {[h['level'] + ' ' + h['text'] for h in chinese]}"
    )
    empty = [h["level"] for h in chinese if not h["text"]]
    assert empty == [], f"zh/{name}: empty headings {empty}"
    # A heading whose translation Sphinx could not use (re-read as a list) stays English.
    translated = translated_headings(name)
    kept = [en["text"] for en, zh in zip(english, chinese, strict=True) if plain(en["text"]) in translated and zh == en]
    assert kept == [], f"zh/{name}: translated headings shown in English {kept} (see scripts/i18n.py check)"
    back = page.locator("a[data-minikv-language-switch]")
    assert back.count() == 1 and back.inner_text().strip() == "English", f"zh/{name}: no switch to English"
    back.click()
    page.wait_for_load_state("load")
    assert page.url == f"{server}/{name}.html", page.url


def search(page, root: str, query: str) -> list[str]:
    page.goto(f"{root}/search.html?q={query}", wait_until="load")
    # Sphinx's searchtools.js writes its summary ("found N pages") into p.search-summary when done.
    page.wait_for_function("() => document.querySelector('#search-results p.search-summary')?.innerText.trim()")
    return page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.getAttribute('href'))")


def test_chinese_search_finds_identifiers_and_chinese_terms(page, server: str) -> None:
    """The zh edition's search finds an identifier and, once translated, a Chinese term (_ext/zh_search.py)."""
    zh = edition_root(server, "zh")
    assert any("api" in href for href in search(page, zh, "RadixCacheManager"))
    sys.path.insert(0, str(REPO / "scripts"))
    import i18n

    glossary = REPO / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "glossary.po"
    heading = {e.msgid: e.msgstr for e in i18n.read_catalog(glossary, "book/glossary")}.get("prefix matching", "")
    if "前缀匹配" not in heading:
        pytest.skip("the glossary is not translated yet: no Chinese term to search for")
    found = search(page, zh, "前缀匹配")
    assert any("glossary" in href for href in found), found


def test_chinese_search_finds_every_glossary_term_and_common_synonyms(page, server: str) -> None:
    """Every term of the zh glossary, however long, and the synonyms readers type find the glossary."""
    zh = edition_root(server, "zh")
    page.goto(f"{zh}/book/glossary.html", wait_until="load")
    terms = page.eval_on_selector_all("dl.glossary dt", "dts => dts.map(dt => dt.innerText.replace('¶', '').trim())")
    assert len(terms) > 40, terms
    missed = [term for term in terms if not any("glossary" in href for href in search(page, zh, term))]
    assert missed == [], f"zh search does not find these glossary terms: {missed}"
    for synonym in ("淘汰", "加锁"):
        assert any("glossary" in href for href in search(page, zh, synonym)), synonym


@pytest.mark.parametrize("width", [800, 1024, 1280, 1440, 1920])
def test_language_switch_sits_in_the_header_and_keeps_the_reader_s_place(page, server: str, width: int) -> None:
    """The edition link is inside the article header's row at every common width, and following it
    from the middle of a page lands on the same section of the other edition, and back."""
    zh = edition_root(server, "zh")
    page.set_viewport_size({"width": width, "height": 900})
    for root, other in ((server, zh), (zh, server)):
        page.goto(f"{root}/book/05_radix.html", wait_until="load")
        section = page.evaluate("() => document.querySelectorAll('article.bd-article section[id]')[3].id")
        # a little into the section, as a reader would be (instantly: the theme scrolls smoothly)
        page.evaluate(
            "id => window.scrollTo({top: document.getElementById(id).getBoundingClientRect().top + window.scrollY"
            " - 60, behavior: 'instant'})",
            section,
        )
        place = page.evaluate(
            """() => {
            const link = document.querySelector('a[data-minikv-language-switch]').getBoundingClientRect();
            const header = document.querySelector('.bd-header-article').getBoundingClientRect();
            return {link: [link.top, link.bottom], box: [link.left, link.right], header: [header.top, header.bottom]};
        }"""
        )
        (top, bottom), (header_top, header_bottom) = place["link"], place["header"]
        assert header_top <= top and bottom <= header_bottom, (
            f"{width}px: the switch {place['link']} leaves the header {place['header']}"
        )
        # a click where the link is (Playwright's own click() would scroll the page first)
        with page.expect_navigation(wait_until="load"):
            page.mouse.click((place["box"][0] + place["box"][1]) / 2, (top + bottom) / 2)
        assert page.url == f"{other}/book/05_radix.html#{section}", page.url
        page.wait_for_timeout(200)
        top = page.evaluate("id => document.getElementById(id).getBoundingClientRect().top", section)
        assert 0 <= top < 200, (
            f"{width}px: the other edition opened with section {section!r} at {top}px, not at the top"
        )


@pytest.mark.parametrize("width", [800, 1280])
def test_a_table_wider_than_the_column_says_that_it_scrolls(page, site: str, width: int) -> None:
    """The guarantees table overflows the column; a reader must see that more columns are to the right."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{site}/book/guarantees.html", wait_until="load")
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('.pst-scrollable-table-container')].map(box => ({
            wide: box.scrollWidth > box.clientWidth + 1,
            marked: box.classList.contains('minikv-wide-table'),
            hint: getComputedStyle(box, '::before').content,
        }))"""
    )
    assert any(box["wide"] for box in boxes), f"{width}px: no table overflows, the test shows nothing"
    for box in boxes:
        assert box["marked"] == box["wide"], box
        if box["wide"]:
            assert "→" in box["hint"], box


@pytest.mark.parametrize("width", [1024, 1280, 1440, 1920])
def test_the_article_header_stays_one_row(page, site: str, width: int) -> None:
    """The header's buttons and the edition link fit one row: the header is no taller than at 1920 px."""
    heights = []
    for each in (1920, width):
        page.set_viewport_size({"width": each, "height": 900})
        page.goto(f"{site}/book/05_radix.html", wait_until="load")
        header = "() => document.querySelector('.bd-header-article').getBoundingClientRect().height"
        heights.append(page.evaluate(header))
    assert heights[1] <= heights[0] + 1 and heights[0] < 80, f"{width}px: header {heights[1]}px, {heights[0]}px at 1920"


def drawn_texts(page, url: str) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """The words a reader sees in the page's pictures: players (captions, details, buttons, SVG text),
    and the SVG images of trees, slot strips and plots (their ``<text>`` elements)."""
    page.goto(url, wait_until="load")
    players = page.evaluate(
        """() => [...document.querySelectorAll('main [data-minikv-player]')].flatMap(p => [
                 ...[...p.querySelectorAll('.mkp-caption, .mkp-details, button, text')].map(e => e.textContent),
                 ...[...p.querySelectorAll('[title]')].map(e => e.getAttribute('title'))])"""
    )
    images = page.evaluate(
        """async () => {
             const sources = [...document.querySelectorAll('main img')].map(i => i.src).filter(s => s.endsWith('.svg'));
             const texts = [];
             for (const src of sources) {
               const svg = new DOMParser().parseFromString(await (await fetch(src)).text(), 'image/svg+xml');
               texts.push(...[...svg.querySelectorAll('text')].map(t => t.textContent));
             }
             return texts;
           }"""
    )
    return {"players": players, "images": images}


@pytest.mark.parametrize("name", ["book/03_storage", "book/04_naive", "book/05_radix"])
def test_chinese_chapters_draw_in_chinese(page, server: str, name: str) -> None:
    """zh chapters 3-5: no label of minikv.viz.labels left in English in a player, a tree or a plot.

    A text the catalog can still translate is an English label the zh build missed; titles and
    notes a notebook writes itself, token words and exception messages are not labels.
    """
    from minikv.viz.labels import translate

    def untranslated(text: str) -> bool:
        plain = " ".join(text.split())
        return translate(plain) != plain

    zh = edition_root(server, "zh")
    english = drawn_texts(page, f"{server}/{name}.html")
    chinese = drawn_texts(page, f"{zh}/{name}.html")
    kinds = ("players", "images") if name == "book/05_radix" else ("images",)
    for kind in kinds:
        assert english[kind] and len(chinese[kind]) == len(english[kind]), kind
        assert any(untranslated(t) for t in english[kind]), f"{name}: no label found in its {kind}"
        left = sorted({t for t in chinese[kind] if untranslated(t)})
        assert left == [], f"zh/{name}: {kind} still show English labels {left[:10]}"
    if name == "book/05_radix":
        page.goto(f"{zh}/{name}.html", wait_until="load")
        assert page.evaluate("[toggleHintShow, toggleHintHide]") == ["点击显示", "点击隐藏"]  # sphinx-togglebutton's
        joined = " ".join(chinese["players"] + chinese["images"])
        for word in ("受保护", "可驱逐", "槽位", "命中率", "播放"):
            assert word in joined, f"zh/{name}: no {word!r} in its pictures"
