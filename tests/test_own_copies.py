"""Every object that keeps a caller's data keeps its own copy (issue 25's class-level guard).

A server reuses its input buffers: once a call has returned, the caller may
overwrite the token ids, slots or rows it passed, and nothing minikv keeps may
change. Each case below builds an object (or makes a call that stores an
argument) from a caller's buffer, observes what the object holds, overwrites
the buffer in place, and observes again: the two observations must be equal.
Every buffer kind a caller may pass is tried (a torch tensor, a NumPy array, a
list).

The cases were found by listing, in ``minikv/`` outside ``exercises/``, every
public constructor and method that stores an argument (``self.x = ...``, a node
field, a pool's free list, a K/V row, a frozen snapshot):

- ``EngineRequest`` (its prompt), ``Engine.submit`` and ``Engine.generate`` (through it);
- ``lifecycle.Request`` (its ids and its slots), ``lifecycle.admit`` and ``finish`` (the ids the tree gets);
- ``RadixCacheManager.insert_prefix`` (keys and slots in the tree, with and without ``handle=``);
- ``PagePool.free`` (the free list) and ``PagePool.allocate`` (the slots it returns are the caller's own);
- ``MHAKVCache.store_kv`` (K/V rows);
- ``block_manager.Sequence`` (its token ids);
- ``Vocab`` (its words);
- ``TreeSnapshot.of``, ``SlotOwnership.of`` and ``TreeRecorder``'s frames (the tree and pool they read).

``workloads.replay_hit_rate`` keeps nothing, and must not change the requests it replays.

Not copied, by design: the parts an ``Engine`` is built from (model, manager, pool,
storage: it drives them), a model's weights, the ``Sequence`` object a
``BlockManager`` tracks, and ``RadixTreeNode.set_key_value``, which the manager
calls with copies it made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager, lifecycle
from minikv.block_manager import Sequence
from minikv.course.vocab import Vocab
from minikv.course.workloads import replay_hit_rate
from minikv.engine import EngineRequest, make_engine, recompute
from minikv.snapshot import SlotOwnership, TreeSnapshot
from minikv.tiny_model import TinyDecoder
from minikv.viz import TreeRecorder

IDS = [3, 1, 4, 1, 5, 9, 2, 6]
MODEL = TinyDecoder(vocab_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_positions=32)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def buffer(kind: str, values: list[int], dtype: str = "int64") -> Any:
    if kind == "tensor":
        return torch.tensor(values, dtype=getattr(torch, dtype))
    if kind == "numpy":
        return np.array(values, dtype=dtype)
    return list(values)


def overwrite(data: Any) -> None:
    """What a caller reusing its buffer does: new values in the same memory."""
    if isinstance(data, list):
        data[:] = [7] * len(data)
    else:
        data[:] = 7


# Each case: (buffer values, build(buffer) -> object, observe(object) -> comparable value).
Case = tuple[list[int], Callable[[Any], Any], Callable[[Any], Any]]


def engine_request(prompt: Any) -> Any:
    engine = make_engine(MODEL, 16)
    return engine, engine.submit(EngineRequest(prompt, 3))


def run_engine(built: Any) -> Any:
    engine, request = built
    if engine.has_work():
        engine.run()
    return request.prompt.tolist(), request.output, recompute(MODEL, IDS, 3)


def admitted(ids: Any) -> Any:
    manager, pool = RadixCacheManager(), PagePool(16)
    return manager, pool, lifecycle.admit(manager, pool, ids)


def finish_and_match(built: Any) -> Any:
    manager, pool, request = built
    if request.running:
        lifecycle.finish(manager, pool, request)
    handle, slots = manager.match_prefix(IDS)
    return request.input_ids.tolist(), handle.cached_len, slots.tolist()


def request_of_slots(slots: Any) -> Any:
    manager = RadixCacheManager()
    handle, _ = manager.match_prefix([])
    return lifecycle.Request(np.array(IDS), handle, torch.as_tensor(slots, dtype=torch.int32))


def inserted(which: str) -> Callable[[Any], Any]:
    """insert_prefix keeping ``which`` ("ids" or "slots") from the caller's buffer, page size 1 or 2."""

    def build(data: Any) -> Any:
        page_size = 2 if isinstance(data, np.ndarray) else 1
        manager = RadixCacheManager(page_size=page_size)
        ids, slots = (data, list(range(8))) if which == "ids" else (IDS, data)
        manager.insert_prefix(ids, slots)
        return manager

    return build


def inserted_from_a_handle(data: Any) -> Any:
    manager = RadixCacheManager()
    manager.insert_prefix(IDS[:3], [20, 21, 22])
    handle, _ = manager.match_prefix(IDS[:3])
    manager.lock_handle(handle)
    manager.insert_prefix(IDS, data, handle=handle)
    return manager


