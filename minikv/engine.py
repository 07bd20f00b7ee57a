"""``Engine``: a small serving loop -- requests that generate, batched, over the paged prefix cache.

Read this file beside the engine chapter. The pieces, and who owns what::

    Engine (this file): waiting queue, running batch, one step at a time
      |- cache manager   match_prefix / lock_handle / insert_prefix / evict   (which prefixes stay)
      |- PagePool        allocate(evict_from=cache) / free                    (which pages nobody holds)
      |- req_to_token    one row of slots per running request                 (where each token's K/V live)
      |- MHAKVCache      store_kv / k_cache / v_cache                         (the K/V themselves)
      '- the model       prefill / decode                                     (reads K/V back by slot)

The model is any :class:`~minikv.models.PagedModel`: the course's random
``TinyDecoder`` or a real Llama (:func:`~minikv.models.load_smollm2`).

A request goes through

1. **admission** (``Engine._admit``): match ``ids[:-1]`` (a server must compute
   at least the last token to get its logits; the match is page-aligned), check
   that the uncached suffix fits, lock the match, check *again* (locking made
   our own match unevictable, exactly as mini-sglang's ``PrefillAdder`` does),
   then allocate -- evicting unlocked prefixes if the pool is short;
2. **prefill**: the uncached suffix is computed, its K/V written through
   ``store_kv``; the last position's logits give the first new token;
3. **decode**, one token per step: a slot for the token fed in (a new page only
   when the request's last page is full), its K/V written, attention over the
   request's slots read back through the cache;
4. **release** (``Engine._release``), when it finishes (stop token or
   budget): the tokens whose K/V exist (prompt and generated) are inserted into
   the tree, the slots the tree did not take (duplicates of what another request
   inserted meanwhile, and a partial last page) are freed by the rule
   :func:`minikv.lifecycle.finish` uses (:func:`~minikv.lifecycle.slots_to_free`),
   and the lock is released.

**Statistics.** The loop neither counts nor times itself: ``Engine.stats``
is kept by a :class:`~minikv.engine_stats.StatsRecorder`, which wraps a few of
this engine's methods (:mod:`minikv.engine_stats` lists which).

**Scheduling.** Which waiting request goes first is the policy's choice
(:mod:`minikv.scheduling`): at the start of each step the engine asks its
policy to order the waiting queue, then admits from the front until a request
does not fit. The default, :class:`~minikv.scheduling.FCFS`, keeps arrival order.

**Admission.** How much room admission keeps for decode is the admission
policy's choice (:mod:`minikv.admission`): before admitting a request the engine
asks it how many slots must stay available beyond the request's uncached prompt.
The default, :class:`~minikv.admission.Optimistic`, holds back one page per
running request, as described below.

**Preemption.** When decode cannot get a slot even after evicting every unlocked
prefix, the newest running request is preempted (as nano-vllm does) and put back
at the front of the waiting queue. Preemption *inserts its finished prefix
first*, through the same ``Engine._release`` a finished request takes,
rather than freeing its slots: one code path instead of two, and the K/V it
computed become an ordinary unlocked prefix. Whether that pays depends on what
the allocation that needed the room evicts next: least recently used leaves,
whole. The victim's leaf is the newest, so older unlocked leaves go first and
the resume matches its generated tokens back; when it is all there is to
evict, it goes whole and the resume recomputes what it had generated (as if its
slots had been freed, plus one insert). With pages, releasing also frees the
victim's partial last page at once. Either way it resumes by prefilling
prompt + generated tokens, so greedy decoding continues exactly where it stopped. To keep the oldest requests moving,
admission holds back one page per running request for its next decode.

**Overlap** (``overlap=True``). mini-sglang prepares batch N+1 on the CPU while
the GPU runs batch N. This engine imitates that: a batch is *launched* when it
is scheduled and *runs* only when its results are collected, one step later,
reading the token ids and slots it needs from the device-side tables
(``token_pool``, ``req_to_token``) at that moment. So the scheduler decides
batch N+1 before it knows batch N's tokens: a request that hit a stop token in
batch N has already been scheduled into N+1 (its extra token is dropped), and
a request whose budget runs out in batch N is released only after N's results
are in -- one step late. :class:`EarlyFreeEngine`, below the engine, releases
it as soon as the scheduler knows it is done instead; its row of
``req_to_token`` then goes to the next request while batch N has not yet read
it, and batch N computes the last token from someone else's slots (chapter 6
and the tests show the wrong output).
When decode would need a preemption, overlap mode first collects the batch in
flight (its results may free enough) and then schedules as the plain loop does.

**Chunked prefill** (``prefill_budget=N``). Without a budget a step runs either
one prefill batch or one decode batch, and a long prompt's prefill holds every
running request's next token back for that step. With a budget, each step
computes at most ``N`` prompt tokens, beside a decode step of every request
whose prompt is done (vLLM and SGLang's mixed batches): decode is scheduled
first, then the prompts being prefilled continue (oldest first), then new
requests are admitted while the budget lasts. Admission still allocates a
prompt's pages at once (so a chunk never runs dry halfway); only the compute is
spread over steps. After each chunk its whole pages go into the tree
(``Engine._insert_unfinished``, SGLang's ``cache_unfinished_req``), so a request
arriving meanwhile matches them, and a preemption mid-prompt keeps them. Only the
chunk that ends the prompt gives a token. With ``overlap=True`` a prompt's next
chunk is scheduled while the previous one is in flight: chunks write disjoint
positions and run in order, so nothing waits for them.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._validate import as_count, as_positive, as_token_ids
from .admission import AdmissionPolicy, as_admission
from .base import BaseCacheHandle, BaseCacheManager, BaseKVCache
from .engine_stats import EngineStats, StatsRecorder
from .errors import ArgumentError, ArgumentTypeError, IntegrityError, OutOfSlotsError, StepLimitError
from .integrity import tree_slots
from .language import tr
from .lifecycle import slots_to_free
from .models.base import PagedModel, check_cache_fits
from .naive_manager import NaiveCacheManager
from .page_pool import PagePool
from .radix_manager import RadixCacheManager
from .scheduling import SchedulingPolicy, as_policy

if TYPE_CHECKING:
    from .lifecycle_engine import AdmitFunction, FinishFunction
    from .mha_pool import StoreFunction


class Status(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class EngineRequest:
    """A prompt, a budget of new tokens, and the stop tokens that end it early (greedy sampling).

    ``output`` holds the generated tokens (a stop token included, as the last
    one). The rest is the scheduler's bookkeeping, readable for drawings and tests.
    """

    def __init__(
        self, prompt: torch.Tensor | np.ndarray | Sequence[int], max_new_tokens: int, stop_tokens: Iterable[int] = ()
    ) -> None:
        # A copy: a server that reuses its input buffer after submit() must not change what is cached.
        self.prompt = as_token_ids(prompt, "prompt").copy()
        if len(self.prompt) == 0:
            raise ArgumentError("prompt must hold at least one token")
        self.max_new_tokens = as_positive(max_new_tokens, "max_new_tokens")
        try:
            stops = list(stop_tokens)
        except TypeError:
            raise ArgumentTypeError(f"stop_tokens must be a list of ints, got {type(stop_tokens).__name__}") from None
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in stops):
            raise ArgumentTypeError("stop_tokens must contain only ints")
        self.stop_tokens = frozenset(int(t) for t in stops)
        self.output: list[int] = []
        self.status = Status.NEW
        self.uid = -1
        """Set by :meth:`Engine.submit`: the order of arrival."""
        # -- while it holds memory --
        self.handle: BaseCacheHandle | None = None
        """Its locked match: the first ``handle.cached_len`` slots of its row belong to the tree."""
        self.row = -1
        """Its row of ``req_to_token`` (-1 when it holds none)."""
        self.num_slots = 0
        """Slots in its row: whole pages, so it may be ahead of ``kv_len``."""
        self.kv_len = 0
        """Tokens whose K/V are written, or will be once the batch in flight has run."""
        self.prefill_len = 0
        """Tokens its prefill must compute up to before it decodes (its length at admission)."""
        self.num_scheduled = 0
        """New tokens that will exist once every scheduled batch has run (ahead of ``output`` when overlapping)."""
        # -- for the statistics --
        self.cached_tokens = -1
        """Prompt tokens served from the cache at its first admission (-1 until admitted)."""
        self.num_preemptions = 0
        self.admissions: list[int] = []
        """The cached length each admission matched (more than one after a preemption)."""
        self.waited_steps = 0
        """Steps spent in the waiting queue, after a preemption too (:class:`~minikv.scheduling.Aging` reads it)."""

    @property
    def token_ids(self) -> np.ndarray:
        """Prompt, then the tokens generated so far."""
        return np.concatenate([self.prompt, np.asarray(self.output, dtype=np.int64)])

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def prefilling(self) -> bool:
        """Admitted, but not every prompt chunk is scheduled yet (only with a ``prefill_budget``)."""
        return self.row >= 0 and self.kv_len < self.prefill_len

    @property
    def cached_len(self) -> int:
        """Leading tokens of its row that the tree owns (its locked match); 0 when it holds nothing."""
        return self.handle.cached_len if self.handle is not None else 0

    def _done_after(self, token: int) -> bool:
        return token in self.stop_tokens or len(self.output) >= self.max_new_tokens

    def __repr__(self) -> str:
        return (
            f"EngineRequest(uid={self.uid}, {self.status.value}, prompt={len(self.prompt)} tokens, "
            f"output={len(self.output)}/{self.max_new_tokens})"
        )


@dataclass
class Batch:
    """One step's work: a prefill of suffixes (or chunks of them), a decode of one token per request, or both."""

    kind: str
    """``"prefill"``, ``"decode"``, or ``"mixed"`` (a prefill and a decode batch in one step: see ``parts``)."""
    requests: list[EngineRequest]
    rows: list[int]
    starts: list[int]
    """Prefill: the first computed position (the cached length). Decode: the position of the token fed in."""
    ends: list[int]
    """Tokens attended over once this batch has run (prefill: the row so far; decode: start + 1)."""
    parts: tuple[Batch, ...] = field(default=())
    """Mixed: the prefill batch and the decode batch, run one after the other."""

    def gives_token(self, index: int) -> bool:
        """Whether the request at ``index`` gets a token (from a prefill, only the chunk that ends its prompt)."""
        return self.kind == "decode" or self.ends[index] == self.requests[index].prefill_len


