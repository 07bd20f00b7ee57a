"""``BlockEngine``: nano-vllm's serving loop, over a block manager instead of a radix tree.

:class:`~minikv.engine.Engine` asks a cache manager for a *prefix* and a page
pool for *slots*. nano-vllm (``nanovllm/engine/scheduler.py`` as of ``f438ce4``)
needs neither: its :class:`~minikv.block_manager.BlockManager` is both. A
request's :class:`~minikv.block_manager.Sequence` gets a *block table* at
admission (its cached blocks reused, the rest taken from the free list), a new
block when a decoded token opens one, and gives its blocks back when it
finishes or is preempted. The slot of token ``t`` is arithmetic::

    slot = block_table[t // block_size] * block_size + t % block_size

so the K/V storage is the engine's :class:`~minikv.MHAKVCache` with
``page_size = block_size``: a block *is* a page. The model sees the same
``prefill``/``decode`` calls as under :class:`~minikv.engine.Engine`, and greedy
outputs must equal :func:`~minikv.engine.recompute`'s, whatever was cached or preempted.

A step is nano-vllm's ``Scheduler.schedule``, then the forward pass, then ``postprocess``:

* **prefill**, if any waiting request fits (``can_allocate``): admit from the
  front of the queue, allocate each one's blocks, and compute its tokens from
  ``num_cached_tokens`` on. Requests admitted in one step are prefilled in
  admission order, so a block that an earlier one registered and a later one
  hits is written before it is read (nano-vllm's batched prefill stores every
  request's K/V layer by layer before attention reads them, which gives the same order);
* otherwise **decode** every running request: each feeds in its last token,
  which ``append`` places (a new block when the token opens one). When no block
  is free, the newest running request is preempted: its blocks go back to the
  free list, hashes kept, and it waits at the front of the queue to be
  prefilled again -- prompt and generated tokens, from whatever is still cached.

The manager is any object with nano-vllm's five methods (``can_allocate``,
``allocate``, ``can_append``, ``append``, ``deallocate``) and its ``blocks``,
``block_size`` and ``free_block_ids``: minikv's ``BlockManager``, or exercise 4's
functions behind :class:`~minikv.exercises.block_engine_adapter.LearnerBlockManager`.
Unlike nano-vllm, ``append`` takes the token (minikv's manager adds it and takes
the block in one call, where nano-vllm has ``append_token`` and ``may_append``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as SequenceOf
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ._validate import as_positive
from .base import BaseKVCache, KVCacheLayout
from .block_manager import BlockManager, Sequence
from .engine import EngineRequest, Status, _as_list, check_fits_model, check_model
from .errors import ArgumentError, ArgumentTypeError, IntegrityError
from .language import tr
from .mha_pool import MHAKVCache
from .models.base import PagedModel, check_cache_fits


@runtime_checkable
class BlockManagerLike(Protocol):
    """What :class:`BlockEngine` needs from a block manager: nano-vllm's names."""

    block_size: int
    blocks: list[Any]
    free_block_ids: deque[int]

    def can_allocate(self, seq: Sequence) -> bool: ...
    def allocate(self, seq: Sequence) -> None: ...
    def can_append(self, seq: Sequence) -> bool: ...
    def append(self, seq: Sequence, token_id: int) -> None: ...
    def deallocate(self, seq: Sequence) -> None: ...


