"""A stateful test of serving: the page pool, the lifecycle and the KV storage, against a reference model.

Hypothesis drives a radix cache, its ``PagePool`` and an ``MHAKVCache`` through
admissions, stores, finishes and aborts in random interleavings, with failures
injected in the middle of calls (a ``kv_fn`` that raises half-way through the
layers, a finish with the wrong pool or manager), refused calls (finishing or
storing twice, a stale handle), and a caller that refills its prompt buffer
while the request is still running.

The reference model knows nothing of trees. It tracks, per slot, who owns it
(``FREE``, ``TREE`` or a request number) and which token's K/V it holds, plus
the cached pages as a dict from page key (the tokens from the start of the
prompt to the end of the page) to slots. Only *which* prefix an eviction picks
is read from the manager (LRU order is tested in ``test_properties.py``); the
model checks that the victim was evictable and enough.

After every step: free + in the tree + held by requests = all slots, with each
slot in exactly the place the model says; ``check_integrity`` passes; and
every cached slot holds the K/V of its own token at its own position, in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE, cache_snapshot, manager_snapshot, pool_snapshot, tree_entries
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minikv import KVCacheLayout, MHAKVCache, PagePool, RadixCacheManager
from minikv.errors import ArgumentError, LockError, OutOfSlotsError, StaleHandleError
from minikv.lifecycle import Request, abort, admit, finish, serve, store
from minikv.radix_manager import RadixCacheHandle

LAYERS, HEADS, HEAD_DIM = 2, 1, 2
VOCAB = 3
NUM_PAGES = {1: 8, 2: 5}
FREE, TREE = "free", "tree"
GARBAGE = ("garbage",)
"""What a slot holds after a store that failed half-way: nothing anyone may read."""

PageKey = tuple[int, ...]


def kv_value(layer: int, token: int, position: int) -> float:
    """The K of ``token`` at ``position`` in ``layer`` (V is its negative); exact in float32."""
    return float(layer * 10_000 + position * 100 + token + 1)


def kv_fn(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A forward pass stand-in: the rows of tokens ``input_ids[start:]``."""
    positions = torch.arange(start, len(input_ids), dtype=torch.float32)
    k = layer * 10_000 + positions * 100 + input_ids[start:].to(torch.float32) + 1
    k = k[:, None, None].expand(-1, HEADS, HEAD_DIM).contiguous()
    return k, -k


class ForwardPassFailed(RuntimeError):
    pass


