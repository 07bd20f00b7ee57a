"""The storage pictures: their data must come from the tensors' strides, checked against hand-worked offsets."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.text import Text

from minikv import KVCacheLayout, MHAKVCache
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.viz import storage as vs

LAYERS, PAGES, HEADS, DIM = 3, 4, 2, 2
HALF = LAYERS * PAGES * HEADS * DIM  # elements of K (or of V), page_size 1


def tiny(layout: KVCacheLayout, page_size: int = 1, device: str = "cpu") -> MHAKVCache:
    return MHAKVCache(HEADS, LAYERS, DIM, PAGES, torch.float32, layout, device, page_size=page_size)


def figure_texts(figure: Figure) -> list[str]:
    texts = [t.get_text() for ax in figure.axes for t in ax.texts]
    texts += [ax.get_title(loc) for ax in figure.axes for loc in ("left", "center")]
    return texts + [label.get_text() for ax in figure.axes for label in ax.get_xticklabels()]


# ------------------------------------------------------------------ element_offsets


def test_offsets_layer_first_by_hand() -> None:
    offsets = vs.element_offsets(tiny(KVCacheLayout.LayerFirst).kv_buffer)
    # (kv, layer, page, row, head, dim) -> kv*48 + layer*16 + page*4 + head*2 + dim
    assert offsets[0, 0, 0, 0, 0, 0] == 0
    assert offsets[0, 0, 0, 0, 1, 1] == 3
    assert offsets[0, 1, 0, 0, 0, 0] == 16
    assert offsets[0, 1, 2, 0, 1, 0] == 16 + 8 + 2
    assert offsets[1, 2, 3, 0, 1, 1] == 48 + 32 + 12 + 2 + 1


def test_offsets_page_first_by_hand() -> None:
    offsets = vs.element_offsets(tiny(KVCacheLayout.PageFirst).kv_buffer)
    # stored (kv, page, layer, ...): kv*48 + page*12 + layer*4 + head*2 + dim
    assert offsets[0, 1, 0, 0, 0, 0] == 4
    assert offsets[0, 0, 1, 0, 0, 0] == 12
    assert offsets[0, 1, 2, 0, 1, 0] == 24 + 4 + 2
    assert offsets[1, 2, 3, 0, 1, 1] == 48 + 36 + 8 + 2 + 1


def test_offsets_of_a_layer_view_include_its_storage_offset() -> None:
    cache = tiny(KVCacheLayout.LayerFirst, page_size=2)
    k1 = cache.k_cache(1)  # (pages, page_size, heads, dim) = (4, 2, 2, 2), layer stride 32
    offsets = vs.element_offsets(k1)
    assert offsets.shape == (4, 2, 2, 2)
    assert offsets[0, 0, 0, 0] == 32
    assert offsets[3, 1, 1, 1] == 32 + 3 * 8 + 4 + 2 + 1
    v0 = cache.v_cache(0)
    assert vs.element_offsets(v0)[0, 0, 0, 0] == 2 * HALF  # V starts after all of K


def test_offsets_agree_with_data_ptr_arithmetic() -> None:
    cache = tiny(KVCacheLayout.PageFirst, page_size=2)
    view = cache.k_cache(2)
    base = cache.kv_buffer.data_ptr()
    offsets = vs.element_offsets(view)
    for index in [(0, 0, 0, 0), (1, 1, 0, 1), (3, 0, 1, 1)]:
        assert offsets[index] == (view[index].data_ptr() - base) // view.element_size()


def test_offsets_need_no_data() -> None:
    cache = MHAKVCache(8, 32, 128, 1000, torch.bfloat16, KVCacheLayout.PageFirst, "meta")
    offsets = vs.element_offsets(cache.k_cache(31))
    assert offsets[999, 0, 7, 127] == 999 * 32 * 8 * 128 + 31 * 8 * 128 + 7 * 128 + 127


def test_offsets_reject_non_tensors() -> None:
    with pytest.raises(ArgumentTypeError, match="view"):
        vs.element_offsets([1, 2, 3])  # type: ignore[arg-type]


# ------------------------------------------------------------------ memory_map and runs


def test_memory_map_owners_by_hand() -> None:
    layer_first = vs.memory_map(tiny(KVCacheLayout.LayerFirst))
    page_first = vs.memory_map(tiny(KVCacheLayout.PageFirst))
    assert len(layer_first) == len(page_first) == 2 * HALF
    # 20 = layer 1 * 16 + page 1 * 4 in LayerFirst; 20 = page 1 * 12 + layer 2 * 4 in PageFirst
    assert layer_first.owner(20) == (0, 1, 1, 0, 0, 0)
    assert page_first.owner(20) == (0, 2, 1, 0, 0, 0)
    assert page_first.owner(48 + 12 + 3) == (1, 0, 1, 0, 1, 1)
    with pytest.raises(ArgumentError, match="offset"):
        layer_first.owner(2 * HALF)


def test_memory_map_with_pages_of_several_tokens() -> None:
    owners = vs.memory_map(tiny(KVCacheLayout.PageFirst, page_size=2))
    # stored (kv, page, layer, row, head, dim) with strides (96, 24, 8, 4, 2, 1)
    assert owners.owner(24 + 16 + 4 + 2) == (0, 2, 1, 1, 1, 0)


def test_memory_map_is_a_permutation_of_coordinates() -> None:
    owners = vs.memory_map(tiny(KVCacheLayout.PageFirst))
    coords = set(zip(owners.kv, owners.layer, owners.page, owners.row, owners.head, owners.dim, strict=True))
    assert len(coords) == 2 * HALF


def test_contiguous_runs() -> None:
    assert vs.contiguous_runs([]) == []
    assert vs.contiguous_runs([7, 3, 1, 2]) == [(1, 3), (7, 1)]
    assert vs.contiguous_runs(np.array([[5, 6], [6, 9]])) == [(5, 2), (9, 1)]
    with pytest.raises(ArgumentTypeError):
        vs.contiguous_runs([0.5, 1.5])


@pytest.mark.parametrize(
    ("layout", "layer_runs", "page_runs"),
    [
        (KVCacheLayout.LayerFirst, [(16, 16)], [(8, 4), (24, 4), (40, 4)]),
        (KVCacheLayout.PageFirst, [(4, 4), (16, 4), (28, 4), (40, 4)], [(24, 12)]),
    ],
)
def test_what_is_contiguous_in_each_layout(layout, layer_runs, page_runs) -> None:
    cache = tiny(layout)
    assert vs.contiguous_runs(vs.element_offsets(cache.k_cache(1))) == layer_runs
    assert vs.contiguous_runs(vs.element_offsets(cache.kv_buffer[0][:, 2])) == page_runs


# ------------------------------------------------------------------ slots and ranks


@pytest.mark.parametrize("layout", list(KVCacheLayout))
def test_slot_grid_is_found_by_storing(layout: KVCacheLayout) -> None:
    cache = tiny(layout, page_size=4)
    before = cache.kv_buffer.clone()
    grid = vs.slot_grid(cache)
    assert grid.shape == (PAGES, 4)
    assert grid.tolist() == [[p * 4 + r for r in range(4)] for p in range(PAGES)]
    assert torch.equal(cache.kv_buffer, before)  # the cache itself is not written


def test_simulated_ranks_split_heads() -> None:
    ranks = vs.simulated_ranks(8, 4, num_layers=2, head_dim=4, num_pages=3)
    assert [r.head_range for r in ranks] == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    assert {r.nbytes for r in ranks} == {2 * 2 * 3 * 2 * 4 * 2}  # kv * layers * pages * local heads * dim * bf16
    assert all(r.device.type == "meta" for r in ranks)
    with pytest.raises(ArgumentError, match="divisible"):
        vs.simulated_ranks(6, 4)


# ------------------------------------------------------------------ figures


def test_draw_layouts_reports_the_runs_it_computed() -> None:
    figure = vs.draw_layouts([tiny(KVCacheLayout.LayerFirst), tiny(KVCacheLayout.PageFirst)], layer=1, page=2)
    assert isinstance(figure, Figure)
    texts = figure_texts(figure)
    assert texts.count("k_cache(1): 1 run") == 1 and texts.count("k_cache(1): 4 runs") == 1
    assert "page 2, K, all layers: 3 runs" in texts and "page 2, K, all layers: 1 run" in texts
    assert any("strides (48, 4, 12, 4, 2, 1)" in t for t in texts)
    cells = [p for p in figure.axes[0].patches if p.get_height() == 0.9]
    assert len(cells) == 2 * HALF


def _luminance(colour: object) -> float:
    """WCAG relative luminance of a matplotlib colour."""
    from matplotlib.colors import to_rgb

    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]  # type: ignore[arg-type]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


@pytest.mark.parametrize("figure_of", ["layouts", "slots"])
def test_storage_figures_are_legible_in_the_book_column(figure_of: str) -> None:
    """Shown unshrunk in the 690-px column (100 dpi), every label at least 9 pt (issue 28, item 7)."""
    if figure_of == "layouts":  # as chapter 3 draws them
        figure = vs.draw_layouts([tiny(KVCacheLayout.LayerFirst), tiny(KVCacheLayout.PageFirst)], layer=1, page=2)
    else:
        figure = vs.draw_slots(tiny(KVCacheLayout.PageFirst, page_size=4), highlight=range(6))
    shown = io.BytesIO()
    figure.savefig(shown, format="png", dpi=100, bbox_inches="tight")  # as the notebooks show it
    width = struct.unpack(">I", shown.getvalue()[16:20])[0]  # the PNG header's width
    assert width <= 690, f"{width} px: the book's column would shrink it"
    figure.canvas.draw()  # lays out the ticks, so their labels exist
    shown = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text()]
    assert sum(t.get_text()[-1].isdigit() for t in shown) > 20  # the numbers were found
    sizes = {t.get_text(): t.get_fontsize() for t in shown}
    small = {text: size for text, size in sizes.items() if size < 9}
    assert not small, small


def test_page_numbers_are_dark_on_light_cells() -> None:
    """The number is the data: each page digit contrasts with its cell at least 4.5:1 (WCAG AA)."""
    figure = vs.draw_layouts([tiny(KVCacheLayout.LayerFirst), tiny(KVCacheLayout.PageFirst)], layer=1, page=2)
    for ax in figure.axes:
        cells = {(round(p.get_x()), round(p.get_y())): p for p in ax.patches if p.get_height() == 0.9}
        digits = [t for t in ax.texts if t.get_text().isdigit()]
        assert len(digits) == len(cells) == 2 * HALF
        for digit in digits:
            x, y = digit.get_position()
            fill = cells[(round(x - 0.5), round(y - 0.45))].get_facecolor()
            light, dark = _luminance(fill), _luminance(digit.get_color())
            assert (light + 0.05) / (dark + 0.05) >= 4.5, (digit.get_text(), fill)


def test_draw_layouts_validates() -> None:
    with pytest.raises(ArgumentTypeError):
        vs.draw_layouts(tiny(KVCacheLayout.LayerFirst))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="layer"):
        vs.draw_layouts([tiny(KVCacheLayout.LayerFirst)], layer=LAYERS)


def test_draw_slots_labels_come_from_the_store() -> None:
    cache = tiny(KVCacheLayout.PageFirst, page_size=4)
    figure = vs.draw_slots(cache, highlight=[0, 5])
    texts = figure_texts(figure)
    assert sorted(t for t in texts if t.startswith("slot ")) == sorted(f"slot {s}" for s in range(16))
    # page 1's K starts at 1 * (layers * page_size * heads * dim) = 48 in layer 0, + 2 * 16 in layer 2
    assert "page 1\nL0 @ 48\nL2 @ 80" in texts
    with pytest.raises(ArgumentError, match="highlight"):
        vs.draw_slots(cache, highlight=[16])


def test_draw_head_split() -> None:
    figure = vs.draw_head_split(vs.simulated_ranks(8, 4))
    assert isinstance(figure, Figure)
    assert "rank 2: heads 4..5, 8 B" in figure_texts(figure)
    with pytest.raises(ArgumentError, match="ranks"):
        vs.draw_head_split(vs.simulated_ranks(8, 4)[1:])
