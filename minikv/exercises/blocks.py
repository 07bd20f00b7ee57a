"""Chapter 4's second half: nano-vllm's hash-chained block table, and its checks.

nano-vllm (``nanovllm/engine/block_manager.py``) caches whole blocks, not
arbitrary prefixes. Each full block gets a hash that chains in the hash of the
block before it, so equal hashes mean equal *prefixes*, not just equal blocks.
A request's prefix is cached as far as its leading blocks' hashes are found.
There is no tree and no lock on a path: each block has a reference count, and a
block whose count drops to zero goes back on the free list *keeping its hash*,
so it can still be hit until someone reuses its memory.

The reference is :class:`minikv.block_manager.BlockManager`. A learner works on
:class:`BlockPool`, the manager's storage without its methods (the same
``blocks``, ``hash_to_block`` and ``free_block_ids``), so after every step the
two can be compared field by field. :class:`~minikv.block_manager.Block` and
:func:`~minikv.block_manager.compute_hash` are the package's own, re-exported here.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._validate import as_positive
from ..block_manager import Block, BlockManager, Sequence, block_hashes, compute_hash
from ..errors import OutOfSlotsError
from ..language import tr
from ._core import (
    Case,
    Draw,
    Mismatch,
    call_watching,
    exercise,
    expect_equal,
    expect_unchanged,
    outcome,
    raised,
    random_case,
    shrink_int,
    shrink_tuple,
)
from ._report import diff

_F = Callable[..., object]


@dataclass
class BlockPool:
    """Every block, the hash table of full blocks, and the free list (the next block to reuse on the left).

    The storage of a :class:`~minikv.block_manager.BlockManager`, under the same
    names, with no sequences and no methods: the exercises write those.
    """

    num_blocks: int
    block_size: int
    blocks: list[Block] = field(init=False)
    hash_to_block: dict[int, int] = field(init=False, default_factory=dict)
    free_block_ids: deque[int] = field(init=False)

    def __post_init__(self) -> None:
        self.num_blocks = as_positive(self.num_blocks, "num_blocks")
        self.block_size = as_positive(self.block_size, "block_size")
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_block_ids = deque(range(self.num_blocks))

    def describe(self) -> str:
        """The pool's state as text, the way the checks print it."""
        return _describe(self)


def _describe(pool: BlockPool | BlockManager) -> str:
    used = [
        tr("{block}(ref {ref_count}, hashed)", block=b.block_id, ref_count=b.ref_count)
        if b.hash != -1
        else tr("{block}(ref {ref_count})", block=b.block_id, ref_count=b.ref_count)
        for b in pool.blocks
        if b.ref_count
    ]
    cached = sorted(pool.hash_to_block.values())
    return tr(
        "in use: {used}\nfree list: {free}\nhash table points at blocks: {cached}",
        used=", ".join(used) or tr("none"),
        free=list(pool.free_block_ids),
        cached=cached,
    )


def _copy_state(source: BlockManager, target: BlockPool) -> None:
    """Make ``target`` hold what ``source`` holds: the reference does a step on the learner's behalf."""
    for mine, theirs in zip(target.blocks, source.blocks, strict=True):
        mine.ref_count, mine.hash, mine.token_ids = theirs.ref_count, theirs.hash, theirs.token_ids
    target.hash_to_block.clear()
    target.hash_to_block.update(source.hash_to_block)
    target.free_block_ids.clear()
    target.free_block_ids.extend(source.free_block_ids)


# -- comparing pools ------------------------------------------------------------------


def _state(pool: BlockPool | BlockManager) -> tuple[Any, ...]:
    return (
        [(b.ref_count, b.hash, tuple(b.token_ids)) for b in pool.blocks],
        dict(pool.hash_to_block),
        list(pool.free_block_ids),
    )


