"""Stateful property tests: the radix manager, driven through the pool and the lifecycle,
against a plain reference model.

Hypothesis admits requests, finishes them in any order, matches without
admitting, evicts and resets, in random interleavings. The reference is a dict
from *page key* (the token ids from the start up to the end of a page) to that
page's slots, plus a logical last-use time per page. It knows nothing of nodes,
splits or heaps. After every step the machine checks that

* the tree holds exactly the reference's pages, with the same slots;
* every page is in one place only: free in the pool, in the tree, or held by
  one running request (nothing leaked, nothing held twice);
* each node's ref_count is the number of running requests whose matched prefix
  covers it, and ``size_info`` is exact;
* node times are ordered as the reference's last-use times;
* ``check_integrity`` passes.

Rules check their own results too: match lengths equal the reference's longest
cached prefix (aligned down to a page), and every eviction takes only unlocked
pages, leaves a prefix-closed cache, frees at least what was asked and takes
least recently used pages first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from helpers import REPRODUCIBLE, Entry, PageKey, assert_pages_accounted, tree_entries, tree_slots
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minikv import NaiveCacheManager, PagePool, RadixCacheManager, Request, SizeInfo, admit, finish
from minikv.errors import EvictionError, LockError, OutOfSlotsError

# -- the reference model ------------------------------------------------------------


@dataclass
class ReferenceCache:
    """What a prefix cache must hold, as plain data: page key -> slots, and page key -> last use."""

    page_size: int
    slots: dict[PageKey, tuple[int, ...]] = field(default_factory=dict)
    last_used: dict[PageKey, int] = field(default_factory=dict)
    clock: int = 0

    def page_keys(self, ids: list[int]) -> list[PageKey]:
        ps = self.page_size
        return [tuple(ids[: (i + 1) * ps]) for i in range(len(ids) // ps)]

    def longest_prefix(self, ids: list[int]) -> int:
        """Tokens of ``ids`` cached as whole pages from the start."""
        pages = 0
        for key in self.page_keys(ids):
            if key not in self.slots:
                break
            pages += 1
        return pages * self.page_size

    def indices(self, ids: list[int], length: int) -> list[int]:
        return [s for key in self.page_keys(ids[:length]) for s in self.slots[key]]

    def use(self, ids: list[int], length: int) -> None:
        """One match (or insert walk): the first ``length`` tokens were just used."""
        self.clock += 1
        for key in self.page_keys(ids[:length]):
            self.last_used[key] = self.clock

    def insert(self, ids: list[int], indices: list[int]) -> int:
        already = self.longest_prefix(ids)
        self.use(ids, already)
        for i, key in enumerate(self.page_keys(ids)):
            if key not in self.slots:
                self.slots[key] = tuple(indices[i * self.page_size : (i + 1) * self.page_size])
                self.last_used[key] = self.clock
        return already

    def locks(self, running: list[Request]) -> dict[PageKey, int]:
        """How many running requests cover each page with their matched (locked) prefix."""
        count: dict[PageKey, int] = {}
        for request in running:
            for key in self.page_keys(request.input_ids.tolist()[: request.cached_len]):
                count[key] = count.get(key, 0) + 1
        return count

    def size_info(self, running: list[Request]) -> SizeInfo:
        locked = self.locks(running)
        protected = sum(1 for key in self.slots if key in locked) * self.page_size
        return SizeInfo(len(self.slots) * self.page_size - protected, protected)

    def is_leaf(self, key: PageKey) -> bool:
        n = len(key)
        return not any(len(other) == n + self.page_size and other[:n] == key for other in self.slots)

    def check_and_apply_eviction(self, evicted: list[int], asked: int, running: list[Request]) -> None:
        """Check an eviction the manager made, then remove those pages from the model."""
        owner = {s: key for key, page in self.slots.items() for s in page}
        assert len(set(evicted)) == len(evicted), f"a slot was evicted twice: {evicted}"
        unknown = [s for s in evicted if s not in owner]
        assert not unknown, f"evicted slots that were not cached: {unknown}"
        gone = {owner[s] for s in evicted}
        assert sum(len(self.slots[key]) for key in gone) == len(evicted), "evicted part of a page"
        assert len(evicted) >= asked, f"asked for {asked}, got {len(evicted)}"
        if asked == 0:
            assert not evicted, "evict(0) must return nothing"
        locked = self.locks(running)
        assert not gone & locked.keys(), "evicted a locked page"
        kept = self.slots.keys() - gone
        for key in kept:  # prefix-closed: leaves go first, so no kept page hangs below an evicted one
            parent = key[: -self.page_size]
            assert not parent or parent in kept, f"{key} kept but its parent page was evicted"
        if gone:
            newest = max(self.last_used[key] for key in gone)
            # Least recently used first: every leaf that could have gone instead was used later.
            for key in kept:
                if key not in locked and self.is_leaf(key):
                    used = self.last_used[key]
                    assert used >= newest, f"evicted a page used at {newest}, kept a leaf used at {used}"
            # And no more than needed, except the rest of the last node(s) taken.
            older = sum(len(self.slots[key]) for key in gone if self.last_used[key] < newest)
            assert older < asked, "kept evicting after enough was freed"
        for key in gone:
            del self.slots[key]
            del self.last_used[key]


# -- the machine ------------------------------------------------------------------

# Pages from a small vocabulary share prefixes often. With page_size 4, two pages
# share their first three tokens, so a three-token agreement must match nothing.
VOCABULARY = {
    1: [(0,), (1,), (2,)],
    4: [(0, 0, 1, 1), (0, 0, 1, 2), (3, 3, 3, 3)],
}
NUM_PAGES = {1: 14, 4: 12}
MAX_PAGES_PER_PROMPT = {1: 6, 4: 3}


def prompts(page_size: int) -> st.SearchStrategy[list[int]]:
    pages = st.lists(st.sampled_from(VOCABULARY[page_size]), max_size=MAX_PAGES_PER_PROMPT[page_size])
    tail = st.lists(st.integers(0, 3), max_size=page_size - 1)
    return st.builds(lambda p, t: [x for page in p for x in page] + t, pages, tail)


def prompts_like(history: list[list[int]], page_size: int) -> st.SearchStrategy[list[int]]:
    """Fresh prompts, earlier prompts again, and earlier prompts cut anywhere and continued:
    the traffic that makes a prefix cache useful (and splits its nodes)."""
    fresh = prompts(page_size)
    if not history:
        return fresh
    limit = (MAX_PAGES_PER_PROMPT[page_size] + 1) * page_size
    earlier = st.sampled_from(history)
    continued = st.builds(lambda base, cut, more: (base[:cut] + more)[:limit], earlier, st.integers(0, limit), fresh)
    return st.one_of(fresh, earlier, continued)


class RadixLifecycleMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        ps = self.page_size
        self.manager = RadixCacheManager(page_size=ps)
        self.pool = PagePool(NUM_PAGES[ps], page_size=ps)
        self.ref = ReferenceCache(ps)
        self.running: list[Request] = []
        self.history: list[list[int]] = []

    def draw_prompt(self, data: st.DataObject) -> list[int]:
        ids = data.draw(prompts_like(self.history, self.page_size), label="prompt")
        self.history = [*self.history, ids][-8:]
        return ids

    # -- rules ----------------------------------------------------------------

    @initialize(data=st.data())
    def warm_the_cache(self, data: st.DataObject) -> None:
        """Start from a cache that already holds a few finished requests, as a server would."""
        for _ in range(data.draw(st.integers(0, 4), label="warm-up requests")):
            if self.checked_admit(self.draw_prompt(data)):
                self.checked_finish(len(self.running) - 1)

    @rule(data=st.data())
    def admit_a_request(self, data: st.DataObject) -> None:
        self.checked_admit(self.draw_prompt(data))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_a_request(self, data: st.DataObject) -> None:
        self.checked_finish(data.draw(st.integers(0, len(self.running) - 1), label="which"))

    def checked_admit(self, ids: list[int]) -> bool:
        """Admit ``ids``, checking the match, the eviction (if any) and the pool; False if out of slots."""
        ps = self.page_size
        matched = self.ref.longest_prefix(ids[:-1])  # admit leaves the last token to compute
        expected_indices = self.ref.indices(ids, matched)
        self.ref.use(ids, matched)
        # Will the pool cope? Free pages first, then pages nobody locks once this match is locked.
        needed = -(-(len(ids) - matched) // ps)
        shortfall = max(needed - self.pool.num_free_pages, 0) * ps
        locked = self.ref.locks(self.running) | dict.fromkeys(self.ref.page_keys(ids[:matched]), 1)
        evictable = sum(1 for key in self.ref.slots if key not in locked) * ps
        evicted_before = self.pool.num_evicted_slots
        if shortfall > evictable:
            with pytest.raises(OutOfSlotsError):
                admit(self.manager, self.pool, ids)
            assert self.pool.num_evicted_slots == evicted_before
            event("admit: out of slots")
            return False
        request = admit(self.manager, self.pool, ids)
        assert request.cached_len == matched
        event(f"admit: matched {'nothing' if matched == 0 else 'everything' if matched == len(ids) else 'a prefix'}")
        assert request.indices[:matched].tolist() == expected_indices
        assert len(request.indices) == len(ids)
        evicted_now = self.pool.num_evicted_slots - evicted_before
        assert evicted_now == request.evicted
        if evicted_now:
            held = set(tree_slots(self.manager))
            evicted = [s for page in self.ref.slots.values() for s in page if s not in held]
            self.ref.check_and_apply_eviction(evicted, shortfall, [*self.running, request])
            event("admit: evicted to make room")
        else:
            assert shortfall == 0
        self.running.append(request)
        return True

    def checked_finish(self, which: int) -> None:
        request = self.running.pop(which)
        ids = request.input_ids.tolist()
        expected = self.ref.insert(ids, request.indices.tolist())
        assert expected >= request.cached_len  # its own locked prefix is still there
        assert finish(self.manager, self.pool, request) == expected
        if expected > request.cached_len:
            event("finish: freed duplicates")

    @rule(data=st.data())
    def match_without_admitting(self, data: st.DataObject) -> None:
        ids = self.draw_prompt(data)
        expected = self.ref.longest_prefix(ids)
        sizes = self.manager.size_info
        handle, indices = self.manager.match_prefix(ids)
        self.ref.use(ids, expected)
        assert handle.cached_len == expected == len(indices)
        assert indices.tolist() == self.ref.indices(ids, expected)
        assert self.manager.size_info == sizes

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        evictable = self.ref.size_info(self.running).evictable_size
        size = data.draw(st.integers(0, evictable + 2), label="size")
        if size > evictable:
            entries = tree_entries(self.manager)
            with pytest.raises(EvictionError):
                self.manager.evict(size)
            assert tree_entries(self.manager) == entries
            event("evict: refused")
            return
        evicted = self.manager.evict(size).tolist()
        if len(evicted) > size:
            event("evict: whole nodes, more than asked")
        self.ref.check_and_apply_eviction(evicted, size, self.running)
        self.pool.free(evicted)

    @rule(now=st.sampled_from([False, False, False, True]))
    def reset(self, now: bool) -> None:
        if not now:  # a reset wipes the cache; done at every chance, the tree would rarely grow
            return
        if any(r.cached_len for r in self.running):
            entries = tree_entries(self.manager)
            with pytest.raises(LockError):
                self.manager.reset()
            assert tree_entries(self.manager) == entries
            event("reset: refused")
            return
        slots = self.manager.reset().tolist()
        event(f"reset: {'empty' if not slots else 'dropped a tree'}")
        assert sorted(slots) == sorted(s for page in self.ref.slots.values() for s in page)
        self.pool.free(slots)
        self.ref.slots.clear()
        self.ref.last_used.clear()

    # -- invariants -------------------------------------------------------------

    @invariant()
    def consistent_with_the_reference(self) -> None:
        self.manager.check_integrity()
        entries = tree_entries(self.manager)
        self.tree_holds_exactly_the_reference(entries)
        self.locks_and_sizes_are_exact(entries)
        self.times_follow_the_reference_order(entries)
        self.every_page_is_in_exactly_one_place()

    def tree_holds_exactly_the_reference(self, entries: dict[PageKey, Entry]) -> None:
        assert {key: e.slots for key, e in entries.items()} == self.ref.slots

    def locks_and_sizes_are_exact(self, entries: dict[PageKey, Entry]) -> None:
        locks = self.ref.locks(self.running)
        for key, entry in entries.items():
            assert entry.ref_count == locks.get(key, 0), f"page {key}: ref_count {entry.ref_count}"
        assert self.manager.size_info == self.ref.size_info(self.running)

    def times_follow_the_reference_order(self, entries: dict[PageKey, Entry]) -> None:
        ordered = sorted(entries, key=lambda key: self.ref.last_used[key])
        for earlier, later in itertools.pairwise(ordered):
            ref_earlier, ref_later = self.ref.last_used[earlier], self.ref.last_used[later]
            tree_earlier, tree_later = entries[earlier].timestamp, entries[later].timestamp
            if ref_earlier == ref_later:
                assert tree_earlier == tree_later, f"{earlier} and {later} were last used together"
            else:
                assert tree_earlier < tree_later, f"{earlier} was last used before {later}"

    def every_page_is_in_exactly_one_place(self) -> None:
        holders = {"tree": tree_slots(self.manager)}
        holders.update({f"request {i}": r.own_slots().tolist() for i, r in enumerate(self.running)})
        assert_pages_accounted(self.pool, holders)


class PagedRadixLifecycleMachine(RadixLifecycleMachine):
    page_size = 4


STATEFUL = settings(REPRODUCIBLE, max_examples=60, stateful_step_count=30)

TestRadixLifecyclePageSize1 = RadixLifecycleMachine.TestCase
TestRadixLifecyclePageSize1.settings = STATEFUL
TestRadixLifecyclePageSize4 = PagedRadixLifecycleMachine.TestCase
TestRadixLifecyclePageSize4.settings = STATEFUL


# -- the naive manager through the lifecycle ----------------------------------------


class NaiveLifecycleMachine(RuleBasedStateMachine):
    """The control group: nothing is ever cached, every slot goes back when its request finishes."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = NaiveCacheManager()
        self.pool = PagePool(12)
        self.running: list[Request] = []

    @rule(ids=prompts(1))
    def admit_a_request(self, ids: list[int]) -> None:
        if len(ids) > self.pool.num_free_pages:
            with pytest.raises(OutOfSlotsError):
                admit(self.manager, self.pool, ids)
            return
        request = admit(self.manager, self.pool, ids)
        assert request.cached_len == 0 and request.evicted == 0 and len(request.own_slots()) == len(ids)
        self.running.append(request)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_a_request(self, data: st.DataObject) -> None:
        request = self.running.pop(data.draw(st.integers(0, len(self.running) - 1), label="which"))
        free_before = self.pool.num_free_pages
        assert finish(self.manager, self.pool, request) == len(request.input_ids)
        assert self.pool.num_free_pages == free_before + len(request.input_ids)

    @rule(ids=prompts(1))
    def match_finds_nothing(self, ids: list[int]) -> None:
        handle, indices = self.manager.match_prefix(ids)
        assert handle.cached_len == 0 and indices.numel() == 0

    @invariant()
    def nothing_cached_and_nothing_lost(self) -> None:
        self.manager.check_integrity()
        assert self.manager.size_info == SizeInfo(0, 0)
        assert self.manager.evict(0).numel() == 0
        holders = {f"request {i}": r.own_slots().tolist() for i, r in enumerate(self.running)}
        assert_pages_accounted(self.pool, holders)


TestNaiveLifecycle = NaiveLifecycleMachine.TestCase
TestNaiveLifecycle.settings = settings(REPRODUCIBLE, max_examples=25, stateful_step_count=25)
