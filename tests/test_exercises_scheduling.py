"""Exercise 6's checks (``minikv.exercises.scheduling``): the cached prefix, longest-prefix-first, aging.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``. The order mutants are the
slips a first policy makes: a wrong tie-break, a match one token too long, the tree ignored, a
match that stamps the tree, generated tokens forgotten.
"""

from __future__ import annotations

import pytest
import torch
from exercise_helpers import WrongAnswers, chapter_tests

from minikv.exercises import check

WRONG = WrongAnswers()
wrong = WRONG.register

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _match(cache, ids):
    return cache.find(ids[:-1])[1]


# -- scheduling.cached_prefix_len ---------------------------------------------------------------


@wrong("scheduling.cached_prefix_len")
def prefix_of_all_ids(cache, ids):
    return cache.find(ids)[1]  # one token too many when the whole prompt is cached


@wrong("scheduling.cached_prefix_len")
def prefix_by_match_prefix(cache, ids):
    handle, _ = cache.match_prefix(torch.from_numpy(ids[:-1]))  # right length, but it stamps and splits
    return handle.cached_len


@wrong("scheduling.cached_prefix_len")
def prefix_of_whole_nodes_only(cache, ids):
    _, matched, cut = cache.find(ids[:-1])
    return matched - (cut[1] if cut is not None else 0)  # forgets a match that ends inside a node


@wrong("scheduling.cached_prefix_len")
def prefix_not_page_aligned(cache, ids):
    _, matched, cut = cache.find(ids[:-1])
    if cut is None:
        return matched
    child, inside = cut
    start = matched - inside  # where the child's key starts in ids
    return start + child.get_match_len(ids[start : len(ids) - 1])  # counts a partial page too


# -- scheduling.lpm_order -----------------------------------------------------------------------


@wrong("scheduling.lpm_order")
def lpm_ignores_the_tree(waiting, cache):
    return list(waiting)


@wrong("scheduling.lpm_order")
def lpm_ties_reversed(waiting, cache):
    return sorted(waiting, key=lambda r: _match(cache, r.token_ids))[::-1]  # reversing flips equal matches too


@wrong("scheduling.lpm_order")
def lpm_ties_by_arrival_number(waiting, cache):
    return sorted(waiting, key=lambda r: (-_match(cache, r.token_ids), r.uid))  # a preempted request loses its place


@wrong("scheduling.lpm_order")
def lpm_match_one_token_too_long(waiting, cache):
    return sorted(waiting, key=lambda r: -cache.find(r.token_ids)[1])


@wrong("scheduling.lpm_order")
def lpm_prompt_only(waiting, cache):
    return sorted(waiting, key=lambda r: -_match(cache, r.prompt))  # forgets what a preempted request generated


@wrong("scheduling.lpm_order")
def lpm_by_match_prefix(waiting, cache):
    return sorted(waiting, key=lambda r: -cache.match_prefix(torch.from_numpy(r.token_ids[:-1]))[0].cached_len)


@wrong("scheduling.lpm_order")
def lpm_sorts_in_place(waiting, cache):
    waiting.sort(key=lambda r: -_match(cache, r.token_ids))
    return waiting


@wrong("scheduling.lpm_order")
def lpm_shortest_first(waiting, cache):
    return sorted(waiting, key=lambda r: _match(cache, r.token_ids))


@wrong("scheduling.lpm_order")
def lpm_longest_prompt_first(waiting, cache):
    return sorted(waiting, key=lambda r: -len(r.token_ids))  # ignores the tree, looks busy


@wrong("scheduling.lpm_order")
def lpm_drops_unmatched(waiting, cache):
    return [r for r in sorted(waiting, key=lambda r: -_match(cache, r.token_ids)) if _match(cache, r.token_ids)]


# -- scheduling.aging_order ---------------------------------------------------------------------


@wrong("scheduling.aging_order")
def aging_ignores_waiting(waiting, cache, tokens_per_step):
    return sorted(waiting, key=lambda r: -_match(cache, r.token_ids))


@wrong("scheduling.aging_order")
def aging_unscaled(waiting, cache, tokens_per_step):
    return sorted(waiting, key=lambda r: -(_match(cache, r.token_ids) + r.waited_steps))


@wrong("scheduling.aging_order")
def aging_ties_reversed(waiting, cache, tokens_per_step):
    return sorted(waiting, key=lambda r: _match(cache, r.token_ids) + tokens_per_step * r.waited_steps)[::-1]


@wrong("scheduling.aging_order")
def aging_by_arrival_number(waiting, cache, tokens_per_step):
    return sorted(waiting, key=lambda r: -(_match(cache, r.token_ids) - tokens_per_step * r.uid))


# -- correct alternatives, written differently from the solutions: they must pass -------------


def lpm_by_buckets(waiting, cache):
    """Group by match length, longest group first, each group in queue order."""
    groups: dict[int, list] = {}
    for request in waiting:
        ids = request.token_ids
        groups.setdefault(cache.find(ids[: len(ids) - 1])[1], []).append(request)
    return [r for length in sorted(groups, reverse=True) for r in groups[length]]


def aging_by_index(waiting, cache, tokens_per_step):
    """Sort by (priority, position) explicitly."""
    keyed = [(-(_match(cache, r.token_ids) + tokens_per_step * r.waited_steps), i, r) for i, r in enumerate(waiting)]
    return [r for _, _, r in sorted(keyed, key=lambda item: item[:2])]


def test_correct_alternatives_pass() -> None:
    for exercise_id, fn in [
        ("scheduling.lpm_order", lpm_by_buckets),
        ("scheduling.aging_order", aging_by_index),
        ("scheduling.cached_prefix_len", lambda cache, ids: int(cache.find(ids[: len(ids) - 1])[1])),
    ]:
        result = check(exercise_id, fn)
        assert result.passed, str(result)


def test_the_engine_cases_tell_the_policies_apart() -> None:
    """Ignoring the tree fails in the engine too, not only on the queues: FCFS computes more tokens."""
    result = check("scheduling.lpm_order", lpm_ignores_the_tree)
    failing = [case.description for case in result.cases if not case.passed]
    assert any(description.startswith("in the engine") for description in failing), failing
    starving = next(
        c for c in check("scheduling.aging_order", aging_ignores_waiting).cases if "keep arriving" in c.description
    )
    assert not starving.passed


def test_a_policy_that_changes_outputs_is_caught() -> None:
    """A policy that hands the engine a foreign request is refused with a sentence, not a crash."""

    def adds_a_request(waiting, cache):
        from minikv.engine import EngineRequest

        return [*waiting, EngineRequest([1], 1)]

    result = check("scheduling.lpm_order", adds_a_request)
    assert not result.passed
    assert "each exactly once" in result.smallest_failure.problem


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("scheduling", WRONG)