class BlockEngine:
    """A waiting queue, a running list, and a step that prefills or decodes, over a block manager.

    ``block_manager`` must be empty (every block free); ``kv_cache`` holds its
    blocks as pages (``num_pages = len(block_manager.blocks)``,
    ``page_size = block_manager.block_size``). ``max_num_seqs`` bounds the
    running list, as nano-vllm's config does (its ``max_num_batched_tokens``, a cap on
    a prefill step's tokens, is left out: the course's models are small). Requests are
    :class:`~minikv.engine.EngineRequest` objects; ``seqs[request.uid]`` is the
    :class:`~minikv.block_manager.Sequence` of a running request: the tokens
    whose K/V are written (its last generated token is not, until it is fed in).
    """

    def __init__(
        self, model: PagedModel, block_manager: BlockManagerLike, kv_cache: BaseKVCache, max_num_seqs: int = 8
    ) -> None:
        check_model(model)
        if not isinstance(block_manager, BlockManagerLike):
            raise ArgumentTypeError(
                tr(
                    "block_manager must have blocks, block_size, free_block_ids and can_allocate, allocate, "
                    "can_append, append, deallocate, got {kind}",
                    kind=type(block_manager).__name__,
                )
            )
        if len(block_manager.free_block_ids) != len(block_manager.blocks):
            raise ArgumentError(tr("block_manager must be empty: every block free"))
        check_cache_fits(model, kv_cache)
        pages, page_size = kv_cache.k_cache(0).shape[:2]
        if (pages, page_size) != (len(block_manager.blocks), block_manager.block_size):
            raise ArgumentError(
                tr(
                    "kv_cache holds {pages} pages of {page_size} slots; "
                    "the block manager has {blocks} blocks of {size}",
                    pages=pages,
                    page_size=page_size,
                    blocks=len(block_manager.blocks),
                    size=block_manager.block_size,
                )
            )
        self.model, self.block_manager, self.kv_cache = model, block_manager, kv_cache
        self.block_size = block_manager.block_size
        self.max_num_seqs = as_positive(max_num_seqs, "max_num_seqs")
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        """Oldest admission first: preemption takes the last."""
        self.finished: list[EngineRequest] = []
        self.seqs: dict[int, Sequence] = {}
        self._next_uid = 0

    # -- the public loop (nano-vllm's LLMEngine) --------------------------------------------------

    def add_request(self, request: EngineRequest) -> EngineRequest:
        """Queue a request; refused, changing nothing, if the model or the blocks could never hold it."""
        self._check_request(request)
        request.uid, self._next_uid = self._next_uid, self._next_uid + 1
        request.status = Status.WAITING
        self.waiting.append(request)
        return request

    def _check_request(self, request: EngineRequest) -> None:
        if not isinstance(request, EngineRequest):
            raise ArgumentTypeError(tr("request must be an EngineRequest, got {kind}", kind=type(request).__name__))
        if request.status is not Status.NEW:
            raise ArgumentError(tr("request: {request} was already submitted", request=repr(request)))
        longest = check_fits_model(self.model, request)
        needed = -(-longest // self.block_size)
        if needed > len(self.block_manager.blocks):
            raise ArgumentError(
                tr(
                    "request: {tokens} tokens need {needed} blocks; there are only {blocks}",
                    tokens=longest,
                    needed=needed,
                    blocks=len(self.block_manager.blocks),
                )
            )

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def step(self) -> tuple[list[EngineRequest], bool]:
        """Schedule, run the model, hand out the tokens. Returns the batch and whether it was a prefill."""
        batch, is_prefill = self.schedule()
        tokens = self._prefill(batch) if is_prefill else self._decode(batch)
        self.postprocess(batch, tokens)
        return batch, is_prefill

    def generate(
        self,
        prompts: Iterable[torch.Tensor | np.ndarray | SequenceOf[int]],
        max_new_tokens: int,
        stop_tokens: Iterable[int] = (),
    ) -> list[list[int]]:
        """One request per prompt, run to the end; each one's generated tokens, in the prompts' order."""
        stops = _as_list(stop_tokens, "stop_tokens")
        requests = [EngineRequest(p, max_new_tokens, stops) for p in _as_list(prompts, "prompts")]
        for request in requests:  # all checked before any is queued
            self._check_request(request)
        for request in requests:
            self.add_request(request)
        while not self.is_finished():
            self.step()
        return [r.output for r in requests]

    # -- scheduling (nano-vllm's Scheduler) ---------------------------------------------------------

    def schedule(self) -> tuple[list[EngineRequest], bool]:
        """Admit what fits and prefill it; if nothing was admitted, decode every running request."""
        scheduled: list[EngineRequest] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            # Every token so far: after a preemption, the generated ones are prefilled too.
            seq = Sequence(request.token_ids.tolist())
            if not self.block_manager.can_allocate(seq):
                break
            self.block_manager.allocate(seq)
            self.seqs[request.uid] = seq
            if request.cached_tokens < 0:
                request.cached_tokens = seq.num_cached_tokens
            request.admissions.append(seq.num_cached_tokens)
            request.status = Status.RUNNING
            self.waiting.popleft()
            self.running.append(request)
            scheduled.append(request)
        if scheduled:
            return scheduled, True
        for request in list(self.running):
            if request not in self.running:
                continue  # preempted below, to make room for an older one
            seq = self.seqs[request.uid]
            while not self.block_manager.can_append(seq) and self.running[-1] is not request:
                self.preempt(self.running[-1])
            if not self.block_manager.can_append(seq):
                self.preempt(request)  # the newest itself: nothing younger is left to give way
                continue
            self.block_manager.append(seq, request.output[-1])  # the token fed in this step
            scheduled.append(request)
        return scheduled, False

    def preempt(self, request: EngineRequest) -> None:
        """Give its blocks back (their hashes stay, so a resume can hit them) and requeue it first."""
        self.running.remove(request)
        self.block_manager.deallocate(self.seqs.pop(request.uid))
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def postprocess(self, batch: list[EngineRequest], tokens: list[int]) -> None:
        """Each request gets its token; a finished one gives its blocks back."""
        for request, token in zip(batch, tokens, strict=True):
            request.output.append(token)
            if request._done_after(token):
                request.status = Status.FINISHED
                self.running.remove(request)
                self.block_manager.deallocate(self.seqs.pop(request.uid))
                self.finished.append(request)

    # -- the forward pass (nano-vllm's ModelRunner) -------------------------------------------------

    def slots(self, seq: Sequence) -> torch.Tensor:
        """The slot of each of ``seq``'s tokens: ``block_table[t // block_size] * block_size + t % block_size``."""
        bs = self.block_size
        table = torch.tensor(seq.block_table, dtype=torch.int64)
        every = (table[:, None] * bs + torch.arange(bs)).flatten()
        return every[: len(seq.token_ids)].to(self.kv_cache.device)

    def _prefill(self, batch: list[EngineRequest]) -> list[int]:
        tokens = []
        for request in batch:  # in admission order: see the module docstring
            seq = self.seqs[request.uid]
            logits = self.model.prefill(seq.token_ids, self.kv_cache, self.slots(seq), seq.num_cached_tokens)
            tokens.append(int(logits[-1].argmax()))
        return tokens

    def _decode(self, batch: list[EngineRequest]) -> list[int]:
        if not batch:
            return []
        seqs = [self.seqs[r.uid] for r in batch]
        tables = [self.slots(seq) for seq in seqs]
        positions = [len(seq.token_ids) - 1 for seq in seqs]
        out_loc = torch.stack([table[-1] for table in tables])
        ids = [seq.token_ids[-1] for seq in seqs]
        logits = self.model.decode(ids, positions, self.kv_cache, out_loc, tables)
        tokens: list[int] = logits.argmax(dim=-1).tolist()
        return tokens

    # -- checking ------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`~minikv.errors.IntegrityError` if the engine's books disagree; then the manager's own check.

        Each running request's sequence holds its tokens but the last generated
        one, in whole blocks; every block is free or in some running table, never
        both; the manager's ``check_integrity`` runs if it has one.
        """
        if {r.uid for r in self.running} != set(self.seqs):
            raise IntegrityError("running", "the running requests and the sequences holding blocks differ")
        used: set[int] = set()
        for request in self.running:
            seq = self.seqs[request.uid]
            if seq.token_ids != request.token_ids[:-1].tolist():
                raise IntegrityError("sequence tokens", f"{request!r}: its sequence is not its tokens but the last")
            if len(seq.block_table) != -(-len(seq.token_ids) // self.block_size):
                raise IntegrityError("block table", f"{request!r}: {len(seq.block_table)} blocks for {len(seq)} tokens")
            used.update(seq.block_table)
        free = list(self.block_manager.free_block_ids)
        if used & set(free) or len(used) + len(free) != len(self.block_manager.blocks):
            raise IntegrityError("blocks", f"{len(used)} blocks in use and {len(free)} free, some twice or missing")
        check_integrity = getattr(self.block_manager, "check_integrity", None)
        if callable(check_integrity):
            check_integrity()


def make_block_engine(
    model: PagedModel,
    num_blocks: int,
    block_size: int = 4,
    block_manager: BlockManagerLike | None = None,
    max_num_seqs: int = 8,
) -> BlockEngine:
    """A :class:`BlockEngine` with K/V storage shaped for ``model``, as :func:`~minikv.engine.make_engine` builds it.

    ``block_manager`` is an empty manager of ``num_blocks`` blocks of ``block_size``
    (exercise 4's, say); None builds minikv's :class:`~minikv.block_manager.BlockManager`.
    """
    check_model(model)
    num_blocks = as_positive(num_blocks, "num_blocks")
    block_size = as_positive(block_size, "block_size")
    if block_manager is None:
        block_manager = BlockManager(num_blocks, block_size)
    elif isinstance(block_manager, BlockManagerLike) and (
        len(block_manager.blocks),
        block_manager.block_size,
    ) != (num_blocks, block_size):
        raise ArgumentError(
            tr(
                "block_manager has {blocks} blocks of {size}, not {num_blocks} of {block_size}",
                blocks=len(block_manager.blocks),
                size=block_manager.block_size,
                num_blocks=num_blocks,
                block_size=block_size,
            )
        )
    kv_cache = MHAKVCache(
        model.num_kv_heads,
        model.num_layers,
        model.head_dim,
        num_blocks,
        model.dtype,
        KVCacheLayout.LayerFirst,
        model.device,
        block_size,
    )
    return BlockEngine(model, block_manager, kv_cache, max_num_seqs)
