"""The random histories of ``radix.cache`` (``minikv.exercises.radix_history``): minikv's own manager passes
them, they reach every operation, and a failing one is shrunk to a small one that still fails."""

from __future__ import annotations

import pytest

from minikv import RadixCacheManager
from minikv.exercises.radix_history import (
    Op,
    describe_history,
    longest_cached_prefix,
    random_history,
    run_history,
    shrink,
)
from minikv.snapshot import TreeSnapshot


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_minikv_passes_many_histories(page_size: int) -> None:
    for seed in range(40):
        history = random_history(seed, page_size)
        failure = run_history(lambda: RadixCacheManager("cpu", page_size), history, page_size)
        assert failure is None, (seed, failure)


def test_histories_are_seeded_and_reach_every_operation() -> None:
    assert random_history(3, 2) == random_history(3, 2)
    assert random_history(3, 2) != random_history(4, 2)
    kinds = {op.kind for seed in range(10) for op in random_history(seed, 1)}
    assert kinds == {"admit", "finish", "abort", "match", "evict", "reset"}
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
