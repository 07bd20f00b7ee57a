"""Draw a radix tree with graphviz, so that a split, a lock or an eviction is something you *see*.

:func:`draw_snapshot` turns a :class:`~minikv.snapshot.TreeSnapshot` (the
tree read into plain values, see :mod:`minikv.snapshot`), plus optional
:class:`~minikv.snapshot.TreeChanges` (what one operation did, from
:func:`~minikv.snapshot.diff_snapshots`), into a :class:`TreeDrawing` (a
``graphviz.Digraph``); :func:`draw_tree` is the shortcut for a manager now.
Nodes are named by their token path, so the same operations always give the
same DOT text and the same SVG bytes -- no ``uid``, ``id()`` or memory address
ever reaches a drawing.

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
from typing import Any

import graphviz

from ..errors import ArgumentError, ArgumentTypeError, MiniKVError
from ..snapshot import (
    SLOT_STATES,
    NodeView,
    Path,
    SlotOwnership,
    TreeChanges,
    TreeSnapshot,
    VocabLike,
    token_namer,
    words,
)
from .labels import CATALOG, text

__all__ = [
    "EVENT_BORDERS",
    "LOOKS",
    "STATE_WORDS",
    "GraphvizMissingError",
    "Look",
    "TreeDrawing",
    "draw_pool",
    "draw_snapshot",
    "draw_tree",
    "node_id",
    "render_svg",
]


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
"""State -> colours. ``requests`` and ``free`` are not tree states; the size plot and the slot strip use them."""

SLOT_LOOKS: Mapping[str, Look] = MappingProxyType(
    {
        "free": Look("#ffffff", "#98a2b3", "#475467"),
        "evictable": LOOKS["evictable"],
        "locked": LOOKS["protected"],
        "evicted": Look("#fef0c7", "#dc6803", "#93370d"),
        "request": LOOKS["requests"],
        "conflict": Look("#d92d20", "#7a271a", "#ffffff"),
    }
)
"""Slot state (see :data:`minikv.snapshot.SLOT_STATES`) -> colours of its cell in the slot strip.