def tree_of(manager: RadixCacheManager) -> Any:
    return str(TreeSnapshot.of(manager))


def as_tensor_view(slots: Any) -> Any:
    """PagePool.free takes tensors and lists; a NumPy buffer is passed as a tensor sharing its memory."""
    return torch.from_numpy(slots) if isinstance(slots, np.ndarray) else slots


def freed(slots: Any) -> PagePool:
    pool = PagePool(8)
    pool.allocate(8)
    pool.free(as_tensor_view(slots))
    return pool


def pool_state(pool: PagePool) -> Any:
    return pool.free_slots().tolist(), pool.allocation_order()


def stored(data: Any) -> Any:
    cache = MHAKVCache(1, 1, 2, 8, torch.float32, KVCacheLayout.LayerFirst, "cpu")
    rows = torch.as_tensor(data, dtype=torch.float32)[:, None, None].expand(-1, 1, 2).contiguous()
    cache.store_kv(rows, -rows, torch.arange(len(rows), dtype=torch.int32), 0)
    return cache


def kv_rows(cache: MHAKVCache) -> Any:
    return cache.k_cache(0).tolist(), cache.v_cache(0).tolist()


def snapshot_after_writes(ids: Any) -> Any:
    manager = RadixCacheManager()
    manager.insert_prefix(IDS, list(range(8)))
    snapshot = TreeSnapshot.of(manager)
    (node,) = manager.root_node.children.values()
    node.value[:] = 0  # the tree the snapshot was taken of changes in place afterwards
    manager.insert_prefix(ids, list(range(8, 16)))
    return snapshot


def ownership(slots: Any) -> Any:
    pool = PagePool(8)
    pool.allocate(8)
    pool.free(as_tensor_view(slots))
    owned = SlotOwnership.of(None, pool)
    pool.allocate(len(IDS) // 2)  # the pool it read changes afterwards
    return owned


def recorded(ids: Any) -> Any:
    recorder = TreeRecorder(RadixCacheManager())
    recorder.insert_prefix(ids, list(range(8)))
    (node,) = recorder.manager.root_node.children.values()
    node.value[:] = 0
    return recorder.frames


CASES: dict[str, Case] = {
    "EngineRequest prompt": (IDS, lambda p: EngineRequest(p, 3), lambda r: r.token_ids.tolist()),
    "Engine.submit, then run": (IDS, engine_request, run_engine),
    "lifecycle.admit ids, then finish": (IDS, admitted, finish_and_match),
    "lifecycle.Request slots": ([0, 1, 2, 3, 4, 5, 6, 7], request_of_slots, lambda r: r.indices.tolist()),
    "insert_prefix ids": (IDS, inserted("ids"), tree_of),
    "insert_prefix slots": ([10, 11, 12, 13, 14, 15, 16, 17], inserted("slots"), tree_of),
    "insert_prefix from a handle": ([20, 21, 22, 13, 14, 15, 16, 17], inserted_from_a_handle, tree_of),
    "PagePool.free": ([2, 3, 4], freed, pool_state),
    "MHAKVCache.store_kv": ([1, 2, 3, 4], stored, kv_rows),
    "Sequence token_ids": (IDS, Sequence, lambda s: list(s.token_ids)),
    "TreeSnapshot.of": (IDS[::-1], snapshot_after_writes, str),
    "SlotOwnership.of": ([0, 1, 2, 3], ownership, lambda o: o.counts()),
    "TreeRecorder frames": (IDS, recorded, lambda frames: [str(f.snapshot) for f in frames]),
}


@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_object_keeps_its_own_copy(name: str, kind: str) -> None:
    values, build, observe = CASES[name]
    data = buffer(kind, values, "int32" if "slots" in name or name == "PagePool.free" else "int64")
    built = build(data)
    before = observe(built)
    overwrite(data)
    assert observe(built) == before, f"{name}: overwriting the caller's {kind} changed what it keeps"


def test_pagepool_allocate_returns_slots_that_are_the_callers_own() -> None:
    pool = PagePool(8)
    slots = pool.allocate(3)
    slots[:] = 7
    assert pool.allocate(5).tolist() == [3, 4, 5, 6, 7]
    assert pool.num_free_slots == 0


def test_replaying_requests_does_not_change_them() -> None:
    requests = [np.array(IDS), np.array(IDS[:4])]
    copies = [r.copy() for r in requests]
    replay_hit_rate(requests, 8)
    assert all(np.array_equal(a, b) for a, b in zip(requests, copies, strict=True))


def test_vocab_keeps_its_own_words() -> None:
    words = ["the", "cat", "sat"]
    vocab = Vocab(words)
    words[0] = "a dog"
    assert vocab.encode("the cat") == [0, 1] and vocab[0] == "the"
