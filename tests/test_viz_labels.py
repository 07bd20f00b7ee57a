"""minikv.viz.labels: one catalog for every drawn word, both languages, readable back for the zh build."""

from __future__ import annotations

import html
import importlib.util
import re
import string
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from viz_scenario import HW, WORDS, run_scenario

from minikv import PagePool, RadixCacheManager
from minikv.engine import EngineRequest, make_engine
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.snapshot import SLOT_STATES
from minikv.tiny_model import TinyDecoder
from minikv.viz import (
    TreeRecorder,
    draw_engine,
    draw_overlap,
    draw_pool,
    draw_slot_table,
    get_language,
    plot_hit_rate,
    plot_lifecycle,
    plot_measures,
    plot_recomputed,
    plot_request_states,
    plot_sizes,
    record_overlap,
    record_timeline,
    set_language,
    storage,
)
from minikv.viz.labels import CATALOG, language, text, translate, translate_html
from minikv.viz.tree import STATE_WORDS

# Words that are code or units, the same in both editions (identifiers, class names, dtypes).
CODE_WORDS = {
    "token", "ref_count", "tp_size", "page_size", "rank", "kv_buffer", "k_cache", "store_kv", "match_prefix",
    "lock_handle", "insert_prefix", "allocate", "evict_from", "cache", "free", "evict", "req_to_token", "PagePool",
    "LayerFirst", "PageFirst", "MHAKVCache", "RadixCacheManager", "TinyDecoder", "Engine", "float32", "KV", "LRU",
    "MiB", "CPU", "overlap", "True", "False",
}  # fmt: skip


