"""The errors the chapters print speak the learner's language (issue 27).

Each case raises one of the minikv errors whose message a chapter shows in its stored output
(chapters 1-5 and *Under the hood*), the way the chapter does. Under ``language("zh")`` the
message is Chinese and still names the argument (or the broken rule) it is about; by default
it is the English message, word for word what the chapters print.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
import torch

from minikv import KVCacheLayout, MHAKVCache, NaiveCacheManager, PagePool, RadixCacheManager
from minikv.errors import (
    ArgumentError,
    ArgumentTypeError,
    EvictionError,
    EvictionUnsupportedError,
    IntegrityError,
    LockError,
    MiniKVError,
    OutOfSlotsError,
    SlotIndexError,
    StaleHandleError,
)
from minikv.kernels import store_cache
from minikv.language import catalog, get_language, language

CJK = re.compile(r"[\u4e00-\u9fff]")


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64)


def slots(*numbers: int) -> torch.Tensor:
    return torch.tensor(numbers, dtype=torch.int32)


def tree() -> RadixCacheManager:
    """[1, 2, 3] in slots 0-2 and [1, 2, 7] beside it (slot 3): a split node and two leaves."""
    cache = RadixCacheManager()
    cache.insert_prefix(ids(1, 2, 3), slots(0, 1, 2))
    cache.insert_prefix(ids(1, 2, 7), slots(0, 1, 3))
    return cache


def out_of_slots() -> None:
    PagePool(4).allocate(6)


def slot_already_held() -> None:
    tree().insert_prefix(ids(9, 9), slots(5, 0))


def too_few_slots() -> None:
    RadixCacheManager().insert_prefix(ids(1, 2, 3), slots(0, 1))


def evict_too_much() -> None:
    tree().evict(6)


def naive_evict() -> None:
    NaiveCacheManager().evict(3)


def lock_a_tensor() -> None:
    cache = tree()
    _, indices = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(indices)  # type: ignore[arg-type]


def lock_an_evicted_handle() -> None:
    cache = tree()
    handle, _ = cache.match_prefix(ids(1, 2, 3, 4))
    cache.evict(cache.size_info.evictable_size)
    cache.lock_handle(handle)


def unlock_what_holds_no_lock() -> None:
    cache = tree()
    held, _ = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(held)
    stranger, _ = cache.match_prefix(ids(1, 2, 9))  # ends at [1, 2], locked only from below
    cache.lock_handle(stranger, unlock=True)


def reset_while_locked() -> None:
    cache = tree()
    held, _ = cache.match_prefix(ids(1, 2, 3, 4))
    cache.lock_handle(held)
    cache.reset()


def wrong_counter() -> None:
    cache = tree()
    cache.evictable_size += 1
    cache.check_integrity()


def lock_not_covering_path() -> None:
    cache = tree()
    leaf = next(node for node in cache.nodes() if node.is_leaf())
    leaf.ref_count += 1
    cache.check_integrity()


def slot_held_twice() -> None:
    cache = copy.deepcopy(tree())
    leaf = next(node for node in cache.nodes() if node.is_leaf() and int(node.value[0]) == 3)
    leaf.value[0] = 2
    cache.check_integrity()


def parent_link_broken() -> None:
    cache = tree()
    leaf = next(node for node in cache.nodes() if node.is_leaf())
    leaf.parent = cache.root_node
    cache.check_integrity()


def free_outside_the_pool() -> None:
    PagePool(16).free([16])


def heads_not_divisible() -> None:
    MHAKVCache(
        num_kv_heads=6, num_layers=1, head_dim=4, num_pages=1, dtype=torch.bfloat16,
        kv_layout=KVCacheLayout.LayerFirst, device="meta", tp_rank=0, tp_size=4,
    )  # fmt: skip


def _cache() -> MHAKVCache:
    return MHAKVCache(
        num_kv_heads=2, num_layers=1, head_dim=2, num_pages=4, dtype=torch.float32,
        kv_layout=KVCacheLayout.LayerFirst, page_size=4, device="cpu",
    )  # fmt: skip


def store_outside() -> None:
    cache = _cache()
    store_cache(cache.k_cache(0), cache.v_cache(0), slots(0, 1, 16), torch.ones(3, 2, 2), torch.ones(3, 2, 2))


def store_twice_in_one_slot() -> None:
    cache = _cache()
    cache.store_kv(torch.ones(3, 2, 2), torch.ones(3, 2, 2), slots(4, 4, 5), layer_id=0)


# (what raises, the error, the argument or rule it must name, English words, their Chinese form)
CASES: list[tuple[Callable[[], None], type[MiniKVError], str, str, str]] = [
    (out_of_slots, OutOfSlotsError, "num_tokens", "slots are free and 0 are evictable, 2 short", "还差 2 个"),
    (
        slot_already_held,
        ArgumentError,
        "indices",
        "is already held by another node of the tree",
        "已被树中另一个节点占用",
    ),
    (too_few_slots, ArgumentError, "input_ids", "has 3 tokens but", "有 3 个 token"),
    (evict_too_much, EvictionError, "size", "asked to evict 6 slots but only 4 are evictable", "只有 4 个可驱逐"),
    (naive_evict, EvictionUnsupportedError, "size", "caches nothing, so it has nothing to evict", "没有东西可驱逐"),
    (lock_a_tensor, ArgumentTypeError, "handle", "must be a RadixCacheHandle, got Tensor", "必须是 RadixCacheHandle"),
    (lock_an_evicted_handle, StaleHandleError, "handle", "was evicted or reset away", "已被驱逐"),
    (unlock_what_holds_no_lock, LockError, "handle", "holds no lock of its own", "自身没有持有锁定"),
    (reset_while_locked, LockError, "reset", "slots are locked; unlock every handle first", "请先解锁每个句柄"),
    (wrong_counter, IntegrityError, "evictable_size", "unlocked nodes hold 4", "未锁定的节点持有 4"),
    (lock_not_covering_path, IntegrityError, "lock covers path", "< its children's", "小于其子节点的"),
    (slot_held_twice, IntegrityError, "slot held twice", "slot 2 is held by 2 nodes", "槽位 2 被 2 个节点持有"),
    (
        heads_not_divisible,
        ArgumentError,
        "tp_size",
        "each rank stores a whole number of heads",
        "每个 rank 存放整数个头",
    ),
    (parent_link_broken, IntegrityError, "parent link", "but its parent is RadixTreeNode(root)", "但它的父节点是"),
    (free_outside_the_pool, SlotIndexError, "slots", "slot 16 is outside [0, 16)", "槽位 16 不在 [0, 16) 之内"),
    (store_outside, SlotIndexError, "indices", "slot 16 is outside [0, 16)", "槽位 16 不在 [0, 16) 之内"),
    (store_twice_in_one_slot, ArgumentError, "out_loc", "must be unique: two tokens cannot share one slot", "不能共用"),
]


def message(raise_it: Callable[[], None], error: type[MiniKVError]) -> str:
    with pytest.raises(error) as caught:
        raise_it()
    return str(caught.value)


def test_the_catalog_has_these_messages() -> None:
    """Without the catalog the Chinese errors would silently fall back to English."""
    assert catalog("zh").get("[{invariant}] at {node}: {detail}"), "fill minikv/locale/zh_CN.po (scripts/messages.py)"


@pytest.mark.parametrize(
    ("raise_it", "error", "argument", "english", "chinese"), CASES, ids=[case[0].__name__ for case in CASES]
)
def test_the_error_speaks_the_learners_language(
    raise_it: Callable[[], None], error: type[MiniKVError], argument: str, english: str, chinese: str
) -> None:
    assert get_language() == "en"
    en = message(raise_it, error)
    assert english in en and argument in en, en
    assert not CJK.search(en), en

    with language("zh"):
        zh = message(raise_it, error)
    assert chinese in zh and argument in zh, zh
    assert english not in zh, zh

    assert message(raise_it, error) == en  # back in English after the block
