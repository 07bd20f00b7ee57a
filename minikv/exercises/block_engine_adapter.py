"""Exercise 4's functions as a block manager: the learner's code backs :class:`~minikv.block_engine.BlockEngine`.

The exercise has the learner write ``allocate(pool, token_ids)`` and
``deallocate(pool, block_table)`` over a ``BlockPool`` (``minikv.exercises.blocks``).
An engine asks a manager for nano-vllm's five methods, on
:class:`~minikv.block_manager.Sequence` objects. :class:`LearnerBlockManager`
translates: it keeps a pool, calls the learner's functions for ``allocate`` and
``deallocate``, and writes the rest itself, the way nano-vllm ``f438ce4`` does:

* ``can_allocate`` has no learner function: it tries the learner's ``allocate``
  on a copy of the pool (the checks proved ``allocate`` raises
  ``OutOfSlotsError`` exactly when minikv's manager would refuse);
* ``append`` takes the free block on the left when a token opens a block
  (dropping the block's stale hash, as ``allocate`` does) and, when a token
  fills its block, hashes it and registers it, as nano-vllm's ``may_append`` does;
* ``check_integrity`` is minikv's :meth:`~minikv.block_manager.BlockManager.check_integrity`,
  run over the learner's pool and the sequences it holds.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any

from ..block_manager import NO_HASH, Block, BlockManager, Sequence, compute_hash
from ..errors import ArgumentError, ArgumentTypeError, OutOfSlotsError
from ..language import tr
from .blocks import BlockPool


class LearnerBlockManager:
    """nano-vllm's block-manager methods over a ``BlockPool`` and exercise 4's functions.

    ``allocate(pool, token_ids) -> (block_table, num_cached_tokens)`` and
    ``deallocate(pool, block_table)`` are the learner's (tasks 4.4 and 4.3).
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, allocate: Callable[..., Any], deallocate: Callable[..., Any]
    ) -> None:
        for name, fn in (("allocate", allocate), ("deallocate", deallocate)):
            if not callable(fn):
                raise ArgumentTypeError(tr("{name} must be a function, got {kind}", name=name, kind=type(fn).__name__))
        self.pool = BlockPool(num_blocks, block_size)
        self.learner_allocate, self.learner_deallocate = allocate, deallocate
        self._live: dict[int, Sequence] = {}

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def blocks(self) -> list[Block]:
        return self.pool.blocks

    @property
    def hash_to_block(self) -> dict[int, int]:
        return self.pool.hash_to_block

    @property
    def free_block_ids(self) -> deque[int]:
        return self.pool.free_block_ids

    def __repr__(self) -> str:
        return (
            f"LearnerBlockManager(num_blocks={self.pool.num_blocks}, block_size={self.block_size}, "
            f"free={len(self.free_block_ids)}, sequences={len(self._live)})"
        )

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether the learner's ``allocate`` succeeds for ``seq``: tried on a copy of the pool."""
        self._check_new(seq)
        try:
            self.learner_allocate(copy.deepcopy(self.pool), list(seq.token_ids))
        except OutOfSlotsError:
            return False
        return True

    def allocate(self, seq: Sequence) -> None:
        self._check_new(seq)
        table, cached = self.learner_allocate(self.pool, list(seq.token_ids))
        seq.block_table, seq.num_cached_tokens = list(table), cached
        self._live[id(seq)] = seq

    def can_append(self, seq: Sequence) -> bool:
        self._check_live(seq)
        return len(seq.token_ids) % self.block_size != 0 or bool(self.free_block_ids)

    def append(self, seq: Sequence, token_id: int) -> None:
        """Add a decoded token: a new block if it opens one, a hash for its block if it fills it."""
        self._check_live(seq)
        bs, pool = self.block_size, self.pool
        if len(seq.token_ids) % bs == 0:
            if not pool.free_block_ids:
                raise OutOfSlotsError(tr("seq: the token opens a new block and no block is free"))
            block = pool.blocks[pool.free_block_ids.popleft()]
            if block.hash != NO_HASH and pool.hash_to_block.get(block.hash) == block.block_id:
                del pool.hash_to_block[block.hash]  # its memory is about to hold other tokens
            block.ref_count, block.hash, block.token_ids = 1, NO_HASH, ()
            seq.block_table.append(block.block_id)
        seq.token_ids.append(int(token_id))
        if len(seq.token_ids) % bs == 0:  # the block is full: from now on a prompt can hit it
            index = len(seq.block_table) - 1
            prefix = pool.blocks[seq.block_table[index - 1]].hash if index else NO_HASH
            block = pool.blocks[seq.block_table[index]]
            block.token_ids = tuple(seq.token_ids[index * bs :])
            block.hash = compute_hash(block.token_ids, prefix)
            pool.hash_to_block[block.hash] = block.block_id

    def deallocate(self, seq: Sequence) -> None:
        self._check_live(seq)
        self.learner_deallocate(self.pool, list(seq.block_table))
        seq.block_table, seq.num_cached_tokens = [], 0
        del self._live[id(seq)]

    def check_integrity(self) -> None:
        """minikv's :meth:`~minikv.block_manager.BlockManager.check_integrity`, over the learner's pool."""
        mirror = BlockManager(self.pool.num_blocks, self.block_size)
        mirror.blocks, mirror.hash_to_block, mirror.free_block_ids = (
            self.pool.blocks,
            self.pool.hash_to_block,
            self.pool.free_block_ids,
        )
        mirror._live = dict(self._live)
        mirror._tables = {key: list(seq.block_table) for key, seq in self._live.items()}
        mirror.check_integrity()

    def _check_new(self, seq: object) -> None:
        if not isinstance(seq, Sequence):
            raise ArgumentTypeError(tr("seq must be a Sequence, got {kind}", kind=type(seq).__name__))
        if id(seq) in self._live or seq.block_table:
            raise ArgumentError(tr("seq already holds blocks; deallocate it first"))

    def _check_live(self, seq: object) -> None:
        if not isinstance(seq, Sequence):
            raise ArgumentTypeError(tr("seq must be a Sequence, got {kind}", kind=type(seq).__name__))
        if self._live.get(id(seq)) is not seq:
            raise ArgumentError(tr("seq holds no blocks of this manager: allocate it first"))
