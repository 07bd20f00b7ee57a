"""Draw a radix tree with graphviz, so that a split, a lock or an eviction is something you *see*.

Three steps, each its own piece:

1. :meth:`TreeSnapshot.of` reads a manager's tree into plain, immutable values.
   A node is named by its *token path* (every token from the root to the end
   of the node). That name comes from content only, so the same operations
   always give the same names, the same DOT text and the same SVG bytes --
   no ``uid``, ``id()`` or memory address ever reaches a drawing.
2. :func:`diff_snapshots` compares two snapshots and says what one operation
   changed: which node was split, inserted or evicted, and which path a match
   walked (:class:`TreeChanges`).
3. :func:`draw_snapshot` (and the shortcut :func:`draw_tree`) turns a snapshot,
   plus optional changes, into a :class:`TreeDrawing` (a ``graphviz.Digraph``).

Every node's box shows its tokens (as words, through ``vocab``), the slot under
each token, its ``ref_count`` and its LRU time. Fill colour says the node's
*state* (locked, evictable leaf, interior); a thick border says what just
*happened* to it (split, inserted, walked); an evicted node stays as a dashed
ghost for one frame. With ``page_size > 1`` each page is a boxed column.
"""

from __future__ import annotations

import hashlib
import html
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Union

import graphviz

from ..base import SizeInfo
from ..errors import ArgumentError, ArgumentTypeError, MiniKVError

Path = tuple[int, ...]
"""A node's name: every token id from the root down to the node's last token. The root is ``()``."""

VocabLike = Union[Mapping[int, Any], Callable[[int], Any], Sequence[str], None]
"""How token ids become words: a dict ``id -> word``, a callable, a sequence indexed by id, or ``None`` (show ids)."""


class GraphvizMissingError(MiniKVError, RuntimeError):
    """The graphviz ``dot`` program, which turns DOT text into SVG, is not installed."""


# -- colours shared by drawings, the player and the plots ---------------------


@dataclass(frozen=True)
class Look:
    """Fill and border colour of one node state (also used for the matching plot bands)."""

    fill: str
    border: str
    text: str = "#101828"


LOOKS: Mapping[str, Look] = MappingProxyType(
    {
        "root": Look("#344054", "#101828", "#ffffff"),
        "protected": Look("#fee4e2", "#d92d20"),
        "evictable": Look("#dcfae6", "#079455"),
        "interior": Look("#f2f4f7", "#667085"),
        "evicted": Look("#ffffff", "#98a2b3", "#98a2b3"),
        "requests": Look("#d1e9ff", "#1570ef"),
        "free": Look("#f9fafb", "#d0d5dd"),
    }
)
"""State -> colours. ``requests`` and ``free`` are not tree states; the size plot uses them."""

EVENT_BORDERS: Mapping[str, str] = MappingProxyType({"inserted": "#7f56d9", "split": "#f79009", "walked": "#1570ef"})
"""What just happened to a node -> the colour of its thick border (and of the edge into it)."""

STATE_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "root": "root (always kept)",
        "protected": "protected: locked (ref > 0)",
        "evictable": "evictable leaf (ref 0)",
        "interior": "interior node, unlocked",
        "evicted": "just evicted (ghost)",
        "inserted": "just inserted",
        "split": "the two halves of a split",
        "walked": "path a match just walked",
    }
)


# -- token ids -> words ---------------------------------------------------------


