"""``store_cache`` against ``store_cache_reference``, bit for bit, on both backends.

On a machine without CUDA the "triton" backend runs the real kernel under
Triton's interpreter (about 1-2 ms per program of 64 tokens), so sizes stay
small. Caches start filled with random values, so a write to the wrong slot,
or a write to a slot that should be left alone, shows up as a difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE, assert_bitwise_equal
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from minikv import KVCacheLayout, MHAKVCache, store_cache, store_cache_reference
from minikv.errors import ArgumentError, ArgumentTypeError, SlotIndexError
from minikv.kernels import (
    TRITON_MISSING,
    interpreted,
    plan_store_launch,
    require_triton,
    triton_interpreter_requested,
    use_interpreter_without_cuda,
)
from minikv.kernels import checks as checks_module
from minikv.kernels import store as store_module
from minikv.kernels.cpu_copy import slot_runs

REPO = Path(__file__).resolve().parent.parent
BACKENDS = ["torch", "triton"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def generator_for(*parts: object) -> torch.Generator:
    """A generator seeded from the test's parameters: each case is random, and the same on every run."""
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def random_like_cache(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


def store_both_ways(
    k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str
) -> None:
    """Store with ``backend`` into the given caches and with the reference into clones; compare bitwise."""
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_cache_reference(expected_k, expected_v, indices, k, v)
    store_cache(k_cache, v_cache, indices, k, v, backend=backend)
    assert_bitwise_equal(k_cache, expected_k)
    assert_bitwise_equal(v_cache, expected_v)


# -- random shapes --------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("paged", [False, True], ids=["3d", "4d"])
def test_random_shapes_match_the_reference(
    backend: str, dtype: torch.dtype, index_dtype: torch.dtype, paged: bool
) -> None:
    gen = generator_for(backend, dtype, index_dtype, paged)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa: E731
    heads, head_dim = pick([1, 3, 5, 8]), pick([7, 16, 24, 33])
    page_size = pick([2, 3, 16]) if paged else 1
    num_pages = pick([40, 97]) // page_size + 4
    num_slots = num_pages * page_size
    num_tokens = int(torch.randint(1, min(num_slots, 150) + 1, (1,), generator=gen))
    shape = (num_pages, page_size, heads, head_dim) if paged else (num_pages, heads, head_dim)
    k_cache, v_cache = random_like_cache(shape, dtype, gen), random_like_cache(shape, dtype, gen)
    indices = torch.randperm(num_slots, generator=gen)[:num_tokens].to(index_dtype)
    k = random_like_cache((num_tokens, heads, head_dim), dtype, gen)
    v = random_like_cache((num_tokens, heads, head_dim), dtype, gen)
    store_both_ways(k_cache, v_cache, indices, k, v, backend)


# -- strided inputs and caches --------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_and_v_sliced_from_a_fused_qkv_tensor(backend: str) -> None:
    gen = generator_for("qkv", backend)
    q_heads, kv_heads, head_dim, n = 6, 3, 24, 70
    qkv = torch.randn(n, q_heads + 2 * kv_heads, head_dim, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    k, v = qkv[:, q_heads : q_heads + kv_heads], qkv[:, q_heads + kv_heads :]
    assert not k.is_contiguous() and k.stride(0) == (q_heads + 2 * kv_heads) * head_dim
    k_cache = random_like_cache((128, kv_heads, head_dim), torch.bfloat16, gen)
    v_cache = random_like_cache((128, kv_heads, head_dim), torch.bfloat16, gen)
    indices = torch.randperm(128, generator=gen)[:n].int()
    store_both_ways(k_cache, v_cache, indices, k, v, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_and_v_whose_head_dim_is_not_the_innermost_axis(backend: str) -> None:
    gen = generator_for("transposed", backend)
    n, heads, head_dim = 33, 3, 10
    k = torch.randn(n, head_dim, heads, generator=gen).transpose(1, 2)  # stride along head_dim is `heads`
    v = torch.randn(heads, n, head_dim, generator=gen).transpose(0, 1)
    assert k.stride(2) == heads and v.stride(0) == head_dim
    k_cache, v_cache = torch.randn(64, heads, head_dim, generator=gen), torch.randn(64, heads, head_dim, generator=gen)
    store_both_ways(k_cache, v_cache, torch.randperm(64, generator=gen)[:n], k, v, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_that_is_a_slice_of_a_larger_buffer(backend: str) -> None:
    gen = generator_for("slice", backend)
    buffer = torch.randn(2, 50, 4, 6, 8, generator=gen, dtype=torch.float32).to(torch.float16)
    k_cache, v_cache = buffer[0, :, :, 1:4], buffer[1, :, :, 1:4]  # pages of 4, heads 1..3 of 6
    assert not k_cache.is_contiguous()
    untouched = buffer[:, :, :, [0, 4, 5]].clone()
    n = 90
    k = torch.randn(n, 3, 8, generator=gen).half()
    v = torch.randn(n, 3, 8, generator=gen).half()
    store_both_ways(k_cache, v_cache, torch.randperm(200, generator=gen)[:n], k, v, backend)
    assert_bitwise_equal(buffer[:, :, :, [0, 4, 5]], untouched)  # heads outside the view were not written


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_page_first_layer_views(backend: str, page_size: int) -> None:
    gen = generator_for("page-first", backend, page_size)
    cache = MHAKVCache(3, 3, 12, 20, torch.bfloat16, KVCacheLayout.PageFirst, "cpu", page_size=page_size)
    cache.kv_buffer.copy_(torch.randn(cache.kv_buffer.shape, generator=gen).to(torch.bfloat16))
    expected = cache.kv_buffer.clone()
    n = 17
    indices = torch.randperm(cache.num_slots, generator=gen)[:n]
    k = torch.randn(n, 3, 12, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, 3, 12, generator=gen).to(torch.bfloat16)
    store_cache_reference(expected[0, 1], expected[1, 1], indices, k, v)
    store_cache(cache.k_cache(1), cache.v_cache(1), indices, k, v, backend=backend)
    assert not cache.k_cache(1).is_contiguous()
    assert_bitwise_equal(cache.kv_buffer, expected)  # layers 0 and 2 untouched, layer 1 as the reference


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_that_are_a_strided_view(backend: str) -> None:
    # Every other entry of a permutation: read contiguously, these would name other slots.
    gen = generator_for("strided-indices", backend)
    base = torch.randperm(96, generator=gen).int()
    indices = base[::2]
    assert not indices.is_contiguous()
    k, v = torch.randn(48, 2, 8, generator=gen), torch.randn(48, 2, 8, generator=gen)
    store_both_ways(torch.randn(96, 2, 8, generator=gen), torch.randn(96, 2, 8, generator=gen), indices, k, v, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_tokens_than_one_program_and_a_ragged_last_program(backend: str) -> None:
    gen = generator_for("programs", backend)
    n = 64 * 3 + 5
    k, v = torch.randn(n, 1, 4, generator=gen), torch.randn(n, 1, 4, generator=gen)
    indices = torch.randperm(300, generator=gen)[:n]
    k_cache, v_cache = torch.randn(300, 1, 4, generator=gen), torch.randn(300, 1, 4, generator=gen)
    store_both_ways(k_cache, v_cache, indices, k, v, backend)


# -- the reference itself, and trivial calls ---------------------------------------


def test_the_reference_puts_slot_s_at_page_s_div_ps_row_s_mod_ps() -> None:
    k_cache, v_cache = torch.zeros(3, 4, 1, 1), torch.zeros(3, 4, 1, 1)
    k, v = torch.tensor([[[1.0]], [[2.0]]]), torch.tensor([[[3.0]], [[4.0]]])
    store_cache_reference(k_cache, v_cache, torch.tensor([5, 11]), k, v)
    assert k_cache[1, 1].item() == 1.0 and k_cache[2, 3].item() == 2.0
    assert v_cache[1, 1].item() == 3.0 and v_cache[2, 3].item() == 4.0
    assert k_cache.sum().item() == 3.0 and v_cache.sum().item() == 7.0


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_no_tokens_writes_nothing(backend: str) -> None:
    k_cache, v_cache = torch.randn(8, 2, 4), torch.randn(8, 2, 4)
    before = (k_cache.clone(), v_cache.clone())
    nothing = torch.empty(0, 2, 4)
    store_cache(k_cache, v_cache, torch.empty(0, dtype=torch.int32), nothing, nothing, backend=backend)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_auto_backend_matches_the_reference_too() -> None:
    gen = generator_for("auto")
    k, v = torch.randn(20, 2, 4, generator=gen), torch.randn(20, 2, 4, generator=gen)
    k_cache, v_cache = torch.randn(32, 2, 4, generator=gen), torch.randn(32, 2, 4, generator=gen)
    store_both_ways(k_cache, v_cache, torch.arange(20), k, v, "auto")


# -- rejected indices: nothing written --------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ([3, 16], SlotIndexError),  # one past the end: the interpreter would silently overwrite memory
        ([3, -1], SlotIndexError),  # the interpreter would corrupt the heap
        ([3, 2**40], SlotIndexError),
        ([3, 7, 3], ArgumentError),  # two tokens, one slot
    ],
    ids=["past-the-end", "negative", "huge", "duplicate"],
)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_bad_indices_are_rejected_before_any_write(
    backend: str, bad: list[int], error: type[Exception], index_dtype: torch.dtype
) -> None:
    if index_dtype == torch.int32 and max(bad) >= 2**31:
        pytest.skip("does not fit in int32")
    gen = generator_for("bad", backend, bad)
    k_cache, v_cache = torch.randn(4, 4, 2, 3, generator=gen), torch.randn(4, 4, 2, 3, generator=gen)
    k, v = torch.randn(len(bad), 2, 3, generator=gen), torch.randn(len(bad), 2, 3, generator=gen)
    before = (k_cache.clone(), v_cache.clone(), k.clone(), v.clone())
    with pytest.raises(error, match="indices"):
        store_cache(k_cache, v_cache, torch.tensor(bad, dtype=index_dtype), k, v, backend=backend)
    for now, then in zip((k_cache, v_cache, k, v), before, strict=True):
        assert_bitwise_equal(now, then)


def test_v_cache_with_other_strides_is_refused() -> None:
    k_cache = torch.zeros(8, 2, 4)
    v_cache = torch.zeros(8, 4, 2).transpose(1, 2)
    with pytest.raises(ArgumentError, match="v_cache"):
        store_cache(k_cache, v_cache, torch.tensor([0]), torch.ones(1, 2, 4), torch.ones(1, 2, 4))
    assert k_cache.sum() == 0 and v_cache.sum() == 0


def test_a_cache_of_the_wrong_rank_is_refused() -> None:
    with pytest.raises(ArgumentError, match="k_cache"):
        store_cache(torch.zeros(8, 8), torch.zeros(8, 8), torch.tensor([0]), torch.ones(1, 8), torch.ones(1, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_compiled_kernel_on_cuda_matches_the_reference(dtype: torch.dtype) -> None:
    gen = generator_for("cuda", dtype)
    k_cache = torch.randn(1000, 4, 3, 40, generator=gen).to(dtype).cuda()
    v_cache = torch.randn(1000, 4, 3, 40, generator=gen).to(dtype).cuda()
    n = 2000
    indices = torch.randperm(4000, generator=gen)[:n].cuda()
    k = torch.randn(n, 3, 40, generator=gen).to(dtype).cuda()
    v = torch.randn(n, 3, 40, generator=gen).to(dtype).cuda()
    store_both_ways(k_cache, v_cache, indices, k, v, "triton")


@pytest.mark.parametrize(
    ("slots", "distinct"),
    [
        ([], True),
        ([4], True),
        ([0, 1, 2, 3], True),  # one run
        ([40, 41, 42, 0, 1, 2], True),  # two runs, out of order
        ([3, 9, 1, 7], True),  # runs of one
        ([5, 6, 7, 6, 7, 8], False),  # two runs that overlap
        ([10, 11, 12, 12], False),  # a run followed by its own last slot
        ([9, 2, 9], False),
    ],
)
def test_all_distinct_sees_overlapping_runs(slots: list[int], distinct: bool) -> None:
    for dtype in (torch.int32, torch.int64):
        assert store_module.all_distinct(torch.tensor(slots, dtype=dtype)) is distinct


def test_runs_split_at_every_break() -> None:
    starts, lengths = slot_runs(np.array([7, 8, 9, 2, 3, 11], dtype=np.int32))
    assert starts.tolist() == [0, 3, 5] and lengths.tolist() == [3, 2, 1]
    starts, lengths = slot_runs(np.array([], dtype=np.int32))
    assert starts.tolist() == [] and lengths.tolist() == []


runs_of_slots = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 6)), max_size=8).map(
    lambda runs: [first + i for first, length in runs for i in range(length)]
)


@given(runs_of_slots, st.sampled_from([torch.int32, torch.int64]))
@settings(REPRODUCIBLE, max_examples=300)
def test_all_distinct_agrees_with_a_set(slots: list[int], dtype: torch.dtype) -> None:
    # Slots made of short ascending runs, overlapping or not, in any order: the shapes the run check reasons about.
    assert store_module.all_distinct(torch.tensor(slots, dtype=dtype)) == (len(set(slots)) == len(slots))


# -- where the kernel runs ------------------------------------------------------------


def test_import_minikv_sets_no_environment_variable_and_imports_no_triton() -> None:
    code = (
        "import os, sys; before = dict(os.environ); import minikv; "
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
        "assert 'triton' not in sys.modules, 'import minikv imported triton'"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)


WITHOUT_TRITON = """
import sys

class NoTriton:  # what macOS and Windows look like: Triton has no wheels there
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "triton":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTriton())
"""


def test_without_triton_a_kernel_says_so_in_one_line_and_the_torch_path_works() -> None:
    """Chapter 3's kernel cells and exercise 3's kernel task, on a machine where ``import triton`` fails."""
    code = WITHOUT_TRITON + (
        "import torch\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "from minikv import KVCacheLayout, MHAKVCache, store_cache\n"
        "from minikv.errors import TritonMissingError\n"
        "from minikv.kernels import TRITON_MISSING, require_triton\n"
        "try:\n"
        "    require_triton()\n"
        "except ImportError as error:  # a ModuleNotFoundError too\n"
        "    assert isinstance(error, TritonMissingError) and str(error).startswith(TRITON_MISSING), error\n"
        "cache = MHAKVCache(2, 1, 4, num_pages=8, dtype=torch.float32, kv_layout=KVCacheLayout.LayerFirst,\n"
        "                   device='cpu')\n"
        "k = torch.ones(3, 2, 4)\n"
        "cache.store_kv(k, 2 * k, torch.tensor([5, 0, 2]), layer_id=0)  # CPU tensors: the torch copy\n"
        "assert (cache.k_cache(0).reshape(8, -1)[[5, 0, 2]] == 1).all()\n"
        "try:\n"
        "    store_cache(cache.k_cache(0), cache.v_cache(0), torch.tensor([1]), k[:1], k[:1], backend='triton')\n"
        "except TritonMissingError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('the triton backend ran without Triton')\n"
        "print('--- a notebook cell:')\n"
        "InteractiveShell.instance().run_cell('from minikv.kernels import require_triton\\n"
        "triton, tl = require_triton()')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    shown = [line for line in result.stdout.split("--- a notebook cell:\n", 1)[1].splitlines() if line.strip()]
    assert len(shown) == 1 and shown[0].startswith(f"✗ {TRITON_MISSING}"), result.stdout


def test_require_triton_returns_triton_and_its_language_where_it_is_installed() -> None:
    triton, tl = require_triton()
    assert triton.__name__ == "triton" and tl.__name__ == "triton.language"


@pytest.mark.parametrize(
    ("value", "requested"),
    [(None, False), ("0", False), ("1", True), ("true", True), ("ON", True), (" yes ", True), ("no", False)],
)
def test_the_interpreter_rule_reads_the_variable_at_each_call(
    monkeypatch: pytest.MonkeyPatch, value: str | None, requested: bool
) -> None:
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpreter_requested() is requested
    assert interpreted("cpu") is True  # CPU tensors: always the interpreter
    assert interpreted(torch.device("cuda", 1)) is requested  # CUDA tensors: compiled unless asked otherwise
    assert plan_store_launch(100, 8, 128, "cuda").interpreted is requested


def test_use_interpreter_without_cuda_respects_an_explicit_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert use_interpreter_without_cuda() is False and os.environ["TRITON_INTERPRET"] == "0"
    monkeypatch.delenv("TRITON_INTERPRET")
    assert use_interpreter_without_cuda() is True and os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert use_interpreter_without_cuda() is False and "TRITON_INTERPRET" not in os.environ


def test_the_launch_plan_follows_the_device() -> None:
    on_cpu = plan_store_launch(130, 3, 24, "cpu")
    assert (on_cpu.block_t, on_cpu.block_h, on_cpu.block_d, on_cpu.num_programs) == (64, 4, 32, 3)
    on_gpu = plan_store_launch(130, 8, 128, "cuda") if not triton_interpreter_requested() else None
    if on_gpu is not None:
        assert (on_gpu.block_t, on_gpu.block_h, on_gpu.block_d, on_gpu.num_warps) == (4, 8, 128, 4)
        assert plan_store_launch(1, 40, 128, "cuda").num_warps == 8


# -- the slot check inside the kernel (the engine's path on CUDA) -------------------------


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_kernel_slot_check_skips_out_of_range_slots_and_counts_them(index_dtype: torch.dtype) -> None:
    gen = generator_for("kernel-check", index_dtype)
    k_cache, v_cache = torch.randn(4, 4, 2, 3, generator=gen), torch.randn(4, 4, 2, 3, generator=gen)
    slots = [3, 16, 7, -1, 2**31 - 1, 0]
    k, v = torch.randn(len(slots), 2, 3, generator=gen), torch.randn(len(slots), 2, 3, generator=gen)
    good = [i for i, s in enumerate(slots) if 0 <= s < 16]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    store_cache_reference(expected_k, expected_v, torch.tensor([slots[i] for i in good]), k[good], v[good])
    flag = torch.zeros(1, dtype=torch.int32)
    store_cache(k_cache, v_cache, torch.tensor(slots, dtype=index_dtype), k, v, slot_check="kernel", error_flag=flag)
    assert flag.item() == 3  # counted, not raised: reading it is the caller's choice
    assert_bitwise_equal(k_cache, expected_k)  # the good rows landed, nothing else changed
    assert_bitwise_equal(v_cache, expected_v)
    store_cache(
        k_cache, v_cache, torch.tensor([1], dtype=index_dtype), k[:1], v[:1], slot_check="kernel", error_flag=flag
    )
    assert flag.item() == 3  # a clean call adds nothing


FLAG = torch.zeros(1, dtype=torch.int32)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"slot_check": "gpu"}, ArgumentError, "slot_check"),
        ({"slot_check": "kernel"}, ArgumentTypeError, "error_flag"),
        ({"slot_check": "kernel", "error_flag": torch.zeros(1)}, ArgumentTypeError, "error_flag"),
        ({"slot_check": "kernel", "error_flag": FLAG.to("meta")}, ArgumentError, "error_flag"),
        ({"slot_check": "kernel", "error_flag": FLAG, "backend": "torch"}, ArgumentError, "kernel"),
    ],
    ids=["unknown", "no-flag", "float-flag", "flag-elsewhere", "torch-backend"],
)  # fmt: skip
def test_bad_slot_check_arguments_are_refused(kwargs: dict, error: type[Exception], name: str) -> None:
    k_cache, v_cache = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    with pytest.raises(error, match=name):
        store_cache(k_cache, v_cache, torch.tensor([0]), torch.ones(1, 2, 4), torch.ones(1, 2, 4), **kwargs)
    assert k_cache.sum() == 0 and v_cache.sum() == 0


