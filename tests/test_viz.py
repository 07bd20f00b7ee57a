"""Tests of minikv.viz: tree drawings, the recorder, the frame player and the plots.

The main scenario is the notes' section 13.4: insert [Hello world], insert
[Hello there] (a split), insert [Hello world how are you]; match and lock it;
try to evict 2 (refused: only 1 slot is evictable), evict 1; unlock; evict 2.
"""

from __future__ import annotations

import random
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from minikv import NaiveCacheManager, PagePool, RadixCacheManager, admit, finish
from minikv.errors import ArgumentError, ArgumentTypeError, EvictionError, MiniKVError
from minikv.viz import (
    Frame,
    FramePlayer,
    GraphvizMissingError,
    TreeDrawing,
    TreeRecorder,
    TreeSnapshot,
    Vocab,
    draw_tree,
    node_id,
    plot_hit_rate,
    plot_lifecycle,
    plot_sizes,
)

HELLO, WORLD, THERE, HOW, ARE, YOU = range(6)
WORDS = {HELLO: "Hello", WORLD: "world", THERE: "there", HOW: "how", ARE: "are", YOU: "you"}
HW = [HELLO, WORLD]
HT = [HELLO, THERE]
HWHAY = [HELLO, WORLD, HOW, ARE, YOU]


def run_scenario(vocab=WORDS) -> TreeRecorder:
    rec = TreeRecorder(RadixCacheManager(), vocab)
    rec.insert_prefix(HW, [0, 1])
    rec.insert_prefix(HT, [2, 3])  # the caller then frees slot 2: the tree already holds "Hello"
    rec.insert_prefix(HWHAY, [0, 1, 4, 5, 6])  # request 3 matched 2 tokens, then allocated 4, 5, 6
    handle, indices = rec.match_prefix(HWHAY)
    assert indices.tolist() == [0, 1, 4, 5, 6]
    rec.lock_handle(handle)
    with pytest.raises(EvictionError):
        rec.evict(2)
    assert rec.evict(1).tolist() == [3]
    rec.lock_handle(handle, unlock=True)
    assert sorted(rec.evict(2).tolist()) == [4, 5, 6]
    rec.check_integrity()
    return rec


@pytest.fixture(scope="module")
def scenario() -> TreeRecorder:
    return run_scenario()


def node_line(dot: str, name: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f"{name} [")]
    assert len(lines) == 1, f"expected one line for node {name}, got {len(lines)}"
    return lines[0]


def attrs(dot: str, name: str) -> dict[str, str]:
    """The attributes of one DOT node statement; the HTML label is kept whole under 'label'."""
    line = node_line(dot, name)
    label = re.search(r"label=(<<.*?</TABLE>>|\"[^\"]*\"|\S+)", line)
    assert label is not None
    rest = line.replace(label.group(0), "")
    found = dict(re.findall(r'(\w+)=("[^"]*"|[^\s\]]+)', rest))
    found = {k: v.strip('"') for k, v in found.items()}
    found["label"] = label.group(1)
    return found


def edge_line(dot: str, tail: str, head: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f"{tail} -> {head}")]
    assert len(lines) == 1
    return lines[0]


P_HELLO, P_HW, P_HT, P_HWHAY = (HELLO,), tuple(HW), tuple(HT), tuple(HWHAY)


# -- captions ---------------------------------------------------------------------


def test_scenario_captions(scenario: TreeRecorder) -> None:
    captions = [f.caption for f in scenario.frames]
    assert captions[:6] == [
        "start: the tree is empty",
        "insert [Hello world]: added [Hello world] (2 slots); 0 tokens already cached (the return value)",
        "insert [Hello there]: split [Hello world] after 1 token; added [there] (1 slot); "
        "1 token already cached (the return value)",
        "insert [Hello world how are you]: added [how are you] (3 slots); 2 tokens already cached (the return value)",
        "match [Hello world how are you]: 5 of 5 tokens cached",
        "lock [Hello world how are you]: ref_count +1 on 3 nodes; 5 slots newly protected",
    ]
    assert captions[6].startswith("evict 2: refused (EvictionError: size: asked to evict 2 slots but only 1")
    assert captions[7:] == [
        "evict 1: removed [there] (1 slot)",
        "unlock [Hello world how are you]: ref_count -1 on 3 nodes; 5 slots evictable again",
        "evict 2: removed [how are you] (3 slots); freed 3 slots: whole nodes go",
    ]
    assert [f.operation for f in scenario.frames] == [
        "start", "insert", "insert", "insert", "match", "lock", "evict", "evict", "unlock", "evict",
    ]  # fmt: skip
    assert [f.index for f in scenario.frames] == list(range(10))


