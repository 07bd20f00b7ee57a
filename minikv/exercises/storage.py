"""Checks for chapter 3: tensor-parallel heads, the page-first layout, slot
mapping, and the store kernel (in torch, then in Triton).

The store checks put every cache and every source tensor in the middle of a
much larger allocation, with guard memory on both sides filled with a marker
value. A kernel that gets its strides or page arithmetic wrong then writes into
the guard, where the check sees it and says so, instead of corrupting memory the
Python process needs: Triton's interpreter does not check bounds, and neither
does a GPU. The guards are sized for the usual slips (a slot used as a page
number, a stride from the wrong tensor), not for any address at all.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..base import KVCacheLayout
from ..kernels import store as _store_module
from ..language import tr
from ..mha_pool import MHAKVCache
from ._core import (
    Case,
    Draw,
    Invalid,
    LearnerRaised,
    Mismatch,
    call,
    call_watching,
    exercise,
    expect_equal,
    explain_a_kernel_compiled_for_no_gpu,
    outcome,
    raised,
    random_case,
    shrink_int,
)
from ._report import diff

_F = Callable[..., object]
LAYERS = 2
FILL = -3.0
"""What every cache slot holds before a store, so that an unwritten slot is recognisable."""
GUARD_FACTOR = 64
"""Guard memory on each side of a tensor, as a multiple of the tensor's own span (plus 4096 elements)."""


