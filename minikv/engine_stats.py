"""What an :class:`~minikv.engine.Engine` did, counted and timed beside the loop, not inside it.

The engine's methods read as the scheduler: they never count or time anything.
A :class:`StatsRecorder` keeps :class:`EngineStats` by wrapping a few of one
engine's methods (on that engine object only; the class is untouched). Each
wrapper calls the engine's own method, then records what it did:

=======================================================  ============================================
engine method                                            recorded
=======================================================  ============================================
``submit``                                               ``prompt_tokens``, ``requests``
``step``                                                 ``steps``, ``step_seconds``
``_admit`` (when it admits)                              ``cached_tokens``
``_schedule_prefill``, ``_schedule_decode``              ``prefill_batches``, ``decode_batches``,
                                                         ``prefill_tokens``
``_preempt``                                             ``preemptions``
``_collect``                                             ``requests`` (the step of each token)
``_run``                                                 ``model_seconds``, ``prefill_seconds``,
                                                         ``decode_tokens``
``_reserve``, ``_new_page``                              ``cache_seconds``, ``evicted_slots``
``_insert_unfinished``                                   ``cache_seconds``, ``duplicate_tokens``
``_release``                                             ``cache_seconds``
=======================================================  ============================================

Time in steps (the logical clock): each request's :class:`RequestSteps` keeps
the number of steps run before it was submitted and the step that gave each of
its tokens, so time to first token and the gaps between tokens are read off
without a clock.

The cache-side methods (the last two lines) are the only ones that call the
cache manager and the pool, and none of them calls another, so no time is
counted twice.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Batch, Engine, EngineRequest


@dataclass
class RequestSteps:
    """When one request arrived and when each of its tokens came, in steps of its engine."""

    submitted: int
    """Steps the engine had run when the request was submitted (its first chance is the next one)."""
    token_steps: list[int] = field(default_factory=list)
    """The step whose batch gave each generated token, in order (steps count from 1)."""

    @property
    def time_to_first_token(self) -> int | None:
        """Steps from submission to the step that gave the first token (None before it came)."""
        return self.token_steps[0] - self.submitted if self.token_steps else None

    @property
    def inter_token_gaps(self) -> list[int]:
        """Steps between consecutive tokens (1 when a token came every step)."""
        return [later - earlier for earlier, later in itertools.pairwise(self.token_steps)]


@dataclass
class EngineStats:
    """Counts and host times of one engine since it was built."""

    steps: int = 0
    prefill_batches: int = 0
    decode_batches: int = 0
    prompt_tokens: int = 0
    """Prompt tokens submitted."""
    prefill_tokens: int = 0
    """Tokens computed by prefill (resumed requests included)."""
    cached_tokens: int = 0
    """Tokens a prefill took from the cache instead of computing (resumed requests included)."""
    decode_tokens: int = 0
    preemptions: int = 0
    evicted_slots: int = 0
    step_seconds: float = 0.0
    """Host time inside :meth:`Engine.step <minikv.engine.Engine.step>`."""
    model_seconds: float = 0.0
    """Time in the model's forward passes."""
    prefill_seconds: float = 0.0
    """The part of ``model_seconds`` spent in prefill batches (what a prefix cache saves)."""
    cache_seconds: float = 0.0
    """Time in the engine's cache-side steps: match, lock and allocate (with eviction), insert, free."""
    duplicate_tokens: int = 0
    """Prefilled tokens whose pages another request had inserted first (the tree's copy kept, ours freed)."""
    requests: dict[int, RequestSteps] = field(default_factory=dict)
    """Each submitted request's steps, by its ``uid``."""

    def times_to_first_token(self) -> list[int]:
        """Time to first token, in steps, of each request that has one (in order of arrival)."""
        return [t for r in self.requests.values() if (t := r.time_to_first_token) is not None]

    def inter_token_gaps(self) -> list[int]:
        """Every gap between two consecutive tokens of a request, in steps, over all requests."""
        return [gap for r in self.requests.values() for gap in r.inter_token_gaps]


