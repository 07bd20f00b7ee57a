"""The frame player in a real browser: headless Chromium (the system one) driven by Playwright.

The page holds the same player twice, as a notebook page does when one
output is displayed twice: both copies must work, each on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from headless import chromium, needs_chromium, serve

from minikv import RadixCacheManager
from minikv.viz import TreeRecorder, Vocab

pytestmark = needs_chromium


def small_recording() -> TreeRecorder:
    vocab = Vocab()
    rec = TreeRecorder(RadixCacheManager(), vocab)
    rec.insert_prefix(vocab.encode("Hello world"), [0, 1])
    rec.insert_prefix(vocab.encode("Hello there"), [2, 3])
    handle, _ = rec.match_prefix(vocab.encode("Hello world"))
    rec.lock_handle(handle)
    rec.evict(1)
    return rec  # 6 frames: start, insert, insert, match, lock, evict


@pytest.fixture(scope="module")
def served_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    player = small_recording().player(interval_ms=120, open_at=0)  # from the first frame, whatever it shows
    root = tmp_path_factory.mktemp("player_page")
    (root / "index.html").write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>player test</title></head><body>\n'
        f'<section id="first">{player.html}</section>\n<p>text between the two outputs</p>\n'
        f'<section id="second">{player.html}</section>\n</body></html>\n',
        encoding="utf-8",
    )
    with serve(root) as address:
        yield f"{address}/index.html", len(player)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


def visible_frames(page, section: str) -> list[int]:
    return page.eval_on_selector_all(
        f"#{section} .mkp-frame",
        "frames => frames.flatMap((f, i) => getComputedStyle(f).display === 'none' ? [] : [i])",
    )


def visible_caption(page, section: str) -> str:
    return page.eval_on_selector_all(
        f"#{section} .mkp-frame",
        "frames => frames.filter(f => getComputedStyle(f).display !== 'none')"
        ".map(f => f.querySelector('figcaption').textContent).join('|')",
    )


def test_slider_next_and_play_change_the_frame(served_page, browser) -> None:
    url, n = served_page
    page = browser.new_page()
    try:
        page.goto(url)
        for section in ("first", "second"):
            assert page.get_attribute(f"#{section} .minikv-player", "data-ready") == "1"
            assert page.is_visible(f"#{section} .mkp-controls")
            assert visible_frames(page, section) == [0]
        assert page.inner_text("#first .mkp-counter") == f"1 / {n}"
        assert visible_caption(page, "first") == "0. start: the tree is empty"
        assert page.is_disabled("#first .mkp-prev")

        page.fill("#first .mkp-slider", "2")  # fires `input`, as dragging does
        assert visible_frames(page, "first") == [2]
        assert visible_caption(page, "first").startswith("2. insert [Hello there]: split [Hello world] after 1 token")
        assert page.inner_text("#first .mkp-counter") == f"3 / {n}"
        assert page.is_visible("#first .mkp-frame[data-index='2'] svg")
        assert visible_frames(page, "second") == [0], "the second copy must not follow the first"

        page.click("#first .mkp-next")
        assert visible_frames(page, "first") == [3]
        assert visible_caption(page, "first").startswith("3. match [Hello world]")
        assert page.input_value("#first .mkp-slider") == "3"

        page.click("#first .mkp-prev")
        assert visible_frames(page, "first") == [2]

        page.click("#first .mkp-play")
        assert "pause" in page.inner_text("#first .mkp-play")
        page.wait_for_function(
            f"document.querySelector('#first .mkp-counter').textContent === '{n} / {n}'", timeout=5000
        )
        page.wait_for_function("document.querySelector('#first .mkp-play').textContent.includes('play')", timeout=5000)
        assert visible_frames(page, "first") == [n - 1]
        assert visible_caption(page, "first") == f"{n - 1}. evict 1: removed [there] (1 slot)"
        assert page.is_disabled("#first .mkp-next")

        page.click("#second .mkp-next")  # the second copy works on its own
        assert visible_frames(page, "second") == [1]
        assert visible_frames(page, "first") == [n - 1]
    finally:
        page.close()


def test_keyboard_and_no_script_fallback(served_page, browser) -> None:
    url, n = served_page
    page = browser.new_page()
    try:
        page.goto(url)
        page.focus("#second .minikv-player")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert visible_frames(page, "second") == [2]
        page.keyboard.press("ArrowLeft")
        assert visible_frames(page, "second") == [1]
    finally:
        page.close()
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(url)
        # Without scripts (an untrusted notebook, a sanitising viewer) every frame shows, controls stay hidden.
        assert visible_frames(page, "first") == list(range(n))
        assert not page.is_visible("#first .mkp-controls")
    finally:
        context.close()


# -- contrast in the book's light and dark themes --------------------------------------------

BOOK_HTML = Path(__file__).resolve().parent.parent / "_build" / "html"
# Without a built book: the rules of its theme that matter here (pydata-sphinx-theme 0.17, measured):
# muted figcaption text, and in dark mode a light output area under the player.
FALLBACK_THEME_CSS = """
html[data-theme=light] body{background:#ffffff;color:#222832}
html[data-theme=dark] body{background:#121212;color:#ced6dd}
figcaption{color:#9ca4af}
html[data-theme=dark] .bd-content div.cell_output .text_html{background-color:#ced6dd;color:#121212;padding:.5rem}
"""
CONTRAST_JS = """
root => {
  const rgba = s => { const v = s.match(/[\\d.]+/g).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const lum = c => c.slice(0, 3).map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; })
                  .reduce((sum, x, k) => sum + x * [0.2126, 0.7152, 0.0722][k], 0);
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let out = [255, 255, 255];
    for (const c of layers.reverse()) out = out.map((o, k) => c[k] * c[3] + o * (1 - c[3]));
    return out;
  };
  const ratio = el => {
    const bg = background(el), fg = rgba(getComputedStyle(el).color);
    const text = fg.slice(0, 3).map((v, k) => v * fg[3] + bg[k] * (1 - fg[3]));
    const [hi, lo] = [lum(text), lum(bg)].sort((a, b) => b - a);
    return (hi + 0.05) / (lo + 0.05);
  };
  const out = {};
  for (const sel of [".mkp-caption", ".mkp-details", ".mkp-counter", ".mkp-controls button"]) {
    const el = root.querySelector(sel);
    if (el) out[sel] = ratio(el);
  }
  return out;
}
"""


def theme_page(root: Path, theme: str, player_html: str) -> None:
    """The player inside the same containers as a notebook output of the book, under the book's CSS."""
    if (BOOK_HTML / "_static").is_dir():
        links = "\n".join(
            f'<link rel="stylesheet" href="_static/{p.relative_to(BOOK_HTML / "_static").as_posix()}">'
            for p in sorted((BOOK_HTML / "_static").rglob("*.css"))
            if p.parent.name in ("styles", "_static")
        )
        (root / "_static").symlink_to(BOOK_HTML / "_static")
        styles = links
    else:
        styles = f"<style>{FALLBACK_THEME_CSS}</style>"
    (root / f"{theme}.html").write_text(
        f'<!DOCTYPE html>\n<html lang="en" data-theme="{theme}" data-mode="{theme}"><head><meta charset="utf-8">'
        f"<title>player, {theme}</title>{styles}</head><body>\n"
        '<main class="bd-main"><div class="bd-content"><article class="bd-article">'
        '<div class="cell docutils container"><div class="cell_output docutils container">'
        f'<div class="output text_html">{player_html}</div></div></div></article></div></main>\n</body></html>\n',
        encoding="utf-8",
    )


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_captions_and_controls_are_readable_in_both_themes(
    browser, tmp_path_factory: pytest.TempPathFactory, theme: str
) -> None:
    rec = small_recording()
    player = rec.player(interval_ms=120)
    root = tmp_path_factory.mktemp(f"theme_{theme}")
    theme_page(root, theme, player.html)
    with serve(root) as address:
        context = browser.new_context(color_scheme=theme)
        try:
            page = context.new_page()
            page.goto(f"{address}/{theme}.html", wait_until="load")
            assert page.evaluate("document.documentElement.dataset.theme") == theme
            ratios = page.eval_on_selector(".minikv-player", CONTRAST_JS)
            assert set(ratios) >= {".mkp-caption", ".mkp-counter", ".mkp-controls button"}, ratios
            low = {sel: round(r, 2) for sel, r in ratios.items() if r < 4.5}
            assert low == {}, f"{theme} theme: contrast below WCAG's 4.5:1: {low}"
        finally:
            context.close()
