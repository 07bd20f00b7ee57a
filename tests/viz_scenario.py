"""Shared by the viz tests: the notes' section 13.4 scenario and readers of DOT text.

The scenario: insert [Hello world], insert [Hello there] (a split), insert
[Hello world how are you]; match and lock it; try to evict 2 (refused: only 1
slot is evictable), evict 1; unlock; evict 2.
"""

from __future__ import annotations

import re

import pytest
import torch

from minikv import PagePool, RadixCacheManager, admit, finish
from minikv.errors import EvictionError
from minikv.viz import TreeRecorder

HELLO, WORLD, THERE, HOW, ARE, YOU = range(6)
WORDS = {HELLO: "Hello", WORLD: "world", THERE: "there", HOW: "how", ARE: "are", YOU: "you"}
HW = [HELLO, WORLD]
HT = [HELLO, THERE]
HWHAY = [HELLO, WORLD, HOW, ARE, YOU]
P_HELLO, P_HW, P_HT, P_HWHAY = (HELLO,), tuple(HW), tuple(HT), tuple(HWHAY)


def run_scenario(vocab=WORDS) -> TreeRecorder:
    rec = TreeRecorder(RadixCacheManager(), vocab)
    rec.insert_prefix(HW, [0, 1])
    rec.insert_prefix(HT, [2, 3])  # the caller then frees slot 2: the tree already holds "Hello"
    rec.insert_prefix(HWHAY, [0, 1, 4, 5, 6])  # request 3 matched 2 tokens, then allocated 4, 5, 6
    handle, indices = rec.match_prefix(HWHAY)
    assert indices.tolist() == [0, 1, 4, 5, 6]
    rec.lock_handle(handle)
    with pytest.raises(EvictionError):
        rec.evict(2)
    assert rec.evict(1).tolist() == [3]
    rec.lock_handle(handle, unlock=True)
    assert sorted(rec.evict(2).tolist()) == [4, 5, 6]
    rec.check_integrity()
    return rec


def node_line(dot: str, name: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f"{name} [")]
    assert len(lines) == 1, f"expected one line for node {name}, got {len(lines)}"
    return lines[0]


def attrs(dot: str, name: str) -> dict[str, str]:
    """The attributes of one DOT node statement; the HTML label is kept whole under 'label'."""
    line = node_line(dot, name)
    label = re.search(r"label=(<<.*?</TABLE>>|\"[^\"]*\"|\S+)", line)
    assert label is not None
    rest = line.replace(label.group(0), "")
    found = dict(re.findall(r'(\w+)=("[^"]*"|[^\s\]]+)', rest))
    found = {k: v.strip('"') for k, v in found.items()}
    found["label"] = label.group(1)
    return found


def edge_line(dot: str, tail: str, head: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f"{tail} -> {head}")]
    assert len(lines) == 1
    return lines[0]


P_HELLO, P_HW, P_HT, P_HWHAY = (HELLO,), tuple(HW), tuple(HT), tuple(HWHAY)


def manager_with(ids: list[int]) -> RadixCacheManager:
    manager = RadixCacheManager()
    manager.insert_prefix(torch.tensor(ids), list(range(len(ids))))
    return manager


def one_request():
    manager, pool = RadixCacheManager(), PagePool(4)
    request = admit(manager, pool, [1, 2])
    finish(manager, pool, request)
    return request


def all_nodes(manager: RadixCacheManager) -> list:
    """Every node but the root, found through the public ``children`` dicts."""
    found, stack = [], list(manager.root_node.children.values())
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found
