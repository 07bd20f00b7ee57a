"""``MHAKVCache``: one allocation, two memory layouts behind one layer-first view, and the tensor-parallel split."""

from __future__ import annotations

import pytest
import torch

from minikv import BaseKVCache, KVCacheLayout, MHAKVCache, store_cache
from minikv.errors import ArgumentError, ArgumentTypeError, SlotIndexError

L, P, S, H, D = 3, 5, 4, 2, 6  # layers, pages, page_size, kv heads, head_dim


def make(layout: KVCacheLayout, dtype: torch.dtype = torch.float32, **kwargs: int) -> MHAKVCache:
    args = {"num_kv_heads": H, "num_layers": L, "head_dim": D, "num_pages": P, "page_size": S} | kwargs
    return MHAKVCache(dtype=dtype, kv_layout=layout, device="cpu", **args)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda x: x.name)
def test_every_layer_view_has_the_documented_shape(layout: KVCacheLayout) -> None:
    cache = make(layout)
    assert isinstance(cache, BaseKVCache)
    assert cache.kv_buffer.shape == (2, L, P, S, H, D)
    for layer in range(L):
        assert cache.k_cache(layer).shape == (P, S, H, D) and cache.v_cache(layer).shape == (P, S, H, D)
    assert (cache.num_layers, cache.num_slots) == (L, P * S)
    assert (cache.dtype, cache.device) == (torch.float32, torch.device("cpu"))


def test_layer_first_keeps_each_layer_contiguous() -> None:
    cache = make(KVCacheLayout.LayerFirst)
    assert cache.kv_buffer.is_contiguous()
    assert cache.k_cache(1).is_contiguous()
    item = cache.kv_buffer.element_size()
    # The same page of the next layer is a whole layer (P * S * H * D elements) further on.
    assert cache.k_cache(1)[2].data_ptr() - cache.k_cache(0)[2].data_ptr() == P * S * H * D * item
    assert cache.kv_buffer.stride() == (L * P * S * H * D, P * S * H * D, S * H * D, H * D, D, 1)


def test_page_first_is_really_page_major_in_memory() -> None:
    cache = make(KVCacheLayout.PageFirst)
    buffer = cache.kv_buffer
    assert not buffer.is_contiguous()
    # Memory order is (2, pages, layers, ...): swapping back the layer and page axes is contiguous.
    assert buffer.permute(0, 2, 1, 3, 4, 5).is_contiguous()
    assert buffer.stride() == (P * L * S * H * D, S * H * D, L * S * H * D, H * D, D, 1)
    item = buffer.element_size()
    # One page's layers sit next to each other: layer 1 of page 2 directly follows layer 0 of page 2.
    assert cache.k_cache(1)[2].data_ptr() - cache.k_cache(0)[2].data_ptr() == S * H * D * item
    assert not cache.k_cache(1).is_contiguous()


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda x: x.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_nbytes_is_the_whole_single_allocation(layout: KVCacheLayout, dtype: torch.dtype) -> None:
    cache = make(layout, dtype)
    item = torch.empty((), dtype=dtype).element_size()
    assert cache.nbytes == 2 * L * P * S * H * D * item
    assert cache.kv_buffer.untyped_storage().nbytes() == cache.nbytes  # one buffer, nothing more
    for layer in range(L):  # every view lives in that one buffer
        assert cache.k_cache(layer).untyped_storage().data_ptr() == cache.kv_buffer.untyped_storage().data_ptr()


