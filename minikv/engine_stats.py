"""What an :class:`~minikv.engine.Engine` did, counted and timed beside the loop, not inside it.

The engine's methods read as the scheduler: they never count or time anything.
A :class:`StatsRecorder` keeps :class:`EngineStats` by wrapping a few of one
engine's methods (on that engine object only; the class is untouched). Each
wrapper calls the engine's own method, then records what it did:

=======================================================  ============================================
engine method                                            recorded
=======================================================  ============================================
``submit``                                               ``prompt_tokens``
``step``                                                 ``steps``, ``step_seconds``
``_admit`` (when it admits)                              ``cached_tokens``, ``prefill_tokens``
``_schedule_prefill``, ``_schedule_decode``              ``prefill_batches``, ``decode_batches``
``_preempt``                                             ``preemptions``
``_run``                                                 ``model_seconds``, ``prefill_seconds``,
                                                         ``decode_tokens``
``_reserve``, ``_new_page``                              ``cache_seconds``, ``evicted_slots``
``_insert_unfinished``, ``_release``                     ``cache_seconds``
=======================================================  ============================================

The cache-side methods (the last two lines) are the only ones that call the
cache manager and the pool, and none of them calls another, so no time is
counted twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Batch, Engine, EngineRequest


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
                cached = request.admissions[-1]
                stats.cached_tokens += cached
                stats.prefill_tokens += request.kv_len - cached
            return admitted

        def count_batches(field: str) -> Callable[..., Batch | None]:
            def scheduled(call: Callable[[], Batch | None]) -> Batch | None:
                batch = call()
                if batch is not None:
                    setattr(stats, field, getattr(stats, field) + 1)
                return batch

            return scheduled

        def preempt(call: Callable[..., None], request: EngineRequest) -> None:
            call(request)
            stats.preemptions += 1

        def run(call: Callable[..., list[int]], batch: Batch) -> list[int]:
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

        wrappers: dict[str, Callable[..., Any]] = {
            "submit": submit,
            "step": step,
            "_admit": admit,
            "_schedule_prefill": count_batches("prefill_batches"),
            "_schedule_decode": count_batches("decode_batches"),
            "_preempt": preempt,
            "_run": run,
            "_reserve": cache_side,
            "_new_page": cache_side,
            "_insert_unfinished": cache_side,
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