@pytest.mark.parametrize("cache_name", ["k_cache", "v_cache"])
def test_an_error_flag_in_the_caches_memory_is_refused(cache_name: str) -> None:
    # Issue 25 (low): a flag that is a view of a cache row was accepted, and the kernel wrote its count there.
    caches = {"k_cache": torch.zeros(8, 2, 4), "v_cache": torch.zeros(8, 2, 4)}
    flag = caches[cache_name][3, 1].view(torch.int32)[2:]  # int32 words inside slot 3's row
    with pytest.raises(ArgumentError, match=f"error_flag shares memory with {cache_name}"):
        store_cache(
            caches["k_cache"], caches["v_cache"], torch.tensor([0, 9]), torch.ones(2, 2, 4), torch.ones(2, 2, 4),
            slot_check="kernel", error_flag=flag,
        )  # fmt: skip
    assert caches["k_cache"].sum() == 0 and caches["v_cache"].sum() == 0  # refused before anything was written
    clean = torch.zeros(1, dtype=torch.int32)  # a counter of its own is accepted
    store_cache(
        caches["k_cache"], caches["v_cache"], torch.tensor([0]), torch.ones(1, 2, 4), torch.ones(1, 2, 4),
        slot_check="kernel", error_flag=clean,
    )  # fmt: skip
    assert clean.item() == 0 and caches["k_cache"][0].sum() == 8