def _device() -> torch.device:
    """CUDA tensors on a GPU (Triton compiles), CPU tensors elsewhere (Triton interprets)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- storage.tp_head_range ------------------------------------------------------


@exercise("storage.tp_head_range", lambda: tr("which KV heads one tensor-parallel rank stores"))
def _tp_cases() -> list[Case]:
    splits = [
        (tr("a single GPU stores all 8 heads"), 8, 0, 1),
        (tr("1 head, 1 GPU"), 1, 0, 1),
        (tr("8 heads over 4 GPUs, rank 1"), 8, 1, 4),
        (tr("8 heads over 4 GPUs, the last rank"), 8, 3, 4),
        (tr("6 heads over 3 GPUs, rank 2"), 6, 2, 3),
        (tr("32 heads over 8 GPUs, rank 5"), 32, 5, 8),
        (tr("8 heads over 8 GPUs: one head each, rank 7"), 8, 7, 8),
    ]
    errors = [
        (tr("6 heads cannot be split evenly over 4 GPUs: raise ValueError"), 6, 0, 4),
        (tr("rank 4 does not exist when tp_size is 4: raise ValueError"), 8, 4, 4),
    ]

    def make(desc: str, heads: int, rank: int, size: int) -> Case:
        def run(fn: _F) -> None:
            got = call(fn, heads, rank, size)
            expected = MHAKVCache(
                heads, 1, 1, 1, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_rank=rank, tp_size=size
            ).head_range
            if not isinstance(got, (range, list, tuple)):
                raise Mismatch(tr("return a range of head numbers."), repr(expected), f"{type(got).__name__}: {got!r}")
            expect_equal(
                tr("the heads of rank {rank} of {size} (of {heads} KV heads)", rank=rank, size=size, heads=heads),
                list(expected),
                list(got),
            )

        return Case(desc, heads, run)

    def make_error(desc: str, heads: int, rank: int, size: int) -> Case:
        def run(fn: _F) -> None:
            try:
                MHAKVCache(heads, 1, 1, 1, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_rank=rank, tp_size=size)
            except ValueError:
                pass
            else:  # pragma: no cover - a check of the reference itself
                raise AssertionError("the reference accepted an impossible split")
            got, error = raised(fn, heads, rank, size)
            if not isinstance(error, ValueError):
                what = outcome(error, got)
                raise Mismatch(
                    tr(
                        "tp_head_range({heads}, {rank}, {size}) must raise ValueError.",
                        heads=heads,
                        rank=rank,
                        size=size,
                    ),
                    "ValueError",
                    what,
                )

        return Case(desc, heads, run)

    def draw(rng: random.Random, size: int) -> tuple[int, int, int]:
        tp = rng.randint(1, 1 + size // 2)
        heads = tp * rng.randint(1, 1 + size // 2) if rng.random() < 0.7 else rng.randint(1, 4 + size * 2)
        rank = rng.choice((rng.randrange(tp), rng.randrange(tp), -1, -rng.randint(1, 9), tp, tp + rng.randint(1, 9)))
        return heads, rank, tp

    def run_one(fn: _F, args: tuple[int, int, int]) -> None:
        try:
            MHAKVCache(
                args[0], 1, 1, 1, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_rank=args[1], tp_size=args[2]
            )
        except ValueError:
            make_error("", *args).run(fn)
        else:
            make("", *args).run(fn)

    def shrink(args: tuple[int, int, int]) -> list[tuple[int, int, int]]:
        heads, rank, tp = args
        smaller = [(h, rank, tp) for h in shrink_int(heads, 1)]
        return smaller + ([(heads, rank, t) for t in shrink_int(tp, 1)] if tp > 1 else [])

    def degenerate(rng: random.Random, size: int) -> tuple[int, int, int]:
        """One GPU, one head per GPU, more GPUs than heads, no GPU at all (tp_size 0 or negative: no rank
        is in ``range(tp_size)``), the first and last ranks and just past them."""
        heads = rng.choice((1, 2, rng.randint(1, 64)))
        tp = rng.choice((1, heads, heads + 1, 2 * heads, 0, -1, -rng.randint(2, 9)))
        rank = rng.choice((0, tp - 1, tp, -1, rng.randrange(max(tp, 1))))
        return heads, rank, tp

    return (
        [make(*s) for s in splits]
        + [make_error(*s) for s in errors]
        + [
            random_case(
                tr(
                    "{count} random splits, possible and impossible (negative ranks, ranks past the end, uneven "
                    "splits, one GPU, more GPUs than heads, tp_size 0 or negative)",
                    count=TP_DRAWS,
                ),
                Draw(
                    draw,
                    run_one,
                    lambda a: f"tp_head_range({a[0]}, {a[1]}, {a[2]})",
                    shrink,
                    classes=((tr("a degenerate configuration"), degenerate),),
                ),
                seed=700,
                max_size=30,
                count=TP_DRAWS,
            )
        ]
    )


TP_DRAWS, VIEW_DRAWS, MAPPING_DRAWS = 1500, 1000, 3000
"""How many random inputs the storage checks draw: as many as keep each check well under a second."""


# -- storage.page_first_view ----------------------------------------------------


@exercise("storage.page_first_view", lambda: tr("the layer-first view of a page-first buffer, without copying"))
def _view_cases() -> list[Case]:
    shapes = [
        (tr("3 pages, 2 layers, 1 head, head_dim 4"), 3, 2, 1, 4),
        (tr("5 pages, 3 layers, 2 heads, head_dim 8"), 5, 3, 2, 8),
        (tr("7 pages, 4 layers, 3 heads, head_dim 24"), 7, 4, 3, 24),
        (tr("a single page, 3 layers"), 1, 3, 2, 2),
        (tr("a single layer, 4 pages"), 4, 1, 2, 2),
    ]

    def make(desc: str, pages: int, layers: int, heads: int, dim: int) -> Case:
        return Case(desc, pages * layers * heads * dim, lambda fn: _check_view(fn, (pages, layers, heads, dim)))

    def draw(rng: random.Random, size: int) -> tuple[Any, ...]:
        dims = tuple(rng.randint(1, 1 + size // 3) for _ in range(4))
        return (*dims, rng.choice(_VIEW_DTYPES), rng.choice(("contiguous", "offset", "strided")))

    def shrink(value: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        out = [(*value[:i], x, *value[i + 1 :]) for i in range(4) for x in shrink_int(value[i], 1)]
        return out + ([(*value[:4], torch.float32, value[5])] if value[4] != torch.float32 else [])

    def show(value: tuple[Any, ...]) -> str:
        pages, layers, heads, dim, dtype, kind = value
        where = {"contiguous": tr("its own contiguous memory"), "offset": tr("a slice of a larger tensor"),
                 "strided": tr("a view whose head_dim stride is 2")}[kind]  # fmt: skip
        return tr(
            "a {dtype} buffer of {pages} pages, {layers} layers, {heads} heads, head_dim {dim}, in {where}",
            dtype=dtype,
            pages=pages,
            layers=layers,
            heads=heads,
            dim=dim,
            where=where,
        )

    return [make(*s) for s in shapes] + [
        random_case(
            tr("{count} random buffers: any shape, dtype, storage offset and strides", count=VIEW_DRAWS),
            Draw(draw, lambda fn, v: _check_view(fn, v[:4], v[4], v[5]), show, shrink),
            seed=600,
            max_size=18,
            count=VIEW_DRAWS,
        )
    ]


_VIEW_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16)


def _page_first_buffer(dims: tuple[int, ...], dtype: torch.dtype, kind: str) -> torch.Tensor:
    """A page-first buffer holding 0, 1, 2, ... in its own element order, stored as ``kind`` says."""
    pages, layers, heads, dim = dims
    shape = (2, pages, layers, heads, dim)
    numel = 2 * pages * layers * heads * dim
    values = torch.arange(numel, dtype=torch.float64)
    if kind == "offset":
        big = torch.full((numel + 37,), -5.0, dtype=torch.float64)
        buffer = big[17 : 17 + numel].view(shape)
    elif kind == "strided":
        buffer = torch.full((*shape[:-1], 2 * dim), -5.0, dtype=torch.float64)[..., ::2]
    else:
        buffer = torch.empty(shape, dtype=torch.float64)
    buffer.copy_(values.view(shape))
    if dtype == torch.float64:
        return buffer
    # the same storage layout in the wanted dtype (exact for small sizes, where reports point at elements)
    base = torch.zeros(buffer.untyped_storage().nbytes() // 8, dtype=dtype)
    out = base.as_strided(shape, buffer.stride(), buffer.storage_offset())
    out.copy_(buffer)
    return out


def _check_view(fn: _F, dims: tuple[int, ...], dtype: torch.dtype = torch.float32, kind: str = "contiguous") -> None:
    pages, layers, heads, dim = dims
    buffer = _page_first_buffer(dims, dtype, kind)
    whole = buffer.untyped_storage()
    original, memory = buffer.clone(), torch.empty(0, dtype=torch.uint8).set_(whole).clone()
    got = call(fn, buffer)
    if not isinstance(got, torch.Tensor):
        raise Mismatch(tr("return a tensor."), "a torch.Tensor", type(got).__name__)
    expect_equal(
        tr("the view's shape (2, layers, pages, heads, head_dim)"), (2, layers, pages, heads, dim), tuple(got.shape)
    )
    if not torch.equal(buffer, original) or not torch.equal(torch.empty(0, dtype=torch.uint8).set_(whole), memory):
        raise Mismatch(tr("your function changed the buffer's memory; a view only looks at it."))
    expected = buffer.permute(0, 2, 1, 3, 4)
    if not torch.equal(got, expected):
        exact = dtype in (torch.float64, torch.float32, torch.int64, torch.int32) or buffer.numel() <= 256
        raise Mismatch(
            _describe_wrong_view(got, expected, buffer)
            if exact and kind == "contiguous"
            else tr(
                "your view does not show buffer[kv, page, layer] at view[kv, layer, page]: "
                "the layers and pages must swap places, whatever the buffer's strides and offset."
            ),
            "view[kv, layer, page] == buffer[kv, page, layer]",
            tr("other elements (see above)"),
        )
    if not _inside(got, whole):
        raise Mismatch(
            tr(
                "your result is a copy, not a view: the store kernel would write into the copy "
                "and the cache would never see it."
            ),
            tr("a tensor that shares the buffer's memory"),
            tr("a tensor with memory of its own"),
        )
    got[1, layers - 1, 0, heads - 1, dim - 1] = 7
    if buffer[1, 0, layers - 1, heads - 1, dim - 1].item() != 7:
        raise Mismatch(tr("writing through your view did not change the buffer where it should have."))


def _inside(view: torch.Tensor, storage: torch.UntypedStorage) -> bool:
    """Whether every element of ``view`` lies in ``storage``'s memory: a view made by any route (``permute``,
    ``as_strided``, ``torch.from_dlpack`` of a slice, which starts a storage of its own at the slice) does."""
    if view.device != storage.device or view.numel() == 0:
        return view.device == storage.device
    size = view.element_size()
    low = high = view.data_ptr()
    for n, stride in zip(view.shape, view.stride(), strict=True):
        reach = (n - 1) * stride * size
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return storage.data_ptr() <= low and high + size <= storage.data_ptr() + storage.nbytes()


def _describe_wrong_view(got: torch.Tensor, expected: torch.Tensor, buffer: torch.Tensor) -> str:
    diff = (got != expected).nonzero()
    kv, layer, page, head, d = (int(x) for x in diff[0])
    value = int(got[kv, layer, page, head, d].item())
    if 0 <= value < buffer.numel():
        skv, spage, slayer, shead, sd = _unravel(value, tuple(buffer.shape))
        source = tr(
            "buffer[{kv}, page {page}, layer {layer}, head {head}, {d}]",
            kv=skv,
            page=spage,
            layer=slayer,
            head=shead,
            d=sd,
        )
    else:
        source = tr("the value {value}, which is not in the buffer at all", value=value)
    return tr(
        "view[{kv}, layer {layer}, page {page}, head {head}, {d}] should be "
        "buffer[{kv}, page {page}, layer {layer}, head {head}, {d}], "
        "but it is {source}. A reshape or view keeps the memory order; the layers and pages must swap places instead.",
        kv=kv,
        layer=layer,
        page=page,
        head=head,
        d=d,
        source=source,
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


# -- storage.slot_mapping ---------------------------------------------------------


@exercise("storage.slot_mapping", lambda: tr("the slot of each token position, from a request's page table"))
def _slot_mapping_cases() -> list[Case]:
    settings = [
        (tr("page_size 1: one page per token"), [5, 2, 9, 0], 0, 4, 1),
        (tr("nothing to map (start == end)"), [3, 1], 2, 2, 4),
        (tr("page_size 4, positions 0..9: the last page is half full"), [2, 0, 7], 0, 10, 4),
        (tr("a decode step: only position 9, in the third page"), [2, 0, 7], 9, 10, 4),
        (tr("positions 5..12 start inside a page and cross two page borders"), [6, 3, 1, 4], 5, 13, 4),
        (tr("page_size 16, pages in descending order"), [40, 30, 20, 10], 0, 50, 16),
        (tr("page_size 3 (not a power of two)"), [4, 8, 1, 0, 5], 2, 14, 3),
    ]

    def make(desc: str, table: list[int], start: int, end: int, page_size: int) -> Case:
        return Case(desc, end - start, lambda fn: _check_slot_mapping(fn, tuple(table), start, end, page_size))

    def draw(rng: random.Random, size: int) -> tuple[tuple[int, ...], int, int, int]:
        page_size = rng.choice((1, 2, 3, 4, 5, 7, 8, 16, 32, rng.randint(1, 64)))
        end = rng.randint(0, size * 4)
        start = rng.randint(0, end)
        pages_needed = -(-end // page_size) + rng.randint(0, 2)
        top = (2**31 - 1) // page_size - 1 if rng.random() < 0.4 else 4 * pages_needed + 4  # slots stay int32
        table = tuple(rng.sample(range(top + 1), pages_needed) if top < 10**6 else
                      {rng.randint(0, top) for _ in range(pages_needed)})  # fmt: skip
        while len(table) < pages_needed:
            table += (rng.randint(0, top),)
        return table, start, end, page_size

    def shrink(args: tuple[tuple[int, ...], int, int, int]) -> list[tuple[tuple[int, ...], int, int, int]]:
        table, start, end, ps = args
        out = [(table, start, e, ps) for e in shrink_int(end, start) if -(-e // ps) <= len(table)]
        out += [(table, st, end, ps) for st in shrink_int(start)]
        out += [(table[:-1], start, end, ps)] if len(table) > -(-end // ps) else []
        # a smaller page size needs more pages: keep only those the table still covers
        out += [(table, start, end, p) for p in shrink_int(ps, 1) if -(-end // p) <= len(table)]
        out += [((*table[:i], x, *table[i + 1 :]), start, end, ps) for i in range(len(table))
                for x in shrink_int(table[i]) if x not in table]  # fmt: skip
        return out

    def show(args: tuple[tuple[int, ...], int, int, int]) -> str:
        table, start, end, ps = args
        return (
            f"slot_mapping(page_table=tensor({list(table)}, dtype=torch.int32), "
            f"start={start}, end={end}, page_size={ps})"
        )

    return [make(*s) for s in settings] + [
        random_case(
            tr(
                "{count} random page tables (any page order, page ids up to 2^31 / page_size), "
                "ranges that start and end mid-page, slots next to the int32 limit",
                count=MAPPING_DRAWS,
            ),
            Draw(
                draw,
                lambda fn, a: _check_slot_mapping(fn, *a),
                show,
                shrink,
                lambda a: a[2] - a[1],
                classes=((tr("slots next to the int32 limit"), _draw_top_slots),),
            ),
            seed=800,
            max_size=20,
            count=MAPPING_DRAWS,
        )
    ]


def _draw_top_slots(rng: random.Random, size: int) -> tuple[tuple[int, ...], int, int, int]:
    """Pages at the very top of what int32 slots reach: the last slot is 2^31 - 1 or just below."""
    page_size = rng.choice((1, 2, 16, rng.randint(1, 64)))
    end = rng.randint(1, 4 + size * 4)
    start = rng.randint(0, end)
    top = (2**31 - 1) // page_size - 1
    table = tuple(top - rng.randrange(4 * (-(-end // page_size)) + 4) for _ in range(-(-end // page_size)))
    return table, start, end, page_size


def _check_slot_mapping(fn: _F, table: tuple[int, ...], start: int, end: int, page_size: int) -> None:
    page_table = torch.tensor(table, dtype=torch.int32)
    got = call_watching(fn, ("page_table", "start", "end", "page_size"), page_table, start, end, page_size)
    if max(table, default=0) < 4096:
        expected = _slots_by_address(page_table, start, end, page_size)
    else:  # too large a cache to allocate: the definition, in Python ints
        expected = [table[p // page_size] * page_size + p % page_size for p in range(start, end)]
    if not isinstance(got, torch.Tensor) or got.dtype.is_floating_point or got.dim() != 1:
        raise Mismatch(tr("return a 1-D integer tensor of slots."), tr("1-D int tensor"), repr(got))
    got_list = got.tolist()
    if got_list != expected:
        where, exp_text, got_text = diff(expected, got_list)
        raise Mismatch(
            tr(
                "the slots of positions {start}..{last} with page_size {page_size} "
                "and page table {table} are wrong: {where}.",
                start=start,
                last=end - 1,
                page_size=page_size,
                table=f"{list(table)[:12]}{'...' if len(table) > 12 else ''}",
                where=where,
            ),
            exp_text,
            got_text,
        )


def _slots_by_address(page_table: torch.Tensor, start: int, end: int, page_size: int) -> list[int]:
    """Find each position's slot by where its row lives in a real paged cache, not by formula."""
    if not len(page_table):
        return []
    pages = int(page_table.max()) + 1
    cache = MHAKVCache(1, 1, 1, pages, torch.float32, KVCacheLayout.LayerFirst, "cpu", page_size=page_size)
    k = cache.k_cache(0)  # (pages, page_size, 1, 1), contiguous: the flat element index is the slot
    slots = []
    for pos in range(start, end):
        row = k[int(page_table[pos // page_size]), pos % page_size]
        slots.append((row.data_ptr() - k.data_ptr()) // k.element_size())
    return slots


# -- storage.store_torch and storage.store -----------------------------------------


@dataclass(frozen=True)
class StoreSetup:
    description: str
    num_tokens: int
    heads: int = 2
    head_dim: int = 8
    page_size: int = 1
    num_pages: int = 16
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"
    """Or "page_first" (a layer of a page-first buffer), "transposed" (head_dim's stride is not 1: heads
    are the fastest dimension in memory) or "padded" (each head's row is a slice of a longer row)."""
    source: str = "contiguous"
    """Or "fused_qkv", "mixed" (K fused, V contiguous), "heads_major", "strided_dim" (head_dim stride 2)."""
    index_dtype: torch.dtype = torch.int32
    bad_slot: int | None = None
    bad_position: int = -1
    """Where in ``indices`` the bad slot goes (the last one by default)."""
    strided_indices: bool = False
    """``indices`` is every other element of a longer tensor (a column of a 2-D table, say)."""
    seed: int = 0


def _store_setups() -> list[StoreSetup]:
    """The hand-made store cases, described in the learner's language."""
    return [
        StoreSetup(tr("one token, page_size 1, 1 head of 4 values"), 1, heads=1, head_dim=4, num_pages=8),
        StoreSetup(tr("5 tokens into random slots, 2 heads of 8"), 5, seed=1),
        StoreSetup(tr("no tokens at all: nothing is written (and nothing crashes)"), 0),
        StoreSetup(tr("70 tokens (one more block than 64), 3 heads of 24: nothing is a power of two"),
                   70, heads=3, head_dim=24, num_pages=96, seed=2),
        StoreSetup(tr("page_size 4: slot s is row s % 4 of page s // 4"), 10, page_size=4, num_pages=8, seed=3),
        StoreSetup(tr("a layer of a page-first buffer: the cache's pages are far apart in memory"),
                   12, page_size=2, num_pages=12, layout="page_first", seed=4),
        StoreSetup(tr("K and V are slices of one fused QKV tensor"), 9, source="fused_qkv", seed=5),
        StoreSetup(tr("K comes from a fused QKV tensor, V is contiguous: their strides differ"),
                   9, source="mixed", seed=6),
        StoreSetup(tr("K and V are transposed views (heads-major in memory)"), 9, source="heads_major", seed=7),
        StoreSetup("float16", 16, dtype=torch.float16, seed=8),
        StoreSetup("bfloat16", 16, dtype=torch.bfloat16, seed=9),
        StoreSetup(tr("int64 slot indices"), 16, index_dtype=torch.int64, seed=10),
        StoreSetup(tr("indices is a strided view (every other element of a longer tensor)"),
                   6, num_pages=8, strided_indices=True, seed=14),
        StoreSetup(
            tr("130 tokens, page_size 16, page-first, bfloat16, fused QKV: everything at once"),
            130, heads=3, head_dim=12, page_size=16, num_pages=12, dtype=torch.bfloat16,
            layout="page_first", source="fused_qkv", seed=11,
        ),
        StoreSetup(tr("a slot one past the end of the cache: raise IndexError and write nothing"),
                   4, num_pages=8, bad_slot=8, seed=12),
        StoreSetup(tr("a negative slot: raise IndexError and write nothing"), 4, num_pages=8, bad_slot=-1, seed=13),
        StoreSetup(tr("the bad slot comes first: raise IndexError and write nothing"),
                   5, num_pages=8, bad_slot=99, bad_position=0, seed=15),
        StoreSetup(tr("a cache whose head_dim stride is not 1 (heads are the fastest dimension in memory)"),
                   7, heads=3, head_dim=5, page_size=2, num_pages=8, layout="transposed", seed=16),
        StoreSetup(tr("a cache whose rows are slices of longer rows: the gaps must stay untouched"),
                   7, heads=2, head_dim=6, page_size=3, num_pages=6, layout="padded", seed=17),
        StoreSetup(tr("k and v whose head_dim stride is not 1"), 8, heads=2, head_dim=6, source="strided_dim", seed=18),
        StoreSetup("float64", 9, dtype=torch.float64, page_size=2, seed=19),
    ]  # fmt: skip


_LAYOUTS = ("contiguous", "page_first", "transposed", "padded")
_SOURCES = ("contiguous", "fused_qkv", "mixed", "heads_major", "strided_dim")
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _draw_store(rng: random.Random, size: int) -> StoreSetup:
    """Any setup the task allows: sizes, page sizes, layouts, source strides, dtypes, index dtypes, bad slots."""
    page_size = rng.choice((1, 1, 2, 3, 4, 5, 8, 16))
    num_pages = rng.randint(1, 2 + 2 * size // page_size)
    n = rng.randint(0, min(size, num_pages * page_size))
    bad = None
    if n and rng.random() < 0.2:
        bad = rng.choice((-1, -rng.randint(2, 50), num_pages * page_size, num_pages * page_size + rng.randint(1, 99)))
    return StoreSetup(
        "random",
        n,
        heads=rng.randint(1, 5),
        head_dim=rng.randint(1, 20),
        page_size=page_size,
        num_pages=num_pages,
        dtype=rng.choice(_DTYPES),
        layout=rng.choice(_LAYOUTS),
        source=rng.choice(_SOURCES),
        index_dtype=rng.choice((torch.int32, torch.int64)),
        bad_slot=bad,
        bad_position=rng.randrange(n) if n else -1,
        strided_indices=rng.random() < 0.3,
        seed=rng.randrange(2**31),
    )


def _shrink_store(setup: StoreSetup) -> list[StoreSetup]:
    r = dataclasses.replace
    out = [r(setup, num_tokens=n) for n in shrink_int(setup.num_tokens, 1 if setup.bad_slot is not None else 0)]
    out += [r(setup, heads=h) for h in shrink_int(setup.heads, 1)]
    out += [r(setup, head_dim=d) for d in shrink_int(setup.head_dim, 1)]
    out += [r(setup, num_pages=p) for p in shrink_int(setup.num_pages, 1)]
    out += [r(setup, page_size=p) for p in shrink_int(setup.page_size, 1)]
    for name, plain in (("layout", "contiguous"), ("source", "contiguous"), ("dtype", torch.float32),
                        ("index_dtype", torch.int32), ("strided_indices", False)):  # fmt: skip
        if getattr(setup, name) != plain:
            out.append(r(setup, **{name: plain}))
    return out


def _run_store(fn: _F, setup: StoreSetup) -> None:
    s = setup
    slots = s.num_pages * s.page_size
    if s.num_tokens > slots or (s.bad_slot is not None and (s.num_tokens == 0 or 0 <= s.bad_slot < slots)):
        raise Invalid
    position = s.bad_position if s.bad_position < s.num_tokens else -1
    _Store(dataclasses.replace(s, bad_position=position)).run(fn)


def _show_store(setup: StoreSetup) -> str:
    s = setup
    text = tr(
        "{tokens} tokens, {heads} heads of {head_dim}, page_size {page_size}, {pages} pages, "
        "{dtype}, cache layout {layout}, k/v {source}, indices {index_dtype}",
        tokens=s.num_tokens,
        heads=s.heads,
        head_dim=s.head_dim,
        page_size=s.page_size,
        pages=s.num_pages,
        dtype=str(s.dtype).replace("torch.", ""),
        layout=s.layout,
        source=s.source,
        index_dtype=str(s.index_dtype).replace("torch.", ""),
    )
    if s.strided_indices:
        text += tr(" (a strided view)")
    if s.bad_slot is not None:
        text += tr(", slot {slot} (out of range) at position {position}", slot=s.bad_slot, position=s.bad_position)
    return text


class _Store:
    """Caches inside guard memory, sources with the requested strides, and the expected result."""

    def __init__(self, setup: StoreSetup) -> None:
        self.setup = s = setup
        device = _device()
        pad = s.head_dim if s.layout == "padded" else 0
        cache_numel = 2 * LAYERS * s.num_pages * s.page_size * s.heads * (s.head_dim + pad)
        self.guard = GUARD_FACTOR * cache_numel + 4096
        self.base = torch.full((self.guard + cache_numel + self.guard,), FILL, dtype=s.dtype, device=device)
        self.k_cache, self.v_cache = self._layer(self.base)
        self.cache_numel = cache_numel
        gen = torch.Generator().manual_seed(s.seed)
        n, h, d = s.num_tokens, s.heads, s.head_dim
        k, v = self._sources(gen, n, h, d, s.source, s.dtype)
        self.k, self.v = _guarded_copy(k, device), _guarded_copy(v, device)
        num_slots = s.num_pages * s.page_size
        slots = torch.randperm(num_slots, generator=gen)[:n]
        if s.bad_slot is not None:
            slots[s.bad_position] = s.bad_slot
        if s.strided_indices:
            # The elements in between are valid slots too:
            # a kernel that ignores the stride writes wrongly, but safely.
            table = torch.full((2 * n,), num_slots - 1, dtype=slots.dtype)
            table[::2] = slots
            self.indices = table.to(s.index_dtype).to(device)[::2]
        else:
            self.indices = slots.to(s.index_dtype).to(device)
        self.expected_base = self.base.clone()
        self.expected_k, self.expected_v = self._layer(self.expected_base)
        if s.bad_slot is None:
            _store_module.store_cache_reference(self.expected_k, self.expected_v, self.indices, self.k, self.v)

    def _layer(self, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer 1's K and V caches (not at the start of the buffer), viewed in ``base`` with the setup's layout."""
        s = self.setup
        pad = s.head_dim if s.layout == "padded" else 0
        numel = 2 * LAYERS * s.num_pages * s.page_size * s.heads * (s.head_dim + pad)
        inner = base[self.guard : self.guard + numel]
        if s.layout == "page_first":
            buffer = inner.view(2, s.num_pages, LAYERS, s.page_size, s.heads, s.head_dim).permute(0, 2, 1, 3, 4, 5)
        elif s.layout == "transposed":
            buffer = inner.view(2, LAYERS, s.num_pages, s.page_size, s.head_dim, s.heads).transpose(-1, -2)
        elif s.layout == "padded":
            buffer = inner.view(2, LAYERS, s.num_pages, s.page_size, s.heads, s.head_dim + pad)[..., : s.head_dim]
        else:
            buffer = inner.view(2, LAYERS, s.num_pages, s.page_size, s.heads, s.head_dim)
        return buffer[0, 1], buffer[1, 1]

    @staticmethod
    def _sources(
        gen: torch.Generator, n: int, h: int, d: int, source: str, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(dtype)

        if source == "fused_qkv":
            qkv = randn(n, 3, h, d)
            return qkv[:, 1], qkv[:, 2]
        if source == "mixed":
            return randn(n, 3, h, d)[:, 1], randn(n, h, d)
        if source == "heads_major":
            return randn(h, n, d).transpose(0, 1), randn(h, n, d).transpose(0, 1)
        if source == "strided_dim":
            return randn(n, h, 2 * d)[..., ::2], randn(d, n, h).permute(1, 2, 0)
        return randn(n, h, d), randn(n, h, d)

    def run(self, fn: _F) -> None:
        s = self.setup
        k_before, v_before, indices_before = self.k.clone(), self.v.clone(), self.indices.clone()
        if s.bad_slot is not None:
            _, error = raised(fn, self.k_cache, self.v_cache, self.indices, self.k, self.v)
            explain_a_kernel_compiled_for_no_gpu(error)
            if not isinstance(error, IndexError):
                what = outcome(error, returned=tr("returned normally"))
                raise Mismatch(
                    tr(
                        "slot {slot} is outside the cache's {slots} slots: check the indices before launching "
                        "(Triton does not check bounds) and raise IndexError.",
                        slot=s.bad_slot,
                        slots=s.num_pages * s.page_size,
                    ),
                    tr("IndexError, nothing written"),
                    what,
                )
            self._check_guard()
            self._check_rows()
            self._check_everything_else()
            return
        try:
            call(fn, self.k_cache, self.v_cache, self.indices, self.k, self.v)
        except LearnerRaised as learner:
            explain_a_kernel_compiled_for_no_gpu(learner.error)
            raise
        if not (torch.equal(self.k, k_before) and torch.equal(self.v, v_before)):
            raise Mismatch(tr("your function changed k or v; it should only read them."))
        if not torch.equal(self.indices, indices_before):
            raise Mismatch(tr("your function changed indices; it should only read them."))
        if torch.equal(self.base, self.expected_base):  # every element as expected, guards included
            return
        self._check_guard()
        self._check_rows()
        self._check_everything_else()

    def _check_everything_else(self) -> None:
        """Every element of the buffer that is not a target row (the other layer, the padding) is untouched."""
        if torch.equal(self.base, self.expected_base):
            return
        where = int((self.base != self.expected_base).nonzero()[0, 0]) - self.guard
        raise Mismatch(
            tr(
                "your code wrote where no target slot lives: element {where} of the cache's buffer "
                "(another layer, or the gap between one head's row and the next) changed. "
                "Use every one of the cache's strides, and the cache's own start, never a shape-based offset.",
                where=where,
            )
        )

    def _check_guard(self) -> None:
        before = int((self.base[: self.guard] != FILL).sum())
        after = int((self.base[self.guard + self.cache_numel :] != FILL).sum())
        if before or after:
            raise Mismatch(
                tr(
                    "your code wrote outside the cache's memory ({before} values before it, {after} after it). "
                    "Check the page and row arithmetic and that every address uses the cache's strides.",
                    before=before,
                    after=after,
                )
            )

    def _check_rows(self) -> None:
        s = self.setup
        ps = s.page_size
        for name, got, expected in (("K", self.k_cache, self.expected_k), ("V", self.v_cache, self.expected_v)):
            if torch.equal(got, expected):
                continue
            got_rows = got.reshape(-1, s.heads * s.head_dim)
            exp_rows = expected.reshape(-1, s.heads * s.head_dim)
            bad = [int(i) for i in (got_rows != exp_rows).any(dim=1).nonzero().flatten()]
            slot = bad[0]
            problem = tr(
                "slot {slot} (page {page}, row {row}) of the {name} cache should hold {expected}, but it holds {got}.",
                slot=slot,
                page=slot // ps,
                row=slot % ps,
                name=name,
                expected=self._identify(exp_rows[slot]),
                got=self._identify(got_rows[slot]),
            )
            if len(bad) > 1:
                problem += tr(" ({count} slots of the {name} cache are wrong.)", count=len(bad), name=name)
            shown = bad[:6]
            raise Mismatch(
                problem,
                "\n".join(tr("slot {slot}: {row}", slot=i, row=self._identify(exp_rows[i])) for i in shown),
                "\n".join(tr("slot {slot}: {row}", slot=i, row=self._identify(got_rows[i])) for i in shown),
            )

    def _identify(self, row: torch.Tensor) -> str:
        """Name a cache row: a token's K or V row, the untouched fill, or something else."""
        flat = row.reshape(1, -1)
        for label, src in (("K", self.k), ("V", self.v)):
            if src.shape[0]:
                hits = (src.reshape(src.shape[0], -1) == flat).all(dim=1).nonzero().flatten()
                if len(hits):
                    return tr("token {token}'s {label} row", token=int(hits[0]), label=label)
        if bool((row == FILL).all()):
            return tr("nothing (the value it had before the store)")
        if bool((row == FILL).any()):
            return tr("a row that is only partly written")
        return tr("values that are no token's K or V row (wrong strides?)")


def _guarded_copy(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``tensor`` with the same strides, in the middle of a zeroed allocation much larger than it."""
    span = (
        1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
        if tensor.numel()
        else 1
    )
    guard = GUARD_FACTOR * span + 4096
    base = torch.zeros(guard + span + guard, dtype=tensor.dtype, device=device)
    copy = base.as_strided(tuple(tensor.shape), tuple(tensor.stride()), guard)
    copy.copy_(tensor)
    return copy


def _store_cases() -> list[Case]:
    def make(setup: StoreSetup) -> Case:
        return Case(
            setup.description, setup.num_tokens * setup.heads * setup.head_dim, lambda fn: _Store(setup).run(fn)
        )

    far = (
        [
            Case(
                tr(
                    "a slot whose row lies 2^31 elements past the cache's start (a layer of a buffer that keeps "
                    "each page's K and V rows side by side, float16): offsets need 64 bits"
                ),
                10**5,  # reported after the hand-made cases: a plainer failure is easier to debug
                _run_far_store,
            )
        ]
        if _far_store_possible()
        else []
    )
    return (
        [make(setup) for setup in _store_setups()]
        + far
        + [
            random_case(
                tr("{count} random stores: any sizes, layouts, strides, dtypes and bad slots", count=16),
                Draw(
                    _draw_store, _run_store, _show_store, _shrink_store, lambda s: s.num_tokens * s.heads * s.head_dim
                ),
                seed=500,
                max_size=40,
                count=16,
            )
        ]
    )


# -- offsets past 2^31 ---------------------------------------------------------------

FAR = 2**31 + 2**20
"""How far from the cache's start (in elements) the far slot's row lies: past what an int32 offset reaches,
and short of 2^32, so that an offset computed in int32 wraps to ``FAR - 2**32``: about 2^31 elements *before*
the cache, where the check keeps guard memory to see it."""
FAR_GUARD = 1 << 16
"""Guard elements around each place the far-slot check watches: the cache's start, the far row, the wrapped
address."""
_FAR_HEADS, _FAR_DIM = 1, 2
_FAR_ROW = _FAR_HEADS * _FAR_DIM
_FAR_PAGE = 2 * _FAR_ROW  # K row, then V row


def _far_store_possible() -> bool:
    """Whether this machine can hold the far-slot check's buffer: about 8 GiB of float16 that the operating
    system maps lazily, page by page as they are touched (a few pages here). Only on the CPU: a GPU would
    allocate all of it. A system that refuses the allocation (no overcommit) leaves the case out."""
    if _device().type != "cpu":
        return False
    if _FAR_POSSIBLE:
        return _FAR_POSSIBLE[0]
    try:
        probe = torch.empty(_far_layout(FAR // _FAR_PAGE)[0], dtype=torch.float16)
        del probe
        possible = True
    except (RuntimeError, MemoryError):
        possible = False
    _FAR_POSSIBLE.append(possible)
    return possible


_FAR_POSSIBLE: list[bool] = []


def _far_layout(far_slot: int) -> tuple[int, int, int | None]:
    """``(buffer length, where the cache starts in it, the wrapped offset or None)`` for a cache of
    ``far_slot + 2`` pages, each page's K and V rows side by side."""
    offset = far_slot * _FAR_PAGE
    wrapped = offset - 2**32 if offset >= 2**31 else None
    before = FAR_GUARD + (-wrapped if wrapped is not None else 0)
    return before + (far_slot + 2) * _FAR_PAGE + FAR_GUARD, before, wrapped


def _run_far_store(fn: _F) -> None:
    """The far-slot case: first on a small cache of the same layout (a function that fails there, or that
    copies the cache, never meets the 8 GiB one), then with the far slot ``FAR`` elements away."""
    _far_store(fn, 5)
    _far_store(fn, FAR // _FAR_PAGE)


def _far_store(fn: _F, far_slot: int) -> None:
    total, before, wrapped = _far_layout(far_slot)
    buffer = torch.empty(total, dtype=torch.float16)  # untouched pages cost no memory
    cache = buffer[before:].as_strided(
        (far_slot + 2, 1, 2, _FAR_HEADS, _FAR_DIM), (_FAR_PAGE, _FAR_PAGE, _FAR_ROW, _FAR_DIM, 1)
    )
    k_cache, v_cache = cache[:, :, 0], cache[:, :, 1]
    offset = far_slot * _FAR_PAGE
    if wrapped is None:  # small: watch all of it
        windows = [(0, total)]
    else:  # the wrapped address (looked at first: its report says why), the cache's start, the far row
        windows = [(before + wrapped - FAR_GUARD, before + wrapped + FAR_GUARD)]
        windows += [(before - FAR_GUARD, before + 4 * _FAR_PAGE + FAR_GUARD), (before + offset - FAR_GUARD, total)]
    for start, end in windows:
        buffer[start:end] = FILL
    gen = torch.Generator().manual_seed(far_slot)
    k, v = (torch.randn(2, _FAR_HEADS, _FAR_DIM, generator=gen).to(torch.float16) for _ in range(2))
    indices = torch.tensor([0, far_slot], dtype=torch.int32)
    try:
        call(fn, k_cache, v_cache, indices, k, v)
    except LearnerRaised as learner:
        explain_a_kernel_compiled_for_no_gpu(learner.error)
        raise
    rows = {before: k[0], before + _FAR_ROW: v[0], before + offset: k[1], before + offset + _FAR_ROW: v[1]}
    for start, end in windows:
        got = buffer[start:end]
        expected = torch.full_like(got, FILL)
        for at, row in rows.items():
            if start <= at < end:
                expected[at - start : at - start + _FAR_ROW] = row.flatten()
        wrong = (got != expected).nonzero().flatten()
        if not len(wrong):
            continue
        where = start + int(wrong[0]) - before
        if wrapped is not None and start == before + wrapped - FAR_GUARD:
            raise Mismatch(
                tr(
                    "your code wrote {count} value(s) {distance} elements before the cache's start, instead of "
                    "slot {slot}'s row {offset} elements after it: that is where the offset lands when it is "
                    "computed in 32 bits, which wrap past 2^31 - 1. A layer of a large KV cache holds more than "
                    "2^31 elements: turn the slot into int64 before multiplying it by a stride (.to(tl.int64)).",
                    count=int((got != expected).sum()),
                    distance=-where,
                    slot=far_slot,
                    offset=offset,
                ),
                tr("slot {slot}'s K row at element {offset}", slot=far_slot, offset=offset),
                tr("writes at element {where}", where=where),
            )
        if far_slot > 5:
            raise Mismatch(
                tr(
                    "with slot {slot}'s row {offset} elements after the cache's start (past 2^31), element {where} "
                    "of the cache's buffer is wrong. Do the slot's offset arithmetic in int64.",
                    slot=far_slot,
                    offset=offset,
                    where=where,
                ),
                tr("token 1's K and V rows in slot {slot}", slot=far_slot),
                tr("element {where}: {value}", where=where, value=float(buffer[before + where])),
            )
        raise Mismatch(
            tr(
                "in a cache that keeps each page's K row and V row side by side (its page stride is twice its "
                "row), with slots 0 and {slot} written, element {where} of the buffer is wrong: use the cache's "
                "own strides.",
                slot=far_slot,
                where=where,
            ),
            tr("token 0's rows in slot 0, token 1's in slot {slot}", slot=far_slot),
            tr("element {where}: {value}", where=where, value=float(buffer[before + where])),
        )


exercise("storage.store_torch", lambda: tr("write each token's K and V rows into its slot, in plain torch"))(
    _store_cases
)
exercise("storage.store", lambda: tr("the store kernel in Triton, and its launcher"))(_store_cases)
