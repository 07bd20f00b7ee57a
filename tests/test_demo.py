"""minikv.course.demo: the helpers the book's demonstrations share."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from minikv import NaiveCacheManager, RadixCacheManager, admit, finish
from minikv.course.demo import (
    Server,
    html_table,
    new_server,
    print_captions,
    print_tree,
    say,
    show_error,
    token_kv,
    tokens_in_slots,
)
from minikv.course.vocab import Vocab
from minikv.errors import ArgumentError, ArgumentTypeError, OutOfSlotsError
from minikv.lifecycle import store
from minikv.viz import TreeRecorder


def test_say_wraps_to_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    say("word " * 40, "  ")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line) <= 76 for line in lines)
    assert lines[0].startswith("  word") and lines[1].startswith("      word")
    say("short", width=10)
    assert capsys.readouterr().out == "short\n"


def test_show_error(capsys: pytest.CaptureFixture[str]) -> None:
    show_error(OutOfSlotsError("no room"), "admit: ")
    assert capsys.readouterr().out == "admit: OutOfSlotsError: no room\n"
    with pytest.raises(ArgumentTypeError):
        show_error("not an error")


def test_token_kv_and_read_back() -> None:
    kv_fn = token_kv(num_kv_heads=2, head_dim=3)
    k, v = kv_fn(0, torch.tensor([5, 6, 7]), 1)
    assert k.shape == (2, 2, 3) and k.dtype == torch.float32
    assert k[:, 0, 0].tolist() == [6, 7] and torch.equal(v, -k) and bool((k[1] == 7).all())
    with pytest.raises(ArgumentError, match="head_dim"):
        token_kv(head_dim=0)


def test_new_server_with_cached_prompts() -> None:
    server = new_server(12, cached=[[1, 2, 3], [1, 2, 4]])
    manager, pool, kv_cache = server
    assert isinstance(server, Server) and isinstance(manager, RadixCacheManager)
    assert server.kv_cache is kv_cache and kv_cache.num_layers == 1
    handle, slots = manager.match_prefix([1, 2, 4, 9])
    assert handle.cached_len == 3 and tokens_in_slots(kv_cache, slots) == [1, 2, 4]
    assert pool.num_free_slots + manager.size_info.total_size == 12  # no slot is lost
    manager.check_integrity()


def test_new_server_paged_and_layered() -> None:
    manager, pool, kv_cache = new_server(16, page_size=4, num_layers=2, num_kv_heads=2, cached=[list(range(8))])
    handle, slots = manager.match_prefix(list(range(8)))
    assert handle.cached_len == 8
    assert tokens_in_slots(kv_cache, slots, layer=1) == list(range(8))
    assert pool.page_size == kv_cache.page_size == 4


def test_lifecycle_by_hand_reads_back_the_tokens() -> None:
    manager, pool, kv_cache = new_server(8)
    request = admit(manager, pool, [3, 1, 4])
    store(request, kv_cache, token_kv())
    assert tokens_in_slots(kv_cache, request.indices) == [3, 1, 4]
    finish(manager, pool, request)


def test_new_server_naive_and_bad_arguments() -> None:
    manager, _, _ = new_server(4, manager="naive")
    assert isinstance(manager, NaiveCacheManager)
    with pytest.raises(ArgumentError, match="radix"):
        new_server(4, manager="lru")
    with pytest.raises(ArgumentError, match="whole number of pages"):
        new_server(6, page_size=4)
    with pytest.raises(ArgumentError, match="num_slots"):
        new_server(0)
    with pytest.raises(ArgumentError, match="naive"):
        new_server(8, manager="naive", page_size=2)


def test_print_tree_and_captions(capsys: pytest.CaptureFixture[str]) -> None:
    vocab = Vocab()
    rec = TreeRecorder(RadixCacheManager(), vocab)
    rec.insert_prefix(vocab.encode("Hello world"), [0, 1])
    print_captions(rec.frames)
    assert capsys.readouterr().out.splitlines() == [
        "0 | start: the tree is empty",
        "1 | insert [Hello world]: added [Hello world] (2 slots); 0 tokens already",
        "    cached (the return value)",
    ]
    print_tree(rec, vocab, values=False)
    assert capsys.readouterr().out.splitlines()[1] == "└─ [Hello world] · ref 0 · t=1"


def test_html_table() -> None:
    table = html_table(["name", "n"], [["<code>a</code>", 1], ["b", 22]], "lr")
    text = table.data
    assert text.count("<tr>") == 3 and "<code>a</code>" in text
    assert 'text-align:right; vertical-align:top; padding:2px 8px; white-space:nowrap;">22</td>' in text
    assert "nowrap" not in html_table(["x"], [["y"]], nowrap=False).data
    with pytest.raises(ArgumentError, match="align"):
        html_table(["x"], [], "c")


def test_show_source_reads_the_package() -> None:
    from minikv.course.demo import SourceListing, show_source
    from minikv.radix_manager import RadixTreeNode

    listing = show_source(RadixCacheManager.evict)
    assert isinstance(listing, SourceListing)
    assert listing.text.startswith("def evict(self")  # dedented: a method reads as a function
    assert repr(listing) == listing.text
    markdown = listing._repr_markdown_()
    assert markdown.startswith("```python\n") and markdown.endswith("\n```")
    assert show_source(RadixTreeNode).text.startswith("class RadixTreeNode")
    from minikv import SizeInfo

    assert show_source(SizeInfo.total_size).text.startswith("@property")  # a property: its getter


def test_show_source_refuses_what_is_not_minikv() -> None:
    from minikv.course.demo import show_source

    with pytest.raises(ArgumentError, match="obj: show_source shows minikv's own code"):
        show_source(textwrap_fill)
    with pytest.raises(ArgumentError, match="obj"):
        show_source(42)


def textwrap_fill() -> None:
    """Defined in a test module: not minikv's code."""