class Engine:
    """A waiting queue, a running batch, and a step that runs one batch.

    ``max_running`` bounds the running batch (and the rows of ``req_to_token``).
    ``insert_after_prefill`` shares a request's prompt pages as soon as they are
    prefilled, as mini-sglang and SGLang do; without it a prompt is cached only
    when its request finishes, so requests running side by side never share.
    ``overlap`` schedules one step ahead, as described in the module docstring.
    ``policy`` orders the waiting queue before admission (a
    :class:`~minikv.scheduling.SchedulingPolicy` or its name, :func:`~minikv.scheduling.as_policy`).
    ``admission`` decides how much room admission keeps for decode (an
    :class:`~minikv.admission.AdmissionPolicy` or its name, :func:`~minikv.admission.as_admission`).
    ``prefill_budget`` (None, or a number of tokens) turns on chunked prefill: at
    most that many prompt tokens are computed per step, beside the decode of the
    running requests (see the module docstring); None prefills each admitted
    prompt whole, in a step of its own.
    ``stats`` counts and times what it does (:class:`~minikv.engine_stats.EngineStats`).
    """

    def __init__(
        self,
        model: PagedModel,
        cache: BaseCacheManager,
        pool: PagePool,
        kv_cache: BaseKVCache,
        max_running: int = 8,
        overlap: bool = False,
        insert_after_prefill: bool = True,
        policy: SchedulingPolicy | str = "fcfs",
        admission: AdmissionPolicy | str = "optimistic",
        prefill_budget: int | None = None,
    ) -> None:
        check_model(model)
        if not isinstance(cache, BaseCacheManager) or not isinstance(pool, PagePool):
            raise ArgumentTypeError("cache must be a BaseCacheManager and pool a PagePool")
        check_cache_fits(model, kv_cache)
        pages, page_size = kv_cache.k_cache(0).shape[:2]
        if cache.page_size != pool.page_size or pool.page_size != page_size or pool.num_pages != pages:
            raise ArgumentError(
                f"cache (page_size {cache.page_size}), pool ({pool.num_pages} pages of {pool.page_size}) and "
                f"kv_cache ({pages} pages of {page_size}) must agree"
            )
        self.model, self.cache, self.pool, self.kv_cache = model, cache, pool, kv_cache
        self.page_size = pool.page_size
        self.max_running = as_positive(max_running, "max_running")
        self.overlap = _as_flag(overlap, "overlap")
        self.insert_after_prefill = _as_flag(insert_after_prefill, "insert_after_prefill")
        self.policy = as_policy(policy)
        self.admission = as_admission(admission)
        self.prefill_budget = as_prefill_budget(prefill_budget)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        """Oldest admission first: preemption takes the last."""
        self.finished: list[EngineRequest] = []
        # Device-side tables, as in mini-sglang: the token ids and the slots of each running request.
        # A row of token ids holds up to max_positions tokens and the one generated after them;
        # a row of slots holds whole pages, so it may need more than max_positions slots.
        self.token_pool = torch.zeros(self.max_running, model.max_positions + 1, dtype=torch.int64, device=model.device)
        slots_width = pool.pages_for(model.max_positions) * self.page_size
        self.req_to_token = torch.zeros(self.max_running, slots_width, dtype=torch.int32, device=pool.device)
        self._free_rows = list(range(self.max_running - 1, -1, -1))
        self._holders: dict[int, EngineRequest] = {}
        """Row -> the request holding it (running, or finished and waiting for its batch to be collected)."""
        self._in_flight: Batch | None = None
        self._next_uid = 0
        self.stats: EngineStats = StatsRecorder().attach(self)

    # -- the public loop ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> EngineRequest:
        """Queue a request. Refused with a clear error, changing nothing, if it could never be served."""
        self._check_request(request)
        request.uid, self._next_uid = self._next_uid, self._next_uid + 1
        request.status = Status.WAITING
        self.waiting.append(request)
        return request

    def _check_request(self, request: EngineRequest) -> None:
        if not isinstance(request, EngineRequest):
            raise ArgumentTypeError(f"request must be an EngineRequest, got {type(request).__name__}")
        if request.status is not Status.NEW:
            raise ArgumentError(f"request: {request!r} was already submitted")
        longest = check_fits_model(self.model, request)
        if self.pool.pages_for(longest) > self.pool.num_pages:
            raise ArgumentError(
                f"prompt: {len(request.prompt)} tokens + {request.max_new_tokens} new need "
                f"{self.pool.pages_for(longest)} pages; the pool can never hold more than {self.pool.num_pages}"
            )

    def has_work(self) -> bool:
        return bool(self.waiting or self.running) or self._in_flight is not None

    def step(self) -> Batch | None:
        """Schedule and run one batch (overlap: launch one, collect the previous). Returns what was scheduled."""
        batch = self._schedule()
        if self.overlap:
            previous, self._in_flight = self._in_flight, batch
            if previous is not None:
                self._collect(previous)
        elif batch is not None:
            self._collect(batch)
        return batch

    def run(self, max_steps: int = 100_000) -> list[EngineRequest]:
        """Step until every request has finished; returns them in the order they finished.

        Raises :class:`~minikv.errors.StepLimitError` if work is left after ``max_steps`` steps.
        """
        max_steps = as_count(max_steps, "max_steps")
        for _ in range(max_steps):
            if not self.has_work():
                return self.finished
            self.step()
        if self.has_work():
            raise StepLimitError(f"max_steps: the engine did not finish within {max_steps} steps")
        return self.finished

    def generate(
        self,
        prompts: Iterable[torch.Tensor | np.ndarray | Sequence[int]],
        max_new_tokens: int,
        stop_tokens: Iterable[int] = (),
    ) -> list[list[int]]:
        """Submit one request per prompt, run them all, and return each one's generated tokens."""
        stops = _as_list(stop_tokens, "stop_tokens")
        requests = [EngineRequest(p, max_new_tokens, stops) for p in _as_list(prompts, "prompts")]
        for request in requests:  # all checked before any is queued
            self._check_request(request)
        for request in requests:
            self.submit(request)
        self.run()
        return [r.output for r in requests]

    def check(self) -> None:
        """Every slot free, in the tree, or held by a request, exactly once; then the manager's own check.

        Each request holding a row must also read: tree-owned prefix, then computed tokens, then
        slots (``cached_len <= kv_len <= num_slots``), its prompt's slots all allocated at admission.
        """
        for request in self._holders.values():
            if not request.cached_len <= request.kv_len <= request.num_slots or request.prefill_len > request.num_slots:
                raise IntegrityError(
                    "request bookkeeping",
                    f"{request!r}: cached_len {request.cached_len}, kv_len {request.kv_len}, prefill_len "
                    f"{request.prefill_len}, num_slots {request.num_slots}: need cached_len <= kv_len <= num_slots "
                    "and prefill_len <= num_slots",
                )
        free = self.pool.free_slots()
        tree = tree_slots(self.cache)
        held = [self.req_to_token[r.row, r.cached_len : r.num_slots] for r in self._holders.values()]
        every = torch.cat([free.cpu(), tree.cpu(), *(h.cpu() for h in held)]).long()
        num_slots = self.pool.num_slots
        if len(every) != num_slots or len(torch.unique(every)) != num_slots:
            counts = torch.bincount(every, minlength=num_slots)
            missing = torch.nonzero(counts == 0).flatten().tolist()[:5]
            twice = torch.nonzero(counts > 1).flatten().tolist()[:5]
            raise IntegrityError(
                "slot accounting",
                f"{len(free)} free + {len(tree)} in the tree + {sum(len(h) for h in held)} held != {num_slots}; "
                f"never held: {missing}, held twice: {twice}",
            )
        self.cache.check_integrity()

    # -- scheduling ----------------------------------------------------------------------------

    def _schedule(self) -> Batch | None:
        if self.prefill_budget is None:
            return self._schedule_prefill() or self._schedule_decode()
        # Chunked: the running requests decode, and the budget's prompt tokens are prefilled beside them.
        decode = self._schedule_decode()
        prefill = self._schedule_prefill()
        if decode is None or prefill is None:
            return prefill or decode
        parts = (prefill, decode)
        return Batch(
            "mixed",
            [r for b in parts for r in b.requests],
            [row for b in parts for row in b.rows],
            [start for b in parts for start in b.starts],
            [end for b in parts for end in b.ends],
            parts,
        )

    def _retiring(self, request: EngineRequest) -> bool:
        """Its last token is in the batch in flight: it needs no more decode (overlap only)."""
        return request.num_scheduled >= request.max_new_tokens

    def _schedule_prefill(self) -> Batch | None:
        budget = self.prefill_budget
        chunks: list[tuple[EngineRequest, int]] = []  # each request, and where its chunk starts
        for request in self.running:  # prompts already being prefilled go on first, oldest first
            if request.prefilling and budget != 0:
                chunks.append((request, request.kv_len))
                budget = self._take_chunk(request, budget)
        self._order_waiting()
        while budget != 0 and self.waiting and len(self.running) < self.max_running and self._free_rows:
            request = self.waiting[0]
            # The admission policy says how much room to keep for decode beyond this prompt.
            if not self._admit(request, self.admission.reserve(self.running, request, self.page_size)):
                break
            self.waiting.popleft()
            self.running.append(request)
            chunks.append((request, request.kv_len))
            budget = self._take_chunk(request, budget)
        for request in self.waiting:
            request.waited_steps += 1
        if not chunks:
            return None
        requests, starts = [r for r, _ in chunks], [start for _, start in chunks]
        return Batch("prefill", requests, [r.row for r in requests], starts, [r.kv_len for r in requests])

    def _take_chunk(self, request: EngineRequest, budget: int | None) -> int | None:
        """Schedule the next chunk of its prompt (all of it without a budget); returns the budget left."""
        size = request.prefill_len - request.kv_len
        if budget is not None:
            size = min(size, budget)
            budget -= size
        request.kv_len += size
        return budget

    def _order_waiting(self) -> None:
        """Put the waiting queue in the policy's order (in place); refused unless it is the same requests."""
        if not self.waiting:
            return
        ordered = self.policy.order(list(self.waiting), self.cache)
        if not isinstance(ordered, list):
            raise ArgumentTypeError(f"policy: {self.policy!r}.order must return a list, got {type(ordered).__name__}")
        if len(ordered) != len(self.waiting) or {id(r) for r in ordered} != {id(r) for r in self.waiting}:
            raise ArgumentError(f"policy: {self.policy!r} must return the waiting requests, each once, reordered")
        self.waiting.clear()
        self.waiting.extend(ordered)

    def _admit(self, request: EngineRequest, reserve: int) -> bool:
        """Reserve its memory, then give it a row. False (and nothing held) if it does not fit now."""
        ids = request.token_ids
        reserved = self._reserve(ids, reserve)
        if reserved is None:
            return False
        handle, matched, new_slots = reserved
        cached = handle.cached_len
        row = self._free_rows.pop()
        self.req_to_token[row, :cached] = matched
        self.req_to_token[row, cached : cached + len(new_slots)] = new_slots
        self.token_pool[row, : len(ids)] = torch.from_numpy(ids)  # the host copies the ids to the device
        self._holders[row] = request
        request.handle, request.row, request.num_slots = handle, row, cached + len(new_slots)
        request.kv_len, request.prefill_len = cached, len(ids)  # its prefill schedules the rest
        request.num_scheduled = len(request.output) + 1
        request.status = Status.RUNNING
        if request.cached_tokens < 0:
            request.cached_tokens = cached
        request.admissions.append(cached)
        return True

    def _reserve(self, ids: np.ndarray, reserve: int) -> tuple[BaseCacheHandle, torch.Tensor, torch.Tensor] | None:
        """Match, check, lock, re-check, allocate: the locked match, its slots and whole new pages, or None."""
        handle, matched = self.cache.match_prefix(torch.from_numpy(ids[:-1]))  # at least one token is computed
        needed = self.pool.pages_for(len(ids) - handle.cached_len) * self.page_size  # whole pages
        if needed + reserve > self._available():
            return None
        self.cache.lock_handle(handle)
        if needed + reserve > self._available():  # our own match is no longer evictable
            self.cache.lock_handle(handle, unlock=True)
            return None
        return handle, matched, self.pool.allocate(needed, evict_from=self.cache)

    def _schedule_decode(self) -> Batch | None:
        preempted = 0
        while True:
            requests = [r for r in self.running if not (self._retiring(r) or r.prefilling)]
            if not requests:
                return None
            # A request whose last page is full needs a new one (with page_size 1: every step).
            needed = self.page_size * sum(r.kv_len == r.num_slots for r in requests)
            if needed <= self._available():
                break
            if self._in_flight is not None:
                self._drain()  # its results may finish requests and free their slots
            elif len(self.running) > 1:  # the newest goes, even if it is still prefilling
                self._preempt(self.running[-1])
                preempted += 1
            else:  # cannot happen: submit() refuses a request the pool could never hold alone
                raise OutOfSlotsError(f"decode: {needed} slots needed, {self._available()} free or evictable")
        positions = []
        for request in requests:
            if request.kv_len == request.num_slots:
                page = self._new_page()
                self.req_to_token[request.row, request.num_slots : request.num_slots + self.page_size] = page
                request.num_slots += self.page_size
            positions.append(request.kv_len)  # the token fed in: the last one generated
            request.kv_len += 1
            request.num_scheduled += 1
        self.admission.decoded(preempted)
        return Batch("decode", requests, [r.row for r in requests], positions, [p + 1 for p in positions])

    def _preempt(self, request: EngineRequest) -> None:
        """Give back everything the newest request holds (its computed prefix goes to the tree) and requeue it."""
        self.running.remove(request)
        self._release(request)
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _new_page(self) -> torch.Tensor:
        """One page for a decode step, evicting an unlocked prefix if none is free."""
        return self.pool.allocate(self.page_size, evict_from=self.cache)

    def _available(self) -> int:
        return self.pool.num_free_slots + self.cache.size_info.evictable_size

    # -- running a batch (the "device" side) ----------------------------------------------------

    def _run(self, batch: Batch) -> list[int | None]:
        """The forward pass. It reads ids and slots from the device tables *now*, as a GPU would."""
        if batch.kind == "prefill":
            tokens: list[int | None] = []
            for index, (row, start, end) in enumerate(zip(batch.rows, batch.starts, batch.ends, strict=True)):
                ids, slots = self.token_pool[row, :end], self.req_to_token[row, :end]
                logits = self.model.prefill(ids, self.kv_cache, slots, start)
                if not batch.gives_token(index):
                    tokens.append(None)  # a chunk that does not end the prompt: its K/V are all it is for
                    continue
                token = int(logits[-1].argmax())
                tokens.append(token)
                self.token_pool[row, end] = token
        else:
            rows = torch.tensor(batch.rows)
            positions = torch.tensor(batch.starts)
            ids = self.token_pool[rows, positions]
            out_loc = self.req_to_token[rows, positions]
            tables = [self.req_to_token[row, :end] for row, end in zip(batch.rows, batch.ends, strict=True)]
            logits = self.model.decode(ids, batch.starts, self.kv_cache, out_loc, tables)
            next_ids = logits.argmax(dim=-1)
            self.token_pool[rows, positions + 1] = next_ids
            tokens = next_ids.tolist()  # the one transfer to the host per step
        return tokens

    def _collect(self, batch: Batch) -> None:
        """Run the batch, then hand each request its token; finished requests are released."""
        if batch.kind == "mixed":
            for part in batch.parts:
                self._collect(part)
            return
        tokens = self._run(batch)
        for request, token in zip(batch.requests, tokens, strict=True):
            if request.finished or token is None:
                continue  # it hit a stop token one batch earlier, or its prompt is not done
            request.output.append(token)
            if request._done_after(token):
                request.status = Status.FINISHED
                if request in self.running:
                    self.running.remove(request)
                self.finished.append(request)
        if batch.kind == "prefill" and self.insert_after_prefill:
            for request, end in zip(batch.requests, batch.ends, strict=True):
                if not request.finished and request.row >= 0:
                    self._insert_unfinished(request, end)
        # Release only what no launched batch still reads: one step late when overlapping.
        in_flight = self._in_flight.requests if self._in_flight is not None else []
        for request in batch.requests:
            if request.finished and request.row >= 0 and request not in in_flight:
                self._release(request)

    def _insert_unfinished(self, request: EngineRequest, end: int) -> int:
        """Share a running request's prefilled pages at once (mini-sglang's ``cache_req(finished=False)``).

        Insert the whole pages of its first ``end`` tokens, then match them back:
        where another request inserted the same tokens first, the tree's slots
        replace ours in the request's row and ours are freed (SGLang remaps the
        row too; freeing without remapping is mini-sglang's open bug #142). The
        lock moves from the old match to the new, longer one. Returns how many
        slots were freed that way (tokens computed twice).
        """
        assert request.handle is not None
        aligned = end - end % self.page_size
        cached = request.cached_len
        if aligned <= cached:
            return 0  # no new whole page to share
        slots = self.req_to_token[request.row, :aligned].clone()
        ids = torch.from_numpy(request.token_ids[:aligned])
        already = self.cache.insert_prefix(ids, slots, handle=request.handle)
        handle, cached_slots = self.cache.match_prefix(ids)
        self.cache.lock_handle(handle)
        self.cache.lock_handle(request.handle, unlock=True)
        # Of the slots the new match covers, free what the tree did not take from us. The request
        # keeps the rest (the naive manager keeps nothing: its match is empty, nothing is freed).
        duplicates = slots_to_free(slots[: handle.cached_len], cached, already, self.page_size)
        self.pool.free(duplicates)
        self.req_to_token[request.row, : handle.cached_len] = cached_slots
        request.handle = handle
        return len(duplicates)

    def _drain(self) -> None:
        batch, self._in_flight = self._in_flight, None
        if batch is not None:
            self._collect(batch)

    # -- giving memory back ----------------------------------------------------------------------

    def _release(self, request: EngineRequest) -> None:
        """Insert the tokens whose K/V exist, free what the tree did not take, unlock (the lifecycle's finish)."""
        assert request.handle is not None
        kv = min(request.kv_len, len(request.prompt) + len(request.output))
        slots = self.req_to_token[request.row, : request.num_slots].clone()
        already = self.cache.insert_prefix(torch.from_numpy(request.token_ids[:kv]), slots[:kv], handle=request.handle)
        self.pool.free(slots_to_free(slots[:kv], request.cached_len, already, self.page_size))
        self.pool.free(slots[self.pool.pages_for(kv) * self.page_size :])  # whole pages reserved, never written
        self.cache.lock_handle(request.handle, unlock=True)
        del self._holders[request.row]
        self._free_rows.append(request.row)
        request.handle, request.row, request.num_slots, request.kv_len = None, -1, 0, 0


