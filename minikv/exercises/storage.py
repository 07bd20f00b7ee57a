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

from collections.abc import Callable
from dataclasses import dataclass

import torch

import minikv as _minikv

from .. import kernels as _kernels_pkg
from .. import mha_pool as _mha_pool
from ..base import KVCacheLayout
from ..kernels import cpu_copy as _cpu_copy
from ..kernels import store as _store_module
from ..mha_pool import MHAKVCache
from ._core import Case, LearnerRaised, Mismatch, call, exercise, expect_equal, outcome, raised

_F = Callable[..., object]
FILL = -3.0
"""What every cache slot holds before a store, so that an unwritten slot is recognisable."""
GUARD_FACTOR = 64
"""Guard memory on each side of a tensor, as a multiple of the tensor's own span (plus 4096 elements)."""


def _device() -> torch.device:
    """CUDA tensors on a GPU (Triton compiles), CPU tensors elsewhere (Triton interprets)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- storage.tp_head_range ------------------------------------------------------


@exercise("storage.tp_head_range", "which KV heads one tensor-parallel rank stores")
def _tp_cases() -> list[Case]:
    splits = [
        ("a single GPU stores all 8 heads", 8, 0, 1),
        ("1 head, 1 GPU", 1, 0, 1),
        ("8 heads over 4 GPUs, rank 1", 8, 1, 4),
        ("8 heads over 4 GPUs, the last rank", 8, 3, 4),
        ("6 heads over 3 GPUs, rank 2", 6, 2, 3),
        ("32 heads over 8 GPUs, rank 5", 32, 5, 8),
        ("8 heads over 8 GPUs: one head each, rank 7", 8, 7, 8),
    ]
    errors = [
        ("6 heads cannot be split evenly over 4 GPUs: raise ValueError", 6, 0, 4),
        ("rank 4 does not exist when tp_size is 4: raise ValueError", 8, 4, 4),
    ]

    def make(desc: str, heads: int, rank: int, size: int) -> Case:
        def run(fn: _F) -> None:
            got = call(fn, heads, rank, size)
            expected = MHAKVCache(
                heads, 1, 1, 1, torch.float32, KVCacheLayout.LayerFirst, "cpu", tp_rank=rank, tp_size=size
            ).head_range
            if not isinstance(got, (range, list, tuple)):
                raise Mismatch("return a range of head numbers.", repr(expected), f"{type(got).__name__}: {got!r}")
            expect_equal(f"the heads of rank {rank} of {size} (of {heads} KV heads)", list(expected), list(got))

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
                raise Mismatch(f"tp_head_range({heads}, {rank}, {size}) must raise ValueError.", "ValueError", what)

        return Case(desc, heads, run)

    return [make(*s) for s in splits] + [make_error(*s) for s in errors]


# -- storage.page_first_view ----------------------------------------------------


@exercise("storage.page_first_view", "the layer-first view of a page-first buffer, without copying")
def _view_cases() -> list[Case]:
    shapes = [
        ("3 pages, 2 layers, 1 head, head_dim 4", 3, 2, 1, 4),
        ("5 pages, 3 layers, 2 heads, head_dim 8", 5, 3, 2, 8),
        ("7 pages, 4 layers, 3 heads, head_dim 24", 7, 4, 3, 24),
        ("a single page, 3 layers", 1, 3, 2, 2),
        ("a single layer, 4 pages", 4, 1, 2, 2),
    ]

    def make(desc: str, pages: int, layers: int, heads: int, dim: int) -> Case:
        def run(fn: _F) -> None:
            numel = 2 * pages * layers * heads * dim
            buffer = torch.arange(numel, dtype=torch.float32).view(2, pages, layers, heads, dim)
            original = buffer.clone()
            got = call(fn, buffer)
            if not isinstance(got, torch.Tensor):
                raise Mismatch("return a tensor.", "a torch.Tensor", type(got).__name__)
            expect_equal(
                "the view's shape (2, layers, pages, heads, head_dim)", (2, layers, pages, heads, dim), tuple(got.shape)
            )
            if not torch.equal(buffer, original):
                raise Mismatch("your function changed the buffer's contents; a view only looks at them.")
            expected = buffer.permute(0, 2, 1, 3, 4)
            if not torch.equal(got, expected):
                raise Mismatch(
                    _describe_wrong_view(got, expected, buffer),
                    "view[kv, layer, page] == buffer[kv, page, layer]",
                    "see above",
                )
            if got.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
                raise Mismatch(
                    "your result is a copy, not a view: the store kernel would write into the copy "
                    "and the cache would never see it.",
                    "a tensor that shares the buffer's memory",
                    "a tensor with memory of its own",
                )
            got[1, layers - 1, 0, heads - 1, dim - 1] = -1.0
            if buffer[1, 0, layers - 1, heads - 1, dim - 1].item() != -1.0:
                raise Mismatch("writing through your view did not change the buffer where it should have.")

        return Case(desc, pages * layers * heads * dim, run)

    return [make(*s) for s in shapes]


def _describe_wrong_view(got: torch.Tensor, expected: torch.Tensor, buffer: torch.Tensor) -> str:
    diff = (got != expected).nonzero()
    kv, layer, page, head, d = (int(x) for x in diff[0])
    value = int(got[kv, layer, page, head, d].item())
    if 0 <= value < buffer.numel():
        skv, spage, slayer, shead, sd = _unravel(value, tuple(buffer.shape))
        source = f"buffer[{skv}, page {spage}, layer {slayer}, head {shead}, {sd}]"
    else:
        source = f"the value {value}, which is not in the buffer at all"
    return (
        f"view[{kv}, layer {layer}, page {page}, head {head}, {d}] should be "
        f"buffer[{kv}, page {page}, layer {layer}, head {head}, {d}], "
        f"but it is {source}. A reshape or view keeps the memory order; the layers and pages must swap places instead."
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


# -- storage.slot_mapping ---------------------------------------------------------


@exercise("storage.slot_mapping", "the slot of each token position, from a request's page table")
def _slot_mapping_cases() -> list[Case]:
    settings = [
        ("page_size 1: one page per token", [5, 2, 9, 0], 0, 4, 1),
        ("nothing to map (start == end)", [3, 1], 2, 2, 4),
        ("page_size 4, positions 0..9: the last page is half full", [2, 0, 7], 0, 10, 4),
        ("a decode step: only position 9, in the third page", [2, 0, 7], 9, 10, 4),
        ("positions 5..12 start inside a page and cross two page borders", [6, 3, 1, 4], 5, 13, 4),
        ("page_size 16, pages in descending order", [40, 30, 20, 10], 0, 50, 16),
        ("page_size 3 (not a power of two)", [4, 8, 1, 0, 5], 2, 14, 3),
    ]

    def make(desc: str, table: list[int], start: int, end: int, page_size: int) -> Case:
        def run(fn: _F) -> None:
            page_table = torch.tensor(table, dtype=torch.int32)
            got = call(fn, page_table.clone(), start, end, page_size)
            expected = _slots_by_address(page_table, start, end, page_size)
            if not isinstance(got, torch.Tensor) or got.dtype.is_floating_point or got.dim() != 1:
                raise Mismatch("return a 1-D integer tensor of slots.", "1-D int tensor", repr(got))
            got_list = got.tolist()
            if got_list != expected:
                raise Mismatch(
                    f"the slots of positions {start}..{end - 1} with page_size {page_size} "
                    f"and page table {table} are wrong.",
                    str(expected),
                    str(got_list),
                )

        return Case(desc, end - start, run)

    return [make(*s) for s in settings]


def _slots_by_address(page_table: torch.Tensor, start: int, end: int, page_size: int) -> list[int]:
    """Find each position's slot by where its row lives in a real paged cache, not by formula."""
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
    layout: str = "contiguous"  # or "page_first": a layer of a page-first buffer
    source: str = "contiguous"  # or "fused_qkv", "mixed" (K fused, V contiguous), "heads_major"
    index_dtype: torch.dtype = torch.int32
    bad_slot: int | None = None
    strided_indices: bool = False
    """``indices`` is every other element of a longer tensor (a column of a 2-D table, say)."""
    seed: int = 0


