"""minikv.course.vocab.Vocab: the toy word-level tokenizer the book's examples use."""

from __future__ import annotations

import pytest

import minikv.viz
from minikv.course.vocab import Vocab
from minikv.errors import ArgumentTypeError


def test_ids_in_order_of_first_appearance() -> None:
    vocab = Vocab()
    assert vocab.encode("Hello world Hello") == [0, 1, 0]
    assert vocab.encode("world how") == [1, 2]
    assert vocab.decode([2, 1, 0]) == "how world Hello"
    assert len(vocab) == 3 and dict(vocab) == {0: "Hello", 1: "world", 2: "how"}
    assert list(vocab) == [0, 1, 2] and repr(vocab) == "Vocab(3 words)"


def test_starting_words_and_id_of() -> None:
    vocab = Vocab(["a", "b", "a"])
    assert dict(vocab) == {0: "a", 1: "b"}
    assert vocab.id_of("b") == 1 and vocab.id_of("c") == 2
    assert Vocab(["a", "b"]).encode("b a") == Vocab(["a", "b"]).encode("b a")  # reproducible


def test_mapping_lookups() -> None:
    vocab = Vocab(["a"])
    assert vocab[0] == "a" and 0 in vocab and 1 not in vocab
    for bad in (1, -1, True, "0"):
        with pytest.raises(KeyError):
            vocab[bad]
    with pytest.raises(KeyError):
        vocab.decode([5])


def test_bad_input() -> None:
    vocab = Vocab()
    with pytest.raises(ArgumentTypeError, match="text must be a str"):
        vocab.encode(["Hello"])
    with pytest.raises(ArgumentTypeError, match="non-empty str"):
        vocab.id_of("")
    with pytest.raises(ArgumentTypeError, match="non-empty str"):
        Vocab([3])


def test_viz_re_exports_the_same_class() -> None:
    assert minikv.viz.Vocab is Vocab
    assert not hasattr(minikv.viz.tree, "Vocab")  # it lives in its own module now
