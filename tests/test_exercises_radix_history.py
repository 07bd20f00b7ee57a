"""The random histories of ``radix.cache`` (``minikv.exercises.radix_history``): minikv's own manager passes
them, they reach every operation, and a failing one is shrunk to a small one that still fails."""

from __future__ import annotations

import pytest

from minikv import RadixCacheManager
from minikv.exercises.radix_history import (
    Op,
    describe_history,
    fork_history,
    longest_cached_prefix,
    random_history,
    run_history,
    shrink,
)
from minikv.snapshot import TreeSnapshot


@pytest.mark.parametrize("page_size", [1, 2, 3, 4, 8])
def test_minikv_passes_many_histories(page_size: int) -> None:
    for seed in range(40):
        history = random_history(seed, page_size)
        failure = run_history(lambda: RadixCacheManager("cpu", page_size), history, page_size)
        assert failure is None, (seed, failure)
    assert run_history(lambda: RadixCacheManager("cpu", page_size), fork_history(page_size), page_size) is None


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_the_fork_history_locks_two_children_under_one_node(page_size: int) -> None:
    """The written history reaches the class random ones reach by chance: a node whose ref_count is the sum
    of two locked children's, and an unlock nobody took there, which minikv refuses."""
    manager = RadixCacheManager("cpu", page_size)
    history = fork_history(page_size)
    cut = next(i for i, op in enumerate(history) if op.kind == "unlock")
    assert run_history(lambda: manager, history[:cut], page_size) is None
    forks = [n for n in manager.nodes() if sum(c.ref_count > 0 for c in n.children.values()) >= 2]
    assert forks and forks[0].ref_count == sum(c.ref_count for c in forks[0].children.values()) == 2


class _NeverRefuses(RadixCacheManager):
    """A lock_handle that lets an unlock nobody took pass silently, instead of refusing it."""

    def lock_handle(self, handle, unlock: bool = False) -> None:
        path = self.path_of(handle)
        if unlock and path and path[0].ref_count <= sum(c.ref_count for c in path[0].children.values()):
            return
        super().lock_handle(handle, unlock)


def test_unlocks_nobody_took_are_played_only_on_a_hardened_cache() -> None:
    history = fork_history(1)
    assert run_history(lambda: _NeverRefuses("cpu", 1), history, 1, hardened=False) is None
    failure = run_history(lambda: _NeverRefuses("cpu", 1), history, 1, hardened=True)
    assert failure is not None and history[failure.step].kind == "unlock"


def test_histories_are_seeded_and_reach_every_operation() -> None:
    assert random_history(3, 2) == random_history(3, 2)
    assert random_history(3, 2) != random_history(4, 2)
    kinds = {op.kind for seed in range(10) for op in random_history(seed, 1)}
    assert kinds == {"admit", "finish", "abort", "match", "evict", "reset", "unlock"}
    sizes = {op.size for seed in range(10) for op in random_history(seed, 4) if op.kind == "evict"}
    assert -1 in sizes and 40 in sizes  # refused evictions too
    ids = {t for seed in range(10) for op in random_history(seed, 1) for t in op.ids}
    assert max(ids) > 2**31  # not only small token ids


class _ForgetsParents(RadixCacheManager):
    """A broken manager: it never locks anything, so eviction may take a running request's prefix."""

    def lock_handle(self, handle, unlock: bool = False) -> None:
        return None


def test_a_failing_history_shrinks_and_still_fails() -> None:
    page_size = 1
    failing = next(
        (h, f)
        for seed in range(60)
        if (f := run_history(lambda: _ForgetsParents("cpu", 1), h := random_history(seed, page_size), 1)) is not None
    )
    history, failure = failing

    def fails(candidate: tuple[Op, ...]):
        return run_history(lambda: _ForgetsParents("cpu", 1), candidate, page_size)

    small, found = shrink(history, fails)
    assert found is not None and fails(small) is not None
    assert len(small) <= failure.step + 1 and len(small) < len(history)
    text = describe_history(small, page_size, found.step)
    assert text.count("\n") == len(small) and "<- fails here" in text


def test_the_model_finds_the_longest_cached_prefix_in_whole_pages() -> None:
    manager = RadixCacheManager(page_size=2)
    manager.insert_prefix([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
    manager.insert_prefix([1, 2, 7, 7], [8, 9, 10, 11])
    tree = TreeSnapshot.of(manager)
    assert longest_cached_prefix(tree, [1, 2, 3, 4, 5]) == (4, [0, 1, 2, 3])
    assert longest_cached_prefix(tree, [1, 2, 7, 7, 9]) == (4, [0, 1, 10, 11])
    assert longest_cached_prefix(tree, [1, 9]) == (0, [])