STORE_SETUPS = [
    StoreSetup("one token, page_size 1, 1 head of 4 values", 1, heads=1, head_dim=4, num_pages=8),
    StoreSetup("5 tokens into random slots, 2 heads of 8", 5, seed=1),
    StoreSetup("no tokens at all: nothing is written (and nothing crashes)", 0),
    StoreSetup("70 tokens (one more block than 64), 3 heads of 24: nothing is a power of two",
               70, heads=3, head_dim=24, num_pages=96, seed=2),
    StoreSetup("page_size 4: slot s is row s % 4 of page s // 4", 10, page_size=4, num_pages=8, seed=3),
    StoreSetup("a layer of a page-first buffer: the cache's pages are far apart in memory",
               12, page_size=2, num_pages=12, layout="page_first", seed=4),
    StoreSetup("K and V are slices of one fused QKV tensor", 9, source="fused_qkv", seed=5),
    StoreSetup("K comes from a fused QKV tensor, V is contiguous: their strides differ", 9, source="mixed", seed=6),
    StoreSetup("K and V are transposed views (heads-major in memory)", 9, source="heads_major", seed=7),
    StoreSetup("float16", 16, dtype=torch.float16, seed=8),
    StoreSetup("bfloat16", 16, dtype=torch.bfloat16, seed=9),
    StoreSetup("int64 slot indices", 16, index_dtype=torch.int64, seed=10),
    StoreSetup("indices is a strided view (every other element of a longer tensor)",
               6, num_pages=8, strided_indices=True, seed=14),
    StoreSetup(
        "130 tokens, page_size 16, page-first, bfloat16, fused QKV: everything at once",
        130, heads=3, head_dim=12, page_size=16, num_pages=12, dtype=torch.bfloat16,
        layout="page_first", source="fused_qkv", seed=11,
    ),
    StoreSetup("a slot one past the end of the cache: raise IndexError and write nothing",
               4, num_pages=8, bad_slot=8, seed=12),
    StoreSetup("a negative slot: raise IndexError and write nothing", 4, num_pages=8, bad_slot=-1, seed=13),
]  # fmt: skip


