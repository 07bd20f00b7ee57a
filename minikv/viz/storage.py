"""Pictures of the storage layer, computed from the real strides of an :class:`~minikv.MHAKVCache`.

Nothing here draws a picture someone typed in. Every function first asks the
tensors where their elements are -- ``storage_offset()`` plus ``index * stride()``
summed over the dimensions -- or asks ``store_kv`` where a slot lands, and only
then draws what it found. So if the storage layer changed, the pictures would
change with it, and the tests of this module would say so.

Data helpers (plain arrays, tested on their own):

* :func:`element_offsets` -- the memory offset of every element of a view;
* :func:`memory_map` -- for every offset of a cache's allocation, which
  (K/V, layer, page, row, head, dim) lives there;
* :func:`contiguous_runs` -- offsets grouped into unbroken stretches of memory;
* :func:`slot_grid` -- which flat slot ``store_kv`` puts in each (page, row);
* :func:`simulated_ranks` -- one cache per tensor-parallel rank.

Figures (each returns a matplotlib ``Figure``, made without pyplot
so nothing is shown or kept behind the caller's back): :func:`draw_layouts`,
:func:`draw_slots`, :func:`draw_head_split`, :func:`draw_rows_read`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .._validate import as_count, as_positive
from ..base import KVCacheLayout
from ..errors import ArgumentError, ArgumentTypeError
from ..mha_pool import MHAKVCache
from .figure import TextFigure
from .labels import text

__all__ = [
    "MemoryMap",
    "contiguous_runs",
    "draw_head_split",
    "draw_layouts",
    "draw_rows_read",
    "draw_slots",
    "element_offsets",
    "memory_map",
    "simulated_ranks",
    "slot_grid",
]

_LAYER_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
_RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
_MAX_LABELLED_CELLS = 64  # beyond this many cells in a row, numbers inside cells become unreadable
_COLUMN_INCHES = 6.7  # the book's 690-px column at the notebooks' 100 dpi, less the margin of a tight crop
_LABEL_POINTS = 9  # the smallest text in a storage figure
_INK = "#1a1a1a"  # text drawn over a cell: dark, on fills kept light by _shade


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class MemoryMap:
    """Who owns each element offset of one cache allocation.

    Each array has one entry per element of the allocation, indexed by the
    element's offset from the allocation's first element.
    """

    kv: np.ndarray
    """0 for K, 1 for V."""
    layer: np.ndarray
    page: np.ndarray
    row: np.ndarray
    """The token row inside the page (``slot % page_size``)."""
    head: np.ndarray
    """The *local* KV head (index into this rank's heads)."""
    dim: np.ndarray

    def __len__(self) -> int:
        return len(self.kv)

    def owner(self, offset: int) -> tuple[int, int, int, int, int, int]:
        """``(kv, layer, page, row, head, dim)`` of the element at ``offset``."""
        offset = as_count(offset, "offset")
        if offset >= len(self):
            raise ArgumentError(f"offset must be in [0, {len(self)}), got {offset}")
        fields = (self.kv, self.layer, self.page, self.row, self.head, self.dim)
        return tuple(int(field[offset]) for field in fields)  # type: ignore[return-value]


def element_offsets(view: torch.Tensor) -> np.ndarray:
    """The offset, in elements from the start of its storage, of every element of ``view``.

    This is the address arithmetic every kernel does: ``storage_offset()``
    plus the sum over dimensions of ``index * stride``. It reads no data, so it
    works for any device (``meta`` included).
    """
    if not isinstance(view, torch.Tensor):
        raise ArgumentTypeError(f"view must be a torch.Tensor, got {type(view).__name__}")
    offsets = np.full(tuple(view.shape), view.storage_offset(), dtype=np.int64)
    for axis, (size, stride) in enumerate(zip(view.shape, view.stride(), strict=True)):
        shape = [1] * view.dim()
        shape[axis] = size
        offsets = offsets + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return offsets


def memory_map(cache: MHAKVCache) -> MemoryMap:
    """For every element of the cache's one allocation, the coordinates that live there.

    Raises if the buffer does not cover its storage exactly once: that would
    mean two coordinates share memory, or memory was allocated and not used.
    """
    buffer = _cache(cache, "cache").kv_buffer
    offsets = element_offsets(buffer).ravel()
    size = buffer.untyped_storage().nbytes() // buffer.element_size()
    if len(offsets) != size or not np.array_equal(np.sort(offsets), np.arange(size)):
        raise ArgumentError("cache: its buffer does not cover its allocation exactly once")
    coordinates = np.indices(tuple(buffer.shape), dtype=np.int64).reshape(buffer.dim(), -1)
    owners = np.empty_like(coordinates)
    owners[:, offsets] = coordinates
    return MemoryMap(*owners)


def contiguous_runs(offsets: Iterable[int] | np.ndarray) -> list[tuple[int, int]]:
    """``offsets`` grouped into maximal unbroken stretches, as ``(start, length)`` in increasing order."""
    values = np.unique(np.asarray(offsets if isinstance(offsets, np.ndarray) else list(offsets)))  # sorted, flat
    if values.size == 0:
        return []
    if not np.issubdtype(values.dtype, np.integer):
        raise ArgumentTypeError(f"offsets must be integers, got {values.dtype}")
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    return [(int(run[0]), len(run)) for run in np.split(values, breaks)]


def slot_grid(cache: MHAKVCache) -> np.ndarray:
    """``grid[page, row]``: the flat slot that ``store_kv`` writes into row ``row`` of page ``page``.

    Found by experiment rather than by formula: every slot's own number is
    written through ``store_kv`` into a scratch cache with the same layers,
    pages, page size and layout (one head of one dimension, float32, CPU), and
    read back from ``k_cache(0)``. ``cache`` itself is not touched.
    """
    cache = _cache(cache, "cache")
    scratch = MHAKVCache(
        num_kv_heads=1, num_layers=cache.num_layers, head_dim=1, num_pages=cache.num_pages,
        dtype=torch.float32, kv_layout=cache.kv_layout, device="cpu", page_size=cache.page_size,
    )  # fmt: skip
    slots = torch.arange(scratch.num_slots, dtype=torch.int64)
    values = (slots + 1).to(torch.float32).reshape(-1, 1, 1)  # +1 so an unwritten row (0) would show as -1
    scratch.store_kv(values, values.clone(), slots, layer_id=0)
    return scratch.k_cache(0)[:, :, 0, 0].to(torch.int64).numpy() - 1


def simulated_ranks(
    num_kv_heads: int,
    tp_size: int,
    *,
    num_layers: int = 1,
    head_dim: int = 1,
    num_pages: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "meta",
) -> list[MHAKVCache]:
    """One :class:`~minikv.MHAKVCache` per tensor-parallel rank, as each GPU would build it.

    On the ``meta`` device (the default) no memory is allocated, so real model
    sizes cost nothing. A head count that ``tp_size`` does not divide raises
    the cache's own :class:`~minikv.errors.ArgumentError`.
    """
    tp_size = as_positive(tp_size, "tp_size")
    return [
        MHAKVCache(
            num_kv_heads,
            num_layers,
            head_dim,
            num_pages,
            dtype,
            KVCacheLayout.LayerFirst,
            device,
            tp_rank=rank,
            tp_size=tp_size,
        )
        for rank in range(tp_size)
    ]


# --------------------------------------------------------------------------- figures


def draw_layouts(caches: Sequence[MHAKVCache], layer: int = 1, page: int = 2) -> Figure:
    """The memory of each cache as a strip of elements, coloured by (layer, page).

    Each cache gets one panel: its allocation wrapped into a K row and a V row
    (the wrap width is the buffer's K/V stride, read from the tensor). Colour
    is the layer, shade and number the page. Below the K row two tracks mark
    the stretches of memory that hold ``k_cache(layer)`` and the K of ``page``
    across every layer, with their run counts in the labels.
    """
    caches = _cache_list(caches)
    _check_index(layer, min(c.num_layers for c in caches), "layer")
    _check_index(page, min(c.num_pages for c in caches), "page")
    row_length = max(c.kv_buffer.stride(0) for c in caches)
    width = min(_COLUMN_INCHES, 1.0 + 0.14 * row_length)  # wider pictures would be shrunk in the column
    figure = TextFigure(figsize=(width, 2.1 * len(caches) + 0.5), layout="constrained")
    axes = figure.subplots(len(caches), 1, squeeze=False)[:, 0]
    for ax, cache in zip(axes, caches, strict=True):
        _draw_one_layout(ax, cache, layer, page, row_length)
    num_layers = max(c.num_layers for c in caches)
    handles = [
        Patch(facecolor=_shade(_layer_colour(i), 0, 1), label=text("storage.layer", layer=i)) for i in range(num_layers)
    ]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(num_layers, 8), frameon=False)
    figure.suptitle(
        text("storage.layouts_title") + "\n" + text("storage.layouts_key"),
        fontsize=_LABEL_POINTS,
    )
    return figure


