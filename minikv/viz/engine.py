"""The engine picture: who owns what in a serving loop, drawn from a live :class:`~minikv.engine.Engine`.

Each box is one part of the engine with what it holds right now (requests in each
queue, slots in the tree, free slots in the pool, rows of ``req_to_token``, the
shape of the K/V storage); each arrow is the calls one part makes on another. So the
picture is also a snapshot: draw it before and after a few steps and the numbers move.
"""

from __future__ import annotations

from typing import Any

import graphviz

from ..engine import Engine
from ..errors import ArgumentTypeError
from .labels import text
from .tree import render_svg

_BOX = {"shape": "box", "style": "rounded,filled", "fontname": "Helvetica", "fontsize": "11", "margin": "0.15,0.08"}
_COLOURS = {
    "engine": "#dbe7ff",
    "cache": "#e3f4e3",
    "pool": "#fff3d6",
    "table": "#f1f1f1",
    "storage": "#fde2e2",
    "model": "#efe6fb",
}


class EngineDrawing(graphviz.Digraph):  # type: ignore[misc]  # graphviz ships no type hints
    """A ``graphviz.Digraph`` of an engine, with a repr that never shows a memory address."""

    def __init__(self, *args: Any, summary: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.summary = summary

    def _copy_kwargs(self, **kwargs: Any) -> dict[str, Any]:
        copied: dict[str, Any] = super()._copy_kwargs(**kwargs)
        copied.update(summary=self.summary)
        return copied

    def __repr__(self) -> str:
        return f"<EngineDrawing: {self.summary}>"

    def svg(self) -> str:
        """The drawing as SVG text (graphviz's version comment removed)."""
        return render_svg(self.source)

    def _repr_image_svg_xml(self) -> str:
        return self.svg()


def draw_engine(engine: Engine, *, title: str | None = None) -> EngineDrawing:
    """Draw the parts of ``engine`` (scheduler, cache manager, pool, ``req_to_token``, K/V storage, model)."""
    if not isinstance(engine, Engine):
        raise ArgumentTypeError(f"engine must be a minikv.engine.Engine, got {type(engine).__name__}")
    cache, pool, kv_cache, model = engine.cache, engine.pool, engine.kv_cache, engine.model
    size = cache.size_info
    rows_in_use = sum(1 for request in engine.running if request.row >= 0)
    k0 = kv_cache.k_cache(0)
    dtype = str(kv_cache.dtype).replace("torch.", "")
    boxes = {
        "engine": (
            text("engine.head"),
            text("engine.queues", waiting=len(engine.waiting), running=len(engine.running),
                 finished=len(engine.finished)),
            text("engine.steps", steps=engine.stats.steps, prefill=engine.stats.prefill_batches,
                 decode=engine.stats.decode_batches),
        ),
        "cache": (
            text("engine.cache_head", name=type(cache).__name__),
            text("engine.tree_holds", total=size.total_size),
            text("engine.tree_split", protected=size.protected_size, evictable=size.evictable_size),
        ),
        "pool": (
            "PagePool",
            text("engine.pool_free", free=pool.num_free_slots, total=pool.num_slots),
            text("engine.pages_of", count=pool.page_size),
        ),
        "table": (
            "req_to_token",
            text("engine.rows", rows=rows_in_use, max_running=engine.max_running),
            text("engine.row_each"),
        ),
        "storage": (
            text("engine.storage_head", name=type(kv_cache).__name__),
            text("engine.storage_shape", layers=kv_cache.num_layers, pages=k0.shape[0], slots_per_page=k0.shape[1]),
            text("engine.storage_heads", heads=k0.shape[2], dims=k0.shape[3], kind=dtype),
        ),
        "model": (
            text("engine.model_head", name=type(model).__name__),
            text("engine.model_shape", layers=model.num_layers, query_heads=model.num_heads,
                 kv_heads=model.num_kv_heads),
            text("engine.model_reads"),
        ),
    }  # fmt: skip
    summary = (
        f"{len(engine.waiting)} waiting, {len(engine.running)} running, {len(engine.finished)} finished; "
        f"tree {size.total_size} slots, pool {pool.num_free_slots} free"
    )
    drawing = EngineDrawing(name="engine", summary=summary)
    drawing.attr(rankdir="TB", nodesep="0.3", ranksep="0.55")
    if title:
        drawing.attr(label=title, labelloc="t", fontname="Helvetica", fontsize="13")
    for name, (head, *lines) in boxes.items():
        label = "<" + f"<B>{_html(head)}</B>" + "".join(f"<BR/>{_html(line)}" for line in lines) + ">"
        drawing.node(name, label=label, fillcolor=_COLOURS[name], **_BOX)
    edges = [
        ("engine", "cache", "match_prefix, lock_handle,\ninsert_prefix"),
        ("engine", "pool", "allocate(evict_from=cache),\nfree"),
        ("pool", "cache", text("engine.evict_edge")),
        ("engine", "table", text("engine.row_edge")),
        ("engine", "model", text("engine.batches_edge")),
        ("table", "model", text("engine.slots_edge")),
        ("model", "storage", text("engine.store_edge")),
    ]
    for tail, head, label in edges:
        drawing.edge(tail, head, label=label, fontname="Helvetica", fontsize="9")
    return drawing


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
