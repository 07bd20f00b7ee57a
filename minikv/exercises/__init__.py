"""Checks for the exercise notebooks: ``check(exercise_id, fn)`` grades a learner's function or class.

    from minikv.exercises import check
    check("storage.slot_mapping", slot_mapping)   # a function: what passed, and the smallest failing case
    check("radix.evict", MyRadixCache)            # exercise 5 grades one method of your class
    check("storage.slot_mapping", slot_mapping, lang="zh")   # the report in Chinese

Each exercise runs real cases against minikv's own implementation: fresh
managers, pools and caches built for every case, several sizes, and the edge
cases that catch the usual mistakes.

What ``check`` promises, whatever the learner's code does:

* every exception it raises (a stub's ``NotImplementedError``, ``sys.exit()``, a
  ``BaseException`` subclass) is a failed case, never raised; only Ctrl-C stops ``check``;
  error messages are cut to a few hundred characters;
* a case that runs past the time limit (20 s) is stopped, even inside a bare ``except:``,
  and the remaining cases are not run: the limit is paid once per check (on Linux and
  macOS, in the main thread, as in Jupyter and Colab);
* afterwards minikv's functions, classes and module attributes, the signal handlers, the
  interval timer and the trace and profile functions are as they were before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..language import checked_language, language
from ..radix_manager import RadixCacheManager

# Each module registers its chapter's exercises; imported in chapter order, so that ids list in that order.
from . import _trees, blocks, capacity, lifecycle, naive, paged_attention, radix, scheduling, storage  # noqa: F401
from ._core import REGISTRY, run_check
from ._report import CaseResult, CheckResult


def check(exercise_id: str, fn: Callable[..., Any], *, lang: str | None = None) -> CheckResult:
    """Run every case of ``exercise_id`` against ``fn`` and return the verdict.

    In a notebook the result shows itself as a report; ``bool(result)`` and
    ``result.passed`` say whether every case passed. The report speaks ``lang``
    (``"en"`` or ``"zh"``), by default the language set with
    :func:`minikv.language.set_language`; it keeps that language when shown later.
    """
    if lang is None:
        return run_check(exercise_id, fn)
    with language(checked_language(lang, "lang")):
        return run_check(exercise_id, fn)


def tree_text(manager: RadixCacheManager) -> str:
    """A radix tree as indented text, one node per line: tokens, slots, ref_count and last-use time.

    The same drawing the radix checks print when a tree differs from the expected one.
    """
    return _trees.render(_trees.snapshot(manager))


def exercise_ids() -> list[str]:
    """Every exercise id, in chapter order."""
    return list(REGISTRY)


__all__ = ["CaseResult", "CheckResult", "check", "exercise_ids", "tree_text"]
