"""The built book, as a reader sees it: every page in headless Chromium.

`make test` builds the book before running pytest; run alone without `_build/html`,
these tests skip and say how to build it. Debian's Chromium is driven through Playwright for
Python with the system browser (no browser download).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from headless import chromium, needs_chromium, serve

REPO = Path(__file__).resolve().parent.parent
HTML = REPO / "_build" / "html"
# Paths of the machine that executed the notebooks (the book's own examples, such as
# "/home/user/doc1.txt" in chapter 5, are fine).
MACHINE_PATHS = re.compile(r"(/work/|/root/|site-packages|\.venv/|/tmp/tmp|/usr/lib/python)")

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
def site() -> Iterator[str]:
    if not (HTML / "index.html").exists():
        pytest.skip(
            "the book is not built: run `make book` (or `.venv/bin/jupyter-book build .`) first; `make test` builds it"
        )
    with serve(HTML) as address:
        yield address


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
    text = page.locator("main").inner_text()
    assert "Traceback (most recent call last)" not in text, f"{name}: shows a traceback"
    leak = MACHINE_PATHS.search(text)
    assert leak is None, f"{name}: shows a machine path near {text[max(0, leak.start() - 60) : leak.end() + 60]!r}"


@pytest.mark.parametrize("name", notebook_pages())
def test_colab_link_points_at_the_notebook_on_main(page, site: str, name: str) -> None:
    page.goto(f"{site}/{name}.html", wait_until="load")
    hrefs = page.eval_on_selector_all("a[href*='colab.research.google.com']", "links => links.map(a => a.href)")
    assert hrefs, f"{name}: no Colab launch link"
    assert all(href.endswith(f"/blob/main/{name}.ipynb") for href in hrefs), hrefs


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