def _compare_pools(expected: BlockManager, got: BlockPool, when: str) -> None:
    exp_blocks, exp_table, exp_free = _state(expected)
    got_blocks, got_table, got_free = _state(got)
    for block_id, (e, g) in enumerate(zip(exp_blocks, got_blocks, strict=True)):
        if e[0] != g[0]:
            raise Mismatch(
                tr(
                    "{when}, block {block} should have ref_count {expected}, not {got}.",
                    when=when,
                    block=block_id,
                    expected=e[0],
                    got=g[0],
                ),
                _describe(expected),
                got.describe(),
            )
        if e[1] != g[1] or e[2] != g[2]:
            if e[1] != g[1] and e[2] != g[2]:
                wrong = tr("its hash and its tokens differ")
            else:
                wrong = tr("its hash differs") if e[1] != g[1] else tr("its tokens differ")
            if e[1] != -1:
                problem = tr(
                    "{when}, block {block} should be hashed (it is full); {wrong}.",
                    when=when,
                    block=block_id,
                    wrong=wrong,
                )
            else:
                problem = tr(
                    "{when}, block {block} should carry no hash; {wrong}.", when=when, block=block_id, wrong=wrong
                )
            raise Mismatch(
                problem,
                _block_line(block_id, e),
                _block_line(block_id, g),
            )
    if exp_table != got_table:
        missing = sorted(set(exp_table.items()) - set(got_table.items()))
        extra = sorted(set(got_table.items()) - set(exp_table.items()))
        if extra and got.blocks[extra[0][1]].hash != extra[0][0]:
            problem = tr(
                "{when}, the hash table is wrong: it should not map hash {hash} to block {block} "
                "(that block now holds other tokens: remove stale entries when a block is reused).",
                when=when,
                hash=extra[0][0],
                block=extra[0][1],
            )
        elif extra:
            problem = tr(
                "{when}, the hash table is wrong: it should not map hash {hash} to block {block}.",
                when=when,
                hash=extra[0][0],
                block=extra[0][1],
            )
        elif missing:
            problem = tr(
                "{when}, the hash table is wrong: it should map hash {hash} to block {block}.",
                when=when,
                hash=missing[0][0],
                block=missing[0][1],
            )
        else:
            problem = tr("{when}, the hash table is wrong.", when=when)
        raise Mismatch(problem, _table_text(exp_table), _table_text(got_table))
    if exp_free != got_free:
        where, exp_text, got_text = diff(exp_free, got_free)
        raise Mismatch(
            tr(
                "{when}, the free list is wrong (its order decides which block is reused next): {where}.",
                when=when,
                where=where,
            ),
            exp_text,
            got_text,
        )


def _block_line(block_id: int, state: tuple[Any, ...]) -> str:
    ref_count, hash_, tokens = state
    return tr(
        "block {block}: ref_count {ref_count}, hash {hash}, tokens {tokens}",
        block=block_id,
        ref_count=ref_count,
        hash=hash_,
        tokens=list(tokens),
    )


def _table_text(table: dict[int, int]) -> str:
    entries = sorted(table.items(), key=lambda item: item[1])
    return "{" + ", ".join(tr("hash {hash} -> block {block}", hash=h, block=b) for h, b in entries) + "}"


@dataclass(frozen=True)
class PoolScenario:
    description: str
    ops: tuple[tuple[Any, ...], ...]  # ("alloc", name, ids) | ("free", name) | ("collide", name[, block index])
    num_blocks: int = 8
    block_size: int = 4

    @property
    def size(self) -> int:
        return sum(len(op[2]) for op in self.ops if op[0] == "alloc")


def _random_ops(seed: int, count: int, block_size: int) -> tuple[tuple[Any, ...], ...]:
    rng = random.Random(seed)
    prompts: list[tuple[int, ...]] = []
    running: list[str] = []
    ops: list[tuple[Any, ...]] = []
    for i in range(count):
        if prompts and rng.random() < 0.6:
            base = rng.choice(prompts)
            prompt = base[: rng.randint(0, len(base))] + tuple(
                rng.randrange(3) for _ in range(rng.randint(1, 2 * block_size))
            )
        else:
            prompt = tuple(rng.randrange(3) for _ in range(rng.randint(1, 3 * block_size)))
        prompts.append(prompt)
        ops.append(("alloc", f"r{i}", prompt))
        running.append(f"r{i}")
        while len(running) > 2 or (running and rng.random() < 0.4):
            ops.append(("free", running.pop(rng.randrange(len(running)))))
    ops.extend(("free", name) for name in running)
    return tuple(ops)