An ``evicted`` cell also has a dashed border, like the ghost of the node it left."""

EVENT_BORDERS: Mapping[str, str] = MappingProxyType({"inserted": "#7f56d9", "split": "#f79009", "walked": "#1570ef"})
"""What just happened to a node -> the colour of its thick border (and of the edge into it)."""

STATE_WORDS: Mapping[str, str] = MappingProxyType(
    {
        state: CATALOG[f"state.{state}"].en
        for state in ("root", "protected", "evictable", "interior", "evicted", "inserted", "split", "walked")
    }
)
"""State or event -> its legend words, in English (drawings take them from :mod:`minikv.viz.labels`)."""


# -- the drawing ----------------------------------------------------------------


class TreeDrawing(graphviz.Digraph):  # type: ignore[misc]  # graphviz ships no type hints
    """A ``graphviz.Digraph`` of a radix tree, with a repr that never shows a memory address.

    In a notebook it displays as SVG (rendered by the ``dot`` program);
    ``.source`` is the DOT text, ``.svg()`` the SVG text.
    """

    def __init__(
        self, *args: Any, tree_nodes: int = 0, ghost_nodes: int = 0, strip_slots: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tree_nodes = tree_nodes
        self.ghost_nodes = ghost_nodes
        self.strip_slots = strip_slots

    def _copy_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        # graphviz's own _copy_kwargs drops extra keywords, so add ours to its result.
        copied: dict[str, Any] = super()._copy_kwargs(**kwargs)
        copied.update(tree_nodes=self.tree_nodes, ghost_nodes=self.ghost_nodes, strip_slots=self.strip_slots)
        return copied

    def __repr__(self) -> str:
        parts = [f"{self.tree_nodes} nodes"] if self.tree_nodes else []
        if self.ghost_nodes:
            parts.append(f"{self.ghost_nodes} just evicted")
        if self.strip_slots:
            parts.append(f"a strip of {self.strip_slots} slots")
        return f"<TreeDrawing: {', '.join(parts) or '0 nodes'}>"

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
    pool: Any = None,
) -> TreeDrawing:
    """Draw ``manager``'s radix tree now.

    ``vocab`` turns token ids into words (a dict, a callable or a sequence).
    ``changes`` (from :func:`~minikv.snapshot.diff_snapshots`, or a recorder frame) highlights
    what the last operation did. ``max_columns`` caps the tokens (pages, when
    ``page_size > 1``) shown per node; the rest is summarised as "+N".
    ``pool`` (a :class:`~minikv.PagePool`) adds a strip of its slots above the
    tree: free, in the tree and evictable, in the tree and locked, or owned by
    a running request (see :class:`~minikv.snapshot.SlotOwnership`). Slots
    that ``evict`` just returned show as evicted only in a recorder's frames,
    which see what ``evict`` returned.
    """
    snapshot = TreeSnapshot.of(manager)
    slots = None if pool is None else SlotOwnership.of(snapshot, pool)
    return draw_snapshot(
        snapshot, vocab, changes=changes, legend=legend, title=title, max_columns=max_columns, slots=slots
    )


def draw_snapshot(
    snapshot: TreeSnapshot,
    vocab: VocabLike = None,
    *,
    changes: TreeChanges | None = None,
    legend: bool = True,
    title: str | None = None,
    max_columns: int = 8,
    slots: SlotOwnership | None = None,
) -> TreeDrawing:
    """Draw a :class:`~minikv.snapshot.TreeSnapshot` (see :func:`draw_tree`); ``slots`` adds the slot strip."""
    if not isinstance(snapshot, TreeSnapshot):
        raise ArgumentTypeError(f"snapshot must be a TreeSnapshot, got {type(snapshot).__name__}")
    if isinstance(max_columns, bool) or not isinstance(max_columns, int) or max_columns < 1:
        raise ArgumentError(f"max_columns must be a positive int, got {max_columns!r}")
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    if slots is not None and not isinstance(slots, SlotOwnership):
        raise ArgumentTypeError(f"slots must be a SlotOwnership, got {type(slots).__name__}")
    namer = token_namer(vocab)
    changes = changes or TreeChanges()
    ghosts = {v.path: v for v in changes.evicted}
    graph_attr = {"rankdir": "TB", "ordering": "out", "nodesep": "0.3", "ranksep": "0.45", "fontname": "Helvetica"}
    label = _graph_label(snapshot, title, legend, slots, _legend_keys(snapshot, changes, bool(ghosts)))
    if label:
        graph_attr.update(label=label, labelloc="t", labeljust="l", fontsize="12")
    drawing = TreeDrawing(
        name="radix_tree",
        graph_attr=graph_attr,
        node_attr={"shape": "box", "fontname": "Helvetica", "fontsize": "12", "margin": "0.06,0.04"},
        edge_attr={"arrowsize": "0.6", "color": "#667085"},
        tree_nodes=len(snapshot.nodes),
        ghost_nodes=len(ghosts),
        strip_slots=0 if slots is None else slots.num_slots,
    )
    for view in _with_ghosts(snapshot, ghosts):
        ghost = view.path in ghosts
        _add_node(drawing, view, namer, snapshot.page_size, max_columns, changes, ghost)
        if not view.is_root:
            _add_edge(drawing, view, changes, ghost, parent_is_ghost=view.parent in ghosts)
    return drawing


def _with_ghosts(snapshot: TreeSnapshot, ghosts: Mapping[Path, NodeView]) -> Iterator[NodeView]:
    """Depth-first over live nodes and ghosts together, ghosts under their former parent, sorted.

    Each path is drawn once: a node with no tokens (a broken tree's) has its parent's path, so
    it is not a box of its own, and the walk cannot come back to a path it has drawn.
    """
    children: dict[Path, list[Path]] = {p: list(v.child_paths) for p, v in snapshot.nodes.items()}
    for path, view in ghosts.items():
        children.setdefault(view.parent, []).append(path)
        children.setdefault(path, [])
    stack: list[Path] = [()]
    drawn: set[Path] = set()
    while stack:
        path = stack.pop()
        if path in drawn:
            continue
        drawn.add(path)
        yield ghosts.get(path) or snapshot.nodes[path]
        kids = sorted(set(children.get(path, ())) - drawn)
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
            "root", text("node.root"), shape="oval", style="filled", fillcolor=look.fill, color=look.border,
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
    status = text("node.evicted") if ghost else text("node.status", ref=view.ref_count, t=view.timestamp)
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
    state = text(f"word.{'evicted' if ghost else view.state}")
    tip = text(
        "node.tooltip", words=words(view.tokens, namer, limit=64), slots_text=_slot_text(view.slots),
        ref=view.ref_count, t=view.timestamp, state=state,
    )  # fmt: skip
    return _dot_text(tip)


def _legend_keys(snapshot: TreeSnapshot, changes: TreeChanges, has_ghosts: bool) -> list[str]:
    """The kinds of node and event this drawing shows, in :data:`LEGEND_ORDER`: its legend lists no other."""
    shown = {view.state for view in snapshot.nodes.values() if not view.is_root}
    shown |= {event for path in snapshot.nodes if (event := changes.event_of(path)) is not None}
    if has_ghosts:
        shown.add("evicted")
    return [key for key in LEGEND_ORDER if key in shown]


def _graph_label(
    snapshot: TreeSnapshot | None,
    title: str | None,
    legend: bool,
    slots: SlotOwnership | None = None,
    keys: Sequence[str] | None = None,
) -> str | None:
    """The graph's label, above the tree: the title and a compact legend, as one HTML-like table.

    A label does not take part in the layout of ranks, so the legend never
    pushes the tree around (a legend *node* would). The legend lists ``keys``
    only (every kind when None), so that it stays smaller than a small tree.
    """
    rows = []
    if title:
        rows.append(f'<TR><TD ALIGN="LEFT"><B>{_html(title)}</B></TD></TR>')
    if slots is not None:
        rows.append(f'<TR><TD ALIGN="LEFT">{_slot_strip(slots, legend)}</TD></TR>')
    if legend and snapshot is not None:
        entries = [_legend_entry(key) for key in (LEGEND_ORDER if keys is None else keys)]
        grid = "".join("<TR>" + "".join(entries[i : i + 2]) + "</TR>" for i in range(0, len(entries), 2))
        if grid:  # an empty tree shows no kind of node
            table = f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">{grid}</TABLE>'
            rows.append(f'<TR><TD ALIGN="LEFT">{table}</TD></TR>')
        info = snapshot.size_info
        footer = text(
            "legend.footer_paged" if snapshot.page_size > 1 else "legend.footer", total=info.total_size,
            protected=info.protected_size, evictable=info.evictable_size, page_size=snapshot.page_size,
        )  # fmt: skip
        rows.append(f'<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="9">{_html(footer)}</FONT></TD></TR>')
    if not rows:
        return None
    return '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">' + "".join(rows) + "</TABLE>>"


SLOTS_PER_ROW = 16
"""The slot strip wraps after this many slots (rounded down to whole pages)."""


def _slot_strip(slots: SlotOwnership, legend: bool) -> str:
    """The pool as a row of numbered cells, one per slot, coloured by owner; with ``legend``, what each colour means.

    The legend lists every state, with its count, except ``evicted`` when no slot is in it: only a
    recorder's frame right after an ``evict`` has such slots, and every other drawing stays as it was.
    """
    per_row = max(slots.page_size, SLOTS_PER_ROW // slots.page_size * slots.page_size)
    size = 'WIDTH="22" HEIGHT="18" FIXEDSIZE="TRUE"'
    cells = []
    for slot, state in enumerate(slots.states):
        look = SLOT_LOOKS[state]
        cells.append(
            f'<TD BGCOLOR="{look.fill}" COLOR="{look.border}" BORDER="1"{_dashed(state)} {size}>'
            f'<FONT POINT-SIZE="9" COLOR="{look.text}">{slot}</FONT></TD>'
        )
    rows = []
    for start in range(0, len(cells), per_row):
        row = cells[start : start + per_row]
        head = (
            f'<TD ALIGN="RIGHT"><FONT POINT-SIZE="10">{_html(text("strip.slots"))}</FONT></TD>'
            if start == 0
            else "<TD></TD>"
        )
        rows.append(f"<TR>{head}{''.join(row)}</TR>")
    strip = '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="0">' + "".join(rows) + "</TABLE>"
    if not legend:
        return strip
    counts = slots.counts()
    entries = []
    for state in SLOT_STATES:
        if state == "evicted" and not counts[state]:
            continue
        look = SLOT_LOOKS[state]
        entry = text("strip.entry", meaning=text(f"slot.{state}"), count=counts[state])
        entries.append(
            f'<TD BGCOLOR="{look.fill}" COLOR="{look.border}" BORDER="1"{_dashed(state)} WIDTH="12" HEIGHT="12"'
            ' FIXEDSIZE="TRUE"></TD>'
            f'<TD ALIGN="LEFT"><FONT POINT-SIZE="9">{_html(entry)}</FONT></TD>'
        )
    key = "".join("<TR>" + "".join(entries[i : i + 3]) + "</TR>" for i in range(0, len(entries), 3))
    return (
        '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
        f'<TR><TD ALIGN="LEFT">{strip}</TD></TR>'
        f'<TR><TD ALIGN="LEFT"><TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2">{key}</TABLE></TD></TR>'
        "</TABLE>"
    )


def _dashed(state: str) -> str:
    """The strip draws a slot on its way from the tree to the pool with a dashed border."""
    return ' STYLE="dashed"' if state == "evicted" else ""


def draw_pool(pool: Any, manager: Any = None, *, title: str | None = None, legend: bool = True) -> TreeDrawing:
    """Draw only the slot strip of ``pool``: who owns each slot, with ``manager``'s tree (if it has one) as owner.

    Useful where there is no tree to draw, e.g. beside a
    :class:`~minikv.NaiveCacheManager`, which holds nothing: every slot that is
    not free is owned by a running request.
    """
    if title is not None and not isinstance(title, str):
        raise ArgumentTypeError(f"title must be a str, got {type(title).__name__}")
    has_tree = manager is not None and hasattr(getattr(manager, "root_node", None), "children")
    snapshot = TreeSnapshot.of(manager) if has_tree else None
    owners = SlotOwnership.of(snapshot, pool)
    label = _graph_label(None, title, legend, owners)
    drawing = TreeDrawing(
        name="slot_pool",
        graph_attr={"label": label or "", "labelloc": "t", "labeljust": "l", "fontname": "Helvetica", "margin": "0.1"},
        node_attr={"shape": "point", "style": "invis", "width": "0", "height": "0"},
        strip_slots=owners.num_slots,
    )
    drawing.node("anchor", "")  # dot draws nothing for a graph without nodes
    return drawing


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
    return f'{swatch}<TD ALIGN="LEFT"><FONT POINT-SIZE="10">{_html(text(f"state.{key}"))}</FONT></TD>'


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _dot_text(text: str) -> str:
    """Plain text for a DOT attribute: backslashes kept literal, never read as an HTML-like label."""
    return str(graphviz.nohtml(text.replace("\\", "\\\\")))