class EarlyFreeEngine(Engine):
    """The hazard chapter 6 shows: with ``overlap=True``, a request is released as soon as the
    scheduler knows it is done, before the batch in flight has read its row.

    Its row of ``req_to_token`` then goes to the next request while that batch
    still has to read it, and the batch computes the last token from someone
    else's ids and slots. Every slot stays accounted for (:meth:`Engine.check`
    passes); only the output is wrong. Not for serving.
    """

    def _schedule(self) -> Batch | None:
        for request in [r for r in self.running if self._retiring(r)]:
            self.running.remove(request)
            self._release(request)  # too early: the batch in flight has not read its row yet
        return super()._schedule()


def check_model(model: object) -> None:
    """Refuse, naming the argument, anything that is not a :class:`~minikv.models.PagedModel`."""
    if not isinstance(model, PagedModel):
        raise ArgumentTypeError(
            f"model must implement minikv.models.PagedModel (a TinyDecoder, a LlamaModel, ...), "
            f"got {type(model).__name__}"
        )


def check_fits_model(model: PagedModel, request: EngineRequest) -> int:
    """Refuse a request whose tokens are outside the model's vocabulary or which outgrows its positions.

    Returns the most tokens whose K/V the request will ever need: the last
    generated token is never fed back, so its K/V are never needed.
    """
    vocab = model.vocab_size
    if request.prompt.min() < 0 or request.prompt.max() >= vocab:
        raise ArgumentError(f"prompt: token ids must be in [0, {vocab})")
    if any(not 0 <= t < vocab for t in request.stop_tokens):
        raise ArgumentError(f"stop_tokens: token ids must be in [0, {vocab}), got {sorted(request.stop_tokens)}")
    longest = len(request.prompt) + request.max_new_tokens - 1
    if longest > model.max_positions:
        raise ArgumentError(
            f"prompt: {len(request.prompt)} tokens + {request.max_new_tokens} new exceed the model's "
            f"max_positions ({model.max_positions})"
        )
    return longest