def course_key_terms() -> dict[str, tuple[str, tuple[str, ...]]]:
    """scripts/i18n.py's KEY_TERMS: the term list every catalog of the course follows."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "i18n.py"
    spec = importlib.util.spec_from_file_location("i18n", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return dict(module.KEY_TERMS)


def rows_read_result() -> SimpleNamespace:
    """What exercise 7's probe returns: request 1 read a row of request 0's page, and missed one of its own."""
    expected = np.zeros((2, 8), dtype=bool)
    expected[0, :3] = expected[1, 4:7] = True
    read = expected.copy()
    read[1, 3], read[1, 6] = True, False
    return SimpleNamespace(read=read, expected=expected, page_size=4, lens=[3, 3])


@pytest.fixture(autouse=True)
def english_after() -> Iterator[None]:
    yield
    set_language("en")


def english_words() -> set[str]:
    found: set[str] = set()
    for label in CATALOG.values():
        for english in (label.en, label.en_other or ""):
            literal = "".join(part for part, *_ in string.Formatter().parse(english))
            found |= set(re.findall(r"[A-Za-z_]{2,}", literal))
    return found - CODE_WORDS - set(WORDS.values())  # the scenario's token words are data


def test_every_label_has_both_languages_and_the_same_fields() -> None:
    for key, label in CATALOG.items():
        assert label.en.strip() and label.zh.strip(), key
        literal = "".join(part for part, *_ in string.Formatter().parse(label.zh))
        chinese = re.search(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]", literal)
        assert chinese or not re.search(r"[A-Za-z]", literal), f"{key}: no Chinese in {label.zh!r}"

        def fields(template: str) -> set[str]:
            return {name for _, name, _, _ in string.Formatter().parse(template) if name}

        assert fields(label.zh) == fields(label.en), key
        if label.en_other is not None:
            assert fields(label.en_other) == fields(label.en), key


def test_the_chinese_uses_the_course_terms() -> None:
    """The catalog's Chinese follows scripts/i18n.py's KEY_TERMS: no variant the term list forbids."""
    for key, label in CATALOG.items():
        for chinese, variants in course_key_terms().values():
            assert not any(v in label.zh for v in variants), f"{key}: {label.zh!r} uses a variant of {chinese!r}"


def test_the_english_of_shared_meanings_matches_their_sources() -> None:
    assert {state: text(f"slot.{state}", lang="en") for state in SLOT_STATES} == dict(SLOT_STATES)
    assert all(text(f"state.{key}", lang="en") == words for key, words in STATE_WORDS.items())


def test_language_setting_is_checked_and_scoped() -> None:
    assert get_language() == "en"
    with pytest.raises(ArgumentError, match="lang"):
        set_language("fr")
    with pytest.raises(ArgumentTypeError, match="lang"):
        set_language(None)  # type: ignore[arg-type]
    assert get_language() == "en"
    with language("zh"):
        assert text("count.slot", count=2) == "2 个槽位"
    assert text("count.slot", count=2) == "2 slots" and text("count.slot", count=1) == "1 slot"
    with pytest.raises(ArgumentError, match="key"):
        text("no.such.key")


# -- every picture kind, drawn in each language -----------------------------------------------


def pictures() -> dict[str, list[str]]:
    """The texts every kind of picture shows: captions, details, SVG text, plot text, player HTML."""
    rec = run_scenario()
    pool = PagePool(8, page_size=2)
    paged = TreeRecorder(RadixCacheManager(page_size=2), WORDS, pool=pool)
    slots = pool.allocate(4)
    paged.insert_prefix([*HW, *HW], slots)
    handle, _ = paged.match_prefix([*HW, *HW])
    paged.lock_handle(handle)
    paged.lock_handle(handle, unlock=True)
    paged.evict(2)
    paged.reset()
    engine = make_engine(TinyDecoder(), num_pages=12, page_size=4)
    engine.submit(EngineRequest(list(range(1, 12)), max_new_tokens=4))
    engine.step()
    svgs = [f.svg() for f in rec.frames + paged.frames]
    svgs += [draw_pool(pool, paged.manager).svg(), draw_engine(engine).svg()]
    # a request's life and the overlap loop over time: chunked prefill and a preemption in a tight pool
    timed = make_engine(TinyDecoder(), num_pages=12, max_running=3, prefill_budget=4)
    life = record_timeline(timed)
    timed.generate([list(range(1, 9)), list(range(2, 8)), [5, 6, 7]], 4)
    overlapped = make_engine(TinyDecoder(), num_pages=20, max_running=2, overlap=True)
    loop = record_overlap(overlapped)
    overlapped.generate([[1, 2, 3], [1, 2, 4], [5, 6]], 3)
    svgs += [life.svg(), draw_overlap(loop).svg()]
    caches = storage.simulated_ranks(8, 4, num_layers=2, head_dim=4, num_pages=4, device="cpu")
    figures = [
        plot_sizes(rec), plot_sizes(paged), storage.draw_layouts(caches[:1], layer=1, page=2),
        storage.draw_slots(caches[0], highlight=[0]), storage.draw_head_split(caches),
        plot_recomputed({"multi-turn chat": [[1, 2, 3], [1, 2, 4]]}, {"multi-turn chat": [0, 2]}),
        plot_request_states({"fcfs": [["waiting", "running"], ["running", "finished"]]}),
        plot_measures({"fcfs": {"preemptions": 1, "steps": 3}}, ["preemptions", "steps"]),
        draw_slot_table([[0, 1, 2, 3], [0, 1, 6, 7]], [4, 3], page_size=2, num_pages=4),
        storage.draw_rows_read(rows_read_result()),
    ]  # fmt: skip
    player = rec.player().html
    return {
        "captions": [f.caption for f in rec.frames + paged.frames],
        "details": [f.sizes_text for f in rec.frames + paged.frames],
        "svg": svgs,
        "plots": [fig._repr_svg_() for fig in figures],
        "player": [player],
    }


def shown_text(markup: str) -> list[str]:
    """The text a reader sees in SVG or player HTML: text elements, captions, details, buttons."""
    parts = re.findall(r"<text\b[^>]*>([^<]*)</text>", markup)
    parts += re.findall(r'class="mkp-(?:caption|details)">([^<]*)<', markup)
    parts += re.findall(r"<button[^>]*>([^<]*)</button>", markup)
    parts += re.findall(r'(?:title|aria-label)="([^"]*)"', markup)
    parts += re.findall(r'play\.innerHTML = "([^"]*)"', markup)
    return [html.unescape(p).replace("\xa0", " ") for p in parts]


def words_only(texts: list[str]) -> list[str]:
    return [t for t in texts if not re.fullmatch(r"[\d.,\s−-]*", t)]


def leftover_english(texts: list[str]) -> list[str]:
    words = english_words()
    found = []
    for piece in texts:
        plain = re.sub(r"\[[^\]]*\]", "", piece)  # token words are data, not labels
        plain = re.sub(r"[(（][A-Za-z]*Error: .*", "", plain)  # an exception's own message (minikv.errors)
        hits = [w for w in re.findall(r"[A-Za-z_]{2,}", plain) if w in words]
        if hits:
            found.append(f"{piece!r}: {hits}")
    return found


@pytest.fixture(scope="module")
def drawn() -> dict[str, dict[str, list[str]]]:
    english = pictures()
    set_language("zh")
    try:
        chinese = pictures()
    finally:
        set_language("en")
    return {"en": english, "zh": chinese}


def test_drawing_in_chinese_leaves_no_english_label(drawn) -> None:  # type: ignore[no-untyped-def]
    zh = drawn["zh"]
    texts = zh["captions"] + zh["details"]
    for markup in zh["svg"] + zh["plots"] + zh["player"]:
        texts += shown_text(markup)
    assert leftover_english(texts) == []
    assert any("驱逐" in t for t in zh["captions"]) and any("槽位" in t for t in texts)


def test_english_drawings_use_english_labels_only(drawn) -> None:  # type: ignore[no-untyped-def]
    en = drawn["en"]
    texts = en["captions"] + en["details"] + [t for m in en["svg"] + en["plots"] for t in shown_text(m)]
    assert not [t for t in texts if re.search(r"[\u4e00-\u9fff]", t)]


def test_translating_english_drawings_gives_the_chinese_ones(drawn) -> None:  # type: ignore[no-untyped-def]
    """What the zh build does to stored English outputs equals drawing in Chinese (text, not layout)."""
    en, zh = drawn["en"], drawn["zh"]
    assert [translate(c) for c in en["captions"]] == zh["captions"]
    assert [translate(d) for d in en["details"]] == zh["details"]
    for kind in ("svg", "plots", "player"):
        for english, chinese in zip(en[kind], zh[kind], strict=True):
            # tick numbers depend on the layout, which the longer or shorter words change
            assert words_only(shown_text(translate_html(english))) == words_only(shown_text(chinese)), kind


def test_translation_keeps_what_is_not_a_label() -> None:
    assert translate("step 3: request 1 retracted") == "step 3: request 1 retracted"
    assert translate("evictable leaf (ref 0)") == "可驱逐的叶子节点（引用 0）"
    assert translate("a sentence with evictable leaf (ref 0) inside") == "a sentence with evictable leaf (ref 0) inside"
    assert translate("evictable", "en") == "evictable"
    page = '<p>evictable</p><svg><text font-family="Helvetica,sans-Serif">evictable</text></svg>'
    out = translate_html(page)
    assert out.startswith("<p>evictable</p>") and ">可驱逐</text>" in out and "Noto Sans CJK SC" in out


def test_plots_show_as_deterministic_svg_with_text_as_text() -> None:
    assert all(f.__module__ == "minikv.viz.plots" for f in (plot_lifecycle, plot_hit_rate))
    first, second = plot_sizes(run_scenario())._repr_svg_(), plot_sizes(run_scenario())._repr_svg_()
    assert first == second
    assert "<text" in first and "Where the slots are" in first and "dc:date" not in first