def test_match_that_splits_says_so() -> None:
    rec = TreeRecorder(RadixCacheManager(), WORDS)
    rec.insert_prefix(HW, [0, 1])
    rec.match_prefix(HT)
    assert rec.frames[-1].caption == "match [Hello there]: split [Hello world] after 1 token; 1 of 2 tokens cached"
    changes = rec.frames[-1].changes
    assert changes.split == ((P_HELLO, P_HW),)
    assert changes.walked == (P_HELLO,)
    assert changes.inserted == ()


def test_frames_record_size_info(scenario: TreeRecorder) -> None:
    infos = [tuple(f.size_info) for f in scenario.frames]
    assert infos == [(0, 0), (2, 0), (3, 0), (6, 0), (6, 0), (1, 5), (1, 5), (0, 5), (5, 0), (2, 0)]
    assert scenario.frames[5].sizes_text == "cached 6 slots: 5 protected, 1 evictable"


def test_refused_operation_records_the_unchanged_tree(scenario: TreeRecorder) -> None:
    refused = scenario.frames[6]
    assert refused.error is not None and "EvictionError" in refused.error
    assert refused.snapshot == scenario.frames[5].snapshot
    assert refused.changes.empty


# -- drawings: labels and the style of each state ---------------------------------------


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
    assert "the two halves of a split" in dot and "just evicted (ghost)" in dot  # the legend


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
    assert "<B>7</B>" in draw_tree(_manager_with([7]), WORDS).source  # unknown ids show as numbers
    with pytest.raises(ArgumentTypeError, match="vocab"):
        draw_tree(manager, "Hello world")
    with pytest.raises(ArgumentTypeError, match="vocab"):
        draw_tree(manager, 3.5)


def test_words_are_escaped_for_dot_and_svg() -> None:
    manager = _manager_with([0, 1])
    drawing = draw_tree(manager, {0: "<b>&", 1: 'say "hi"'})
    assert "<B>&lt;b&gt;&amp;</B>" in drawing.source
    svg = drawing.svg()
    assert "&lt;b&gt;&amp;" in svg and svg.lstrip().startswith("<?xml")


def test_vocab_tokenizer() -> None:
    vocab = Vocab()
    assert vocab.encode("Hello world Hello") == [0, 1, 0]
    assert vocab.decode([1, 0]) == "world Hello" and len(vocab) == 2 and dict(vocab) == {0: "Hello", 1: "world"}
    with pytest.raises(ArgumentTypeError):
        vocab.encode(["Hello"])


def test_needs_a_tree() -> None:
    naive = NaiveCacheManager()
    with pytest.raises(ArgumentTypeError, match="manager must be a RadixCacheManager"):
        draw_tree(naive)
    with pytest.raises(ArgumentTypeError, match="manager"):
        TreeRecorder(naive)
    rec = TreeRecorder(RadixCacheManager())
    with pytest.raises(ArgumentTypeError, match="already a TreeRecorder"):
        TreeRecorder(rec)


def test_missing_dot_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    drawing = draw_tree(_manager_with([0, 1]))
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `dot` anywhere
    assert "digraph radix_tree" in drawing.source  # building DOT text needs no graphviz program
    with pytest.raises(GraphvizMissingError, match="apt-get install -y graphviz"):
        drawing.svg()
    with pytest.raises(GraphvizMissingError):
        drawing._repr_mimebundle_()
    assert isinstance(GraphvizMissingError("x"), MiniKVError)


# -- determinism and reprs ----------------------------------------------------------


def test_same_operations_give_identical_bytes(scenario: TreeRecorder) -> None:
    again = run_scenario()  # fresh manager: every node has a different uid
    assert [f.dot for f in again.frames] == [f.dot for f in scenario.frames]
    for i in (2, 7):
        assert again.frames[i].svg() == scenario.frames[i].svg()
    assert again.player().html == scenario.player().html
    first_uids = {n.uid for n in _all_nodes(scenario.manager)}
    assert first_uids.isdisjoint(n.uid for n in _all_nodes(again.manager))  # so equal output cannot come from uids


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


def test_reprs_show_no_addresses(scenario: TreeRecorder) -> None:
    drawing = scenario.frames[5].drawing
    assert repr(drawing) == "<TreeDrawing: 5 nodes>"
    assert repr(drawing.copy()) == "<TreeDrawing: 5 nodes>"
    assert repr(scenario.frames[7]) == "<Frame 7: evict 1: removed [there] (1 slot)>"
    assert repr(scenario) == "<TreeRecorder: 10 frames of RadixCacheManager>"
    assert repr(scenario.player()) == "<FramePlayer: 10 frames>"
    bundle = scenario.frames[7]._repr_mimebundle_()
    assert bundle["text/plain"] == repr(scenario.frames[7]) and "<svg" in bundle["image/svg+xml"]
    assert "Generated by graphviz" not in bundle["image/svg+xml"]
    assert "0x" not in drawing.source