def test_glue_emits_what_myst_nb_reads(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import IPython.display

    from minikv.course.demo import GLUE_PREFIX, glue

    monkeypatch.setitem(sys.modules, "myst_nb", None)  # any import of myst_nb now fails: Colab has none
    shown: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kwargs: shown.append((objs, kwargs)))
    glue("smallest_pool", 280)
    glue("rate", 0.25, display=True)
    assert shown == [
        (
            ({GLUE_PREFIX + "text/plain": "280"},),
            {"raw": True, "metadata": {"scrapbook": {"name": "smallest_pool", "mime_prefix": GLUE_PREFIX}}},
        ),
        (({"text/plain": "0.25"},), {"raw": True, "metadata": {"scrapbook": {"name": "rate", "mime_prefix": ""}}}),
    ]
    assert capsys.readouterr().out == "smallest_pool = 280\n"  # hidden: printed; displayed: shown already
    with pytest.raises(ArgumentError, match="name"):
        glue("", 1)


def test_glue_matches_myst_nb_and_its_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundle is myst-nb's own, and myst-nb's extraction (what the book build runs) reads it back."""
    import IPython.display
    import nbformat

    glue_module = pytest.importorskip("myst_nb.ext.glue")
    from minikv.course.demo import GLUE_PREFIX, glue

    assert GLUE_PREFIX == glue_module.GLUE_PREFIX
    calls: dict[str, list[Any]] = {"minikv": [], "myst_nb": []}
    for who, fn in (("minikv", glue), ("myst_nb", glue_module.glue)):
        monkeypatch.setattr(glue_module, "ipy_display", lambda *objs, _w=who, **kw: calls[_w].append((objs, kw)))
        monkeypatch.setattr(IPython.display, "display", lambda *objs, _w=who, **kw: calls[_w].append((objs, kw)))
        fn("x", [1, 2], display=False)
        fn("y", 0.5, display=True)
    assert calls["minikv"] == calls["myst_nb"]
    (objs, kwargs), _ = calls["minikv"]
    output = nbformat.v4.new_output("display_data", data=objs[0], metadata=kwargs["metadata"])
    cell = nbformat.v4.new_code_cell(outputs=[output])
    ((key, stored),) = glue_module.extract_glue_data_cell(cell)
    assert key == "x" and stored["data"] == {"text/plain": "[1, 2]"} and cell.outputs == []