class Vocab(Mapping[int, str]):
    """A toy word-level tokenizer, so the book can write ``vocab.encode("Hello world")``.

    Each new word gets the next id, in order of first appearance, so the ids
    are reproducible. It is a ``Mapping`` from id to word and can be passed
    anywhere a ``vocab`` is accepted.
    """

    def __init__(self, words: Sequence[str] = ()) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = []
        for word in words:
            self.id_of(word)

    def id_of(self, word: str) -> int:
        if not isinstance(word, str) or not word:
            raise ArgumentTypeError(f"word must be a non-empty str, got {word!r}")
        if word not in self._ids:
            self._ids[word] = len(self._words)
            self._words.append(word)
        return self._ids[word]

    def encode(self, text: str) -> list[int]:
        """Split ``text`` on whitespace and return one id per word (new words get new ids)."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        return [self.id_of(word) for word in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self[int(i)] for i in ids)

    def __getitem__(self, token: int) -> str:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < len(self._words):
            raise KeyError(token)
        return self._words[token]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._words)))

    def __len__(self) -> int:
        return len(self._words)

    def __repr__(self) -> str:
        return f"Vocab({len(self._words)} words)"


def token_namer(vocab: VocabLike) -> Callable[[int], str]:
    """Turn ``vocab`` into a function ``id -> word``; ids it does not know are shown as numbers."""
    if vocab is None:
        return str
    if isinstance(vocab, (str, bytes)):
        raise ArgumentTypeError("vocab must be a dict id->word, a callable or a sequence of words, got a string")
    if isinstance(vocab, Mapping):
        return lambda token: str(vocab[token]) if token in vocab else str(token)
    if callable(vocab):
        return lambda token: str(vocab(token))
    if isinstance(vocab, Sequence):
        return lambda token: str(vocab[token]) if 0 <= token < len(vocab) else str(token)
    raise ArgumentTypeError(
        f"vocab must be a dict id->word, a callable or a sequence of words, got {type(vocab).__name__}"
    )


def words(tokens: Sequence[int], namer: Callable[[int], str], limit: int | None = None) -> str:
    """``[Hello world]``-style text for captions: words joined by spaces, cut after ``limit`` tokens."""
    shown = list(tokens if limit is None else tokens[:limit])
    text = " ".join(_printable(namer(t)) for t in shown)
    if limit is not None and len(tokens) > limit:
        text += f" … (+{len(tokens) - limit})"
    return text


def _printable(word: str) -> str:
    """Make whitespace-only and control-character words visible."""
    word = word.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return word if word.strip() else "␣" * max(1, len(word))


# -- snapshots ------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One node as plain values, frozen at the moment of the snapshot."""

    path: Path
    """Token ids from the root to this node's end: the node's name."""
    start: int
    """How many of ``path``'s tokens belong to the ancestors."""
    slots: tuple[int, ...]
    ref_count: int
    timestamp: int
    children: tuple[Path, ...]
    """Children's paths, sorted, so drawings order children the same way every time."""

    @property
    def tokens(self) -> Path:
        """This node's own tokens (its edge label)."""
        return self.path[self.start :]

    @property
    def parent(self) -> Path:
        return self.path[: self.start]

    @property
    def is_root(self) -> bool:
        return not self.path

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def state(self) -> str:
        """``root``, ``protected``, ``evictable`` (an unlocked leaf) or ``interior`` (unlocked, with children)."""
        if self.is_root:
            return "root"
        if self.ref_count > 0:
            return "protected"
        return "evictable" if self.is_leaf else "interior"


@dataclass(frozen=True)
class TreeSnapshot:
    """A manager's tree at one moment, as immutable values keyed by token path."""

    page_size: int
    nodes: Mapping[Path, NodeView]
    size_info: SizeInfo

    @classmethod
    def of(cls, manager: Any) -> TreeSnapshot:
        """Read ``manager``'s tree without changing it (only public attributes are read).

        Works with :class:`~minikv.RadixCacheManager`, a :class:`~minikv.viz.recorder.TreeRecorder`
        around one, or any object with the same ``root_node`` structure.
        """
        root = getattr(manager, "root_node", None)
        if root is None or not hasattr(root, "children"):
            raise ArgumentTypeError(
                f"manager must be a RadixCacheManager (something with a tree to draw), got {type(manager).__name__}"
            )
        page_size = int(getattr(manager, "page_size", 1))
        nodes: dict[Path, NodeView] = {}
        pending: list[tuple[Any, Path, int]] = [(root, (), 0)]
        while pending:
            node, path, start = pending.pop()
            kids = sorted(
                ((path + tuple(int(t) for t in child.key.tolist()), child) for child in node.children.values()),
                key=lambda pair: pair[0],
            )
            slots = () if not path else tuple(int(s) for s in node.value.tolist())
            children = tuple(p for p, _ in kids)
            nodes[path] = NodeView(path, start, slots, int(node.ref_count), int(node.timestamp), children)
            pending.extend((child, child_path, len(path)) for child_path, child in kids)
        info = getattr(manager, "size_info", None)
        if not isinstance(info, SizeInfo):
            evictable = sum(len(v.tokens) for v in nodes.values() if not v.is_root and v.ref_count == 0)
            protected = sum(len(v.tokens) for v in nodes.values() if not v.is_root and v.ref_count > 0)
            info = SizeInfo(evictable, protected)
        return cls(page_size, MappingProxyType(nodes), info)

    @property
    def root(self) -> NodeView:
        return self.nodes[()]

    @property
    def num_nodes(self) -> int:
        """Nodes, root excluded (as ``RadixCacheManager.num_nodes`` counts them)."""
        return len(self.nodes) - 1

    def depth_first(self) -> Iterator[NodeView]:
        """Every node, root first, children in sorted order: the order drawings list them."""
        stack = [self.root]
        while stack:
            view = stack.pop()
            yield view
            stack.extend(self.nodes[p] for p in reversed(view.children))

    def path_along(self, tokens: Sequence[int]) -> tuple[Path, ...]:
        """The nodes (root excluded) that end inside ``tokens``, top down: the path a match of ``tokens`` walks."""
        tokens = tuple(int(t) for t in tokens)
        return tuple(p for p in (tokens[:n] for n in range(1, len(tokens) + 1)) if p in self.nodes)


