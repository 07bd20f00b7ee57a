"""``Vocab``: a toy word-level tokenizer, so the book can write ``vocab.encode("Hello world")``.

A real tokenizer splits text into sub-word pieces; for a cache that makes no
difference (it only ever sees token ids), so the book uses words: one id per
distinct word, handed out in order of first appearance. The ids are therefore
reproducible, and a :class:`Vocab` is also a ``Mapping`` from id to word, which
the drawings in ``minikv.viz`` accept to show words instead of numbers::

    vocab = Vocab()
    vocab.encode("Hello world Hello")   # [0, 1, 0]
    vocab.decode([1, 0])                # 'world Hello'
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ..errors import ArgumentTypeError

__all__ = ["Vocab"]


class Vocab(Mapping[int, str]):
    """A toy word-level tokenizer: each new word gets the next id, in order of first appearance.

    ``Vocab(words)`` starts with ``words`` numbered 0, 1, 2, ... It is a
    ``Mapping`` from id to word and can be passed anywhere a ``vocab`` is accepted.
    """

    def __init__(self, words: Sequence[str] = ()) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = []
        for word in words:
            self.id_of(word)

    def id_of(self, word: str) -> int:
        """The id of ``word``, giving it the next free id if it is new."""
        if not isinstance(word, str) or not word:
            raise ArgumentTypeError(f"word must be a non-empty str, got {word!r}")
        if word not in self._ids:
            self._ids[word] = len(self._words)
            self._words.append(word)
        return self._ids[word]

    def encode(self, text: str) -> list[int]:
        """Split ``text`` on whitespace and return one id per word (new words get new ids)."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        return [self.id_of(word) for word in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        """The words of ``ids``, joined by spaces (``KeyError`` for an id it never handed out)."""
        return " ".join(self[int(i)] for i in ids)

    def __getitem__(self, token: int) -> str:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < len(self._words):
            raise KeyError(token)
        return self._words[token]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._words)))

    def __len__(self) -> int:
        return len(self._words)

    def __repr__(self) -> str:
        return f"Vocab({len(self._words)} words)"