# -- the player -----------------------------------------------------------------------


def test_player_html_holds_every_frame(scenario: TreeRecorder) -> None:
    player = scenario.player()
    page = player.html
    assert player._repr_html_() == page and len(player) == 10
    assert page.count('<figure class="mkp-frame"') == 10 and page.count("<svg") == 10
    assert "<?xml" not in page and "<!DOCTYPE" not in page and "Generated by graphviz" not in page
    assert re.fullmatch(r"minikv-player-[0-9a-f]{12}", player.player_id)
    assert f'id="{player.player_id}"' in page and "root.dataset.ready" in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "element ids must be unique within one player"
    assert "<script src" not in page and "cdn" not in page.lower() and "widget" not in page.lower()
    for frame in scenario.frames:
        assert f"{frame.index}. {frame.caption}".replace('"', "&quot;") in page
    assert "cached 6 slots: 5 protected, 1 evictable" in page
    assert scenario.player(start=7).html.count('<figure class="mkp-frame"') == 3
    with pytest.raises(ArgumentError, match="empty"):
        scenario.player(start=20)


def test_player_from_tuples_and_errors(tmp_path) -> None:
    a, b = draw_tree(_manager_with([0])), draw_tree(_manager_with([0, 1]))
    player = FramePlayer([(a, "one"), (b, "two", "details")], title="Two trees", interval_ms=100)
    assert player.html.count('<figure class="mkp-frame"') == 2
    assert "Two trees" in player.html and "details" in player.html
    saved = player.save(tmp_path / "p.html").read_text()
    assert saved.startswith("<!DOCTYPE html>") and player.html in saved
    with pytest.raises(ArgumentError):
        FramePlayer([])
    with pytest.raises(ArgumentTypeError):
        FramePlayer([("not svg", 1)])
    with pytest.raises(ArgumentError, match="not SVG"):
        FramePlayer([("plain text", "caption")])
    with pytest.raises(ArgumentError, match="interval_ms"):
        FramePlayer([(a, "one")], interval_ms=0)


# -- recording does not change the manager ---------------------------------------------