def test_views_alias_the_buffer() -> None:
    cache = make(KVCacheLayout.PageFirst)
    cache.k_cache(2)[4, 3, 1, 5] = 7.0
    cache.v_cache(0)[0, 0, 0, 0] = -7.0
    assert cache.kv_buffer[0, 2, 4, 3, 1, 5] == 7.0 and cache.kv_buffer[1, 0, 0, 0, 0, 0] == -7.0
    assert cache.kv_buffer.abs().sum() == 14.0


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_tensor_parallel_ranks_split_the_heads(tp_size: int) -> None:
    heads = 8
    covered: list[int] = []
    for rank in range(tp_size):
        cache = make(KVCacheLayout.LayerFirst, num_kv_heads=heads, tp_rank=rank, tp_size=tp_size)
        assert cache.local_kv_heads == heads // tp_size and cache.num_kv_heads == heads
        assert cache.k_cache(0).shape == (P, S, heads // tp_size, D)
        assert cache.nbytes == 2 * L * P * S * (heads // tp_size) * D * 4
        assert len(cache.head_range) == heads // tp_size
        covered.extend(cache.head_range)
    assert covered == list(range(heads))  # every head on exactly one rank, in order


def test_head_range_of_a_middle_rank() -> None:
    assert make(KVCacheLayout.LayerFirst, num_kv_heads=8, tp_rank=2, tp_size=4).head_range == range(4, 6)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda x: x.name)
def test_store_kv_writes_token_rows_through_the_layer_view(layout: KVCacheLayout) -> None:
    cache = make(layout)
    gen = torch.Generator().manual_seed(3)
    out_loc = torch.tensor([0, 5, 19, 7], dtype=torch.int32)
    k, v = torch.randn(4, H, D, generator=gen), torch.randn(4, H, D, generator=gen)
    cache.store_kv(k, v, out_loc, 1)
    for i, slot in enumerate(out_loc.tolist()):
        assert torch.equal(cache.k_cache(1)[slot // S, slot % S], k[i])
        assert torch.equal(cache.v_cache(1)[slot // S, slot % S], v[i])
    written = torch.zeros(P * S, dtype=torch.bool)
    written[out_loc.long()] = True
    rest = cache.k_cache(1).reshape(P * S, H, D)[~written]
    assert rest.abs().sum() == 0  # no other slot of layer 1
    for other in (0, 2):
        assert cache.k_cache(other).abs().sum() == 0 and cache.v_cache(other).abs().sum() == 0


def test_both_layouts_hold_the_same_logical_content() -> None:
    layer_first, page_first = make(KVCacheLayout.LayerFirst), make(KVCacheLayout.PageFirst)
    gen = torch.Generator().manual_seed(5)
    for layer in range(L):
        out_loc = torch.randperm(P * S, generator=gen)[:9]
        k, v = torch.randn(9, H, D, generator=gen), torch.randn(9, H, D, generator=gen)
        layer_first.store_kv(k, v, out_loc, layer)
        page_first.store_kv(k, v, out_loc, layer)
    assert torch.equal(layer_first.kv_buffer, page_first.kv_buffer)  # equal as layer-first views
    assert not torch.equal(  # and different as bytes in memory
        layer_first.kv_buffer.flatten(), page_first.kv_buffer.permute(0, 2, 1, 3, 4, 5).flatten()
    )


def test_page_size_one_cache_is_addressed_by_slot() -> None:
    cache = make(KVCacheLayout.PageFirst, page_size=1, num_pages=6)
    cache.store_kv(torch.ones(1, H, D), torch.full((1, H, D), 2.0), torch.tensor([4]), 2)
    assert cache.k_cache(2)[4, 0].sum() == H * D and cache.v_cache(2)[4, 0].sum() == 2 * H * D


def test_repr_names_the_shape_and_layout() -> None:
    text = repr(make(KVCacheLayout.PageFirst, num_kv_heads=4, tp_rank=1, tp_size=2))
    assert text == (
        f"MHAKVCache(layers={L}, pages={P}, page_size={S}, heads=2/4, head_dim={D}, "
        "dtype=torch.float32, layout=PageFirst, device=cpu)"
    )


def test_store_kv_errors_name_its_own_arguments() -> None:
    cache = make(KVCacheLayout.LayerFirst)
    with pytest.raises(IndexError, match="out_loc"):
        cache.store_kv(torch.ones(1, H, D), torch.ones(1, H, D), torch.tensor([P * S]), 0)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("bogus", "device: 'bogus' is not a device torch knows"),
        ("mps", "minikv stores its caches on 'cpu' or 'cuda'"),
        (3, "device must be a torch.device or a string"),
        *([("cuda", "CUDA is not available")] if not torch.cuda.is_available() else []),
        ("cuda:99", "CUDA"),
    ],
)
def test_a_device_that_cannot_hold_the_cache_is_refused_by_name(device: object, message: str) -> None:
    with pytest.raises((ArgumentError, ArgumentTypeError), match=message):
        MHAKVCache(2, 1, 4, 4, torch.float32, KVCacheLayout.LayerFirst, device)  # type: ignore[arg-type]


def test_check_stores_reports_what_the_kernel_refused_and_starts_again() -> None:
    # On CUDA, store_kv lets the kernel check out_loc and count the slots it refused; run that path on CPU.
    cache = make(KVCacheLayout.PageFirst)
    k, v = torch.ones(3, H, D), torch.ones(3, H, D)
    cache.check_stores()  # nothing to report
    store_cache(
        cache.k_cache(0), cache.v_cache(0), torch.tensor([1, P * S, -5]), k, v,
        slot_check="kernel", error_flag=cache._bad_slots,
    )  # fmt: skip
    assert cache.k_cache(0)[0, 1].sum() == H * D  # the good slot was written
    assert cache.kv_buffer.sum() == 2 * H * D  # and nothing else
    with pytest.raises(SlotIndexError, match=r"out_loc: 2 slot\(s\)"):
        cache.check_stores()
    cache.check_stores()  # counted once, then reset


def test_store_kv_on_cpu_checks_every_slot_before_writing() -> None:
    cache = make(KVCacheLayout.LayerFirst)
    with pytest.raises(SlotIndexError, match="out_loc"):
        cache.store_kv(torch.ones(2, H, D), torch.ones(2, H, D), torch.tensor([0, -1]), 0)
    with pytest.raises(ArgumentError, match="out_loc must be unique"):
        cache.store_kv(torch.ones(2, H, D), torch.ones(2, H, D), torch.tensor([4, 4]), 0)
    assert cache.kv_buffer.abs().sum() == 0
    cache.check_stores()


def test_a_meta_cache_has_a_size_but_takes_no_stores() -> None:
    cache = MHAKVCache(32, 32, 128, 1000, torch.float16, KVCacheLayout.LayerFirst, "meta")
    assert cache.nbytes == 2 * 32 * 1000 * 32 * 128 * 2  # sized without allocating
    k = torch.ones(1, 32, 128, dtype=torch.float16, device="meta")
    with pytest.raises(ArgumentError, match="k_cache is on meta"):
        cache.store_kv(k, k, torch.tensor([0], device="meta"), 0)