def failing_kv_fn(fail_at: int):  # type: ignore[no-untyped-def]
    """A kv_fn that writes ``fail_at`` layers and then raises."""

    def kv(layer: int, input_ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == fail_at:
            raise ForwardPassFailed(f"layer {layer}")
        return kv_fn(layer, input_ids, start)

    return kv


@dataclass
class Running:
    """A request the model knows is running, and what the model expects of it."""

    number: int
    request: Request
    prompt: tuple[int, ...]
    buffer: np.ndarray
    """The caller's buffer the prompt was admitted from (the caller may refill it)."""
    stored: bool = False
    locked_keys: tuple[PageKey, ...] = field(default=())


class ServingMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        ps = self.page_size
        self.num_slots = NUM_PAGES[ps] * ps
        self.manager = RadixCacheManager(page_size=ps)
        self.pool = PagePool(NUM_PAGES[ps], page_size=ps)
        self.cache = MHAKVCache(
            HEADS, LAYERS, HEAD_DIM, NUM_PAGES[ps], torch.float32, KVCacheLayout.LayerFirst, "cpu", ps
        )
        # -- the reference model
        self.owner: list[str | int] = [FREE] * self.num_slots
        self.content: list[tuple[object, ...] | None] = [None] * self.num_slots
        """(token, position) whose K/V the slot holds, None if never written, GARBAGE after a failed store."""
        self.cached: dict[PageKey, tuple[int, ...]] = {}
        self.running: dict[int, Running] = {}
        self.done: list[Request] = []
        self.handles: list[RadixCacheHandle] = []
        self.history: list[tuple[int, ...]] = []
        self.next_number = 0

    # -- the model's arithmetic --------------------------------------------------------

    def own_page_slots(self, request: Request) -> list[int]:
        """Every slot of the pages a request allocated: a partial last page is held whole."""
        ps = self.page_size
        pages = sorted({s // ps for s in request.own_slots().tolist()})
        return [page * ps + offset for page in pages for offset in range(ps)]

    def page_keys(self, ids: tuple[int, ...]) -> list[PageKey]:
        ps = self.page_size
        return [ids[: end + ps] for end in range(0, len(ids) - ps + 1, ps)]

    def cached_prefix(self, ids: tuple[int, ...]) -> int:
        length = 0
        for key in self.page_keys(ids):
            if key not in self.cached:
                break
            length = len(key)
        return length

    def locked(self) -> set[PageKey]:
        return {key for r in self.running.values() for key in r.locked_keys}

    def evictable_slots(self, extra_locked: set[PageKey]) -> int:
        locked = self.locked() | extra_locked
        return sum(len(slots) for key, slots in self.cached.items() if key not in locked)

    def sync_evictions(self, shortfall: int, locked: set[PageKey]) -> list[int]:
        """Read which cached pages the manager evicted, check the choice was allowed, update the model."""
        present = set(tree_entries(self.manager))
        gone = [key for key in self.cached if key not in present]
        assert present <= set(self.cached), "eviction added pages to the tree"
        assert not set(gone) & locked, "a locked page was evicted"
        for key in gone:  # only whole subtrees go: nothing cached may extend an evicted page
            assert not any(other[: len(key)] == key for other in present if len(other) > len(key)), key
        freed = [s for key in gone for s in self.cached.pop(key)]
        assert len(freed) >= shortfall
        for slot in freed:
            assert self.owner[slot] == TREE
            self.owner[slot] = FREE
        return freed

    # -- prompts -------------------------------------------------------------------------

    def draw_prompt(self, data: st.DataObject) -> tuple[int, ...]:
        fresh = st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=3 * self.page_size + 2).map(tuple)
        if self.history:
            earlier = st.sampled_from(self.history)
            longer = st.tuples(earlier, st.integers(0, 6), fresh).map(lambda t: (t[0][: t[1]] + t[2])[:8])
            strategy = st.one_of(fresh, earlier, longer)
        else:
            strategy = fresh
        prompt = data.draw(strategy, label="prompt")
        self.history = [*self.history, prompt][-6:]
        return prompt

    # -- admit ---------------------------------------------------------------------------

    def expect_admit(self, prompt: tuple[int, ...], whole_prompt: bool) -> tuple[int, int, set[PageKey]] | None:
        """(cached_len, shortfall, locked pages) if the admission fits, None if it must fail."""
        ps = self.page_size
        cached = self.cached_prefix(prompt if whole_prompt else prompt[:-1])
        own_locks = set(self.page_keys(prompt[:cached]))
        needed = -(-(len(prompt) - cached) // ps)
        free_pages = self.owner.count(FREE) // ps
        shortfall = max(needed - free_pages, 0) * ps
        if shortfall > self.evictable_slots(own_locks):
            return None
        return cached, shortfall, own_locks

    def admit_checked(self, prompt: tuple[int, ...], whole_prompt: bool) -> Running | None:
        expected = self.expect_admit(prompt, whole_prompt)
        buffer = np.array(prompt, dtype=np.int64)
        if expected is None:
            contents = self.contents()
            with pytest.raises(OutOfSlotsError):
                admit(self.manager, self.pool, buffer, whole_prompt=whole_prompt)
            assert self.contents() == contents  # the match may split or stamp nodes; nothing cached moves
            event("admit: out of slots")
            return None
        cached, shortfall, own_locks = expected
        expected_prefix = [s for key in self.page_keys(prompt[:cached]) for s in self.cached[key]]
        request = admit(self.manager, self.pool, buffer, whole_prompt=whole_prompt)
        assert request.cached_len == cached
        assert request.indices[:cached].tolist() == expected_prefix
        assert len(request.indices) == len(prompt)
        if shortfall or request.evicted:
            self.sync_evictions(shortfall, self.locked() | own_locks)
            event("admit: evicted")
        number = self.next_number
        self.next_number += 1
        for slot in self.own_page_slots(request):
            assert self.owner[slot] == FREE, f"slot {slot} handed out while {self.owner[slot]} holds it"
            self.owner[slot] = number
        running = Running(number, request, prompt, buffer, locked_keys=tuple(own_locks))
        self.running[number] = running
        how_much = "nothing" if cached == 0 else "all but the last token" if cached >= len(prompt) - 1 else "a prefix"
        event(f"admit: {how_much} cached")
        return running

    @initialize(data=st.data())
    def warm_up(self, data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(0, 3), label="warm-up requests")):
            running = self.admit_checked(self.draw_prompt(data), whole_prompt=False)
            if running is not None:
                self.store_checked(running)
                self.finish_checked(running)

    @rule(data=st.data(), whole_prompt=st.booleans())
    def admit_a_request(self, data: st.DataObject, whole_prompt: bool) -> None:
        self.admit_checked(self.draw_prompt(data), whole_prompt)

    # -- store ---------------------------------------------------------------------------

    def store_checked(self, running: Running) -> None:
        store(running.request, self.cache, kv_fn)
        for position, slot in enumerate(running.request.indices.tolist()):
            if position >= running.request.cached_len:
                self.content[slot] = (running.prompt[position], position)
        running.stored = True

    def pick(self, data: st.DataObject, stored: bool | None = None) -> Running:
        choices = sorted(n for n, r in self.running.items() if stored is None or r.stored == stored)
        return self.running[data.draw(st.sampled_from(choices), label="request")]

    @precondition(lambda self: any(not r.stored for r in self.running.values()))
    @rule(data=st.data())
    def store_a_request(self, data: st.DataObject) -> None:
        self.store_checked(self.pick(data, stored=False))

    @precondition(lambda self: any(not r.stored and len(r.request.own_slots()) for r in self.running.values()))
    @rule(data=st.data(), fail_at=st.integers(0, LAYERS - 1))
    def store_with_a_forward_pass_that_fails(self, data: st.DataObject, fail_at: int) -> None:
        choices = sorted(n for n, r in self.running.items() if not r.stored and len(r.request.own_slots()))
        running = self.running[data.draw(st.sampled_from(choices), label="request")]
        with pytest.raises(ForwardPassFailed):
            store(running.request, self.cache, failing_kv_fn(fail_at))
        assert running.request.running
        for slot in running.request.own_slots().tolist():
            self.content[slot] = GARBAGE  # some layers may have been written
        event("store: failed half-way")

    # -- finish and abort ------------------------------------------------------------------

    def finish_checked(self, running: Running) -> None:
        request, prompt, ps = running.request, running.prompt, self.page_size
        slots = request.indices.tolist()
        already = self.cached_prefix(prompt)
        assert already >= request.cached_len
        assert finish(self.manager, self.pool, request) == already
        for key in self.page_keys(prompt)[already // ps :]:
            self.cached[key] = tuple(slots[len(key) - ps : len(key)])
        inserted_end = len(prompt) - len(prompt) % ps
        kept = {slots[p] for p in range(max(already, request.cached_len), inserted_end)}
        for slot in self.own_page_slots(request):
            assert self.owner[slot] == running.number
            self.owner[slot] = TREE if slot in kept else FREE
        del self.running[running.number]
        self.done.append(request)
        if already > request.cached_len:
            event("finish: freed duplicates")

    @precondition(lambda self: any(r.stored for r in self.running.values()))
    @rule(data=st.data())
    def finish_a_request(self, data: st.DataObject) -> None:
        self.finish_checked(self.pick(data, stored=True))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def abort_a_request(self, data: st.DataObject) -> None:
        running = self.pick(data)
        abort(self.manager, self.pool, running.request)
        for slot in self.own_page_slots(running.request):
            assert self.owner[slot] == running.number
            self.owner[slot] = FREE
        del self.running[running.number]
        self.done.append(running.request)

    @rule(data=st.data(), fail_at=st.integers(0, LAYERS - 1))
    def serve_with_a_forward_pass_that_fails(self, data: st.DataObject, fail_at: int) -> None:
        prompt = self.draw_prompt(data)
        expected = self.expect_admit(prompt, whole_prompt=False)
        if expected is None or len(prompt) == 0:
            return  # covered by admit; an empty prompt calls no kv_fn
        _, shortfall, own_locks = expected
        evicted_before = self.pool.num_evicted_slots
        with pytest.raises(ForwardPassFailed):
            serve(self.manager, self.pool, list(prompt), self.cache, failing_kv_fn(fail_at))
        if self.pool.num_evicted_slots > evicted_before:
            self.sync_evictions(shortfall, self.locked() | own_locks)
        # The request's slots are free again (the invariants check it); what it wrote there is no one's.
        self.content = [GARBAGE if self.owner[s] == FREE else c for s, c in enumerate(self.content)]
        event("serve: failed in the store step")

    # -- the caller reuses its buffer ----------------------------------------------------------

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def refill_the_callers_buffer(self, data: st.DataObject) -> None:
        running = self.pick(data)
        running.buffer[:] = (running.buffer + 1) % VOCAB  # the next prompt, written over the old one
        assert tuple(running.request.input_ids.tolist()) == running.prompt

    # -- refused calls change nothing ---------------------------------------------------------

    def deep_snapshot(self) -> object:
        return (
            manager_snapshot(self.manager),
            pool_snapshot(self.pool),
            cache_snapshot(self.cache).tolist(),
            [
                (n, r.request.indices.tolist(), list(r.request.trace), r.request.running)
                for n, r in self.running.items()
            ],
            [(list(r.trace), r.already_cached, r.aborted) for r in self.done],
        )

    def refused(self, call, error: type[Exception]) -> None:  # type: ignore[no-untyped-def]
        before = self.deep_snapshot()
        with pytest.raises(error):
            call()
        assert self.deep_snapshot() == before

    @precondition(lambda self: any(r.stored for r in self.running.values()))
    @rule(data=st.data(), which=st.sampled_from(["pool", "manager", "page size"]))
    def finish_with_the_wrong_pool_or_manager(self, data: st.DataObject, which: str) -> None:
        request = self.pick(data, stored=True).request
        ps = self.page_size
        if which == "pool":
            other = PagePool(NUM_PAGES[ps], page_size=ps)
            self.refused(lambda: finish(self.manager, other, request), ArgumentError)
        elif which == "manager":
            self.refused(lambda: finish(RadixCacheManager(page_size=ps), self.pool, request), ArgumentError)
        else:
            self.refused(lambda: finish(self.manager, PagePool(4, page_size=ps + 1), request), ArgumentError)
        event(f"refused: finish with another {which}")

    @precondition(lambda self: self.done)
    @rule(data=st.data(), call=st.sampled_from(["finish", "store", "abort"]))
    def touch_a_request_that_is_done(self, data: st.DataObject, call: str) -> None:
        request = data.draw(st.sampled_from(self.done), label="done request")
        calls = {
            "finish": lambda: finish(self.manager, self.pool, request),
            "store": lambda: store(request, self.cache, kv_fn),
            "abort": lambda: abort(self.manager, self.pool, request),
        }
        self.refused(calls[call], LockError)
        event(f"refused: {call} a request that is done")

    @rule(data=st.data())
    def match_without_admitting(self, data: st.DataObject) -> None:
        prompt = self.draw_prompt(data)
        contents = self.contents()
        handle, indices = self.manager.match_prefix(list(prompt))
        assert handle.cached_len == self.cached_prefix(prompt)
        assert indices.tolist() == [s for key in self.page_keys(prompt[: handle.cached_len]) for s in self.cached[key]]
        assert self.contents() == contents
        if handle.cached_len:
            self.handles = [*self.handles, handle][-4:]

    @precondition(lambda self: any(h.node.is_evicted() for h in self.handles))
    @rule(data=st.data(), unlock=st.booleans())
    def lock_a_stale_handle(self, data: st.DataObject, unlock: bool) -> None:
        stale = data.draw(st.sampled_from([h for h in self.handles if h.node.is_evicted()]), label="stale")
        self.refused(lambda: self.manager.lock_handle(stale, unlock=unlock), StaleHandleError)
        event("refused: a stale handle")

    @rule(data=st.data())
    def evict_and_give_back(self, data: st.DataObject) -> None:
        evictable = self.evictable_slots(set())
        if not evictable:
            return
        size = data.draw(st.integers(1, evictable), label="evict size")
        freed = self.manager.evict(size)
        assert sorted(self.sync_evictions(size, self.locked())) == sorted(freed.tolist())
        self.pool.free(freed)
        event("evict: given back to the pool")

    # -- invariants ------------------------------------------------------------------------------

    def contents(self) -> object:
        """What is cached and where, and which slots are free: what a failed admission must not move."""
        return ({k: e.slots for k, e in tree_entries(self.manager).items()}, self.pool.free_slots().tolist())

    @invariant()
    def every_slot_is_where_the_model_says(self) -> None:
        free = set(self.pool.free_slots().tolist())
        entries = tree_entries(self.manager)
        in_tree = [s for e in entries.values() for s in e.slots]
        held = {n: self.own_page_slots(r.request) for n, r in self.running.items()}
        assert len(free) + len(in_tree) + sum(len(h) for h in held.values()) == self.num_slots
        for slot in range(self.num_slots):
            where = self.owner[slot]
            if where == FREE:
                assert slot in free, f"slot {slot} should be free"
            elif where == TREE:
                assert slot not in free and slot in in_tree, f"slot {slot} should be in the tree"
            else:
                assert slot in held[where], f"slot {slot} should be held by request {where}"  # type: ignore[index]
        assert {k: e.slots for k, e in entries.items()} == self.cached

    @invariant()
    def the_tree_is_sound(self) -> None:
        self.manager.check_integrity()
        protected = sum(len(self.cached[key]) for key in self.locked())
        assert self.manager.size_info.protected_size == protected

    @invariant()
    def every_cached_slot_holds_its_tokens_kv(self) -> None:
        ps = self.page_size
        for key, slots in self.cached.items():
            for offset, slot in enumerate(slots):
                position = len(key) - ps + offset
                assert self.content[slot] == (key[position], position), f"slot {slot} of {key}"
                for layer in range(LAYERS):
                    row = self.cache.k_cache(layer)[slot // ps, slot % ps]
                    assert torch.all(row == kv_value(layer, key[position], position)), (slot, layer)
                    assert torch.all(self.cache.v_cache(layer)[slot // ps, slot % ps] == -row)


class PagedServingMachine(ServingMachine):
    page_size = 2


STEPS = settings(REPRODUCIBLE, max_examples=60, stateful_step_count=40)
TestServingPageSize1 = ServingMachine.TestCase
TestServingPageSize1.settings = STEPS
TestServingPageSize2 = PagedServingMachine.TestCase
TestServingPageSize2.settings = STEPS
