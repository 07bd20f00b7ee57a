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


def eviction() -> TreeRecorder:
    """Chapter 5's full example, shortened: no request runs, evict(2) takes 4 slots, then the pool takes them."""
    vocab = Vocab()
    manager, pool = RadixCacheManager(), PagePool(NUM_SLOTS)
    rec = TreeRecorder(manager, vocab, pool=pool)
    for text in ("Hello world", "Hello there", "Hello world how are you"):
        finish(rec, pool, admit(rec, pool, vocab.encode(text)))
    evicted = rec.evict(2)  # "there" and "how are you"
    assert len(evicted) == EVICTED
    pool.free(evicted)
    rec.note("the pool takes the evicted slots back")
    return rec


EVICTED = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    rec, pool = recording()
    evicting = eviction()
    root = tmp_path_factory.mktemp("strip_page")
    (root / "now.svg").write_text(draw_tree(rec, rec.vocab, pool=pool).svg(), encoding="utf-8")
    (root / "evict.svg").write_text(evicting.frames[-2].svg(), encoding="utf-8")  # the evict frame, as an image
    player = rec.player()
    (root / "index.html").write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>strip</title></head><body>\n'
        f'<section id="player">{player.html}</section>\n'
        f'<section id="eviction">{evicting.player(open_at=len(evicting.frames) - 2).html}</section>\n'
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


def strip_of(page: object, player: str) -> list[str]:
    """The fill of each strip cell in ``player``'s shown frame, slot 0 first (every cell visible)."""
    cells = page.eval_on_selector(f"{player} .minikv-player", STRIP_CELLS)  # type: ignore[attr-defined]
    strip = [c for c in cells if c[1] is not None and c[1] in {look.fill for look in SLOT_LOOKS.values()}]
    assert [n for n, _, _ in strip][:NUM_SLOTS] == list(range(NUM_SLOTS))
    assert all(visible for _, _, visible in strip[:NUM_SLOTS])
    return [fill for _, fill, _ in strip[:NUM_SLOTS]]


def test_evicted_slots_render_on_their_way_to_the_pool_in_the_player(served, browser) -> None:
    page = browser.new_page()
    try:
        page.goto(served + "index.html")
        eviction = page.locator("#eviction .mkp-frame:visible")  # the frame shown, not hidden ones
        shown = "fs => fs.filter(f => getComputedStyle(f).display !== 'none')[0].textContent"
        assert page.eval_on_selector_all("#eviction .mkp-frame", shown).startswith("13. evict 2: removed [there]")
        fills = strip_of(page, "#eviction")
        assert fills.count(SLOT_LOOKS["evicted"].fill) == EVICTED
        assert SLOT_LOOKS["request"].fill not in fills  # no request runs
        assert eviction.get_by_text(f"evicted, on its way to the pool: {EVICTED}").is_visible()
        assert eviction.get_by_text("owned by a running request: 0").is_visible()
        page.click("#eviction .mkp-next")  # the pool takes them back
        assert page.eval_on_selector_all("#eviction .mkp-frame", shown).startswith("14. the pool takes")
        fills = strip_of(page, "#eviction")
        assert SLOT_LOOKS["evicted"].fill not in fills and SLOT_LOOKS["request"].fill not in fills
        assert fills.count(SLOT_LOOKS["free"].fill) == NUM_SLOTS - 2
    finally:
        page.close()


def test_evicted_slots_render_in_a_static_image(served, browser) -> None:
    page = browser.new_page()
    try:
        page.goto(served + "evict.svg")
        texts = page.eval_on_selector_all("text", "ts => ts.map(t => t.textContent)")
        assert f"evicted, on its way to the pool: {EVICTED}" in texts
        assert "owned by a running request: 0" in texts
        fills = page.eval_on_selector_all("polygon", "ps => ps.map(p => p.getAttribute('fill'))")
        assert fills.count(SLOT_LOOKS["evicted"].fill) == EVICTED + 1  # the cells, and the legend's swatch
        border = f'polygon[stroke="{SLOT_LOOKS["evicted"].border}"][stroke-dasharray]'
        assert page.eval_on_selector_all(border, "ps => ps.length") == EVICTED + 1  # drawn dashed, like a ghost
    finally:
        page.close()