def draw_slots(cache: MHAKVCache, highlight: Iterable[int] = ()) -> Figure:
    """Flat token slots against pages: where ``store_kv`` puts each slot, from :func:`slot_grid`.

    One column per page, one cell per row of the page, each labelled with the
    slot found there. ``highlight`` slots (say, one request's) are filled.
    Under each page: the element offset where that page's K starts in layer 0
    and in the last layer, read from the strides of ``k_cache``.
    """
    cache = _cache(cache, "cache")
    grid = slot_grid(cache)
    marked = {as_count(s, "highlight") for s in highlight}
    outside = sorted(s for s in marked if s >= cache.num_slots)
    if outside:
        raise ArgumentError(f"highlight: slot {outside[0]} is outside [0, {cache.num_slots})")
    first = element_offsets(cache.k_cache(0))[:, 0, 0, 0]
    last = element_offsets(cache.k_cache(cache.num_layers - 1))[:, 0, 0, 0]
    pages, rows = grid.shape
    figure = TextFigure(figsize=(max(4.0, 1.2 + 1.1 * pages), 1.6 + 0.45 * rows), layout="constrained")
    ax = figure.subplots()
    for p in range(pages):
        for r in range(rows):
            slot = int(grid[p, r])
            colour = "#f2b134" if slot in marked else "white"
            ax.add_patch(Rectangle((p, rows - 1 - r), 1, 1, facecolor=colour, edgecolor="black", linewidth=0.8))
            ax.text(p + 0.5, rows - 0.5 - r, text("storage.slot", slot=slot), ha="center", va="center",
                    fontsize=_LABEL_POINTS)  # fmt: skip
        ax.add_patch(Rectangle((p, 0), 1, rows, fill=False, edgecolor="black", linewidth=2.0))
    ax.set_xlim(0, pages)
    ax.set_ylim(0, rows)
    ax.set_xticks([p + 0.5 for p in range(pages)])
    ax.set_xticklabels(
        [f"{text('storage.page', page=p)}\nL0 @ {first[p]}\nL{cache.num_layers - 1} @ {last[p]}" for p in range(pages)],
        fontsize=_LABEL_POINTS,
    )
    ax.set_yticks([rows - 0.5 - r for r in range(rows)])
    ax.set_yticklabels([text("storage.row", row=r) for r in range(rows)], fontsize=_LABEL_POINTS)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(
        text("storage.slots_title", value=cache.kv_layout.name, page_size=cache.page_size)
        + "\n"
        + text("storage.slots_note"),
        fontsize=9,
    )
    return figure