class StatsRecorder:
    """Keeps an engine's :class:`EngineStats` by wrapping the methods listed in the module docstring.

    ``Engine`` attaches one to itself when it is built (``engine.stats`` is its
    ``stats``); attaching a second recorder to the same engine records on top of
    the first, each into its own ``EngineStats``.
    """

    def __init__(self) -> None:
        self.stats = EngineStats()

    def attach(self, engine: Engine) -> EngineStats:
        """Wrap ``engine``'s methods; returns the stats they record into."""
        stats = self.stats

        def submit(call: Callable[..., EngineRequest], request: EngineRequest) -> EngineRequest:
            submitted = call(request)
            stats.prompt_tokens += len(submitted.prompt)
            stats.requests[submitted.uid] = RequestSteps(stats.steps)
            return submitted

        def step(call: Callable[[], Batch | None]) -> Batch | None:
            start = time.perf_counter()
            batch = call()
            stats.steps += 1
            stats.step_seconds += time.perf_counter() - start
            return batch

        def admit(call: Callable[..., bool], request: EngineRequest, reserve: int) -> bool:
            admitted = call(request, reserve)
            if admitted:
                stats.cached_tokens += request.admissions[-1]
            return admitted

        def count_batches(name: str) -> Callable[..., Batch | None]:
            def scheduled(call: Callable[[], Batch | None]) -> Batch | None:
                batch = call()
                if batch is not None:
                    setattr(stats, name, getattr(stats, name) + 1)
                    if batch.kind == "prefill":
                        stats.prefill_tokens += sum(batch.ends) - sum(batch.starts)
                return batch

            return scheduled

        def collect(call: Callable[..., None], batch: Batch) -> None:
            if batch.kind == "mixed":
                return call(batch)  # its parts are collected (and recorded) one by one
            before = [len(r.output) for r in batch.requests]
            call(batch)
            for request, had in zip(batch.requests, before, strict=True):
                if len(request.output) > had:  # inside a step: it is step number stats.steps + 1
                    stats.requests[request.uid].token_steps.append(stats.steps + 1)

        def preempt(call: Callable[..., None], request: EngineRequest) -> None:
            call(request)
            stats.preemptions += 1

        def run(call: Callable[..., list[int | None]], batch: Batch) -> list[int | None]:
            start = time.perf_counter()
            tokens = call(batch)
            elapsed = time.perf_counter() - start
            stats.model_seconds += elapsed
            if batch.kind == "prefill":
                stats.prefill_seconds += elapsed
            else:
                stats.decode_tokens += len(batch.requests)
            return tokens

        def cache_side(call: Callable[..., Any], *args: Any) -> Any:
            start, evicted_before = time.perf_counter(), engine.pool.num_evicted_slots
            try:
                return call(*args)
            finally:
                stats.cache_seconds += time.perf_counter() - start
                stats.evicted_slots += engine.pool.num_evicted_slots - evicted_before

        def insert_unfinished(call: Callable[..., int], *args: Any) -> int:
            duplicates: int = cache_side(call, *args)
            stats.duplicate_tokens += duplicates
            return duplicates

        wrappers: dict[str, Callable[..., Any]] = {
            "submit": submit,
            "step": step,
            "_admit": admit,
            "_schedule_prefill": count_batches("prefill_batches"),
            "_schedule_decode": count_batches("decode_batches"),
            "_preempt": preempt,
            "_collect": collect,
            "_run": run,
            "_reserve": cache_side,
            "_new_page": cache_side,
            "_insert_unfinished": insert_unfinished,
            "_release": cache_side,
        }
        for name, wrapper in wrappers.items():
            setattr(engine, name, _bind(wrapper, getattr(engine, name)))
        return stats


def _bind(wrapper: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with ``wrapper`` around it; keeps the method's name and docstring for help()."""

    def wrapped(*args: Any) -> Any:
        return wrapper(method, *args)

    wrapped.__name__, wrapped.__doc__ = method.__name__, method.__doc__
    return wrapped
