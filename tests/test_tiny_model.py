"""``TinyDecoder``: attention that reads K/V from the paged cache by slot.

The one property that matters: logits computed from cached K/V equal logits
recomputed from scratch, whenever the slot bookkeeping is right -- and differ
when a cached prefix's slots were handed to someone else.
"""

from __future__ import annotations

import pytest
import torch

from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager, admit, finish
from minikv.errors import ArgumentError, ArgumentTypeError
from minikv.tiny_model import TinyDecoder, gather_kv

LAYOUTS = list(KVCacheLayout)
PAGE_SIZES = [1, 4]
SYSTEM = [5, 17, 42, 8, 33, 21, 9, 60, 14]  # 9 tokens: with page_size 4 only 8 of them are shareable
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(seed=0)


def make_cache(model: TinyDecoder, layout: KVCacheLayout, page_size: int, num_pages: int = 16) -> MHAKVCache:
    return MHAKVCache(
        model.num_kv_heads, model.num_layers, model.head_dim, num_pages, torch.float32, layout, "cpu", page_size
    )


def serve_through_cache(
    model: TinyDecoder, manager: RadixCacheManager, pool: PagePool, cache: MHAKVCache, prompt: list[int]
) -> tuple[torch.Tensor, int]:
    """admit -> prefill -> finish; the logits of the computed tokens and how many tokens came from the cache."""
    request = admit(manager, pool, prompt)
    logits = model.prefill(prompt, cache, request.indices, request.cached_len)
    finish(manager, pool, request)
    return logits, request.cached_len


def test_same_seed_same_model_and_gqa_shape() -> None:
    a, b, c = TinyDecoder(seed=3), TinyDecoder(seed=3), TinyDecoder(seed=4)
    ids = [1, 2, 3, 4]
    assert torch.equal(a.forward(ids), b.forward(ids))
    assert not torch.allclose(a.forward(ids), c.forward(ids))
    assert a.forward(ids).shape == (4, a.vocab_size)
    with pytest.raises(ArgumentError, match="num_kv_heads"):
        TinyDecoder(num_heads=4, num_kv_heads=3)


def test_forward_is_causal(model: TinyDecoder) -> None:
    """A token's logits do not depend on later tokens (else a cached prefix could never be reused)."""
    full = model.forward([3, 1, 4, 1, 5, 9])
    assert torch.allclose(model.forward([3, 1, 4]), full[:3], **TOLERANCE)


def test_keys_depend_on_position(model: TinyDecoder) -> None:
    """The same tokens at other positions have other K rows: a prefix's K/V is only valid where it was computed."""
    cache = make_cache(model, KVCacheLayout.LayerFirst, 1)
    model.prefill([7, 7], cache, torch.tensor([0, 1], dtype=torch.int32), 0)
    k, _ = gather_kv(cache, 0, torch.tensor([0, 1]))
    assert not torch.allclose(k[0], k[1])


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_prefill_without_cache_equals_forward(model: TinyDecoder, layout: KVCacheLayout, page_size: int) -> None:
    prompt = [*SYSTEM, 1, 2, 3]
    cache = make_cache(model, layout, page_size)
    indices = PagePool(16, page_size).allocate(len(prompt))
    logits = model.prefill(prompt, cache, indices, 0)
    assert torch.allclose(logits, model.forward(prompt), **TOLERANCE)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_prefill_after_cached_prefix_equals_forward(model: TinyDecoder, layout: KVCacheLayout, page_size: int) -> None:
    manager, pool, cache = (
        RadixCacheManager(page_size=page_size),
        PagePool(16, page_size),
        make_cache(model, layout, page_size),
    )
    first, second = [*SYSTEM, 1, 2, 3], [*SYSTEM, 50, 51, 52, 53]

    logits, cached = serve_through_cache(model, manager, pool, cache, first)
    assert cached == 0
    assert torch.allclose(logits, model.forward(first), **TOLERANCE)

    logits, cached = serve_through_cache(model, manager, pool, cache, second)
    assert cached == len(SYSTEM) - len(SYSTEM) % page_size > 0
    assert logits.shape == (len(second) - cached, model.vocab_size)  # only the new tokens were computed
    assert torch.allclose(logits, model.forward(second)[cached:], **TOLERANCE)
    manager.check_integrity()


def test_triton_store_backend_gives_the_same_logits_and_rows(model: TinyDecoder) -> None:
    """One small case through the Triton kernel (interpreted on CPU): cache rows match the torch path bit for bit."""
    prompt = [*SYSTEM, 1, 2]
    indices = torch.tensor([3, 2, 1, 0, 4, 5, 6, 7, 12, 13, 14], dtype=torch.int32)  # pages out of order
    caches = {}
    for backend in ("torch", "triton"):
        cache = make_cache(model, KVCacheLayout.PageFirst, 4, num_pages=4)
        model.prefill(prompt[:8], cache, indices[:8], 0, store_backend=backend)
        logits = model.prefill(prompt, cache, indices, 8, store_backend=backend)
        assert torch.allclose(logits, model.forward(prompt)[8:], **TOLERANCE)
        caches[backend] = cache
    assert torch.equal(caches["torch"].kv_buffer, caches["triton"].kv_buffer)


