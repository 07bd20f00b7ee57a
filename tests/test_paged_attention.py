"""The paged decode-attention kernel reads what the gather path reads, and refuses what it cannot read.

The kernel (``minikv.kernels.paged_attention``) runs under Triton's interpreter here, on CPU tensors,
and compiled on a GPU; both are checked against the gather path (``gather_kv`` then
``causal_attention``) computed in float32, on every configuration hypothesis draws: page sizes,
GQA groups, head dims that are not powers of two, page-first layers (strided), slot tables with
unused columns, each dtype. The models' decode is checked with the kernel in the loop.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv import KVCacheLayout, MHAKVCache
from minikv.errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, SlotIndexError
from minikv.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
)
from minikv.models.attention import decode_attention
from minikv.tiny_model import TinyDecoder

pytest.importorskip("triton")

# The kernel adds in float32 and rounds once; the tolerance is a few units of the output's last place.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def make_case(seed, batch, heads, kv_heads, head_dim, page_size, pages, width, dtype, layout, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    cache = MHAKVCache(kv_heads, 2, head_dim, pages, dtype, layout, device, page_size)
    layer = 1
    k_cache, v_cache = cache.k_cache(layer), cache.v_cache(layer)
    k_cache.copy_(torch.randn(k_cache.shape, generator=gen).to(dtype))
    v_cache.copy_(torch.randn(v_cache.shape, generator=gen).to(dtype))
    q = torch.randn(batch, heads, head_dim, generator=gen).to(dtype).to(device)
    num_slots = pages * page_size
    table = torch.stack([torch.randperm(num_slots, generator=gen)[:width] for _ in range(batch)]).to(device)
    lens = torch.randint(1, width + 1, (batch,), generator=gen).to(device)
    return cache, layer, q, table, lens


def reference_in_float32(q, k_cache, v_cache, table, lens):
    return paged_decode_attention_reference(q.float(), k_cache.float(), v_cache.float(), table, lens)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    head_dim=st.sampled_from([1, 7, 16, 24, 64, 80]),
    page_size=st.sampled_from([1, 2, 3, 16]),
    width=st.integers(1, 300),  # up to three blocks of the interpreter's 128 slots
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    layout=st.sampled_from([KVCacheLayout.LayerFirst, KVCacheLayout.PageFirst]),
)
def test_the_kernel_reads_what_the_gather_path_reads(
    seed, batch, kv_heads, group, head_dim, page_size, width, dtype, layout
) -> None:
    pages = -(-width // page_size) + 3
    cache, layer, q, table, lens = make_case(
        seed, batch, kv_heads * group, kv_heads, head_dim, page_size, pages, width, dtype, layout
    )
    k_cache, v_cache = cache.k_cache(layer), cache.v_cache(layer)
    out = paged_decode_attention(q, k_cache, v_cache, table, lens)
    expected = reference_in_float32(q, k_cache, v_cache, table, lens)
    assert out.dtype == dtype and out.shape == (batch, kv_heads * group * head_dim)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_a_long_context_crosses_many_blocks_and_pages() -> None:
    cache, layer, q, table, lens = make_case(3, 2, 4, 2, 32, 16, 40, 600, torch.float32, KVCacheLayout.LayerFirst)
    lens = torch.tensor([600, 333])
    out = paged_decode_attention(q, cache.k_cache(layer), cache.v_cache(layer), table, lens)
    expected = reference_in_float32(q, cache.k_cache(layer), cache.v_cache(layer), table, lens)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_an_empty_batch_returns_an_empty_result() -> None:
    cache, layer, q, table, lens = make_case(0, 1, 2, 1, 8, 1, 8, 4, torch.float32, KVCacheLayout.LayerFirst)
    out = paged_decode_attention(q[:0], cache.k_cache(layer), cache.v_cache(layer), table[:0], lens[:0])
    assert out.shape == (0, 16)


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_model_decodes_the_same_through_the_kernel(page_size: int) -> None:
    model = TinyDecoder(vocab_size=64, num_heads=4, num_kv_heads=2, head_dim=16, max_positions=64, seed=1)
    cache = MHAKVCache(2, model.num_layers, 16, 64, torch.float32, KVCacheLayout.LayerFirst, "cpu", page_size)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    tables, starts, tokens, out_loc = [], [], [], []
    for b, prompt in enumerate(prompts):
        slots = torch.arange(len(prompt) + 1) + b * 32 * page_size  # each request on pages of its own
        model.prefill(prompt, cache, slots[: len(prompt)], 0)
        tables.append(slots)
        starts.append(len(prompt))
        tokens.append(prompt[-1])
        out_loc.append(int(slots[-1]))
    out_loc_t = torch.tensor(out_loc)
    gathered = model.decode(tokens, starts, cache, out_loc_t, tables, attention_backend="gather")
    through_kernel = model.decode(tokens, starts, cache, out_loc_t, tables, attention_backend="triton")
    torch.testing.assert_close(through_kernel, gathered, atol=2e-5, rtol=2e-5)


def test_decode_attention_names_a_wrong_backend() -> None:
    cache, layer, q, table, _ = make_case(0, 1, 2, 1, 8, 1, 8, 4, torch.float32, KVCacheLayout.LayerFirst)
    with pytest.raises(ArgumentError, match="attention_backend"):
        decode_attention(q, cache, layer, [table[0]], backend="flash")


def bad_calls():
    cache, layer, q, table, lens = make_case(0, 2, 4, 2, 8, 2, 8, 6, torch.float32, KVCacheLayout.LayerFirst)
    k, v = cache.k_cache(layer), cache.v_cache(layer)
    outside = table.clone()
    outside[1, 0] = 16  # one past the last slot
    negative = table.clone()
    negative[0, 0] = -1
    return [
        ("q", ArgumentTypeError, (q.tolist(), k, v, table, lens)),
        ("q", ArgumentError, (q[0], k, v, table, lens)),
        ("k_cache", ArgumentError, (q, k[:, :, :1].expand(-1, -1, 3, -1), v, table, lens)),
        ("k_cache", ArgumentError, (q, k.half(), v, table, lens)),
        ("v_cache", ArgumentError, (q, k, v[..., :4], table, lens)),
        ("table", ArgumentError, (q, k, v, table.float(), lens)),
        ("table", ArgumentError, (q, k, v, table[:1], lens)),
        ("lens", ArgumentError, (q, k, v, table, torch.tensor([0, 2]))),
        ("lens", ArgumentError, (q, k, v, table, torch.tensor([7, 2]))),
        ("table", SlotIndexError, (q, k, v, outside, torch.tensor([1, 6]))),
        ("table", SlotIndexError, (q, k, v, negative, lens)),
        ("table", DeviceMismatchError, (q, k, v, table.to("meta"), lens)),
    ]


@pytest.mark.parametrize(("name", "error", "call"), bad_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_bad_arguments_are_refused_by_name(name, error, call) -> None:
    with pytest.raises(error, match=name):
        paged_decode_attention(*call)


def test_a_slot_past_a_request_s_length_is_never_read() -> None:
    """Columns after lens[b] may hold anything (a server's row is wider than the request)."""
    cache, layer, q, table, lens = make_case(5, 2, 2, 1, 8, 1, 16, 8, torch.float32, KVCacheLayout.LayerFirst)
    lens = torch.tensor([3, 8])
    garbage = table.clone()
    garbage[0, 3:] = 10**6  # outside the cache, but beyond request 0's length
    out = paged_decode_attention(q, cache.k_cache(layer), cache.v_cache(layer), garbage, lens)
    torch.testing.assert_close(out, reference_in_float32(q, cache.k_cache(layer), cache.v_cache(layer), table, lens))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the kernel compiled)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_compiled_kernel_matches_on_cuda(dtype: torch.dtype, page_size: int) -> None:
    pages = -(-2000 // page_size) + 4
    cache, layer, q, table, lens = make_case(
        7, 4, 32, 8, 128, page_size, pages, 2000, dtype, KVCacheLayout.LayerFirst, "cuda"
    )
    out = paged_decode_attention(q, cache.k_cache(layer), cache.v_cache(layer), table, lens)
    expected = reference_in_float32(q, cache.k_cache(layer), cache.v_cache(layer), table, lens)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