def _scenarios() -> list[PoolScenario]:
    """The hand-made histories both block checks replay, described in the current language."""
    return [
        PoolScenario(tr("an empty prompt needs no block"), (("alloc", "A", ()),)),
        PoolScenario(
            tr("5 tokens, block_size 4: one full block (hashed) and one partial block (not hashed)"),
            (("alloc", "A", (1, 2, 3, 4, 5)),),
        ),
        PoolScenario(
            tr("the same prompt while the first still runs: the full block is shared (ref_count 2)"),
            (("alloc", "A", (1, 2, 3, 4, 5)), ("alloc", "B", (1, 2, 3, 4, 5))),
        ),
        PoolScenario(
            tr("a prompt of exactly two blocks, seen before: its last block is computed again, never reused"),
            (("alloc", "A", tuple(range(8))), ("alloc", "B", tuple(range(8)))),
        ),
        PoolScenario(
            tr("the first block is shared, the second differs"),
            (("alloc", "A", (1, 2, 3, 4, 5, 6, 7, 8, 9)), ("alloc", "B", (1, 2, 3, 4, 9, 9, 9, 9, 9))),
        ),
        PoolScenario(
            tr("after the first request finished, its freed block is taken back from the free list"),
            (("alloc", "A", (1, 2, 3, 4, 5)), ("free", "A"), ("alloc", "B", (1, 2, 3, 4, 6))),
        ),
        PoolScenario(
            tr("a block whose hash matches but whose tokens differ (a collision) is not reused"),
            (("alloc", "A", (1, 2, 3, 4, 5)), ("collide", "A"), ("alloc", "B", (1, 2, 3, 4, 5))),
        ),
        PoolScenario(
            tr("a reused block's old hash is removed from the hash table"),
            (
                ("alloc", "A", (1, 2, 3, 4)),
                ("free", "A"),
                ("alloc", "B", (5, 6, 7, 8, 9)),
                ("alloc", "C", (1, 2, 3, 4, 1)),
            ),
            num_blocks=2,
        ),
        PoolScenario(
            tr("not enough free blocks: raise OutOfSlotsError and change nothing"),
            (("alloc", "A", tuple(range(12))), ("alloc", "B", tuple(range(20, 30)))),
            num_blocks=4,
        ),
        PoolScenario(
            tr("a cached prefix on free blocks: taking it back uses free blocks too"),
            (("alloc", "A", tuple(range(9))), ("free", "A"), ("alloc", "B", (*range(8), 50, 51, 52, 53, 54))),
            num_blocks=4,
        ),
        PoolScenario(
            tr("4 blocks needed, 2 of them cached but free, 3 free in all: OutOfSlotsError"),
            (("alloc", "A", tuple(range(9))), ("free", "A"), ("alloc", "B", (*range(8), 50, 51, 52, 53, 54))),
            num_blocks=3,
        ),
        PoolScenario(
            tr("12 requests over a tiny vocabulary, block_size 2"), _random_ops(1, 12, 2), num_blocks=24, block_size=2
        ),
        PoolScenario(
            tr("12 requests over a tiny vocabulary, block_size 3"), _random_ops(2, 12, 3), num_blocks=20, block_size=3
        ),
    ]


def _run_scenario(scenario: PoolScenario, allocate: _F | None, deallocate: _F | None, learner_allocates: bool) -> None:
    """Replay ``scenario`` on the learner's pool and on minikv's :class:`BlockManager`, comparing after every step.

    The learner writes one of the two operations; the other is done by the
    reference, which then copies its state onto the learner's pool (the two
    were equal before the step, so that is the step done right).
    """
    mine = BlockPool(scenario.num_blocks, scenario.block_size)
    ref = BlockManager(scenario.num_blocks, scenario.block_size)
    tables: dict[str, list[int]] = {}
    sequences: dict[str, Sequence] = {}
    for number, op in enumerate(scenario.ops, 1):
        when = tr("after step {number} ({op})", number=number, op=_describe_op(op))
        if op[0] == "collide":
            at = op[2] if len(op) > 2 else 0
            if op[1] not in tables or at >= len(tables[op[1]]):
                continue
            for block in (mine.blocks[tables[op[1]][at]], ref.blocks[sequences[op[1]].block_table[at]]):
                block.token_ids = tuple(t + 100 for t in block.token_ids)
            continue
        if op[0] == "alloc":
            _, name, ids = op
            seq = Sequence(list(ids))
            try:
                ref.allocate(seq)
                expected = (list(seq.block_table), seq.num_cached_tokens)
            except OutOfSlotsError:
                expected = None
            if learner_allocates:
                assert allocate is not None
                before = _state(mine)
                given = list(ids)
                result, error = raised(allocate, mine, given)
                expect_unchanged(("token_ids",), (list(ids),), (given,))
                if expected is None:
                    if not isinstance(error, OutOfSlotsError):
                        raise Mismatch(
                            tr(
                                "step {number} needs more blocks than are free: "
                                "raise OutOfSlotsError before changing anything.",
                                number=number,
                            ),
                            "OutOfSlotsError",
                            outcome(error, returned=tr("returned normally")),
                        )
                    if _state(mine) != before:
                        raise Mismatch(
                            tr(
                                "step {number} raised, but the pool had already changed: check first, then change.",
                                number=number,
                            )
                        )
                    continue
                if error is not None:
                    raise Mismatch(
                        tr(
                            "step {number} ({op}): your function {outcome}.",
                            number=number,
                            op=_describe_op(op),
                            outcome=outcome(error),
                        )
                    )
                table, cached = _unpack(result)
                expect_equal(tr("the block table of step {number}", number=number), expected[0], table)
                expect_equal(tr("the number of cached tokens of step {number}", number=number), expected[1], cached)
            else:
                if expected is None:
                    continue
                _copy_state(ref, mine)
                table = expected[0]
            tables[name], sequences[name] = table, seq
        else:
            _, name = op
            if name not in tables:  # its allocation failed: nothing to give back
                continue
            table = tables.pop(name)
            ref.deallocate(sequences.pop(name))
            if learner_allocates:
                _copy_state(ref, mine)
            else:
                assert deallocate is not None
                call_watching(deallocate, ("block_table",), mine, list(table))
        _compare_pools(ref, mine, when)