def _as_list(values: Any, name: str) -> list[Any]:
    """An iterable argument as a list (read once: a generator is not consumed twice)."""
    if isinstance(values, (str, bytes)):
        raise ArgumentTypeError(f"{name} must be a list, got {type(values).__name__}")
    try:
        return list(values)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be a list, got {type(values).__name__}") from None


def as_prefill_budget(prefill_budget: object) -> int | None:
    """None (whole prompts) or the prompt tokens one step may compute (at least 1), else refused by name."""
    return None if prefill_budget is None else as_positive(prefill_budget, "prefill_budget")


def _as_flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def make_engine(
    model: PagedModel,
    num_pages: int,
    page_size: int = 1,
    manager: str | BaseCacheManager = "radix",
    max_running: int = 8,
    overlap: bool = False,
    insert_after_prefill: bool = True,
    engine_class: type[Engine] = Engine,
    policy: SchedulingPolicy | str = "fcfs",
    admission: AdmissionPolicy | str = "optimistic",
    prefill_budget: int | None = None,
    store: StoreFunction | None = None,
    admit: AdmitFunction | None = None,
    finish: FinishFunction | None = None,
) -> Engine:
    """An engine with a pool and K/V storage shaped for ``model``, around a cache manager.

    ``manager`` is ``"radix"`` or ``"naive"`` for a fresh minikv manager, or a manager of your
    own (an empty one, with ``page_size`` pages), such as the radix cache of exercise 5.
    ``engine_class`` builds a subclass of :class:`Engine` instead, such as :class:`EarlyFreeEngine`.
    ``policy`` orders the waiting queue (:func:`~minikv.scheduling.as_policy`: a policy or its name).
    ``admission`` keeps room for decode (:func:`~minikv.admission.as_admission`: a policy or its name).
    ``prefill_budget`` turns on chunked prefill (:class:`Engine`).
    ``store`` writes K/V with a store function of your own, such as exercise 3's kernel, instead of
    minikv's (:class:`~minikv.MHAKVCache`).
    ``admit`` and ``finish`` admit and release requests with functions of your own, such as exercise 2's:
    the engine is then a :class:`~minikv.lifecycle_engine.LifecycleEngine` (``engine_class`` must be
    ``Engine``, which becomes ``LifecycleEngine``, or a subclass of it).
    Every argument is checked before anything is built.
    """
    from .base import KVCacheLayout
    from .lifecycle_engine import LifecycleEngine, as_lifecycle
    from .mha_pool import MHAKVCache, as_store

    check_model(model)
    as_positive(num_pages, "num_pages")
    as_positive(page_size, "page_size")
    as_positive(max_running, "max_running")
    _as_flag(overlap, "overlap")
    _as_flag(insert_after_prefill, "insert_after_prefill")
    policy = as_policy(policy)
    admission = as_admission(admission)
    as_prefill_budget(prefill_budget)
    as_store(store)
    if not (isinstance(engine_class, type) and issubclass(engine_class, Engine)):
        raise ArgumentTypeError(f"engine_class must be Engine or a subclass, got {engine_class!r}")
    lifecycle: dict[str, Any] = {}
    if admit is not None or finish is not None:
        as_lifecycle(admit, finish)
        engine_class = LifecycleEngine if engine_class is Engine else engine_class
        if not issubclass(engine_class, LifecycleEngine):
            raise ArgumentError(
                tr("engine_class: admit and finish drive a LifecycleEngine, got {name}", name=engine_class.__name__)
            )
        lifecycle = {"admit": admit, "finish": finish}
    if isinstance(manager, BaseCacheManager):
        own_page_size = getattr(manager, "page_size", 1)
        if own_page_size != page_size:
            raise ArgumentError(f"manager: its page_size is {own_page_size}, the engine's is {page_size}")
        if manager.size_info.total_size:
            raise ArgumentError("manager: must be empty (its tree holds slots of another pool)")
        cache: BaseCacheManager = manager
    elif manager == "radix":
        cache = RadixCacheManager(model.device, page_size)
    elif manager == "naive":
        if page_size != 1:
            raise ArgumentError("manager: the naive manager works with page_size 1 only")
        cache = NaiveCacheManager(model.device)
    elif isinstance(manager, str):
        raise ArgumentError(f"manager must be 'radix' or 'naive', got {manager!r}")
    else:
        raise ArgumentTypeError(f"manager must be 'radix', 'naive' or a cache manager, got {type(manager).__name__}")
    pool = PagePool(num_pages, page_size, model.device)
    kv_cache = MHAKVCache(
        model.num_kv_heads,
        model.num_layers,
        model.head_dim,
        num_pages,
        model.dtype,
        KVCacheLayout.LayerFirst,
        model.device,
        page_size,
        store=store,
    )
    return engine_class(
        model, cache, pool, kv_cache, max_running, overlap, insert_after_prefill, policy, admission, prefill_budget,
        **lifecycle,
    )  # fmt: skip


def recompute(
    model: PagedModel,
    prompt: torch.Tensor | np.ndarray | Sequence[int],
    max_new_tokens: int,
    stop_tokens: Iterable[int] = (),
) -> list[int]:
    """Greedy generation with no cache at all: every step runs ``model.forward`` over the whole sequence.

    The yardstick: whatever the engine caches, shares, evicts or preempts, its
    output must equal this one, token for token.
    """
    check_model(model)
    request = EngineRequest(prompt, max_new_tokens, stop_tokens)
    check_fits_model(model, request)
    ids = request.token_ids.tolist()
    while True:
        token = int(model.forward(ids)[-1].argmax())
        ids.append(token)
        request.output.append(token)
        if request._done_after(token):
            return request.output
