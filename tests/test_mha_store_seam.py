"""``MHAKVCache(..., store=fn)``: a store function of one's own (exercise 3's kernel) behind ``store_kv``.

The course plugs the learner's kernel into the model's cache, so these tests hold the seam to
what the default path promises: the same writes, the same checks before anything is written,
and the engine generating the same tokens on top of it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from minikv import KVCacheLayout, MHAKVCache, store_cache_reference
from minikv.engine import make_engine, recompute
from minikv.errors import ArgumentError, ArgumentTypeError, SlotIndexError
from minikv.mha_pool import as_store
from minikv.tiny_model import TinyDecoder

L, P, S, H, D = 2, 6, 4, 2, 3  # layers, pages, page_size, kv heads, head_dim


class Recorder:
    """A store function that writes as the reference does and remembers each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, ...]] = []

    def __call__(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        self.calls.append((k_cache, v_cache, indices, k, v))
        store_cache_reference(k_cache, v_cache, indices, k, v)


def make(layout: KVCacheLayout, store: Callable[..., None] | None = None) -> MHAKVCache:
    return MHAKVCache(H, L, D, P, torch.float32, layout, "cpu", page_size=S, store=store)


def rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, D, generator=generator), torch.randn(n, H, D, generator=generator)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda x: x.name)
def test_the_store_function_gets_each_layers_views_and_the_callers_rows(layout: KVCacheLayout) -> None:
    store = Recorder()
    cache = make(layout, store)
    assert cache.store is store
    out_loc = torch.tensor([5, 0, 17], dtype=torch.int32)
    for layer in range(L):
        k, v = rows(3, layer)
        cache.store_kv(k, v, out_loc, layer)
        k_cache, v_cache, indices, got_k, got_v = store.calls[-1]
        # The layer's own (pages, page_size, heads, head_dim) views: writes through them land in the buffer.
        for got, want in ((k_cache, cache.k_cache(layer)), (v_cache, cache.v_cache(layer))):
            assert got.shape == (P, S, H, D)
            assert (got.data_ptr(), got.stride()) == (want.data_ptr(), want.stride())
        assert indices is out_loc and got_k is k and got_v is v
    assert len(store.calls) == L


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda x: x.name)
def test_a_store_function_writes_what_the_default_path_writes(layout: KVCacheLayout) -> None:
    default, custom = make(layout), make(layout, Recorder())
    for step, slots in enumerate(([3, 4, 5, 6, 7], [23, 0], [], [8])):
        out_loc = torch.tensor(slots, dtype=torch.int64)
        for layer in range(L):
            k, v = rows(len(slots), 10 * step + layer)
            default.store_kv(k, v, out_loc, layer)
            custom.store_kv(k, v, out_loc, layer)
    assert torch.equal(default.kv_buffer, custom.kv_buffer)
    assert default.kv_buffer.abs().sum() > 0


@pytest.mark.parametrize("bad", [42, "store_cache", torch.zeros(1)], ids=["int", "str", "tensor"])
def test_a_store_that_is_not_callable_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ArgumentTypeError, match="store must be None or a function"):
        make(KVCacheLayout.LayerFirst, bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="store must be None or a function"):
        as_store(bad)
    with pytest.raises(ArgumentTypeError, match="store must be None or a function"):
        make_engine(TinyDecoder(), num_pages=8, store=bad)  # type: ignore[arg-type]
    assert as_store(None) is None


def _bad_calls() -> list[tuple[str, type[Exception], torch.Tensor, torch.Tensor, torch.Tensor, int]]:
    k, v = rows(2, 0)
    ok = torch.tensor([1, 2], dtype=torch.int32)
    return [
        ("slot past the end", SlotIndexError, k, v, torch.tensor([1, P * S], dtype=torch.int32), 0),
        ("slot -1", SlotIndexError, k, v, torch.tensor([-1, 2], dtype=torch.int32), 0),
        ("same slot twice", ArgumentError, k, v, torch.tensor([2, 2], dtype=torch.int32), 0),
        ("float slots", ArgumentTypeError, k, v, torch.tensor([1.0, 2.0]), 0),
        ("one slot for two tokens", ArgumentError, k, v, ok[:1], 0),
        ("wrong head_dim", ArgumentError, k[..., :2], v[..., :2], ok, 0),
        ("wrong dtype", ArgumentTypeError, k.double(), v.double(), ok, 0),
        ("layer out of range", SlotIndexError, k, v, ok, L),
    ]


@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_a_bad_call_is_refused_before_the_store_function_sees_it(case: tuple) -> None:
    _, error, k, v, out_loc, layer = case
    store = Recorder()
    cache = make(KVCacheLayout.PageFirst, store)
    before = cache.kv_buffer.clone()
    with pytest.raises(error):
        cache.store_kv(k, v, out_loc, layer)
    assert store.calls == []
    assert torch.equal(cache.kv_buffer, before)
    # The default path refuses the same call with the same error.
    with pytest.raises(error):
        make(KVCacheLayout.PageFirst).store_kv(k, v, out_loc, layer)


def test_a_store_function_that_fails_leaves_the_cache_usable() -> None:
    def broken(*_: torch.Tensor) -> None:
        raise NotImplementedError

    cache = make(KVCacheLayout.LayerFirst, broken)
    k, v = rows(1, 0)
    with pytest.raises(NotImplementedError):
        cache.store_kv(k, v, torch.tensor([0]), 0)
    assert cache.kv_buffer.abs().sum() == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_engine_generates_the_same_tokens_through_a_store_function(page_size: int) -> None:
    model = TinyDecoder(seed=0)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 9], [7, 7, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
    store = Recorder()
    yours = make_engine(model, num_pages=48 // page_size, page_size=page_size, max_running=2, store=store)
    default = make_engine(model, num_pages=48 // page_size, page_size=page_size, max_running=2)
    assert yours.kv_cache.store is store  # type: ignore[attr-defined]
    outputs = yours.generate(prompts, 6)
    yours.check()
    assert outputs == default.generate(prompts, 6) == [recompute(model, p, 6) for p in prompts]
    assert len(store.calls) >= model.num_layers * yours.stats.steps  # every step stores, through it