@pytest.mark.parametrize("page_size", [1, 2])
def test_recording_does_not_change_behaviour(page_size: int) -> None:
    plain = RadixCacheManager(page_size=page_size)
    recorded = RadixCacheManager(page_size=page_size)
    rec = TreeRecorder(recorded)
    rng = random.Random(1234 + page_size)
    handles: list[tuple] = []
    next_slot = 0
    for _ in range(150):
        op = rng.choice(["insert", "insert", "match", "lock", "unlock", "evict"])
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 7))]
        if op == "insert":
            slots = list(range(next_slot, next_slot + len(ids)))
            next_slot += -(-len(ids) // page_size) * page_size  # whole pages, as a pool hands them out
            outcome = _both(lambda: plain.insert_prefix(ids, slots), lambda: rec.insert_prefix(ids, slots))
        elif op == "match":
            outcome = _both(lambda: _match(plain, ids), lambda: _match(rec, ids))
        elif op == "lock":
            (h1, _), (h2, _) = plain.match_prefix(ids), rec.match_prefix(ids)
            outcome = _both(lambda: plain.lock_handle(h1), lambda: rec.lock_handle(h2))
            handles.append((h1, h2))
        elif op == "unlock" and handles:
            h1, h2 = handles.pop(rng.randrange(len(handles)))
            outcome = _both(lambda: plain.lock_handle(h1, unlock=True), lambda: rec.lock_handle(h2, unlock=True))
        else:
            size = rng.randrange(0, 6)
            outcome = _both(lambda: sorted(plain.evict(size).tolist()), lambda: sorted(rec.evict(size).tolist()))
        assert TreeSnapshot.of(plain) == TreeSnapshot.of(recorded), f"diverged after {op}: {outcome}"
    recorded.check_integrity()
    assert len(rec.frames) > 150
    assert any(f.error for f in rec.frames), "the run should include refused operations"


def _both(first, second):
    """Run both calls; their results, or the types of the errors they raise, must agree."""
    results = []
    for call in (first, second):
        try:
            results.append(("ok", call()))
        except MiniKVError as exc:
            results.append(("error", type(exc)))
    assert results[0] == results[1]
    return results[0]


def _match(manager, ids):
    handle, indices = manager.match_prefix(ids)
    return handle.cached_len, indices.tolist()


def test_recorder_works_with_the_lifecycle() -> None:
    vocab = Vocab()
    manager, pool = RadixCacheManager(), PagePool(8)
    rec = TreeRecorder(manager, vocab, pool=pool)
    plain_manager, plain_pool = RadixCacheManager(), PagePool(8)
    requests = []
    for text in ["Hello world", "Hello there", "Hello world how are you", "how are you"]:
        ids = vocab.encode(text)
        with rec.labelled(f"request [{text}]"):
            request = admit(rec, pool, ids)
            finish(rec, pool, request)
        plain = admit(plain_manager, plain_pool, ids)
        finish(plain_manager, plain_pool, plain)
        assert (request.cached_len, request.already_cached, request.indices.tolist()) == (
            plain.cached_len, plain.already_cached, plain.indices.tolist(),
        )  # fmt: skip
        requests.append(request)
    assert TreeSnapshot.of(manager) == TreeSnapshot.of(plain_manager)
    ops = [f.operation for f in rec.frames]
    assert ops[:5] == ["start", "match", "lock", "insert", "unlock"]
    assert "evict" in ops  # the last request had to evict to get its slots
    evict = next(f for f in rec.frames if f.operation == "evict")
    assert evict.caption == "request [how are you] · evict 1: removed [there] (1 slot)"
    assert [f.free_slots for f in rec.frames[:4]] == [8, 8, 8, 6]
    rec.note("all four requests are done")
    assert rec.frames[-1].caption == "all four requests are done" and rec.frames[-1].operation == "note"
    # the plots read the same run
    sizes = plot_sizes(rec)
    bars = sizes.axes[0].patches
    assert len(bars) == 4 * len(rec.frames)
    assert [b.get_height() for b in bars[: len(rec.frames)]] == [f.size_info.protected_size for f in rec.frames]
    hit = plot_hit_rate(requests, vocab=vocab)
    heights = [b.get_height() for b in hit.axes[0].patches]
    assert heights == pytest.approx([0 / 2, 1 / 2, 2 / 5, 0 / 3])
    assert [t.get_text() for t in hit.axes[0].get_xticklabels()][1] == "[Hello there]"
    life = plot_lifecycle(requests)
    texts = [t.get_text() for t in life.axes[0].texts]
    assert texts.count("1. match_prefix") == 4 and texts.count("7. unlock") == 4
    assert "3 new slots, after\nevicting 1" in texts


# -- plots ------------------------------------------------------------------------------


def test_plots_are_deterministic_figures(scenario: TreeRecorder) -> None:
    import io

    from matplotlib.figure import Figure

    def png(fig) -> bytes:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        return buffer.getvalue()

    fig = plot_sizes(scenario)
    assert isinstance(fig, Figure) and png(fig) == png(plot_sizes(run_scenario()))
    bars = fig.axes[0].patches
    assert len(bars) == 2 * len(scenario.frames)  # no pool: protected and evictable only
    evictable = [f.size_info.evictable_size for f in scenario.frames]
    assert [b.get_height() for b in bars[len(scenario.frames) :]] == evictable
    infos = plot_sizes([f.size_info for f in scenario.frames])
    assert len(infos.axes[0].patches) == len(bars)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:3] == ["start", "insert", "insert"]


def test_plot_arguments_are_checked(scenario: TreeRecorder) -> None:
    with pytest.raises(ArgumentTypeError):
        plot_sizes([1, 2, 3])
    with pytest.raises(ArgumentTypeError):
        plot_hit_rate([object()])
    with pytest.raises(ArgumentError, match="labels"):
        plot_lifecycle(_one_request(), labels=["a", "b"])
    with pytest.raises(ArgumentError, match="empty"):
        plot_hit_rate([])


def test_frame_is_a_frame(scenario: TreeRecorder) -> None:
    assert all(isinstance(f, Frame) for f in scenario.frames)
    assert scenario.frames[3].drawing is scenario.frames[3].drawing  # built once


# -- helpers ----------------------------------------------------------------------------


def _manager_with(ids: list[int]) -> RadixCacheManager:
    manager = RadixCacheManager()
    manager.insert_prefix(torch.tensor(ids), list(range(len(ids))))
    return manager


def _one_request():
    manager, pool = RadixCacheManager(), PagePool(4)
    request = admit(manager, pool, [1, 2])
    finish(manager, pool, request)
    return request


def _all_nodes(manager: RadixCacheManager) -> list:
    """Every node but the root, found through the public ``children`` dicts."""
    found, stack = [], list(manager.root_node.children.values())
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found
