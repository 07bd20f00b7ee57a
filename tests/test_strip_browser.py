"""The slot strip in a real browser (headless system Chromium, driven by Playwright).

It must render, with its slot numbers and owner colours, both inside the
frame player and as a static SVG image (as the built book shows drawings).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from headless import chromium, needs_chromium, serve

from minikv import PagePool, RadixCacheManager, admit, finish
from minikv.viz import TreeRecorder, Vocab, draw_tree
from minikv.viz.tree import SLOT_LOOKS

NUM_SLOTS = 8

pytestmark = needs_chromium


def recording() -> tuple[TreeRecorder, PagePool]:
    vocab = Vocab()
    manager, pool = RadixCacheManager(), PagePool(NUM_SLOTS)
    rec = TreeRecorder(manager, vocab, pool=pool)
    finish(rec, pool, admit(rec, pool, vocab.encode("Hello world how")))
    admit(rec, pool, vocab.encode("Hello world there you"))
    rec.note("a request is running: [Hello world] locked, 2 slots its own")
    return rec, pool


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    rec, pool = recording()
    root = tmp_path_factory.mktemp("strip_page")
    (root / "now.svg").write_text(draw_tree(rec, rec.vocab, pool=pool).svg(), encoding="utf-8")
    player = rec.player()
    (root / "index.html").write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>strip</title></head><body>\n'
        f'<section id="player">{player.html}</section>\n'
        '<img id="static" src="now.svg" alt="the tree now, with its slot strip">\n</body></html>\n',
        encoding="utf-8",
    )
    with serve(root) as address:
        yield f"{address}/"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


STRIP_CELLS = """
(root) => {
  // the strip's cells: polygons filled with a slot colour, each with its slot number drawn inside
  const figure = [...root.querySelectorAll('.mkp-frame')].find(f => getComputedStyle(f).display !== 'none');
  const texts = [...figure.querySelectorAll('svg text')];
  return texts.filter(t => /^\\d+$/.test(t.textContent) && t.getAttribute('font-size') === '9.00').map(t => {
    const box = t.getBBox();
    const cell = [...figure.querySelectorAll('svg polygon')].find(p => {
      const b = p.getBBox();
      return p.getAttribute('fill') !== 'none' && b.width < 40 && b.x <= box.x && box.x + box.width <= b.x + b.width
        && b.y <= box.y && box.y + box.height <= b.y + b.height;
    });
    const rect = t.getBoundingClientRect();
    return [Number(t.textContent), cell ? cell.getAttribute('fill') : null, rect.width > 0 && rect.height > 0];
  });
}
"""


def test_the_strip_renders_in_the_player(served, browser) -> None:
    page = browser.new_page()
    try:
        page.goto(served + "index.html")
        caption = page.eval_on_selector_all(
            ".mkp-frame", "fs => fs.filter(f => getComputedStyle(f).display !== 'none')[0].textContent"
        )
        assert caption.startswith("3. insert [Hello world how]")  # opens on the first frame that shows something
        page.fill("#player .mkp-slider", str(page.eval_on_selector_all(".mkp-frame", "fs => fs.length") - 1))
        cells = page.eval_on_selector("#player .minikv-player", STRIP_CELLS)
        strip = [c for c in cells if c[1] is not None and c[1] in {look.fill for look in SLOT_LOOKS.values()}]
        assert [n for n, _, _ in strip][:NUM_SLOTS] == list(range(NUM_SLOTS))
        fills = [fill for _, fill, _ in strip[:NUM_SLOTS]]
        assert fills[:3] == [SLOT_LOOKS["locked"].fill] * 2 + [SLOT_LOOKS["evictable"].fill]
        assert fills.count(SLOT_LOOKS["request"].fill) == 2 and fills.count(SLOT_LOOKS["free"].fill) == 3
        assert all(visible for _, _, visible in strip[:NUM_SLOTS])
        assert page.locator("#player").get_by_text("owned by a running request: 2").first.is_visible()
    finally:
        page.close()


def test_the_strip_renders_as_a_static_image(served, browser) -> None:
    page = browser.new_page()
    try:
        page.goto(served + "index.html")
        page.wait_for_function("document.getElementById('static').complete")
        width = page.eval_on_selector("#static", "img => img.naturalWidth")
        assert width > 200
        page.goto(served + "now.svg")
        texts = page.eval_on_selector_all("text", "ts => ts.map(t => t.textContent)")
        assert [t for t in texts if t.isdigit()][:NUM_SLOTS] == [str(s) for s in range(NUM_SLOTS)]
        assert "owned by a running request: 2" in texts
    finally:
        page.close()
