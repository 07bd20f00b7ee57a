"""minikv.viz.tree: the drawing of a tree -- node labels, the style of each state, ghosts, determinism."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from viz_scenario import (
    HW,
    P_HELLO,
    P_HT,
    P_HW,
    P_HWHAY,
    WORDS,
    attrs,
    edge_line,
    manager_with,
)

from minikv import NaiveCacheManager, PagePool, RadixCacheManager, RadixTreeNode, admit, finish
from minikv.errors import ArgumentError, ArgumentTypeError, IntegrityError, MiniKVError
from minikv.viz import (
    GraphvizMissingError,
    TreeDrawing,
    TreeRecorder,
    TreeSnapshot,
    Vocab,
    draw_snapshot,
    draw_tree,
    node_id,
)


def test_split_frame_styles(scenario: TreeRecorder) -> None:
    dot = scenario.frames[2].dot
    hello, world, there = attrs(dot, node_id(P_HELLO)), attrs(dot, node_id(P_HW)), attrs(dot, node_id(P_HT))
    assert hello["class"] == "interior split" and world["class"] == "evictable split"
    assert there["class"] == "evictable inserted"
    split_colour = hello["color"]
    assert world["color"] == split_colour and there["color"] != split_colour
    assert hello["penwidth"] == world["penwidth"] == there["penwidth"] == "3"
    assert hello["fillcolor"] != world["fillcolor"]  # interior vs evictable leaf
    assert world["fillcolor"] == there["fillcolor"]
    assert "<B>Hello</B>" in hello["label"] and ">0</FONT>" in hello["label"] and "ref 0 · t 2" in hello["label"]
    assert "<B>world</B>" in world["label"] and ">1</FONT>" in world["label"] and "ref 0 · t 1" in world["label"]
    assert "<B>there</B>" in there["label"] and ">3</FONT>" in there["label"]
    root = attrs(dot, "root")
    assert root["class"] == "root" and root["shape"] == "oval"
    assert f'color="{split_colour}"' in edge_line(dot, node_id(P_HELLO), node_id(P_HW))
    # the legend lists what this frame shows: a split and an insert, but no ghost and no lock
    assert "the two halves of a split" in dot and "just inserted" in dot
    assert "just evicted (ghost)" not in dot and "protected: locked" not in dot


def test_the_legend_lists_only_what_the_drawing_shows() -> None:
    tree = RadixCacheManager()
    assert '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">' not in draw_tree(tree).source  # empty
    tree.insert_prefix([1, 2], [0, 1])
    one_leaf = draw_tree(tree).source
    assert "evictable leaf" in one_leaf and "protected: locked" not in one_leaf and "interior" not in one_leaf
    handle, _ = tree.match_prefix([1, 2, 3])
    tree.lock_handle(handle)
    assert "protected: locked" in draw_tree(tree).source
    assert "evictable leaf" not in draw_tree(tree).source


def test_match_frame_marks_the_walked_path(scenario: TreeRecorder) -> None:
    dot = scenario.frames[4].dot
    for path in (P_HELLO, P_HW, P_HWHAY):
        assert attrs(dot, node_id(path))["class"].endswith(" walked")
    assert attrs(dot, node_id(P_HT))["class"] == "evictable"
    assert "penwidth=2.5" in edge_line(dot, "root", node_id(P_HELLO))
    assert "penwidth" not in edge_line(dot, node_id(P_HELLO), node_id(P_HT))


def test_locked_path_is_protected(scenario: TreeRecorder) -> None:
    dot = scenario.frames[5].dot
    protected = [attrs(dot, node_id(p)) for p in (P_HELLO, P_HW, P_HWHAY)]
    assert [a["class"] for a in protected] == ["protected"] * 3
    assert all("ref 1 · t" in a["label"] for a in protected)
    there = attrs(dot, node_id(P_HT))
    assert there["class"] == "evictable" and there["fillcolor"] != protected[0]["fillcolor"]
    leaf = protected[2]["label"]
    assert all(f"<B>{w}</B>" in leaf for w in ("how", "are", "you"))
    assert all(f">{s}</FONT>" in leaf for s in (4, 5, 6))


def test_evicted_node_is_a_ghost(scenario: TreeRecorder) -> None:
    frame = scenario.frames[7]
    dot = frame.dot
    ghost = attrs(dot, node_id(P_HT, ghost=True))
    assert ghost["class"] == "evicted" and "dashed" in ghost["style"] and "filled" not in ghost["style"]
    assert "evicted: slots freed" in ghost["label"] and "<B>there</B>" in ghost["label"]
    assert f"{node_id(P_HT)} [" not in dot  # the live node is gone
    assert "style=dashed" in edge_line(dot, node_id(P_HELLO), node_id(P_HT, ghost=True))
    assert repr(frame.drawing) == "<TreeDrawing: 4 nodes, 1 just evicted>"
    assert attrs(dot, node_id(P_HELLO))["class"] == "protected"


def test_unlocked_tree_states(scenario: TreeRecorder) -> None:
    dot = scenario.frames[8].dot
    assert attrs(dot, node_id(P_HELLO))["class"] == "interior"
    assert attrs(dot, node_id(P_HW))["class"] == "interior"
    assert attrs(dot, node_id(P_HWHAY))["class"] == "evictable"
    last = scenario.frames[9].dot
    assert attrs(last, node_id(P_HW))["class"] == "evictable"  # a leaf again, once its child went
    assert attrs(last, node_id(P_HWHAY, ghost=True))["class"] == "evicted"


def test_draw_tree_now_has_no_highlights(scenario: TreeRecorder) -> None:
    drawing = draw_tree(scenario, WORDS)  # the recorder stands in for its manager
    assert isinstance(drawing, TreeDrawing)
    assert repr(drawing) == "<TreeDrawing: 3 nodes>"
    classes = [c.strip('"') for c in re.findall(r'class=("[^"]*"|\w+)', drawing.source)]
    assert sorted(classes) == ["evictable", "interior", "root"]
    assert "the two halves of a split" not in draw_tree(scenario, WORDS, legend=False).source


def test_title_and_hidden_columns() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix(list(range(20)), list(range(20)))
    source = draw_tree(manager, title="a <long> node", max_columns=4).source
    assert "a &lt;long&gt; node" in source and "… +16" in source
    with pytest.raises(ArgumentError, match="max_columns"):
        draw_tree(manager, max_columns=0)


def test_pages_are_boxed_columns() -> None:
    vocab = Vocab()
    rec = TreeRecorder(RadixCacheManager(page_size=2), vocab)
    rec.insert_prefix(vocab.encode("a b c d e"), [0, 1, 2, 3, 4])
    assert rec.frames[-1].caption.endswith("last 1 token not inserted (a partial page)")
    rec.insert_prefix(vocab.encode("a b x y"), [6, 7, 8, 9])
    dot = rec.frames[-1].dot
    upper = attrs(dot, node_id((0, 1)))
    assert upper["class"] == "interior split"
    assert re.search(r'<TD BORDER="1"[^>]*><B>a b</B></TD>', upper["label"])
    lower = attrs(dot, node_id((0, 1, 2, 3)))["label"]
    assert "<B>c d</B>" in lower and ">2 3</FONT>" in lower
    assert "Boxed columns are pages of 2 slots." in dot


def test_vocab_forms_give_the_same_words() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix(HW, [0, 1])
    as_list = ["Hello", "world"]
    sources = {draw_tree(manager, v).source for v in (WORDS, as_list, WORDS.__getitem__, Vocab(as_list))}
    assert len(sources) == 1 and "<B>Hello world</B>" not in sources.pop()  # one column per token
    plain = draw_tree(manager).source
    assert "<B>0</B>" in plain and "<B>1</B>" in plain
    assert "<B>7</B>" in draw_tree(manager_with([7]), WORDS).source  # unknown ids show as numbers
    with pytest.raises(ArgumentTypeError, match="vocab"):
        draw_tree(manager, "Hello world")
    with pytest.raises(ArgumentTypeError, match="vocab"):
        draw_tree(manager, 3.5)


def test_words_are_escaped_for_dot_and_svg() -> None:
    manager = manager_with([0, 1])
    drawing = draw_tree(manager, {0: "<b>&", 1: 'say "hi"'})
    assert "<B>&lt;b&gt;&amp;</B>" in drawing.source
    svg = drawing.svg()
    assert "&lt;b&gt;&amp;" in svg and svg.lstrip().startswith("<?xml")


def test_missing_dot_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    drawing = draw_tree(manager_with([0, 1]))
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `dot` anywhere
    assert "digraph radix_tree" in drawing.source  # building DOT text needs no graphviz program
    with pytest.raises(GraphvizMissingError, match="apt-get install -y graphviz"):
        drawing.svg()
    with pytest.raises(GraphvizMissingError):
        drawing._repr_mimebundle_()
    assert isinstance(GraphvizMissingError("x"), MiniKVError)


def test_children_are_ordered_by_token() -> None:
    first, second = RadixCacheManager(), RadixCacheManager()
    prompts = [[5, 1], [5, 9], [5, 3], [2]]
    for i, ids in enumerate(prompts):
        first.insert_prefix(ids, [2 * i, 2 * i + 1][: len(ids)])
    for i, ids in reversed(list(enumerate(prompts))):
        second.match_prefix(ids)  # touch in another order: same tree, other timestamps
        second.insert_prefix(ids, [2 * i, 2 * i + 1][: len(ids)])
    order = [re.findall(r"^\t(n_\w+) \[", draw_tree(m).source, re.M) for m in (first, second)]
    assert order[0] == order[1]
    assert order[0] == [node_id(p) for p in ((2,), (5,), (5, 1), (5, 3), (5, 9))]


# -- the slot strip ---------------------------------------------------------------------


def strip_cells(dot: str) -> list[tuple[str, str]]:
    """(fill colour, slot number) of each cell of the slot strip, in order."""
    cell = r'<TD BGCOLOR="(#\w+)" COLOR="#\w+" BORDER="1"(?: STYLE="dashed")? WIDTH="22"[^>]*><FONT[^>]*>(\d+)</FONT>'
    return re.findall(cell, dot)


def test_the_slot_strip_colours_each_owner() -> None:
    from minikv.viz.tree import SLOT_LOOKS

    vocab = Vocab()
    manager, pool = RadixCacheManager(), PagePool(8)
    finish(manager, pool, admit(manager, pool, vocab.encode("Hello world how")))
    running = admit(manager, pool, vocab.encode("Hello world there you"))  # locks [Hello world], 2 new slots
    dot = draw_tree(manager, vocab, pool=pool).source
    cells = strip_cells(dot)
    assert [int(n) for _, n in cells] == list(range(8))
    fills = [fill for fill, _ in cells]
    owner = dict.fromkeys(pool.free_slots().tolist(), "free")
    owner.update({0: "locked", 1: "locked", 2: "evictable"})
    owner.update(dict.fromkeys(running.indices[running.cached_len :].tolist(), "request"))
    assert fills == [SLOT_LOOKS[owner[s]].fill for s in range(8)]
    assert "owned by a running request: 2" in dot and "in the tree, locked (ref &gt; 0): 2" in dot
    assert not strip_cells(draw_tree(manager, vocab).source)  # no pool, no strip
    assert strip_cells(draw_tree(manager, vocab, pool=pool, legend=False).source) == cells
    assert "running request" not in draw_tree(manager, vocab, pool=pool, legend=False).source


def test_the_strip_wraps_and_draw_pool_needs_no_tree() -> None:
    from minikv.viz.tree import draw_pool

    pool = PagePool(40)
    dot = draw_pool(pool, NaiveCacheManager(), title="the naive manager holds nothing").source
    assert [int(n) for _, n in strip_cells(dot)] == list(range(40))
    assert dot.count("<TR><TD></TD>") == 2  # 40 slots: rows of 16, 16 and 8
    assert "free in the pool: 40" in dot and "protected: locked" not in dot  # no tree legend
    assert "<svg" in draw_pool(pool).svg()
    paged = draw_pool(PagePool(10, page_size=3)).source
    assert paged.count("<TR><TD></TD>") == 1  # 30 slots in rows of 15: whole pages of 3
    with pytest.raises(ArgumentTypeError, match="slots"):
        draw_snapshot(TreeSnapshot.of(RadixCacheManager()), slots=pool)


def test_strip_reprs() -> None:
    from minikv.viz.tree import draw_pool

    pool = PagePool(4)
    assert repr(draw_pool(pool)) == "<TreeDrawing: a strip of 4 slots>"
    manager = manager_with([0, 1])
    assert repr(draw_tree(manager, pool=pool)) == "<TreeDrawing: 2 nodes, a strip of 4 slots>"
    assert repr(draw_tree(manager, pool=pool).copy()) == "<TreeDrawing: 2 nodes, a strip of 4 slots>"


def broken_tree(kind: str) -> RadixCacheManager:
    """A tree with a node of no tokens under [1, 2, 3], or a cycle back to the root or to itself."""
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    manager.insert_prefix([1, 2, 4], [0, 1, 5])
    shared = next(iter(manager.root_node.children.values()))
    if kind == "empty node":
        leaf = next(iter(shared.children.values()))
        empty = RadixTreeNode()
        empty.set_key_value(np.array([], dtype=np.int64), torch.empty(0, dtype=torch.int32))
        empty.parent = leaf
        leaf.children[99] = empty
    else:
        shared.children[77] = manager.root_node if kind == "cycle to the root" else shared
    return manager


def test_drawing_a_tree_with_an_empty_node_terminates() -> None:
    manager = broken_tree("empty node")
    drawing = draw_tree(manager)
    assert drawing.tree_nodes == len(TreeSnapshot.of(manager).nodes)
    assert "svg" in drawing.svg()[:200].lower()
    assert len(TreeRecorder(manager).frames[0].drawing.source) > 0


@pytest.mark.parametrize("kind", ["cycle to the root", "cycle to itself"])
def test_drawing_a_tree_with_a_cycle_is_refused_with_a_minikv_error(kind: str) -> None:
    manager = broken_tree(kind)
    with pytest.raises(IntegrityError, match="cycle"):
        TreeSnapshot.of(manager)
    with pytest.raises(IntegrityError, match="cycle"):
        draw_tree(manager)