@dataclass(frozen=True)
class TreeChanges:
    """What one operation did to the tree, by node path."""

    walked: tuple[Path, ...] = ()
    """Nodes on the path a match (or an insert's match) walked, top down."""
    split: tuple[tuple[Path, Path], ...] = ()
    """``(upper, lower)`` pairs: a node was cut into these two halves."""
    split_before: tuple[NodeView, ...] = ()
    """The nodes as they were before they were split, for captions."""
    inserted: tuple[Path, ...] = ()
    evicted: tuple[NodeView, ...] = ()
    """Removed nodes as they were just before: drawn as ghosts."""
    ref_changed: tuple[Path, ...] = ()
    """Nodes whose ``ref_count`` changed (a lock or an unlock)."""

    def event_of(self, path: Path) -> str | None:
        """The one event a drawing shows for ``path``: inserted, then split, then walked."""
        if path in self.inserted:
            return "inserted"
        if any(path in pair for pair in self.split):
            return "split"
        if path in self.walked:
            return "walked"
        return None

    @property
    def empty(self) -> bool:
        return not (self.walked or self.split or self.inserted or self.evicted or self.ref_changed)


def diff_snapshots(before: TreeSnapshot, after: TreeSnapshot, walked: Sequence[int] = ()) -> TreeChanges:
    """Say what changed between two snapshots of the same tree.

    A node that is new in ``after`` is the upper half of a split when its path
    ends strictly inside a node of ``before`` (that node, which keeps its path,
    is the lower half); otherwise it was inserted. A node missing from ``after``
    was evicted. ``walked`` is the matched token prefix, if the operation matched.
    """
    split: list[tuple[Path, Path]] = []
    split_before: list[NodeView] = []
    inserted: list[Path] = []
    for view in after.depth_first():
        path = view.path
        if path in before.nodes:
            continue
        lower = next(
            (
                old
                for old in before.nodes.values()
                if len(old.path) > len(path) and old.start < len(path) and old.path[: len(path)] == path
            ),
            None,
        )
        if lower is not None:
            split.append((path, lower.path))
            split_before.append(lower)
        else:
            inserted.append(path)
    evicted = tuple(v for v in before.depth_first() if v.path not in after.nodes)
    ref_changed = tuple(
        v.path for v in after.depth_first() if v.path in before.nodes and before.nodes[v.path].ref_count != v.ref_count
    )
    return TreeChanges(
        walked=after.path_along(walked),
        split=tuple(split),
        split_before=tuple(split_before),
        inserted=tuple(inserted),
        evicted=evicted,
        ref_changed=ref_changed,
    )


# -- the drawing ----------------------------------------------------------------


