"""Every drawing terminates on any tree ``minikv.snapshot`` can be handed: drawn, or refused with a minikv error.

Issue 25's class-level guard for the drawings. Hypothesis builds trees of plain
objects with the fields ``TreeSnapshot.of`` reads (``children``, ``key``,
``value``, ``ref_count``, ``timestamp``, ``parent``), healthy or not: nodes with
no tokens, nodes listed under two parents, cycles back to an ancestor or to the
node itself, and fields of the wrong type. Each drawing (``draw_tree``,
``draw_snapshot``, a ``TreeRecorder`` frame, ``outline``) must return, or raise
a :class:`~minikv.errors.MiniKVError`, within a time limit: never hang, never
leak a raw ``AttributeError`` or ``TypeError``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers import REPRODUCIBLE
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minikv import RadixCacheManager
from minikv.errors import ArgumentTypeError, IntegrityError, MiniKVError
from minikv.snapshot import TreeSnapshot, outline
from minikv.viz import TreeRecorder, draw_snapshot, draw_tree

SECONDS = 10  # per drawing; a healthy one takes milliseconds


class TookTooLong(Exception):
    pass


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail, instead of hanging the suite, if the block runs longer than ``seconds``."""

    def stop(*_: object) -> None:
        raise TookTooLong(f"still drawing after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


good_ids = st.lists(st.integers(0, 50), min_size=1, max_size=4)
field_values = {
    "ids": st.one_of(
        good_ids.map(lambda ids: torch.tensor(ids, dtype=torch.int64)),
        good_ids.map(lambda ids: np.array(ids, dtype=np.int32)),
        good_ids,
        st.just([]),  # a node with no tokens
        st.sampled_from([None, "abc", 3, [1.5], [[1, 2]], [None], object(), torch.zeros(2, 2), float("nan")]),
    ),
    "number": st.one_of(
        st.integers(0, 3),
        st.sampled_from([1.0, 2.5, np.int64(2), torch.tensor(1)]),
        st.sampled_from([None, "1", float("nan"), float("inf"), [1], object()]),
    ),
}


@st.composite
def broken_managers(draw: st.DrawFn) -> SimpleNamespace:
    """A manager-like object whose tree may be healthy, odd or broken in any of the ways above."""

    def node(parent: Any) -> SimpleNamespace:
        wrong = draw(st.integers(0, 9)) == 0  # one node in ten gets a field of any kind
        ids = draw(field_values["ids"] if wrong else good_ids)
        return SimpleNamespace(
            key=ids,
            value=draw(field_values["ids"]) if wrong else list(range(len(ids))),
            ref_count=draw(field_values["number"]) if wrong else draw(st.integers(0, 2)),
            timestamp=draw(field_values["number"]) if wrong else draw(st.integers(0, 9)),
            parent=parent if draw(st.integers(0, 9)) else None,
            children={},
        )

    root = SimpleNamespace(key=[], value=[], ref_count=1, timestamp=0, parent=None, children={})
    nodes = [root]
    for _ in range(draw(st.integers(0, 12))):
        parent = draw(st.sampled_from(nodes))
        child = node(parent)
        filed = draw(
            st.one_of(st.integers(0, 60), st.tuples(st.integers(0, 9), st.integers(0, 9)), st.text(max_size=2))
        )
        parent.children[filed] = child
        nodes.append(child)
    for _ in range(draw(st.integers(0, 2))):  # extra edges: shared children, cycles, self-loops
        parent, child = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        parent.children[draw(st.integers(100, 120))] = child
    if draw(st.integers(0, 19)) == 0:
        draw(st.sampled_from(nodes)).children = draw(st.sampled_from([None, [1, 2], "children", 5]))
    page_size = draw(st.integers(1, 4)) if draw(st.integers(0, 7)) else draw(st.sampled_from([0, -1, "2", 2.0, None]))
    return SimpleNamespace(root_node=root, page_size=page_size)


def drawings(manager: Any) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("TreeSnapshot.of", lambda: TreeSnapshot.of(manager)),
        ("draw_tree", lambda: draw_tree(manager).source),
        ("draw_snapshot", lambda: draw_snapshot(TreeSnapshot.of(manager)).source),
        ("outline", lambda: outline(TreeSnapshot.of(manager))),
        ("TreeRecorder frame", lambda: TreeRecorder(manager).frames[0].drawing.source),  # type: ignore[arg-type]
    ]


@settings(REPRODUCIBLE, max_examples=150)
@given(broken_managers())
def test_every_drawing_returns_or_refuses_with_a_minikv_error(manager: SimpleNamespace) -> None:
    outcomes = set()
    for name, draw in drawings(manager):
        with within(SECONDS):
            try:
                draw()
                outcomes.add("drawn")
            except MiniKVError as error:
                outcomes.add(type(error).__name__)
            except Exception as error:  # what the test exists to catch
                pytest.fail(f"{name} raised a raw {type(error).__name__}: {error}")
    event(" / ".join(sorted(outcomes)))


def test_a_tree_that_lists_nodes_twice_is_drawn_in_time_linear_in_it() -> None:
    """A chain of 40 nodes, each listed twice under its parent: 2**40 paths, 80 drawn nodes."""
    root = SimpleNamespace(key=[], value=[], ref_count=1, timestamp=0, parent=None, children={})
    node = root
    for token in range(40):
        child = SimpleNamespace(key=[token], value=[token], ref_count=0, timestamp=token, parent=node, children={})
        node.children[token] = child
        node.children[-1 - token] = child
        node = child
    manager = SimpleNamespace(root_node=root, page_size=1)
    with within(SECONDS):
        snapshot = TreeSnapshot.of(manager)
        drawing = draw_snapshot(snapshot)
    assert snapshot.num_nodes == 80
    assert drawing.tree_nodes >= 41


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("key", None, ArgumentTypeError),
        ("key", "abc", ArgumentTypeError),
        ("value", [1.5, None], ArgumentTypeError),
        ("ref_count", "1", ArgumentTypeError),
        ("timestamp", float("nan"), ArgumentTypeError),
        ("children", [1, 2], ArgumentTypeError),
    ],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: object, error: type) -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    (node,) = manager.root_node.children.values()
    setattr(node, field, value)
    with within(SECONDS), pytest.raises(error, match=field):
        draw_tree(manager)


def test_a_cycle_is_still_refused_as_a_cycle() -> None:
    manager = RadixCacheManager()
    manager.insert_prefix([1, 2, 3], [0, 1, 2])
    (node,) = manager.root_node.children.values()
    node.children[9] = manager.root_node
    with within(SECONDS), pytest.raises(IntegrityError, match="cycle"):
        draw_tree(manager)