class _Store:
    """Caches inside guard memory, sources with the requested strides, and the expected result."""

    def __init__(self, setup: StoreSetup) -> None:
        self.setup = s = setup
        device = _device()
        layers = 2
        cache_numel = 2 * layers * s.num_pages * s.page_size * s.heads * s.head_dim
        self.guard = GUARD_FACTOR * cache_numel + 4096
        self.base = torch.full((self.guard + cache_numel + self.guard,), FILL, dtype=s.dtype, device=device)
        inner = self.base[self.guard : self.guard + cache_numel]
        if s.layout == "page_first":
            buffer = inner.view(2, s.num_pages, layers, s.page_size, s.heads, s.head_dim).permute(0, 2, 1, 3, 4, 5)
        else:
            buffer = inner.view(2, layers, s.num_pages, s.page_size, s.heads, s.head_dim)
        self.k_cache, self.v_cache = buffer[0, 1], buffer[1, 1]  # layer 1: not at the start of the buffer
        self.cache_numel = cache_numel
        gen = torch.Generator().manual_seed(s.seed)
        n, h, d = s.num_tokens, s.heads, s.head_dim
        k, v = self._sources(gen, n, h, d, s.source, s.dtype)
        self.k, self.v = _guarded_copy(k, device), _guarded_copy(v, device)
        num_slots = s.num_pages * s.page_size
        slots = torch.randperm(num_slots, generator=gen)[:n]
        if s.bad_slot is not None:
            slots[-1] = s.bad_slot
        if s.strided_indices:
            # The elements in between are valid slots too:
            # a kernel that ignores the stride writes wrongly, but safely.
            table = torch.full((2 * n,), num_slots - 1, dtype=slots.dtype)
            table[::2] = slots
            self.indices = table.to(s.index_dtype).to(device)[::2]
        else:
            self.indices = slots.to(s.index_dtype).to(device)
        self.expected_k, self.expected_v = self.k_cache.clone(), self.v_cache.clone()
        if s.bad_slot is None:
            _store_module.store_cache_reference(self.expected_k, self.expected_v, self.indices, self.k, self.v)

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
        return randn(n, h, d), randn(n, h, d)

    def run(self, fn: _F) -> None:
        s = self.setup
        k_before, v_before = self.k.clone(), self.v.clone()
        if s.bad_slot is not None:
            _, error = raised(fn, self.k_cache, self.v_cache, self.indices, self.k, self.v)
            _explain_a_kernel_compiled_for_no_gpu(error)
            if not isinstance(error, IndexError):
                what = outcome(error, returned="returned normally")
                raise Mismatch(
                    f"slot {s.bad_slot} is outside the cache's {s.num_pages * s.page_size} slots: "
                    "check the indices before launching "
                    "(Triton does not check bounds) and raise IndexError.",
                    "IndexError, nothing written",
                    what,
                )
            self._check_guard()
            self._check_rows()
            return
        try:
            call(fn, self.k_cache, self.v_cache, self.indices, self.k, self.v)
        except LearnerRaised as learner:
            _explain_a_kernel_compiled_for_no_gpu(learner.error)
            raise
        self._check_guard()
        if not (torch.equal(self.k, k_before) and torch.equal(self.v, v_before)):
            raise Mismatch("your function changed k or v; it should only read them.")
        self._check_rows()

    def _check_guard(self) -> None:
        before = int((self.base[: self.guard] != FILL).sum())
        after = int((self.base[self.guard + self.cache_numel :] != FILL).sum())
        if before or after:
            raise Mismatch(
                f"your code wrote outside the cache's memory ({before} values before it, {after} after it). "
                "Check the page and row arithmetic and that every address uses the cache's strides."
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
            problem = (
                f"slot {slot} (page {slot // ps}, row {slot % ps}) of the {name} cache should hold "
                f"{self._identify(exp_rows[slot])}, but it holds {self._identify(got_rows[slot])}."
            )
            if len(bad) > 1:
                problem += f" ({len(bad)} slots of the {name} cache are wrong.)"
            shown = bad[:6]
            raise Mismatch(
                problem,
                "\n".join(f"slot {i}: {self._identify(exp_rows[i])}" for i in shown),
                "\n".join(f"slot {i}: {self._identify(got_rows[i])}" for i in shown),
            )

    def _identify(self, row: torch.Tensor) -> str:
        """Name a cache row: a token's K or V row, the untouched fill, or something else."""
        flat = row.reshape(1, -1)
        for label, src in (("K", self.k), ("V", self.v)):
            if src.shape[0]:
                hits = (src.reshape(src.shape[0], -1) == flat).all(dim=1).nonzero().flatten()
                if len(hits):
                    return f"token {int(hits[0])}'s {label} row"
        if bool((row == FILL).all()):
            return "nothing (the value it had before the store)"
        if bool((row == FILL).any()):
            return "a row that is only partly written"
        return "values that are no token's K or V row (wrong strides?)"


def _explain_a_kernel_compiled_for_no_gpu(error: BaseException | None) -> None:
    """Triton's error for a ``@triton.jit`` kernel launched on a machine without a GPU, in plain words."""
    if error is not None and "active drivers" in str(error) and not torch.cuda.is_available():
        raise Mismatch(
            "your kernel was set up to be compiled for a GPU, and this machine has none. Triton decides "
            "when @triton.jit runs: call minikv.kernels.use_interpreter_without_cuda() before defining "
            "the kernel (the notebook's first cell does), then run the kernel's cell again.",
            "a kernel that runs in Triton's interpreter",
            f"{type(error).__name__}: {error}",
        )


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

    return [make(setup) for setup in STORE_SETUPS]


_REFERENCE_STORES = (
    *(
        (owner, name)
        for owner in (_store_module, _kernels_pkg, _minikv)
        for name in ("store_cache", "store_cache_reference")
    ),
    *((owner, "launch_store_kernel") for owner in (_store_module, _kernels_pkg)),
    (_cpu_copy, "copy_rows"),
    (_mha_pool, "store_cache"),
)

exercise(
    "storage.store_torch", "write each token's K and V rows into its slot, in plain torch", forbid=_REFERENCE_STORES
)(_store_cases)
exercise("storage.store", "the store kernel in Triton, and its launcher", forbid=_REFERENCE_STORES)(_store_cases)
