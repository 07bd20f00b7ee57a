"""Fixtures shared by the minikv core tests (helpers that are not fixtures live in ``helpers.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# ``import helpers`` must work whatever import mode or working directory pytest runs with.
sys.path.insert(0, str(Path(__file__).parent))

from viz_scenario import run_scenario

from minikv import RadixCacheManager
from minikv.viz import TreeRecorder


@pytest.fixture
def hello_tree() -> RadixCacheManager:
    """A small page_size-1 tree with a split: [1, 2] shared, then [3] / [4, 5] below it, and [9] alone.

    Slots: [1, 2] -> 10, 11; [3] -> 12; [4, 5] -> 13, 14; [9] -> 20.
    """
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [10, 11, 12])
    manager.insert_prefix([1, 2, 4, 5], [10, 11, 13, 14])
    manager.insert_prefix([9], [20])
    return manager


@pytest.fixture(scope="module")
def scenario() -> TreeRecorder:
    """The viz tests' recorded scenario (``viz_scenario.run_scenario``), once per test module."""
    return run_scenario()


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny matrices: torch's thread pool only adds contention on a shared machine (5x slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
