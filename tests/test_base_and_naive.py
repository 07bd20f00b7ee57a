"""The shared types of ``minikv.base``, the error hierarchy, and ``NaiveCacheManager``.

The base classes are a contract that every manager and storage keeps; these tests
pin what the contract is made of, so a renamed or dropped method shows up here
first. The naive manager is the control group: it must honour the same contract
while caching nothing.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch

from minikv import (
    BaseCacheHandle,
    BaseCacheManager,
    BaseKVCache,
    KVCacheLayout,
    NaiveCacheHandle,
    NaiveCacheManager,
    RadixCacheHandle,
    RadixCacheManager,
    SizeInfo,
    errors,
)

# -- base types ---------------------------------------------------------------


def test_layouts_are_exactly_layer_first_and_page_first() -> None:
    assert [layout.name for layout in KVCacheLayout] == ["LayerFirst", "PageFirst"]


def test_storage_interface_is_the_documented_one() -> None:
    assert BaseKVCache.__abstractmethods__ == {"k_cache", "v_cache", "store_kv", "device", "dtype", "num_layers"}
    with pytest.raises(TypeError):
        BaseKVCache()  # type: ignore[abstract]


def test_manager_interface_is_the_documented_one() -> None:
    assert BaseCacheManager.__abstractmethods__ == {
        "match_prefix", "lock_handle", "insert_prefix", "evict", "reset", "size_info", "check_integrity",
    }  # fmt: skip
    assert BaseCacheManager.page_size == 1
    signature = inspect.signature(BaseCacheManager.lock_handle)
    assert signature.parameters["unlock"].default is False
    handle = inspect.signature(BaseCacheManager.insert_prefix).parameters["handle"]
    assert handle.kind is inspect.Parameter.KEYWORD_ONLY and handle.default is None


def test_a_storage_that_implements_every_method_can_be_built() -> None:
    class OneLayer(BaseKVCache):
        def __init__(self) -> None:
            self.k = torch.zeros(4, 1, 1, 2)
            self.v = torch.zeros(4, 1, 1, 2)

        def k_cache(self, index: int) -> torch.Tensor:
            return self.k

        def v_cache(self, index: int) -> torch.Tensor:
            return self.v

        def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
            self.k[out_loc, 0] = k
            self.v[out_loc, 0] = v

        device = property(lambda self: self.k.device)
        dtype = property(lambda self: self.k.dtype)
        num_layers = property(lambda self: 1)

    storage = OneLayer()
    storage.store_kv(torch.ones(1, 1, 2), torch.full((1, 1, 2), 2.0), torch.tensor([3]), 0)
    assert storage.k_cache(0)[3].sum() == 2 and storage.v_cache(0)[3].sum() == 4
    assert storage.num_layers == 1 and storage.dtype == torch.float32


def test_handles_are_frozen_values() -> None:
    handle = NaiveCacheHandle(0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.cached_len = 3  # type: ignore[misc]
    assert NaiveCacheHandle(0) == NaiveCacheHandle(0)
    assert issubclass(NaiveCacheHandle, BaseCacheHandle) and issubclass(RadixCacheHandle, BaseCacheHandle)
    assert [f.name for f in dataclasses.fields(BaseCacheHandle)] == ["cached_len"]


def test_size_info_total_is_the_sum_and_fields_are_named() -> None:
    info = SizeInfo(evictable_size=3, protected_size=5)
    assert info.total_size == 8
    assert info == (3, 5)
    assert info._fields == ("evictable_size", "protected_size")
    assert SizeInfo(0, 0).total_size == 0


# -- errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.ArgumentError, ValueError),
        (errors.ArgumentTypeError, TypeError),
        (errors.DeviceMismatchError, ValueError),
        (errors.SlotIndexError, IndexError),
        (errors.LockError, RuntimeError),
        (errors.StaleHandleError, RuntimeError),
        (errors.EvictionError, RuntimeError),
        (errors.OutOfSlotsError, RuntimeError),
        (errors.DoubleFreeError, RuntimeError),
        (errors.IntegrityError, RuntimeError),
    ],
)
def test_every_error_is_a_minikv_error_and_the_expected_builtin(error: type, builtin: type) -> None:
    assert issubclass(error, errors.MiniKVError)
    assert issubclass(error, builtin)


def test_specific_errors_refine_general_ones() -> None:
    assert issubclass(errors.DeviceMismatchError, errors.ArgumentError)
    assert issubclass(errors.StaleHandleError, errors.LockError)


def test_integrity_error_names_the_rule_and_the_node() -> None:
    node = object()
    error = errors.IntegrityError("ref_count", "negative ref_count -1", node)
    assert error.invariant == "ref_count" and error.node is node
    assert str(error).startswith("[ref_count] at ") and str(error).endswith(": negative ref_count -1")
    global_error = errors.IntegrityError("evictable_size", "counter is 3, nodes hold 2")
    assert global_error.node is None
    assert str(global_error) == "[evictable_size]: counter is 3, nodes hold 2"


# -- NaiveCacheManager --------------------------------------------------------


@pytest.mark.parametrize(
    "input_ids",
    [[1, 2, 3], torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3], dtype=torch.int32), np.array([1, 2, 3]), []],
)
def test_naive_match_finds_nothing_whatever_the_input_form(input_ids: object) -> None:
    manager = NaiveCacheManager()
    handle, indices = manager.match_prefix(input_ids)
    assert handle == NaiveCacheHandle(0)
    assert indices.dtype == torch.int32 and indices.device == manager.device and indices.shape == (0,)


def test_naive_match_still_validates_its_input() -> None:
    with pytest.raises(errors.ArgumentTypeError, match="input_ids"):
        NaiveCacheManager().match_prefix(torch.tensor([1.0, 2.0]))


def test_naive_insert_says_everything_was_already_cached() -> None:
    # So the caller frees indices[cached_len=0 : len], i.e. every slot it used.
    manager = NaiveCacheManager()
    assert manager.insert_prefix([5, 6, 7], torch.tensor([3, 1, 2], dtype=torch.int32)) == 3
    assert manager.insert_prefix([], []) == 0
    assert manager.size_info == SizeInfo(0, 0)


def test_naive_insert_checks_lengths_and_indices() -> None:
    manager = NaiveCacheManager()
    with pytest.raises(errors.ArgumentError, match="indices"):
        manager.insert_prefix([1, 2], [0])
    with pytest.raises(errors.ArgumentError, match="indices"):
        manager.insert_prefix([1], [-1])
    with pytest.raises(errors.ArgumentTypeError, match="indices"):
        manager.insert_prefix([1], torch.tensor([0.0]))


def test_naive_lock_and_unlock_do_nothing_for_its_own_handles() -> None:
    manager = NaiveCacheManager()
    handle, _ = manager.match_prefix([1, 2])
    manager.lock_handle(handle)
    manager.lock_handle(handle, unlock=True)
    manager.lock_handle(handle, unlock=True)  # an empty match locks nothing, so unlocking it is harmless
    assert manager.size_info == SizeInfo(0, 0)


def test_naive_lock_refuses_a_foreign_handle() -> None:
    radix_handle, _ = RadixCacheManager().match_prefix([1])
    with pytest.raises(errors.ArgumentTypeError, match="handle"):
        NaiveCacheManager().lock_handle(radix_handle)


def test_naive_evict_zero_and_reset_return_empty_int32() -> None:
    manager = NaiveCacheManager()
    for result in (manager.evict(0), manager.reset()):
        assert result.dtype == torch.int32 and result.numel() == 0


def test_naive_evict_more_than_evictable_is_an_eviction_error() -> None:
    # The contract: a size above size_info.evictable_size (here 0) is a clear minikv error.
    with pytest.raises(errors.EvictionError, match="size"):
        NaiveCacheManager().evict(1)


def test_naive_evict_negative_is_an_argument_error() -> None:
    with pytest.raises(errors.ArgumentError, match="size"):
        NaiveCacheManager().evict(-1)


def test_naive_page_size_is_one() -> None:
    manager = NaiveCacheManager()
    assert manager.page_size == 1 and isinstance(manager, BaseCacheManager)


def test_a_handle_checks_its_fields() -> None:
    with pytest.raises(errors.ArgumentTypeError, match="cached_len"):
        NaiveCacheHandle(-1)
    with pytest.raises(errors.ArgumentTypeError, match="cached_len"):
        NaiveCacheHandle(True)
    with pytest.raises(errors.ArgumentTypeError, match="node"):
        RadixCacheHandle(3, None)  # type: ignore[arg-type]


def test_naive_insert_takes_the_handle_of_its_own_match() -> None:
    manager = NaiveCacheManager()
    handle, _ = manager.match_prefix([1, 2])
    assert manager.insert_prefix([1, 2, 3], [0, 1, 2], handle=handle) == 3
    with pytest.raises(errors.ArgumentTypeError, match="handle"):
        manager.insert_prefix([1], [0], handle=RadixCacheManager().match_prefix([1])[0])


def test_naive_empty_results_are_fresh_tensors() -> None:
    # The notes pre-create one empty_tensor and hand it to every caller: a caller that resized its
    # result then changed every later "empty" result. Each result is now its own tensor.
    manager = NaiveCacheManager()
    _, first = manager.match_prefix([1])
    first.resize_(2).fill_(5)
    _, second = manager.match_prefix([2])
    assert second.tolist() == [] and manager.evict(0).tolist() == [] and manager.reset().tolist() == []
    assert first is not second and manager.empty_tensor.tolist() == []