@pytest.mark.parametrize(
    "shape, match",
    [
        ({"num_layers": 3}, "layers"),
        ({"num_kv_heads": 4}, "KV heads"),
        ({"head_dim": 8}, "KV heads"),
        ({"dtype": torch.float16}, "float16"),
        ({"tp_size": 2}, "KV heads"),  # a tensor-parallel rank holds only half the heads
    ],
)
def test_mismatched_cache_raises_and_writes_nothing(model: TinyDecoder, shape: dict, match: str) -> None:
    args = {"num_kv_heads": 2, "num_layers": 2, "head_dim": 16, "dtype": torch.float32, "tp_size": 1} | shape
    cache = MHAKVCache(
        args["num_kv_heads"], args["num_layers"], args["head_dim"], 8, args["dtype"], KVCacheLayout.LayerFirst,
        "cpu", 1, 0, args["tp_size"],
    )  # fmt: skip
    with pytest.raises(ArgumentError, match=match):
        model.prefill([1, 2, 3], cache, torch.tensor([0, 1, 2]), 0)
    assert not cache.kv_buffer.any()


@pytest.mark.parametrize(
    "ids, indices, cached_len, error, match",
    [
        ([1, 2, 3], torch.tensor([0, 1]), 0, ArgumentError, "one slot per token"),
        ([1, 2, 3], torch.tensor([0, 1, 99]), 0, ArgumentError, "slots must be in"),
        ([1, 2, 3], [0, 1, 2], 0, ArgumentTypeError, "indices"),
        ([1, 2, 3], torch.tensor([0, 1, 2]), 3, ArgumentError, "cached_len"),
        ([1, 2, 64], torch.tensor([0, 1, 2]), 0, ArgumentError, "input_ids"),
        ([], torch.tensor([], dtype=torch.int32), 0, ArgumentError, "input_ids"),
    ],
)
def test_bad_prefill_arguments_raise_and_write_nothing(
    model: TinyDecoder, ids: list[int], indices: object, cached_len: int, error: type, match: str
) -> None:
    cache = make_cache(model, KVCacheLayout.LayerFirst, 1, num_pages=8)
    with pytest.raises(error, match=match):
        model.prefill(ids, cache, indices, cached_len)
    assert not cache.kv_buffer.any()


def test_unknown_store_backend_raises(model: TinyDecoder) -> None:
    cache = make_cache(model, KVCacheLayout.LayerFirst, 1, num_pages=8)
    with pytest.raises(ArgumentError, match="store_backend"):
        model.prefill([1, 2], cache, torch.tensor([0, 1]), 0, store_backend="cuda")
    assert not cache.kv_buffer.any()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_freeing_the_trees_slots_corrupts_later_requests(model: TinyDecoder, page_size: int) -> None:
    """The notes' step 5 (free ``indices[:already_cached]``): another request overwrites the cached prefix."""
    num_pages = 32 // page_size
    manager, pool = RadixCacheManager(page_size=page_size), PagePool(num_pages, page_size)
    cache = make_cache(model, KVCacheLayout.LayerFirst, page_size, num_pages)
    first, second = [*SYSTEM, 1, 2, 3], [*SYSTEM, 50, 51, 52, 53]
    serve_through_cache(model, manager, pool, cache, first)

    request = admit(manager, pool, second)
    model.prefill(second, cache, request.indices, request.cached_len)
    already = manager.insert_prefix(second, request.indices)
    assert already == request.cached_len > 0
    tail = len(second) - len(second) % page_size
    pool.free(request.indices[tail:])  # the partial last page the tree did not take: right
    pool.free(request.indices[:already])  # the erratum; the right slice, [cached_len:already], is empty
    manager.lock_handle(request.handle, unlock=True)
    shared = request.indices[:already]
    assert set(shared.tolist()) <= set(pool.free_slots().tolist())  # free in the pool, yet still in the tree

    # A stranger takes those slots and stores its own K/V there.
    stranger = list(range(30, 30 + len(shared)))
    intruder = admit(manager, pool, stranger)
    assert intruder.cached_len == 0 and set(intruder.indices.tolist()) == set(shared.tolist())
    model.prefill(stranger, cache, intruder.indices, 0)

    # The second prompt continued by one token: served from the cache, its logits are now wrong.
    follow_up = [*second, 7]
    request = admit(manager, pool, follow_up)
    assert request.cached_len == len(second) - len(second) % page_size
    logits = model.prefill(follow_up, cache, request.indices, request.cached_len)
    assert (logits - model.forward(follow_up)[request.cached_len :]).abs().max() > 0.1

    # The tree itself is still consistent; it refuses the stranger's prompt on slots it holds.
    manager.check_integrity()
    with pytest.raises(ArgumentError, match="already held"):
        finish(manager, pool, intruder)