# -- host-device transfers, counted where they would happen ------------------------------

# Tensor methods that bring a value to the host: on CUDA each one waits for the GPU.
TRANSFERS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy", "cpu", "nonzero", "unique"}


class CountTransfers(TorchFunctionMode):
    """Every call that would copy a tensor's values to the host (and so synchronise, on CUDA)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name in TRANSFERS or (
            name == "to" and any(str(a).startswith("cpu") for a in (*args[1:], *(kwargs or {}).values()))
        ):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_the_engine_path_makes_no_transfer() -> None:
    # What MHAKVCache.store_kv runs on CUDA, on CPU tensors: the conversions it makes would be syncs there.
    gen = generator_for("transfers")
    k_cache, v_cache = torch.randn(64, 4, 2, 8, generator=gen), torch.randn(64, 4, 2, 8, generator=gen)
    indices = torch.randperm(256, generator=gen)[:70].int()
    k, v = torch.randn(70, 2, 8, generator=gen), torch.randn(70, 2, 8, generator=gen)
    flag = torch.zeros(1, dtype=torch.int32)
    with CountTransfers() as counted:
        store_cache(k_cache, v_cache, indices, k, v, slot_check="kernel", error_flag=flag)
    assert counted.calls == []
    assert flag.item() == 0


def test_the_host_check_of_device_slots_makes_one_transfer() -> None:
    # check_slots' path for CUDA slots, run on CPU slots: one transfer of three numbers, whatever the verdict.
    for slots, verdict in (([5, 1, 9, 2], (1, 9, False)), ([4, 4], (4, 4, True)), ([-3, 7], (-3, 7, False))):
        with CountTransfers() as counted:
            got = checks_module._slot_verdict_on_device(torch.tensor(slots))
        assert counted.calls == ["tolist"]
        assert got == verdict


@pytest.mark.skipif(not torch.cuda.is_available() or triton_interpreter_requested(), reason="needs compiled CUDA")
def test_store_kv_on_cuda_never_synchronises() -> None:
    cache = MHAKVCache(8, 2, 128, 4096, torch.bfloat16, KVCacheLayout.PageFirst, "cuda", page_size=16)
    k = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16)
    out_loc = torch.randperm(cache.num_slots, device="cuda")[:300].int()
    cache.store_kv(k, k, out_loc, 1)  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for layer in range(2):
            cache.store_kv(k, k, out_loc, layer)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cache.check_stores()
    assert torch.equal(cache.k_cache(1).reshape(-1, 8, 128)[out_loc.long()], k)


@pytest.mark.skipif(not torch.cuda.is_available() or triton_interpreter_requested(), reason="needs compiled CUDA")
def test_store_cache_by_hand_on_cuda_synchronises_once() -> None:
    k_cache = torch.zeros(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(4096, device="cuda")[:300]
    store_cache(k_cache, v_cache, slots, k, k)  # compile outside the count
    torch.cuda.synchronize()
    import warnings

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store_cache(k_cache, v_cache, slots, k, k)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert torch.equal(k_cache[slots], k)


@pytest.mark.skipif(not torch.cuda.is_available() or triton_interpreter_requested(), reason="needs compiled CUDA")
def test_store_kv_can_be_captured_in_a_cuda_graph() -> None:
    cache = MHAKVCache(8, 1, 128, 1024, torch.bfloat16, KVCacheLayout.LayerFirst, "cuda")
    k = torch.randn(64, 8, 128, device="cuda", dtype=torch.bfloat16)
    out_loc = torch.arange(64, device="cuda", dtype=torch.int32)
    cache.store_kv(k, k, out_loc, 0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.store_kv(k, k, out_loc, 0)
    k.add_(1)
    out_loc.add_(100)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache.k_cache(0)[100:164, 0], k)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_kernel_runs_on_the_tensors_gpu_not_the_current_one() -> None:
    k_cache = torch.zeros(64, 2, 8, device="cuda:1")
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(10, 2, 8, device="cuda:1")
    with torch.cuda.device(0):
        store_cache(k_cache, v_cache, torch.arange(10, device="cuda:1"), k, k, backend="triton")
    assert torch.equal(k_cache[:10], k) and torch.equal(v_cache[:10], k)


# -- refused memory layouts and tensor kinds (each writes nothing) ------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_that_is_part_of_the_cache_is_refused(backend: str) -> None:
    k_cache, v_cache = torch.randn(16, 2, 4), torch.randn(16, 2, 4)
    before = (k_cache.clone(), v_cache.clone())
    with pytest.raises(ArgumentError, match="v shares memory with v_cache"):
        store_cache(k_cache, v_cache, torch.tensor([0, 1]), torch.randn(2, 2, 4), v_cache[4:6], backend=backend)
    with pytest.raises(ArgumentError, match="k shares memory with v_cache"):
        store_cache(k_cache, v_cache, torch.tensor([0, 1]), v_cache[8:10], torch.randn(2, 2, 4), backend=backend)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_negated_views_are_stored_by_value(backend: str) -> None:
    z = torch.complex(torch.randn(5, 2, 4), torch.randn(5, 2, 4))
    k = z.conj().imag  # a view whose memory holds -value
    assert k.is_neg()
    v = torch.randn(5, 2, 4)
    store_both_ways(torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), torch.tensor([0, 2, 4, 6, 7]), k, v, backend)
    k_cache = torch.zeros(8, 2, 4)
    store_cache(k_cache, torch.zeros(8, 2, 4), torch.tensor([0, 2, 4, 6, 7]), k, v, backend=backend)
    assert torch.equal(k_cache[[0, 2, 4, 6, 7]], -z.imag)


def test_a_negated_cache_is_refused() -> None:
    z = torch.zeros(8, 2, 4, dtype=torch.complex64)
    v_cache = torch.zeros(8, 2, 4, dtype=torch.complex64).real  # the same strides, not negated
    with pytest.raises(ArgumentError, match="k_cache is a negated view"):
        store_cache(z.conj().imag, v_cache, torch.tensor([0]), torch.ones(1, 2, 4), torch.ones(1, 2, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_caches_one_row_apart_in_one_buffer_are_refused(backend: str) -> None:
    buffer = torch.zeros(17, 2, 4)
    with pytest.raises(ArgumentError, match="must not share memory"):
        store_cache(
            buffer[:16], buffer[1:], torch.tensor([0]), torch.ones(1, 2, 4), torch.ones(1, 2, 4), backend=backend
        )
    assert buffer.sum() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["slots", "heads"])
def test_caches_whose_slots_share_memory_are_refused(backend: str, which: str) -> None:
    row = torch.zeros(1, 2, 4)
    k_cache = row.expand(16, 2, 4) if which == "slots" else torch.zeros(16, 1, 4).expand(16, 2, 4)
    v_cache = torch.zeros(1, 2, 4).expand(16, 2, 4) if which == "slots" else torch.zeros(16, 1, 4).expand(16, 2, 4)
    with pytest.raises(ArgumentError, match="share memory"):
        store_cache(k_cache, v_cache, torch.tensor([3]), torch.ones(1, 2, 4), torch.ones(1, 2, 4), backend=backend)
    assert k_cache.sum() == 0


def test_meta_and_sparse_tensors_are_refused_by_name() -> None:
    meta = torch.zeros(8, 2, 4, device="meta")
    one = torch.ones(1, 2, 4, device="meta")
    with pytest.raises(ArgumentError, match="k_cache is on meta"):
        store_cache(meta, torch.zeros(8, 2, 4, device="meta"), torch.tensor([0], device="meta"), one, one)
    sparse = torch.ones(1, 2, 4).to_sparse()
    with pytest.raises(ArgumentTypeError, match="k must be a dense tensor"):
        store_cache(torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), torch.tensor([0]), sparse, torch.ones(1, 2, 4))
    with pytest.raises(ArgumentTypeError, match="indices must be a dense tensor"):
        store_cache(
            torch.zeros(8, 2, 4),
            torch.zeros(8, 2, 4),
            torch.tensor([0]).to_sparse(),
            torch.ones(1, 2, 4),
            torch.ones(1, 2, 4),
        )