class TreeDrawing(graphviz.Digraph):
    """A ``graphviz.Digraph`` of a radix tree, with a repr that never shows a memory address.

    In a notebook it displays as SVG (rendered by the ``dot`` program);
    ``.source`` is the DOT text, ``.svg()`` the SVG text.
    """

    def __init__(self, *args: Any, tree_nodes: int = 0, ghost_nodes: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree_nodes = tree_nodes
        self.ghost_nodes = ghost_nodes

    def _copy_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        # graphviz's own _copy_kwargs drops extra keywords, so add ours to its result.
        copied = super()._copy_kwargs(**kwargs)
        copied.update(tree_nodes=self.tree_nodes, ghost_nodes=self.ghost_nodes)
        return copied

    def __repr__(self) -> str:
        ghosts = f", {self.ghost_nodes} just evicted" if self.ghost_nodes else ""
        return f"<TreeDrawing: {self.tree_nodes} nodes{ghosts}>"

    def svg(self) -> str:
        """The drawing as SVG text (graphviz's version comment removed, so versions differ less)."""
        return render_svg(self.source)

    def _repr_image_svg_xml(self) -> str:
        return self.svg()


def render_svg(dot_source: str) -> str:
    """Run ``dot -Tsvg`` on DOT text; raise :class:`GraphvizMissingError` if ``dot`` is not installed."""
    executable = shutil.which("dot")
    if executable is None:
        raise GraphvizMissingError(
            "drawing: the graphviz program 'dot' is not on PATH. Install it "
            "(Debian/Ubuntu/Colab: `apt-get install -y graphviz`; macOS: `brew install graphviz`) and retry."
        )
    result = subprocess.run([executable, "-Tsvg"], input=dot_source.encode("utf-8"), capture_output=True, check=False)
    if result.returncode != 0:
        raise ArgumentError(f"drawing: dot rejected the DOT source: {result.stderr.decode(errors='replace').strip()}")
    return _GRAPHVIZ_VERSION_COMMENT.sub("", result.stdout.decode("utf-8"))


_GRAPHVIZ_VERSION_COMMENT = re.compile(r"<!-- Generated by graphviz[^>]*-->\n?")


def node_id(path: Path, ghost: bool = False) -> str:
    """The DOT node name of the node at ``path``: a hash of the token path (``root`` for the root)."""
    if not path:
        return "root"
    digest = hashlib.sha1(",".join(map(str, path)).encode()).hexdigest()[:12]
    return ("ghost_" if ghost else "n_") + digest


def draw_tree(
    manager: Any,
    vocab: VocabLike = None,
    *,
    changes: TreeChanges | None = None,
    legend: bool = True,
    title: str | None = None,
    max_columns: int = 8,
) -> TreeDrawing:
    """Draw ``manager``'s radix tree now.

    ``vocab`` turns token ids into words (a dict, a callable or a sequence).
    ``changes`` (from :func:`diff_snapshots`, or a recorder frame) highlights
    what the last operation did. ``max_columns`` caps the tokens (pages, when
    ``page_size > 1``) shown per node; the rest is summarised as "+N".
    """
    return draw_snapshot(
        TreeSnapshot.of(manager), vocab, changes=changes, legend=legend, title=title, max_columns=max_columns
    )


def draw_snapshot(
    snapshot: TreeSnapshot,
    vocab: VocabLike = None,
    *,
    changes: TreeChanges | None = None,
    legend: bool = True,
    title: str | None = None,
    max_columns: int = 8,
) -> TreeDrawing:
    """Draw a :class:`TreeSnapshot` (see :func:`draw_tree`)."""
    if not isinstance(snapshot, TreeSnapshot):
        raise ArgumentTypeError(f"snapshot must be a TreeSnapshot, got {type(snapshot).__name__}")
    if isinstance(max_columns, bool) or not isinstance(max_columns, int) or max_columns < 1:
        raise ArgumentError(f"max_columns must be a positive int, got {max_columns!r}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    namer = token_namer(vocab)
    changes = changes or TreeChanges()
    ghosts = {v.path: v for v in changes.evicted}
    graph_attr = {"rankdir": "TB", "ordering": "out", "nodesep": "0.3", "ranksep": "0.45", "fontname": "Helvetica"}
    label = _graph_label(snapshot, title, legend)
    if label:
        graph_attr.update(label=label, labelloc="t", labeljust="l", fontsize="12")
    drawing = TreeDrawing(
        name="radix_tree",
        graph_attr=graph_attr,
        node_attr={"shape": "box", "fontname": "Helvetica", "fontsize": "12", "margin": "0.06,0.04"},
        edge_attr={"arrowsize": "0.6", "color": "#667085"},
        tree_nodes=len(snapshot.nodes),
        ghost_nodes=len(ghosts),
    )
    for view in _with_ghosts(snapshot, ghosts):
        ghost = view.path in ghosts
        _add_node(drawing, view, namer, snapshot.page_size, max_columns, changes, ghost)
        if not view.is_root:
            _add_edge(drawing, view, changes, ghost, parent_is_ghost=view.parent in ghosts)
    return drawing


def _with_ghosts(snapshot: TreeSnapshot, ghosts: Mapping[Path, NodeView]) -> Iterator[NodeView]:
    """Depth-first over live nodes and ghosts together, ghosts under their former parent, sorted."""
    children: dict[Path, list[Path]] = {p: list(v.children) for p, v in snapshot.nodes.items()}
    for path, view in ghosts.items():
        children.setdefault(view.parent, []).append(path)
        children.setdefault(path, [])
    stack: list[Path] = [()]
    while stack:
        path = stack.pop()
        yield ghosts.get(path) or snapshot.nodes[path]
        kids = sorted(set(children.get(path, ())))
        stack.extend(reversed(kids))


def _add_node(
    drawing: TreeDrawing,
    view: NodeView,
    namer: Callable[[int], str],
    page_size: int,
    max_columns: int,
    changes: TreeChanges,
    ghost: bool,
) -> None:
    if view.is_root:
        look = LOOKS["root"]
        drawing.node(
            "root", "root", shape="oval", style="filled", fillcolor=look.fill, color=look.border,
            fontcolor=look.text, **{"class": "root"},
        )  # fmt: skip
        return
    name = node_id(view.path, ghost)
    label = _node_label(view, namer, page_size, max_columns, ghost)
    tooltip = _tooltip(view, namer, ghost)
    if ghost:
        look = LOOKS["evicted"]
        drawing.node(
            name, label, style="rounded,dashed", color=look.border, fontcolor=look.text, penwidth="1.5",
            tooltip=tooltip, **{"class": "evicted"},
        )  # fmt: skip
        return
    state = view.state
    look = LOOKS[state]
    event = changes.event_of(view.path)
    border = EVENT_BORDERS[event] if event else look.border
    penwidth = "3" if event else ("2" if state == "protected" else "1.2")
    css = state if event is None else f"{state} {event}"
    drawing.node(
        name, label, style="rounded,filled", fillcolor=look.fill, color=border, penwidth=penwidth,
        fontcolor=look.text, tooltip=tooltip, **{"class": css},
    )  # fmt: skip


def _add_edge(drawing: TreeDrawing, view: NodeView, changes: TreeChanges, ghost: bool, parent_is_ghost: bool) -> None:
    head = node_id(view.path, ghost)
    tail = node_id(view.parent, parent_is_ghost)
    if ghost:
        drawing.edge(tail, head, style="dashed", color=LOOKS["evicted"].border)
        return
    event = changes.event_of(view.path)
    if event:
        drawing.edge(tail, head, color=EVENT_BORDERS[event], penwidth="2.5")
    else:
        drawing.edge(tail, head)


def _node_label(view: NodeView, namer: Callable[[int], str], page_size: int, max_columns: int, ghost: bool) -> str:
    """An HTML-like label: one column per token (per page when ``page_size > 1``), slot under token."""
    tokens, slots = view.tokens, view.slots
    columns = [(tokens[i : i + page_size], slots[i : i + page_size]) for i in range(0, len(tokens), page_size)]
    shown, hidden = columns[:max_columns], columns[max_columns:]
    paged = page_size > 1
    cell = ' BORDER="1" SIDES="LRTB" COLOR="#98a2b3"' if paged else ""
    slot_colour = "#98a2b3" if ghost else "#475467"
    top = "".join(f"<TD{cell}><B>{_html(words(t, namer))}</B></TD>" for t, _ in shown)
    bottom = "".join(
        f'<TD{cell}><FONT POINT-SIZE="9" COLOR="{slot_colour}">{_html(_slot_text(s))}</FONT></TD>' for _, s in shown
    )
    if hidden:
        more = sum(len(t) for t, _ in hidden)
        top += f'<TD ROWSPAN="2"><FONT POINT-SIZE="10">… +{more}</FONT></TD>'
    span = len(shown) + (1 if hidden else 0)
    if ghost:
        status = "evicted: slots freed"
    else:
        status = f"ref {view.ref_count} · t {view.timestamp}"
    status_row = f'<TR><TD COLSPAN="{span}"><FONT POINT-SIZE="9">{_html(status)}</FONT></TD></TR>'
    spacing = ' CELLSPACING="2"' if paged else ' CELLSPACING="0"'
    return (
        f'<<TABLE BORDER="0" CELLBORDER="0"{spacing} CELLPADDING="2">'
        f"<TR>{top}</TR><TR>{bottom}</TR>{status_row}</TABLE>>"
    )


def _slot_text(slots: Sequence[int]) -> str:
    """Slots as short text: ``4 5`` stays, ``4 5 6 7`` becomes ``4–7``."""
    if not slots:
        return ""
    runs: list[list[int]] = [[slots[0]]]
    for s in slots[1:]:
        if s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return " ".join(f"{r[0]}–{r[-1]}" if len(r) >= 3 else " ".join(map(str, r)) for r in runs)


def _tooltip(view: NodeView, namer: Callable[[int], str], ghost: bool) -> str:
    state = "evicted" if ghost else view.state
    text = (
        f"[{words(view.tokens, namer, limit=64)}] slots {_slot_text(view.slots)}; "
        f"ref_count {view.ref_count}, t {view.timestamp}; {state}"
    )
    return _dot_text(text)


def _graph_label(snapshot: TreeSnapshot, title: str | None, legend: bool) -> str | None:
    """The graph's label, above the tree: the title and a compact legend, as one HTML-like table.

    A label does not take part in the layout of ranks, so the legend never
    pushes the tree around (a legend *node* would).
    """
    rows = []
    if title:
        rows.append(f'<TR><TD ALIGN="LEFT"><B>{_html(title)}</B></TD></TR>')
    if legend:
        entries = [_legend_entry(key) for key in LEGEND_ORDER]
        grid = "".join("<TR>" + "".join(entries[i : i + 2]) + "</TR>" for i in range(0, len(entries), 2))
        rows.append(f'<TR><TD ALIGN="LEFT"><TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">{grid}</TABLE></TD></TR>')
        info = snapshot.size_info
        footer = (
            f"ref = locks held, t = last use. Cached {info.total_size} slots = "
            f"{info.protected_size} protected + {info.evictable_size} evictable."
        )
        if snapshot.page_size > 1:
            footer += f" Boxed columns are pages of {snapshot.page_size} slots."
        rows.append(f'<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="9">{_html(footer)}</FONT></TD></TR>')
    if not rows:
        return None
    return '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">' + "".join(rows) + "</TABLE>>"


LEGEND_ORDER = ("protected", "evictable", "interior", "evicted", "split", "inserted", "walked")


def _legend_entry(key: str) -> str:
    """Two cells: a swatch drawn the way such a node is drawn, and its meaning."""
    size = 'WIDTH="20" HEIGHT="12" FIXEDSIZE="TRUE"'
    if key in EVENT_BORDERS:
        swatch = f'<TD BGCOLOR="{LOOKS["interior"].fill}" COLOR="{EVENT_BORDERS[key]}" BORDER="3" {size}></TD>'
    else:
        look = LOOKS[key]
        dashed = ' STYLE="dashed"' if key == "evicted" else ""
        swatch = f'<TD BGCOLOR="{look.fill}" COLOR="{look.border}" BORDER="1"{dashed} {size}></TD>'
    return f'{swatch}<TD ALIGN="LEFT"><FONT POINT-SIZE="10">{_html(STATE_WORDS[key])}</FONT></TD>'


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _dot_text(text: str) -> str:
    """Plain text for a DOT attribute: backslashes kept literal, never read as an HTML-like label."""
    return graphviz.nohtml(text.replace("\\", "\\\\"))
