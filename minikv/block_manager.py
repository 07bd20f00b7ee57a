"""nano-vllm's block manager: prefix caching by whole blocks, found through a chain of hashes.

The radix managers share any common prefix, token by token. nano-vllm
(``nanovllm/engine/block_manager.py``) settles for less and gets a simpler
structure: the KV cache is cut into fixed blocks of ``block_size`` tokens, each
sequence owns a *block table* (block ids in order), and only **full** blocks can
be shared. A full block is named by a hash of its tokens *and* of the hash of
the block before it, so one dictionary lookup per block answers "has this whole
prefix been computed before?" -- no tree, no path to lock.

What replaces the tree's locks and LRU:

* each block counts the sequences using it (``ref_count``), so a shared block
  stays as long as one user is left;
* a block whose count drops to zero goes back on the free list *keeping its hash
  and tokens*. Until the free list hands it out again, a new prompt can still hit
  it and take it back. Eviction is implicit: it happens when a free block is
  reused, and the free list's order (tail blocks first, see :meth:`BlockManager.deallocate`)
  is the whole eviction policy.

This module keeps nano-vllm's rules (the last block of a prompt is always
computed; a hash hit is trusted only if the block's tokens match) but not its
code, and adds what a textbook needs: validated arguments that leave the state
untouched when refused, and :meth:`BlockManager.check_integrity`.

It follows nano-vllm as of commit ``f438ce4`` (February 2026), the design
before chunked prefill: a prompt's full blocks are hashed and registered when
:meth:`BlockManager.allocate` takes them, since the whole prompt is computed in
the step that allocates it. Since PR #204 (April 2026, ``bb823b3`` and later)
nano-vllm registers a block only after the forward pass that wrote it
(``hash_blocks``): with chunked prefill a block may be allocated steps before
its K/V exist, and a block findable that early would be read unwritten.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ._validate import as_positive, as_token_ids
from .errors import ArgumentError, ArgumentTypeError, IntegrityError, OutOfSlotsError

NO_HASH = -1
"""The ``hash`` of a block that is not full. Real hashes are unsigned 64-bit numbers, so -1 never collides with one."""

_INT64 = (-(2**63), 2**63)


def _as_token_list(value: object, name: str) -> list[int]:
    """Token ids as a list of Python ints, each fitting the 8 bytes (int64) the hash reads.

    A NumPy ``uint64`` id of ``2**63`` or more is refused (by ``as_token_ids``), like the same id in
    a list: cast to int64 it would wrap to a negative id and hash like another token.
    """
    array = as_token_ids(value, name)  # type: ignore[arg-type]
    tokens: list[int] = array.tolist()
    return tokens


def _as_token(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not _INT64[0] <= value < _INT64[1]:
        raise ArgumentError(f"{name} must fit in 64 bits, got {value}")
    return int(value)


def _hash_block(block_tokens: tuple[int, ...] | list[int], prefix_hash: int) -> int:
    # The parent's hash first (8 bytes, little-endian), then the tokens as int64:
    # the layout nano-vllm feeds to xxh64. blake2b is in the standard library.
    h = hashlib.blake2b(digest_size=8)
    if prefix_hash != NO_HASH:
        h.update(prefix_hash.to_bytes(8, "little"))
    h.update(np.asarray(block_tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def compute_hash(token_ids: list[int] | tuple[int, ...] | np.ndarray, prefix_hash: int = NO_HASH) -> int:
    """The hash of one block of tokens, chained to the hash of everything before it.

    ``prefix_hash`` is the hash of the previous block (``-1`` for a sequence's
    first block). Chaining is what lets one lookup stand for a whole prefix: two
    equal blocks at different places, or after different prefixes, get
    different hashes, so a hit on block ``i`` means blocks ``0..i`` all match.

    The hash is stable across processes and machines (unlike Python's ``hash``),
    so cached blocks could be named the same way by every worker.
    """
    tokens = _as_token_list(token_ids, "token_ids")
    if isinstance(prefix_hash, bool) or not isinstance(prefix_hash, (int, np.integer)):
        raise ArgumentTypeError(f"prefix_hash must be an int, got {type(prefix_hash).__name__}")
    if prefix_hash != NO_HASH and not 0 <= prefix_hash < 2**64:
        raise ArgumentError(f"prefix_hash must be -1 or a 64-bit block hash (0 <= h < 2**64), got {prefix_hash}")
    return _hash_block(tokens, int(prefix_hash))


def block_hashes(token_ids: list[int] | tuple[int, ...] | np.ndarray, block_size: int) -> list[int]:
    """The chained hash of every *full* block of ``token_ids``, in order.

    A partial last block gets no hash: its tokens may still grow, and a hash
    names content that will never change.
    """
    tokens = _as_token_list(token_ids, "token_ids")
    block_size = as_positive(block_size, "block_size")
    hashes: list[int] = []
    prefix = NO_HASH
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prefix = _hash_block(tokens[start : start + block_size], prefix)
        hashes.append(prefix)
    return hashes


@dataclass
class Block:
    """One block of ``block_size`` KV slots, and what the manager knows about its content."""

    block_id: int
    ref_count: int = 0
    """Sequences whose block table lists this block. Zero means the block is on the free list."""
    hash: int = NO_HASH
    """The chained hash of the prefix that ends with this block; -1 until the block is full."""
    token_ids: tuple[int, ...] = ()
    """The block's own tokens once it is full, kept so a hash collision cannot pass for a hit."""


@dataclass(eq=False)
class Sequence:
    """A request as the block manager sees it: its tokens, and where their KV lives.

    nano-vllm's name. ``block_table[i]`` is the block holding tokens
    ``i * block_size`` to ``(i + 1) * block_size - 1``; the slot of token ``t`` is
    ``block_table[t // block_size] * block_size + t % block_size``.
    ``block_table`` and ``num_cached_tokens`` are the manager's to write: they are
    filled by :meth:`BlockManager.allocate` and cleared by :meth:`BlockManager.deallocate`,
    and ``token_ids`` should grow only through :meth:`BlockManager.append`, which
    keeps the blocks in step.

    Compared by identity (``eq=False``): two requests with the same prompt are
    still two sequences, each with its own references on the blocks.
    """

    token_ids: list[int]
    block_table: list[int] = field(init=False, default_factory=list)
    num_cached_tokens: int = field(init=False, default=0)
    """Leading prompt tokens whose KV was found in cached blocks at allocation (a multiple of ``block_size``).

    Prefill computes only ``token_ids[num_cached_tokens:]``.
    """

    def __post_init__(self) -> None:
        self.token_ids = _as_token_list(self.token_ids, "token_ids")

    def __len__(self) -> int:
        return len(self.token_ids)


class BlockManager:
    """A fixed pool of blocks shared by sequences through reference counts and chained hashes.

    The whole state is three public structures plus the live sequences:
    ``blocks`` (every :class:`Block`), ``hash_to_block`` (hash -> block id, for
    full blocks whose content can still be found) and ``free_block_ids`` (the
    blocks nobody uses, the next one to reuse on the left).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = as_positive(num_blocks, "num_blocks")
        self.block_size = as_positive(block_size, "block_size")
        self.blocks: list[Block] = [Block(i) for i in range(self.num_blocks)]
        self.hash_to_block: dict[int, int] = {}
        """Where to find the block of each chained hash. A hash maps to the block that registered it last."""
        self.free_block_ids = deque(range(self.num_blocks))
        """Blocks with ``ref_count`` 0, oldest-freed on the left: ``allocate`` reuses from the left."""
        # The sequences holding blocks, by identity: check_integrity counts their
        # references, and a sequence cannot be allocated twice or freed twice.
        self._live: dict[int, Sequence] = {}
        # The manager's own copy of each live sequence's block table: deallocate
        # releases these blocks, never what a user may have written into seq.block_table.
        self._tables: dict[int, list[int]] = {}

    def __repr__(self) -> str:
        return (
            f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={len(self.free_block_ids)}, sequences={len(self._live)})"
        )

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def sequences(self) -> tuple[Sequence, ...]:
        """The sequences holding blocks now, in the order they were allocated."""
        return tuple(self._live.values())

    # -- reading -----------------------------------------------------------------

    def cached_blocks(self, token_ids: list[int] | tuple[int, ...] | np.ndarray) -> list[int]:
        """The blocks :meth:`allocate` would reuse for a prompt of ``token_ids``; changes nothing.

        Blocks are matched from the first one on and the walk stops at the first
        miss: a block's KV depends on every token before it, so a hit after a
        miss would be a different prefix. The last block is never reused, even
        if it is cached, so that prefill always has at least one token to compute
        (nano-vllm issue #144: attention over zero new tokens crashed).
        """
        tokens = _as_token_list(token_ids, "token_ids")
        return self._cached_prefix(tokens)

    def _cached_prefix(self, tokens: list[int]) -> list[int]:
        bs = self.block_size
        num_blocks = -(-len(tokens) // bs)
        hits: list[int] = []
        prefix = NO_HASH
        for i in range(num_blocks - 1):  # every block but the last, which is full or partial
            block_tokens = tuple(tokens[i * bs : (i + 1) * bs])
            prefix = _hash_block(block_tokens, prefix)
            block_id = self.hash_to_block.get(prefix)
            # The collision guard: a 64-bit hash is trusted for the prefix, but the
            # block's own tokens are compared, and a block already matched earlier in
            # this prompt (possible only through a collision) is never listed twice.
            if block_id is None or self.blocks[block_id].token_ids != block_tokens or block_id in hits:
                break
            hits.append(block_id)
        return hits

    def _blocks_to_take(self, tokens: list[int], hits: list[int]) -> int:
        # A hit that another sequence uses costs nothing; a hit on a free block
        # leaves the free list like any new block does.
        num_blocks = -(-len(tokens) // self.block_size)
        return num_blocks - sum(1 for block_id in hits if self.blocks[block_id].ref_count > 0)

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether :meth:`allocate` would succeed for ``seq`` now (a scheduler asks before admitting)."""
        tokens = self._new_sequence_tokens(seq)
        return self._blocks_to_take(tokens, self._cached_prefix(tokens)) <= len(self.free_block_ids)

    def can_append(self, seq: Sequence) -> bool:
        """Whether :meth:`append` would succeed: a token that opens a new block needs a free one."""
        self._live_sequence(seq)
        return len(seq.token_ids) % self.block_size != 0 or bool(self.free_block_ids)

    # -- changing ----------------------------------------------------------------

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table for its tokens, reusing the cached blocks of its prefix.

        Fills ``seq.block_table`` and ``seq.num_cached_tokens``. Every new full
        block is hashed and registered at once, so the next request with the same
        prefix hits it even while this one is still running. (A server must not
        let anyone read a block before prefill has written its KV; nano-vllm today
        registers blocks in ``hash_blocks`` after each step. With no model here,
        allocation stands in for the step.) Raises
        :class:`~minikv.errors.OutOfSlotsError` and changes nothing if free blocks are short.
        """
        tokens = self._new_sequence_tokens(seq)
        hits = self._cached_prefix(tokens)
        needed = self._blocks_to_take(tokens, hits)
        if needed > len(self.free_block_ids):
            raise OutOfSlotsError(f"seq: {needed} free blocks needed, {len(self.free_block_ids)} free")
        bs = self.block_size
        table: list[int] = []
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free_block_ids.remove(block_id)  # O(free blocks), as in nano-vllm
            block.ref_count += 1
            table.append(block_id)
        prefix = self.blocks[hits[-1]].hash if hits else NO_HASH
        for i in range(len(hits), -(-len(tokens) // bs)):
            block = self._take_free_block()
            if (i + 1) * bs <= len(tokens):
                block_tokens = tuple(tokens[i * bs : (i + 1) * bs])
                prefix = _hash_block(block_tokens, prefix)
                self._register(block, prefix, block_tokens)
            table.append(block.block_id)
        seq.token_ids = tokens
        seq.block_table = table
        seq.num_cached_tokens = len(hits) * bs
        self._live[id(seq)] = seq
        self._tables[id(seq)] = list(table)

    def append(self, seq: Sequence, token_id: int) -> None:
        """Add one decoded token to ``seq``, taking a new block when the token opens one.

        When the token fills its block, the block is hashed and registered: from
        then on, another prompt that starts with this sequence's tokens reuses it.
        (nano-vllm splits this into ``Sequence.append_token`` and
        ``BlockManager.may_append``/``hash_blocks``, one step apart.) Raises
        :class:`~minikv.errors.OutOfSlotsError` and changes nothing when a new
        block is needed and none is free; a scheduler would preempt a sequence first.
        """
        self._live_sequence(seq)
        self._check_table_unchanged(seq)
        token = _as_token(token_id, "token_id")
        bs = self.block_size
        position = len(seq.token_ids)
        if -(-position // bs) != len(seq.block_table):
            raise ArgumentError(
                f"seq.token_ids: {position} tokens do not fit its {len(seq.block_table)} blocks; "
                "tokens must be added through append"
            )
        if position % bs == 0:
            if not self.free_block_ids:
                raise OutOfSlotsError(f"seq: token {position} opens a new block and no block is free")
            block_id = self._take_free_block().block_id
            seq.block_table.append(block_id)
            self._tables[id(seq)].append(block_id)
        seq.token_ids.append(token)
        if (position + 1) % bs == 0:
            index = position // bs
            prefix = self.blocks[seq.block_table[index - 1]].hash if index else NO_HASH
            block_tokens = tuple(seq.token_ids[index * bs :])
            self._register(self.blocks[seq.block_table[index]], _hash_block(block_tokens, prefix), block_tokens)

    def deallocate(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; the blocks no one else uses go to the free list, hashes kept.

        The table is walked in reverse, so a sequence's *last* blocks reach the
        free list first and are reused first. Its first blocks, the ones other
        prompts are most likely to share (a system prompt), stay findable longest.
        ``seq`` keeps its tokens: allocating it again (after a preemption) finds
        whatever of its blocks is still cached.

        ``seq.block_table`` must be the table the manager wrote: an edited one is
        refused before any block is released.
        """
        self._live_sequence(seq)
        self._check_table_unchanged(seq)
        for block_id in reversed(self._tables.pop(id(seq))):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
        seq.block_table = []
        seq.num_cached_tokens = 0
        del self._live[id(seq)]

    def _take_free_block(self) -> Block:
        block = self.blocks[self.free_block_ids.popleft()]
        # This is the eviction: the block's old content is gone, so its hash must
        # stop pointing here -- unless a newer block registered the same hash since.
        if block.hash != NO_HASH and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
        block.ref_count, block.hash, block.token_ids = 1, NO_HASH, ()
        return block

    def _register(self, block: Block, block_hash: int, block_tokens: tuple[int, ...]) -> None:
        block.hash, block.token_ids = block_hash, block_tokens
        self.hash_to_block[block_hash] = block.block_id

    # -- argument checks ----------------------------------------------------------

    def _new_sequence_tokens(self, seq: object) -> list[int]:
        if not isinstance(seq, Sequence):
            raise ArgumentTypeError(f"seq must be a Sequence, got {type(seq).__name__}")
        if id(seq) in self._live:
            raise ArgumentError("seq already holds blocks of this manager; deallocate it first")
        if seq.block_table:
            raise ArgumentError("seq has a non-empty block table: it holds blocks of another manager")
        return _as_token_list(seq.token_ids, "seq.token_ids")

    def _live_sequence(self, seq: object) -> None:
        if not isinstance(seq, Sequence):
            raise ArgumentTypeError(f"seq must be a Sequence, got {type(seq).__name__}")
        if self._live.get(id(seq)) is not seq:
            raise ArgumentError("seq holds no blocks of this manager: allocate it first")

    def _check_table_unchanged(self, seq: Sequence) -> None:
        if seq.block_table != self._tables[id(seq)]:
            raise ArgumentError(
                f"seq.block_table was changed: the manager gave it {self._tables[id(seq)]}, it now lists "
                f"{seq.block_table!r}; the manager alone writes block tables"
            )

    # -- integrity -----------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise :class:`~minikv.errors.IntegrityError` naming the first broken invariant.

        Checked: block ids match positions; every live sequence's table covers its
        tokens, each full block holds those tokens under the right chained hash and
        the partial one has no hash, and the table is the one the manager wrote; a
        block's ``ref_count`` equals the number of tables listing it; the free list
        holds each ``ref_count``-0 block exactly once and nothing else; a hashed
        block is full; every hash table entry points at a block carrying that hash.
        """
        if len(self.blocks) != self.num_blocks:
            raise IntegrityError("block count", f"{len(self.blocks)} blocks, num_blocks is {self.num_blocks}")
        for i, block in enumerate(self.blocks):
            if block.block_id != i:
                raise IntegrityError("block ids", f"position {i} holds block_id {block.block_id}", block)
            if (block.hash == NO_HASH) != (block.token_ids == ()):
                raise IntegrityError("hash iff full", "a block has a hash exactly when it records its tokens", block)
            if block.hash != NO_HASH and len(block.token_ids) != self.block_size:
                raise IntegrityError(
                    "hash iff full", f"hashed with {len(block.token_ids)} tokens, not {self.block_size}", block
                )
        uses = [0] * self.num_blocks
        for seq in self._live.values():
            self._check_sequence(seq)
            if seq.block_table != self._tables.get(id(seq)):
                raise IntegrityError("block table", "a block table differs from the one the manager wrote", seq)
            for block_id in seq.block_table:
                uses[block_id] += 1
        for block, count in zip(self.blocks, uses, strict=True):
            if block.ref_count != count:
                raise IntegrityError(
                    "ref_count", f"ref_count {block.ref_count}, but {count} block tables list it", block
                )
        free = list(self.free_block_ids)
        if len(set(free)) != len(free):
            twice = next(b for b in free if free.count(b) > 1)
            raise IntegrityError("free list", f"block {twice} is on the free list twice")
        expected_free = {block.block_id for block in self.blocks if block.ref_count == 0}
        if set(free) != expected_free:
            wrong = min(set(free) ^ expected_free)
            where = "is on the free list but in use" if wrong in set(free) else "is unused but not on the free list"
            raise IntegrityError(
                "free list", f"block {wrong} {where}", self.blocks[wrong] if 0 <= wrong < self.num_blocks else None
            )
        for block_hash, block_id in self.hash_to_block.items():
            if not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):
                raise IntegrityError("hash table", f"hash {block_hash} maps to {block_id!r}, not a block id")
            if self.blocks[block_id].hash != block_hash:
                raise IntegrityError(
                    "hash table", f"hash {block_hash} maps to a block that carries another hash", self.blocks[block_id]
                )

    def _check_sequence(self, seq: Sequence) -> None:
        bs = self.block_size
        tokens, table = seq.token_ids, seq.block_table
        if len(table) != -(-len(tokens) // bs):
            raise IntegrityError(
                "table length",
                f"{len(tokens)} tokens need {-(-len(tokens) // bs)} blocks, the table has {len(table)}",
                seq,
            )
        if len(set(table)) != len(table) or not all(isinstance(b, int) and 0 <= b < self.num_blocks for b in table):
            raise IntegrityError("table entries", f"a table lists an unknown block or one block twice: {table}", seq)
        cached = seq.num_cached_tokens
        if cached % bs or not 0 <= cached <= max(0, (len(table) - 1) * bs):
            raise IntegrityError("num_cached_tokens", f"{cached} is not a whole number of blocks before the last", seq)
        prefix = NO_HASH
        for i, block_id in enumerate(table):
            block = self.blocks[block_id]
            block_tokens = tuple(tokens[i * bs : (i + 1) * bs])
            if len(block_tokens) < bs:
                if block.hash != NO_HASH:
                    raise IntegrityError("block contents", f"block {i} of the table is partial but hashed", block)
                continue
            prefix = _hash_block(block_tokens, prefix)
            if block.token_ids != block_tokens or block.hash != prefix:
                raise IntegrityError(
                    "block contents", f"block {i} of the table does not hold its tokens under their chained hash", block
                )