def _describe_op(op: tuple[Any, ...]) -> str:
    if op[0] == "alloc":
        return tr("allocate {name} = {ids}", name=op[1], ids=list(op[2]))
    if op[0] == "free":
        return tr("deallocate {name}", name=op[1])
    if len(op) < 3 or op[2] == 0:
        return tr("corrupt {name}'s first block so its tokens no longer match its hash", name=op[1])
    return tr(
        "corrupt {name}'s block {block} (counting from 0) so its tokens no longer match its hash",
        name=op[1],
        block=op[2],
    )


def _draw_ops(rng: random.Random, size: int) -> PoolScenario:
    """Random histories: block sizes 1-5, tight pools, token ids up to 2^62, collisions on any block."""
    block_size = rng.randint(1, 5)
    big = rng.random() < 0.5
    prompts: list[tuple[int, ...]] = []
    running: list[str] = []
    ops: list[tuple[Any, ...]] = []

    def token() -> int:
        return rng.randrange(2**62) if big and rng.random() < 0.3 else rng.randrange(3)

    for i in range(rng.randint(1, 2 + size // 2)):
        if prompts and rng.random() < 0.6:
            base = rng.choice(prompts)
            prompt = base[: rng.randint(0, len(base))] + tuple(token() for _ in range(rng.randint(1, 2 * block_size)))
        else:
            prompt = tuple(token() for _ in range(rng.randint(0, 3 * block_size)))
        prompts.append(prompt)
        ops.append(("alloc", f"r{i}", prompt))
        running.append(f"r{i}")
        if rng.random() < 0.15:
            ops.append(("collide", f"r{i}", rng.randrange(max(1, len(prompt) // block_size))))
        while running and (len(running) > 2 or rng.random() < 0.4):
            ops.append(("free", running.pop(rng.randrange(len(running)))))
    ops.extend(("free", name) for name in running)
    need = max((-(-len(op[2]) // block_size) for op in ops if op[0] == "alloc"), default=1)
    return PoolScenario(
        "random", tuple(ops), num_blocks=rng.randint(max(1, need - 1), 3 * need + 2), block_size=block_size
    )


def _draw_tight(rng: random.Random, size: int) -> PoolScenario:
    """A pool exactly as large as the longest request needs, one block more or one block less."""
    scenario = _draw_ops(rng, size)
    need = max((-(-len(op[2]) // scenario.block_size) for op in scenario.ops if op[0] == "alloc"), default=1)
    return dataclasses.replace(scenario, num_blocks=max(1, need + rng.choice((-1, 0, 0, 1))))


def _draw_stale(rng: random.Random, size: int) -> PoolScenario:
    """Long block tables in a small pool, one request at a time: freed blocks are reused while their old
    hashes are still in the table, and later prompts hit those stale entries far past the first block."""
    block_size = rng.randint(1, 3)
    blocks_per_prompt = rng.randint(3, 4 + size)
    first = tuple(rng.randrange(2) for _ in range(block_size * blocks_per_prompt + rng.randint(0, block_size)))
    prompts = [first]
    ops: list[tuple[Any, ...]] = []
    for i in range(rng.randint(3, 4 + size // 2)):
        base = rng.choice(prompts)
        keep = rng.randint(0, len(base))
        prompt = base[:keep] + tuple(rng.randrange(2) for _ in range(rng.randint(0, len(base) - keep + block_size)))
        prompts.append(prompt)
        ops.append(("alloc", f"r{i}", prompt))
        if rng.random() < 0.2:
            ops.append(("collide", f"r{i}", rng.randrange(max(1, len(prompt) // block_size))))
        ops.append(("free", f"r{i}"))
    need = max(-(-len(op[2]) // block_size) for op in ops if op[0] == "alloc")
    return PoolScenario("random", tuple(ops), num_blocks=need + rng.randint(0, 2), block_size=block_size)


def _shrink_ops(scenario: PoolScenario) -> list[PoolScenario]:
    r = dataclasses.replace
    ops = scenario.ops
    out = []
    for i, op in enumerate(ops):
        if op[0] == "alloc":
            out.append(r(scenario, ops=tuple(o for o in ops if o[1] != op[1])))
            if op[2]:
                out.append(r(scenario, ops=(*ops[:i], (op[0], op[1], op[2][:-1]), *ops[i + 1 :])))
            small = tuple(min(t, 3) for t in op[2])
            if small != op[2]:
                out.append(r(scenario, ops=(*ops[:i], (op[0], op[1], small), *ops[i + 1 :])))
        elif op[0] == "collide":
            out.append(r(scenario, ops=ops[:i] + ops[i + 1 :]))
    out += [r(scenario, num_blocks=n) for n in shrink_int(scenario.num_blocks, 1)]
    return out


def _show_ops(scenario: PoolScenario) -> str:
    return tr(
        "block_size {block_size}, {num_blocks} blocks: {ops}",
        block_size=scenario.block_size,
        num_blocks=scenario.num_blocks,
        ops="; ".join(_describe_op(op) for op in scenario.ops),
    )


def _random_pool_case(allocating: bool, seed: int) -> Case:
    def run(fn: _F, scenario: PoolScenario) -> None:
        _run_scenario(scenario, fn if allocating else None, None if allocating else fn, allocating)

    return random_case(
        tr(
            "{n} random histories: block sizes 1-5, token ids up to 2^62, collisions on any block, "
            "pools exactly as large as needed (give or take a block), long tables that hit stale hashes",
            n=POOL_DRAWS,
        ),
        Draw(
            _draw_ops,
            run,
            _show_ops,
            _shrink_ops,
            lambda s: s.size,
            classes=(
                (tr("a pool of exactly the blocks needed ± 1"), _draw_tight),
                (tr("stale hashes"), _draw_stale),
            ),
        ),
        seed=seed,
        max_size=12,
        count=POOL_DRAWS,
    )


POOL_DRAWS, HASH_DRAWS = 1000, 3000
"""How many random inputs the block checks draw: as many as keep each check well under a second."""


def _unpack(result: object) -> tuple[list[int], int]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Mismatch(
            tr("return a pair (block_table, num_cached_tokens)."), tr("(list of block ids, int)"), repr(result)
        )
    table, cached = result
    if not isinstance(table, list) or not all(isinstance(b, int) for b in table):
        raise Mismatch(tr("the block table must be a list of block ids (ints)."), "list[int]", repr(table))
    return table, cached


# -- the exercises ---------------------------------------------------------------------


@exercise("blocks.block_hashes", lambda: tr("the chained hash of every full block"))
def _hash_cases() -> list[Case]:
    inputs = [
        (tr("no tokens"), (), 4),
        (tr("fewer tokens than one block: no full block, no hash"), (1, 2, 3), 4),
        (tr("exactly one block"), (1, 2, 3, 4), 4),
        (tr("two full blocks and a partial one"), tuple(range(10)), 4),
        (tr("the same block twice in a row: the chain gives each a different hash"), (7, 7, 7, 7, 7, 7), 3),
        (tr("block_size 1"), (5, 6, 7), 1),
        (tr("block_size 16, 50 tokens"), tuple(i % 5 for i in range(50)), 16),
    ]

    def make(desc: str, ids: tuple[int, ...], block_size: int) -> Case:
        def run(fn: _F) -> None:
            got = call_watching(fn, ("token_ids", "block_size"), list(ids), block_size)
            expected = block_hashes(list(ids), block_size)
            if not isinstance(got, list):
                raise Mismatch(tr("return a list of ints."), tr("a list"), type(got).__name__)
            if got == expected:
                return
            unchained = [compute_hash(ids[i : i + block_size]) for i in range(0, len(ids) - block_size + 1, block_size)]
            hint = ""
            if len(got) != len(expected):
                hint = tr(" There are {n} full blocks; a partial block gets no hash.", n=len(ids) // block_size)
            elif got == unchained:
                hint = tr(
                    " Each block's hash must chain in the previous block's hash (prefix_hash), "
                    "so equal blocks at different places differ."
                )
            where, exp_text, got_text = diff(expected, got)
            raise Mismatch(
                tr(
                    "{call} is wrong: {where}.{hint}",
                    call=f"block_hashes({_ids_text(ids)}, {block_size})",
                    where=where,
                    hint=hint,
                ),
                exp_text,
                got_text,
            )

        return Case(desc, len(ids), run)

    def draw(rng: random.Random, size: int) -> tuple[tuple[int, ...], int]:
        top = rng.choice((3, 1000, 2**62))
        return tuple(rng.randrange(top) for _ in range(rng.randint(0, 3 * size))), rng.randint(1, 1 + size)

    def near_whole_blocks(rng: random.Random, size: int) -> tuple[tuple[int, ...], int]:
        """A whole number of blocks, one token short of it or one over, block sizes 1 to 64."""
        bs = rng.choice((1, 2, rng.randint(1, 64)))
        n = max(0, bs * rng.randint(0, 1 + size // 2) + rng.choice((-1, 0, 1)))
        return tuple(rng.randrange(rng.choice((2, 2**62))) for _ in range(n)), bs

    def shrink(value: tuple[tuple[int, ...], int]) -> list[tuple[tuple[int, ...], int]]:
        ids, bs = value
        out = [(smaller, bs) for smaller in shrink_tuple(ids)] + [(ids, b) for b in shrink_int(bs, 1)]
        return out + [((*ids[:i], min(t, 3), *ids[i + 1 :]), bs) for i, t in enumerate(ids) if t > 3]

    return [make(*i) for i in inputs] + [
        random_case(
            tr(
                "{n} random token lists: any length (partial blocks too, and a whole number of blocks "
                "give or take a token), block sizes 1-64, token ids up to 2^62",
                n=HASH_DRAWS,
            ),
            Draw(
                draw,
                lambda fn, v: make("", *v).run(fn),
                lambda v: f"block_hashes({list(v[0])}, {v[1]})",
                shrink,
                lambda v: len(v[0]),
                classes=((tr("a whole number of blocks ± 1 token"), near_whole_blocks),),
            ),
            seed=1300,
            max_size=12,
            count=HASH_DRAWS,
        )
    ]


def _ids_text(ids: tuple[int, ...]) -> str:
    text = str(list(ids))
    return text if len(text) < 200 else text[:200] + " ...]"


@exercise("blocks.allocate", lambda: tr("a block table that reuses cached blocks, nano-vllm style"))
def _allocate_cases() -> list[Case]:
    def make(scenario: PoolScenario) -> Case:
        return Case(scenario.description, scenario.size, lambda fn: _run_scenario(scenario, fn, None, True))

    return [make(s) for s in _scenarios()] + [_random_pool_case(True, seed=1400)]


@exercise("blocks.deallocate", lambda: tr("give a finished request's blocks back, keeping their hashes"))
def _deallocate_cases() -> list[Case]:
    freeing = [s for s in _scenarios() if any(op[0] == "free" for op in s.ops)] + [
        PoolScenario(
            tr("three blocks freed at once: the tail goes back first"),
            (("alloc", "A", tuple(range(11))), ("free", "A")),
        ),
        PoolScenario(
            tr("a shared block survives until its last user leaves"),
            (("alloc", "A", (1, 2, 3, 4, 5)), ("alloc", "B", (1, 2, 3, 4, 6)), ("free", "A"), ("free", "B")),
        ),
    ]

    def make(scenario: PoolScenario) -> Case:
        return Case(scenario.description, scenario.size, lambda fn: _run_scenario(scenario, None, fn, False))

    return [make(s) for s in freeing] + [_random_pool_case(False, seed=1500)]
