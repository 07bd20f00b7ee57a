"""Checks for the paged-attention exercises: the decode step in torch, the online softmax, the kernel.

The spec is :func:`minikv.kernels.paged_decode_attention_reference` (the gather path): request
``b``'s query attends over the K/V rows whose slots are the first ``lens[b]`` entries of its row
of the slot table, query head ``h`` reading KV head ``h // (heads // kv_heads)``.

The caches, the queries and the table sit in the middle of larger allocations (guard memory), so
that a kernel with a wrong stride or page arithmetic reads the guard, not memory the process
needs: the interpreter does not check bounds, and neither does a GPU. The table's entries past
``lens[b]`` are valid slots of other requests (a kernel that forgets the length reads them and
gets a wrong answer, not a crash), and so is the guard around the table.

:func:`rows_read` shows which cache rows a learner's kernel used, with a *probe cache*: every K
row is zero, so every row a program reads gets the same weight, and the V row of slot ``s`` in KV
head ``g`` is ``g + 1`` at element ``s`` and zero elsewhere. The output of a query head then has a
non-zero element ``s`` exactly for the slots it drew on, and its elements sum to the number of
the KV head it read, plus one. No instrumentation of Triton is needed: the answer itself says
which rows it read.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from ..kernels.paged_attention import paged_decode_attention_reference
from ..language import tr
from ._core import (
    Case,
    Draw,
    LearnerRaised,
    Mismatch,
    call,
    exercise,
    explain_a_kernel_compiled_for_no_gpu,
    random_case,
    shrink_int,
)

_F = Callable[..., object]
T = TypeVar("T")
GUARD = float("nan")
"""What the memory around every tensor holds: a read outside shows up as NaN in the answer."""


def _device() -> torch.device:
    """CUDA tensors on a GPU (a learner's kernel compiles), CPU tensors elsewhere (it is interpreted)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# -- setups ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """One decode step: sizes, the requests' lengths, and how the tensors are laid out."""

    description: str
    lens: tuple[int, ...]
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 8
    page_size: int = 4
    num_pages: int = 8
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"
    """``contiguous``: one layer's ``(pages, page_size, kv_heads, head_dim)`` tensor; ``page_first``:
    a layer of a page-first buffer (pages further apart than one layer's page)."""
    table: str = "contiguous"
    """``contiguous`` or ``slice``: the table is the first columns of a wider one (its row stride is larger)."""
    shared: bool = True
    """Whether the requests share their first page (a cached prefix)."""
    q_scale: float = 1.0
    """Queries this many times larger make scores in the hundreds: an exp without the maximum overflows."""
    seed: int = 0

    @property
    def size(self) -> int:
        return sum(self.lens) * self.heads * self.head_dim


@dataclass
class Tensors:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    lens: torch.Tensor


GUARD_FACTOR = 16
"""Guard memory on each side of a tensor, as a multiple of its span (plus 4096 elements): more than
the usual slips reach (a slot taken for a page number with pages of up to 8 rows, a block of 128
table entries past the end)."""


def _guarded(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype, fill: float) -> torch.Tensor:
    """A tensor of ``shape`` and ``strides`` in the middle of an allocation filled with ``fill``."""
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if all(shape) else 1
    guard = GUARD_FACTOR * span + 4096
    base = torch.full((guard + span + guard,), fill, dtype=dtype, device=_device())
    return base.as_strided(shape, strides, guard)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _page_tables(setup: Setup, rng: random.Random) -> list[list[int]]:
    """Each request's pages, distinct across requests except a shared first page."""
    s = setup
    pages = list(range(s.num_pages))
    rng.shuffle(pages)
    shared = pages.pop() if s.shared and len(s.lens) > 1 else None
    tables = []
    for length in s.lens:
        needed = -(-length // s.page_size)
        own = [shared] if shared is not None else []
        own += [pages.pop() for _ in range(needed - len(own))]
        tables.append(own)
    return tables


def pages_needed(setup: Setup) -> int:
    """The fewest pages a setup's requests need (with the shared first page counted once)."""
    needed = [-(-n // setup.page_size) for n in setup.lens]
    return sum(needed) - (len(needed) - 1 if setup.shared and len(needed) > 1 else 0)


def _build(setup: Setup) -> Tensors:
    s = setup
    gen = torch.Generator().manual_seed(s.seed)
    rng = random.Random(s.seed)
    batch, width = len(s.lens), max(s.lens, default=1) + rng.randint(0, 5)
    num_slots = s.num_pages * s.page_size
    q = _guarded((batch, s.heads, s.head_dim), _strides((batch, s.heads, s.head_dim)), s.dtype, GUARD)
    q.copy_((torch.randn(batch, s.heads, s.head_dim, generator=gen) * s.q_scale).to(s.dtype))
    cache_shape = (s.num_pages, s.page_size, s.kv_heads, s.head_dim)
    if s.layout == "page_first":  # the layer-1 view of a (pages, 2 layers, page_size, kv_heads, head_dim) buffer
        inner = _strides((s.num_pages, 2, s.page_size, s.kv_heads, s.head_dim))
        strides = (inner[0], *inner[2:])
        offset = inner[1]
    else:
        strides, offset = _strides(cache_shape), 0
    caches = []
    for _ in range(2):
        whole = _guarded((offset + 1 + 2 * math.prod(cache_shape),), (1,), s.dtype, GUARD)
        cache = whole.as_strided(cache_shape, strides, whole.storage_offset() + offset)
        cache.copy_(torch.randn(cache_shape, generator=gen).to(s.dtype))
        caches.append(cache)
    tables = _page_tables(s, rng)
    column_stride = width + (3 if s.table == "slice" else 0)
    table = _guarded((batch, width), (column_stride, 1), torch.int32, 0)
    table.as_strided((batch * column_stride,), (1,), table.storage_offset()).fill_(0)
    for b, (length, pages) in enumerate(zip(s.lens, tables, strict=True)):
        slots = [pages[i // s.page_size] * s.page_size + i % s.page_size for i in range(length)]
        padding = [rng.randrange(num_slots) for _ in range(width - length)]  # valid slots, but not this request's
        table[b] = torch.tensor(slots + padding, dtype=torch.int32)
    if s.table == "slice":  # the columns past the width hold valid slots too
        whole_rows = table.as_strided((batch, column_stride), (column_stride, 1), table.storage_offset())
        whole_rows[:, width:] = torch.randint(0, num_slots, (batch, column_stride - width), generator=gen).to(
            torch.int32
        )
    lens = torch.tensor(s.lens, dtype=torch.int32, device=_device())
    return Tensors(q, caches[0], caches[1], table, lens)


def expected_output(t: Tensors) -> torch.Tensor:
    """The spec, computed in float32: ``(batch, heads, head_dim)``."""
    batch, heads, dim = t.q.shape
    ref = paged_decode_attention_reference(
        t.q.float(), t.k_cache.float().contiguous(), t.v_cache.float().contiguous(), t.table, t.lens
    )
    return ref.view(batch, heads, dim)


def _variant(t: Tensors, *, head_map: str = "div", use_lens: bool = True, scale: bool = True) -> torch.Tensor:
    """What common slips compute, to name them in a report (plain torch, float32)."""
    batch, heads, dim = t.q.shape
    ps, kv_heads = t.k_cache.shape[1], t.k_cache.shape[2]
    group = heads // kv_heads
    out = torch.zeros(batch, heads, dim, device=t.q.device)
    for b in range(batch):
        length = int(t.lens[b]) if use_lens else t.table.shape[1]
        slots = t.table[b, :length].long()
        k = t.k_cache[slots // ps, slots % ps].float()
        v = t.v_cache[slots // ps, slots % ps].float()
        for h in range(heads):
            g = h // group if head_map == "div" else h % kv_heads
            scores = k[:, g] @ t.q[b, h].float() * (1 / math.sqrt(dim) if scale else 1.0)
            out[b, h] = torch.softmax(scores, 0) @ v[:, g]
    return out


def _runner(check: Callable[[_F, T], None], value: T) -> Callable[[_F], None]:
    """A case's run: ``check`` on this one value."""
    return lambda fn: check(fn, value)


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2e-2


def _check_decode(fn: _F, setup: Setup) -> None:
    t = _build(setup)
    before = [x.clone() for x in (t.q, t.k_cache, t.v_cache, t.table, t.lens)]
    try:
        got = call(fn, t.q, t.k_cache, t.v_cache, t.table, t.lens)
    except LearnerRaised as learner:
        explain_a_kernel_compiled_for_no_gpu(learner.error)
        raise
    for name, old, new in zip(("q", "k_cache", "v_cache", "table", "lens"), before,
                              (t.q, t.k_cache, t.v_cache, t.table, t.lens), strict=True):  # fmt: skip
        if not torch.equal(old.nan_to_num(), new.nan_to_num()):
            raise Mismatch(tr("your function changed `{name}`; attention only reads it.", name=name))
    shape = tuple(t.q.shape)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        shown = tr("shape {shape}", shape=tuple(got.shape)) if isinstance(got, torch.Tensor) else type(got).__name__
        raise Mismatch(
            tr("return the output as a (batch, heads, head_dim) tensor."), tr("shape {shape}", shape=shape), shown
        )
    expected = expected_output(t)
    got32 = got.detach().float()
    tol = _tolerance(setup.dtype)
    close = torch.isclose(got32, expected, rtol=tol, atol=tol)
    if bool(close.all()):
        return
    bad = (~close).any(dim=2).nonzero()
    b, h = (int(x) for x in bad[0])
    if bool(torch.isnan(got32).any()):
        problem = tr(
            "request {b}, query head {h}: the output differs from the spec and holds NaN: the kernel read memory "
            "outside the tensors (the guard around them is NaN); {bad} of {pairs} (request, head) pairs are wrong.",
            b=b,
            h=h,
            bad=len(bad),
            pairs=shape[0] * shape[1],
        )
    else:
        problem = tr(
            "request {b}, query head {h}: the output differs from the spec (largest difference {largest:.3g}); "
            "{bad} of {pairs} (request, head) pairs are wrong.",
            b=b,
            h=h,
            largest=float((got32 - expected).abs().max()),
            bad=len(bad),
            pairs=shape[0] * shape[1],
        )
    problem += _diagnosis(t, got32, tol)
    raise Mismatch(problem, _row(expected[b, h]), _row(got32[b, h]))


def _diagnosis(t: Tensors, got: torch.Tensor, tol: float) -> str:
    slips = [
        ({"head_map": "mod"}, tr("query head h must read KV head h // (heads // kv_heads), not h % kv_heads")),
        ({"use_lens": False}, tr("only the first lens[b] slots of a row are the request's: mask the rest")),
        ({"scale": False}, tr("scores are scaled by 1 / sqrt(head_dim)")),
    ]
    for kwargs, sentence in slips:
        if bool(torch.isclose(got, _variant(t, **kwargs), rtol=tol, atol=tol).all()):  # type: ignore[arg-type]
            return tr(" It matches what you get if you forget that {sentence}.", sentence=sentence)
    return ""


def _row(values: torch.Tensor) -> str:
    items = [f"{v:.4g}" for v in values.tolist()]
    return "[" + ", ".join(items[:8]) + (tr(", ... ({n} values)", n=len(items)) if len(items) > 8 else "") + "]"


def _setups() -> list[Setup]:
    """The decode cases' settings, described in the current language (so built when a check runs)."""
    return [
        Setup(tr("one request, one token, one head"), (1,), heads=1, head_dim=4, num_pages=2),
        Setup(tr("one request of 7 tokens over two pages of 4"), (7,), head_dim=4, num_pages=4),
        Setup(tr("three requests of different lengths, sharing their first page"), (5, 9, 2), num_pages=8),
        Setup(tr("grouped-query attention: 4 query heads share 2 KV heads"), (6, 3),
              heads=4, kv_heads=2, num_pages=6),
        Setup(tr("8 query heads, 1 KV head (multi-query)"), (5,), heads=8, kv_heads=1, num_pages=4),
        Setup(tr("page_size 1: every token its own page"), (6, 4), page_size=1, num_pages=12),
        Setup(tr("page_size 3 and head_dim 12 (not powers of two)"), (8, 5), head_dim=12, page_size=3, num_pages=8),
        Setup(tr("a layer of a page-first buffer: pages are further apart than one layer's page"), (6, 7),
              heads=4, kv_heads=2, layout="page_first", num_pages=8),
        Setup(tr("the table is a slice of a wider one: its row stride is not its width"), (5, 3), table="slice"),
        Setup(tr("large scores (queries scaled by 100): exp() of a raw score overflows"), (9, 4), q_scale=100.0),
        Setup(tr("a request longer than one block of the loop (40 tokens)"), (40, 3),
              head_dim=4, page_size=8, num_pages=8),
        Setup("float16", (6, 5), heads=4, kv_heads=2, dtype=torch.float16),
    ]  # fmt: skip


def _draw_setup(rng: random.Random, size: int) -> Setup:
    kv_heads = rng.randint(1, 2)
    page_size = rng.choice((1, 2, 3, 4, 8))
    lens = tuple(rng.randint(1, 2 + 3 * size) for _ in range(rng.randint(1, 3)))
    setup = Setup(
        "random",
        lens,
        heads=kv_heads * rng.randint(1, 3),
        kv_heads=kv_heads,
        head_dim=rng.choice((1, 2, 4, 5, 8, 16)),
        page_size=page_size,
        num_pages=1,
        dtype=rng.choice((torch.float32, torch.float32, torch.float16)),
        layout=rng.choice(("contiguous", "page_first")),
        table=rng.choice(("contiguous", "slice")),
        shared=rng.random() < 0.5,
        q_scale=rng.choice((1.0, 1.0, 30.0)),
        seed=rng.randrange(2**31),
    )
    return dataclasses.replace(setup, num_pages=pages_needed(setup) + rng.randint(0, 3))


def _shrink_setup(setup: Setup) -> list[Setup]:
    r = dataclasses.replace
    out = [r(setup, lens=setup.lens[:i] + setup.lens[i + 1 :]) for i in range(len(setup.lens)) if len(setup.lens) > 1]
    for i, n in enumerate(setup.lens):
        out += [r(setup, lens=(*setup.lens[:i], m, *setup.lens[i + 1 :])) for m in shrink_int(n, 1)]
    out += [r(setup, head_dim=d) for d in shrink_int(setup.head_dim, 1)]
    for name, plain in (("layout", "contiguous"), ("table", "contiguous"), ("dtype", torch.float32),
                        ("q_scale", 1.0), ("shared", False)):  # fmt: skip
        if getattr(setup, name) != plain:
            out.append(r(setup, **{name: plain}))
    return [s for s in out if s.num_pages >= pages_needed(s)]


def _show_setup(setup: Setup) -> str:
    s = setup
    return tr(
        "lens {lens}, {heads} query heads over {kv_heads} KV heads of {head_dim}, page_size {page_size}, "
        "{num_pages} pages, {dtype}, cache {layout}, table {table}, {shared}queries x{q_scale:g}",
        lens=list(s.lens),
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        page_size=s.page_size,
        num_pages=s.num_pages,
        dtype=str(s.dtype).replace("torch.", ""),
        layout=s.layout,
        table=s.table,
        shared=tr("a shared first page, ") if s.shared else "",
        q_scale=s.q_scale,
    )


def _decode_cases(count: int) -> list[Case]:
    cases = [Case(s.description, s.size, _runner(_check_decode, s)) for s in _setups()]
    cases.append(Case(tr("which cache rows each query head reads (a probe cache: see rows_read)"), 10**5, _check_probe))
    return [
        *cases,
        random_case(
            tr(
                "{count} random decode steps: any lengths, page sizes, GQA groups, layouts, table strides, dtypes",
                count=count,
            ),
            Draw(_draw_setup, _check_decode, _show_setup, _shrink_setup, lambda s: s.size),
            seed=2800,
            max_size=8,
            count=count,
        ),
    ]


# -- the probe: which rows a kernel read -------------------------------------------------------------


PROBE = Setup("probe", (6, 10, 3), heads=4, kv_heads=2, head_dim=24, page_size=4, num_pages=6)
PROBE_PAGES = ((2, 0), (2, 5, 3), (4,))
"""The probe's page tables: requests 0 and 1 share page 2 (a cached prefix); page 1 belongs to nobody."""


@dataclass(frozen=True)
class RowsRead:
    """Which cache rows (slots) each request's query heads drew on, and which they should have.

    ``read[b, s]``: some query head of request ``b`` used slot ``s``; ``expected[b, s]``: slot ``s``
    is one of request ``b``'s first ``lens[b]`` slots. ``kv_head[b, h]``: the KV head query head
    ``h`` of request ``b`` read (-1 where it cannot be told: rows of several heads, or none).
    """

    read: np.ndarray
    expected: np.ndarray
    kv_head: np.ndarray
    expected_kv_head: np.ndarray
    page_size: int
    lens: tuple[int, ...]

    @property
    def correct(self) -> bool:
        return bool((self.read == self.expected).all() and (self.kv_head == self.expected_kv_head).all())


def _probe_tensors() -> Tensors:
    s = PROBE
    device = _device()
    num_slots = s.num_pages * s.page_size
    q_shape = (len(s.lens), s.heads, s.head_dim)
    q = _guarded(q_shape, _strides(q_shape), torch.float32, 0.0)
    q.copy_(torch.randn(q_shape, generator=torch.Generator().manual_seed(0)))
    shape = (s.num_pages, s.page_size, s.kv_heads, s.head_dim)
    k_cache = _guarded(shape, _strides(shape), torch.float32, 0.0)
    v_cache = _guarded(shape, _strides(shape), torch.float32, 0.0)
    k_cache.zero_()
    v_cache.zero_()
    for slot in range(num_slots):
        for g in range(s.kv_heads):
            v_cache[slot // s.page_size, slot % s.page_size, g, slot] = g + 1.0
    width = max(s.lens) + 2
    nobodys = s.page_size * 1  # page 1's first row: the table's padding, and the memory around the table
    table = _guarded((len(s.lens), width), (width, 1), torch.int32, nobodys)
    table.fill_(nobodys)
    for b, (length, pages) in enumerate(zip(s.lens, PROBE_PAGES, strict=True)):
        slots = [pages[i // s.page_size] * s.page_size + i % s.page_size for i in range(length)]
        table[b, :length] = torch.tensor(slots, dtype=torch.int32)
    assert num_slots <= s.head_dim
    return Tensors(q, k_cache, v_cache, table, torch.tensor(s.lens, dtype=torch.int32, device=device))


def rows_read(decode: Callable[..., torch.Tensor]) -> RowsRead:
    """Run ``decode(q, k_cache, v_cache, table, lens)`` on a probe cache and say which rows it used.

    Three requests (6, 10 and 3 tokens, pages of 4; the first two share a page), 4 query heads over
    2 KV heads. Every K row is zero, so the rows a query head reads share its attention equally;
    the V row of slot ``s`` in KV head ``g`` is ``g + 1`` at element ``s``. Element ``s`` of an
    output is then non-zero exactly when that head used slot ``s``, and the output sums to the KV
    head's number plus one. Draw the result with :func:`minikv.viz.storage.draw_rows_read`.
    """
    t = _probe_tensors()
    out = decode(t.q, t.k_cache, t.v_cache, t.table, t.lens)
    out = torch.as_tensor(out).detach().float().cpu().reshape(t.q.shape)
    s = PROBE
    num_slots = s.num_pages * s.page_size
    used = out[:, :, :num_slots].abs() > 1e-4
    read = used.any(dim=1).numpy()
    expected = np.zeros_like(read)
    for b, length in enumerate(s.lens):
        expected[b, t.table[b, :length].cpu().long().numpy()] = True
    group = s.heads // s.kv_heads
    kv_head = np.full((len(s.lens), s.heads), -1)
    totals = out.sum(dim=2)
    for b in range(len(s.lens)):
        for h in range(s.heads):
            total = float(totals[b, h])
            if math.isfinite(total) and abs(total - round(total)) < 1e-3 and 1 <= round(total) <= s.kv_heads:
                kv_head[b, h] = round(total) - 1
    expected_kv = np.tile(np.arange(s.heads) // group, (len(s.lens), 1))
    return RowsRead(read, expected, kv_head, expected_kv, s.page_size, s.lens)


def _check_probe(fn: _F) -> None:
    try:
        found = call(rows_read, fn)
    except LearnerRaised as learner:
        if learner.function:  # raised in the learner's code
            explain_a_kernel_compiled_for_no_gpu(learner.error)
            raise
        raise Mismatch(
            tr("the checker could not read your output on the probe cache: return (batch, heads, head_dim).")
        ) from None
    for b in range(len(found.lens)):
        extra = np.nonzero(found.read[b] & ~found.expected[b])[0].tolist()
        missing = np.nonzero(found.expected[b] & ~found.read[b])[0].tolist()
        if extra or missing:
            ps = found.page_size
            raise Mismatch(
                tr("request {b} (lens {length}) did not read exactly its own slots", b=b, length=found.lens[b])
                + (tr("; it read slots {extra} it does not own", extra=extra) if extra else "")
                + (tr("; it skipped its slots {missing}", missing=missing) if missing else "")
                + tr(" (slot s is row s % {ps} of page s // {ps}).", ps=ps),
                str(np.nonzero(found.expected[b])[0].tolist()),
                str(np.nonzero(found.read[b])[0].tolist()),
            )
    wrong = np.argwhere(found.kv_head != found.expected_kv_head)
    if len(wrong):
        b, h = (int(x) for x in wrong[0])
        raise Mismatch(
            tr(
                "request {b}'s query head {h} read the rows of the wrong KV head: with "
                "{heads} query heads over {kv_heads} KV heads, head h reads KV head h // {group}.",
                b=b,
                h=h,
                heads=PROBE.heads,
                kv_heads=PROBE.kv_heads,
                group=PROBE.heads // PROBE.kv_heads,
            ),
            tr("KV head {g}", g=found.expected_kv_head[b, h]),
            tr("KV head {g}", g=found.kv_head[b, h]) if found.kv_head[b, h] >= 0 else tr("rows of several KV heads"),
        )


exercise("paged_attention.decode_torch", lambda: tr("decode attention over paged K/V, in plain torch"))(
    lambda: _decode_cases(24)
)


# -- paged_attention.online_softmax -------------------------------------------------------------------


@dataclass(frozen=True)
class Blocks:
    """Scores and values, cut into blocks of these lengths; some scores may be -inf (masked lanes)."""

    lengths: tuple[int, ...]
    dim: int
    scale: float = 1.0
    shift: float = 0.0
    masked: tuple[int, ...] = ()
    """Positions whose score is -inf (never a whole block)."""
    seed: int = 0

    @property
    def size(self) -> int:
        return sum(self.lengths) * self.dim


def _scores_values(spec: Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(spec.seed)
    n = sum(spec.lengths)
    scores = (torch.randn(n, generator=gen, dtype=torch.float64) * spec.scale + spec.shift).float()
    for i in spec.masked:
        scores[i] = float("-inf")
    return scores, torch.randn(n, spec.dim, generator=gen)


def _blocks(spec: Blocks, scores: torch.Tensor, values: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The blocks, one at a time, each in the same two buffers (as a kernel holds one block in registers)."""
    longest = max(spec.lengths)
    s_buffer, v_buffer = torch.empty(longest), torch.empty(longest, spec.dim)
    start = 0
    for n in spec.lengths:
        s_buffer[:n] = scores[start : start + n]
        v_buffer[:n] = values[start : start + n]
        yield s_buffer[:n], v_buffer[:n]
        start += n


def _check_online(fn: _F, spec: Blocks) -> None:
    scores, values = _scores_values(spec)
    expected = torch.softmax(scores.double(), 0) @ values.double()
    got = call(fn, _blocks(spec, scores, values))
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (spec.dim,):
        shown = tr("shape {shape}", shape=tuple(got.shape)) if isinstance(got, torch.Tensor) else type(got).__name__
        raise Mismatch(
            tr("return the weighted sum of the values as a (dim,) tensor."),
            tr("shape {shape}", shape=(spec.dim,)),
            shown,
        )
    got64 = got.detach().double()
    if bool(torch.isclose(got64, expected, rtol=1e-4, atol=1e-5).all()):
        return
    problem = tr("the result is not softmax(scores) @ values.")
    if bool(torch.isnan(got64).any() | torch.isinf(got64).any()):
        problem = tr(
            "the result is not softmax(scores) @ values: it holds NaN or inf. Large scores overflow exp(); "
            "subtract the running maximum first (and a block may hold -inf scores, masked lanes)."
        )
    elif len(spec.lengths) > 1 and bool(
        torch.isclose(
            got64, torch.softmax(scores[-spec.lengths[-1] :].double(), 0) @ values[-spec.lengths[-1] :].double()
        ).all()
    ):
        problem = tr(
            "the result is not softmax(scores) @ values: it equals the last block's alone. The blocks arrive one "
            "at a time in the same buffer: fold each into running values before asking for the next, do not keep them."
        )
    raise Mismatch(problem, _row(expected.float()), _row(got64.float()))


@exercise("paged_attention.online_softmax", lambda: tr("softmax(scores) @ values, one block at a time"))
def _online_cases() -> list[Case]:
    settings = [
        (tr("one block of 4"), Blocks((4,), 3)),
        (tr("one block of one score"), Blocks((1,), 2)),
        (tr("three blocks of 4: the running maximum grows"), Blocks((4, 4, 4), 3, seed=1)),
        (tr("the largest score comes in the last block"), Blocks((3, 3, 1), 2, shift=0.0, seed=5)),
        (tr("blocks of different lengths"), Blocks((5, 1, 3, 2), 4, seed=2)),
        (tr("scores near 1000: exp() of a raw score overflows"), Blocks((4, 4), 3, scale=5.0, shift=1000.0, seed=3)),
        (tr("scores near -1000: exp() of a raw score is 0 everywhere"),
         Blocks((4, 4), 3, scale=5.0, shift=-1000.0, seed=4)),
        (tr("-inf scores (masked lanes) in the last block"), Blocks((4, 4), 2, masked=(5, 6, 7), seed=6)),
        (tr("scores that spread over hundreds: most weights underflow"), Blocks((4, 4, 4), 2, scale=300.0, seed=7)),
    ]  # fmt: skip

    def draw(rng: random.Random, size: int) -> Blocks:
        lengths = tuple(rng.randint(1, 2 + size // 2) for _ in range(rng.randint(1, 1 + size // 2)))
        masked: list[int] = []
        start = 0
        for n in lengths:
            if n > 1 and rng.random() < 0.3:
                masked += rng.sample(range(start + 1, start + n), rng.randint(1, n - 1))
            start += n
        return Blocks(
            lengths,
            rng.randint(1, 6),
            scale=rng.choice((1.0, 10.0, 100.0)),
            shift=rng.choice((0.0, 0.0, 500.0, -500.0)),
            masked=tuple(sorted(masked)),
            seed=rng.randrange(2**31),
        )

    def shrink(spec: Blocks) -> list[Blocks]:
        r = dataclasses.replace
        out = []
        if len(spec.lengths) > 1:
            keep = sum(spec.lengths[:-1])
            out.append(r(spec, lengths=spec.lengths[:-1], masked=tuple(i for i in spec.masked if i < keep)))
        out += [r(spec, dim=d) for d in shrink_int(spec.dim, 1)]
        out += [r(spec, masked=())] if spec.masked else []
        out += [r(spec, shift=0.0)] if spec.shift else []
        return out

    def show(spec: Blocks) -> str:
        text = tr("blocks of {lengths} scores, values of dim {dim}", lengths=list(spec.lengths), dim=spec.dim)
        text += tr(", scores ~ N({shift:g}, {scale:g}²)", shift=spec.shift, scale=spec.scale)
        return text + (tr(", -inf at positions {masked}", masked=list(spec.masked)) if spec.masked else "")

    return [Case(desc, spec.size, _runner(_check_online, spec)) for desc, spec in settings] + [
        random_case(
            tr("24 random block sequences: lengths, huge and tiny scores, masked lanes"),
            Draw(draw, _check_online, show, shrink, lambda spec: spec.size),
            seed=2900,
            max_size=12,
        )
    ]


exercise("paged_attention.decode", lambda: tr("the paged decode-attention kernel in Triton, and its launcher"))(
    lambda: _decode_cases(6)
)