def draw_head_split(ranks: Sequence[MHAKVCache]) -> Figure:
    """The tensor-parallel split of KV heads: which rank stores which global head.

    ``ranks`` are the caches of ranks ``0..tp_size-1`` (see :func:`simulated_ranks`).
    The top row shows every global KV head coloured by its owner, read from
    each cache's ``head_range``; below it, each rank's local heads and bytes.
    """
    ranks = _cache_list(ranks, "ranks")
    tp_size, num_heads = ranks[0].tp_size, ranks[0].num_kv_heads
    if [c.tp_rank for c in ranks] != list(range(tp_size)) or any(
        c.tp_size != tp_size or c.num_kv_heads != num_heads for c in ranks
    ):
        raise ArgumentError(f"ranks must be the caches of ranks 0..{tp_size - 1} of one model, in order")
    owner = np.full(num_heads, -1)
    for cache in ranks:
        owner[list(cache.head_range)] = cache.tp_rank
    cell = 0.4 if num_heads <= 12 else 4.8 / num_heads  # inches per head; the rank labels need ~2.6 in
    figure = TextFigure(figsize=(cell * num_heads + 2.8, 1.0 + 0.45 * (tp_size + 1)), layout="constrained")
    ax = figure.subplots()
    top = tp_size + 0.3
    for head in range(num_heads):
        colour = _RANK_COLOURS[owner[head] % len(_RANK_COLOURS)]
        ax.add_patch(Rectangle((head, top), 1, 0.8, facecolor=colour, edgecolor="white"))
        ax.text(head + 0.5, top + 0.4, str(head), ha="center", va="center", fontsize=8, color="white")
    for cache in ranks:
        y = tp_size - 1 - cache.tp_rank
        colour = _RANK_COLOURS[cache.tp_rank % len(_RANK_COLOURS)]
        for local, head in enumerate(cache.head_range):
            ax.add_patch(Rectangle((head, y), 1, 0.8, facecolor=colour, alpha=0.35, edgecolor=colour))
            ax.text(head + 0.5, y + 0.4, f"{local}", ha="center", va="center", fontsize=8)
        ax.text(
            num_heads + 0.2, y + 0.4,
            text("storage.rank", rank=cache.tp_rank, first=cache.head_range.start, last=cache.head_range.stop - 1,
                 size=_size(cache.nbytes)),
            va="center", fontsize=8,
        )  # fmt: skip
    ax.text(num_heads + 0.2, top + 0.4, text("storage.global_head"), va="center", fontsize=8)
    ax.set_xlim(0, num_heads + 2.6 / cell)  # room for the rank labels on the right
    ax.set_ylim(-0.2, top + 1.0)
    ax.axis("off")
    ax.set_title(
        text("storage.heads_title", num_heads=num_heads, tp_size=tp_size, local=ranks[0].local_kv_heads)
        + "\n"
        + text("storage.heads_note"),
        fontsize=9,
    )
    return figure


# --------------------------------------------------------------------------- helpers


def _draw_one_layout(ax: Any, cache: MHAKVCache, layer: int, page: int, row_length: int) -> None:
    owners = memory_map(cache)
    kv_stride = cache.kv_buffer.stride(0)
    labelled = kv_stride <= _MAX_LABELLED_CELLS
    for offset in range(len(owners)):
        layer_of, page_of = int(owners.layer[offset]), int(owners.page[offset])
        x, y = offset % kv_stride, 3 - (offset // kv_stride)
        colour = _shade(_layer_colour(layer_of), page_of, cache.num_pages)
        ax.add_patch(Rectangle((x, y), 1, 0.9, facecolor=colour, edgecolor="white", linewidth=0.5))
        if labelled:
            ax.text(x + 0.5, y + 0.45, str(page_of), ha="center", va="center", fontsize=_LABEL_POINTS, color=_INK)
    for row in range(len(owners) // kv_stride):
        kv = int(owners.kv[row * kv_stride])  # which half this row of memory belongs to, as stored
        ax.text(-0.4, 3 - row + 0.45, "KV"[kv], ha="right", va="center", fontsize=_LABEL_POINTS, weight="bold")
    tracks = (
        (1.0, f"k_cache({layer})", element_offsets(cache.k_cache(layer)), "black"),
        (0.25, text("storage.page_track", page=page), element_offsets(cache.kv_buffer[0][:, page]), "tab:gray"),
    )
    for track_y, name, offsets, track_colour in tracks:
        runs = contiguous_runs(offsets)
        for start, length in runs:
            ax.add_patch(
                Rectangle((start, track_y), length, 0.3, facecolor=track_colour, edgecolor="white", linewidth=1.0)
            )
        label = text("storage.runs", track=name, count=len(runs))
        ax.text(0, track_y + 0.36, label, ha="left", va="bottom", fontsize=_LABEL_POINTS)
    ax.set_xlim(-1.2, row_length + 0.2)
    ax.set_ylim(0.15, 4.0)
    ax.set_yticks([])
    step = cache.page_size * cache.local_kv_heads * cache.head_dim
    ax.set_xticks(range(0, kv_stride + 1, step))
    ax.tick_params(axis="x", labelsize=_LABEL_POINTS)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(
        text("storage.buffer", value=cache.kv_layout.name, shape=tuple(cache.kv_buffer.shape),
             strides=cache.kv_buffer.stride()),
        fontsize=_LABEL_POINTS, loc="left",
    )  # fmt: skip


def draw_rows_read(found: Any) -> Figure:
    """Which cache rows a decode-attention kernel read, one panel per request, pages as columns.

    ``found`` is what ``minikv.exercises.paged_attention.rows_read`` returns: boolean arrays
    ``read`` and ``expected`` of shape ``(requests, slots)``, the ``page_size`` and the ``lens``.
    A cell is one row of a page (slot ``page * page_size + row``): filled blue where the request
    read a row it owns, red where it read a row it does not own, outlined in orange where it owns
    the row but did not read it, blank elsewhere.
    """
    read = np.asarray(getattr(found, "read", None), dtype=bool)
    expected = np.asarray(getattr(found, "expected", None), dtype=bool)
    page_size = as_positive(getattr(found, "page_size", 0), "found.page_size")
    if read.ndim != 2 or read.shape != expected.shape or read.shape[1] % page_size:
        raise ArgumentError("found: read and expected must be (requests, slots) arrays of whole pages")
    requests, slots = read.shape
    pages = slots // page_size
    lens = list(getattr(found, "lens", [int(row.sum()) for row in expected]))
    figure = TextFigure(figsize=(max(4.0, 1.0 + 0.55 * pages * requests), 1.4 + 0.32 * page_size), layout="constrained")
    axes = figure.subplots(1, requests, squeeze=False)[0]
    for b, ax in enumerate(axes):
        for slot in range(slots):
            page, row = divmod(slot, page_size)
            mine, used = bool(expected[b, slot]), bool(read[b, slot])
            colour = ("#4c72b0" if mine else "#c44e52") if used else "white"
            edge, width = ("#dd8452", 2.0) if mine and not used else ("black", 0.6)
            ax.add_patch(
                Rectangle((page, page_size - 1 - row), 1, 1, facecolor=colour, edgecolor=edge, linewidth=width)
            )
        for page in range(pages):
            ax.add_patch(Rectangle((page, 0), 1, page_size, fill=False, edgecolor="black", linewidth=1.6))
        ax.set_xlim(0, pages)
        ax.set_ylim(0, page_size)
        ax.set_xticks([p + 0.5 for p in range(pages)])
        ax.set_xticklabels([str(p) for p in range(pages)], fontsize=8)
        ax.set_yticks([page_size - 0.5 - r for r in range(page_size)])
        ax.set_yticklabels([str(r) for r in range(page_size)], fontsize=8)
        ax.set_xlabel(text("storage.page_axis"), fontsize=8)
        ax.set_ylabel(text("storage.row_axis") if b == 0 else "", fontsize=8)
        ax.tick_params(length=0)
        wrong = int((read[b] & ~expected[b]).sum()) + int((expected[b] & ~read[b]).sum())
        verdict = text("storage.rows_right") if not wrong else text("storage.rows_wrong", count=wrong)
        length = lens[b] if b < len(lens) else "?"
        ax.set_title(text("storage.request_rows", n=b, total=length, verdict=verdict), fontsize=9)
    figure.legend(
        handles=[
            Patch(facecolor="#4c72b0", edgecolor="black", label=text("storage.read_own")),
            Patch(facecolor="#c44e52", edgecolor="black", label=text("storage.read_other")),
            Patch(facecolor="white", edgecolor="#dd8452", linewidth=2.0, label=text("storage.own_unread")),
        ],
        loc="outside lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    return figure


def _size(nbytes: int) -> str:
    return f"{nbytes:,} B" if nbytes < 2**20 else f"{nbytes / 2**20:,.1f} MiB"


def _layer_colour(layer: int) -> tuple[float, float, float]:
    return to_rgb(_LAYER_COLOURS[layer % len(_LAYER_COLOURS)])


def _shade(colour: tuple[float, float, float], page: int, num_pages: int) -> tuple[float, float, float]:
    """The layer's colour mixed with white: 45% for page 0, up to 85% for the last page.

    Light enough everywhere for the dark page number drawn over it to read.
    """
    mix = 0.45 + 0.4 * page / max(1, num_pages - 1)
    return tuple(c + (1.0 - c) * mix for c in colour)  # type: ignore[return-value]


def _cache(cache: object, name: str) -> MHAKVCache:
    if not isinstance(cache, MHAKVCache):
        raise ArgumentTypeError(f"{name} must be an MHAKVCache, got {type(cache).__name__}")
    return cache


def _cache_list(caches: object, name: str = "caches") -> list[MHAKVCache]:
    if isinstance(caches, MHAKVCache) or not isinstance(caches, Sequence) or len(caches) == 0:
        raise ArgumentTypeError(f"{name} must be a non-empty sequence of MHAKVCache")
    return [_cache(c, f"{name}[{i}]") for i, c in enumerate(caches)]


def _check_index(value: object, bound: int, name: str) -> None:
    index = as_count(value, name)
    if index >= bound:
        raise ArgumentError(f"{name} must be in [0, {bound}), got {index}")
