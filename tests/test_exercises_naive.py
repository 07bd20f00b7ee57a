"""Exercise 4's check of the naive manager (``minikv.exercises.naive``): subclasses that break one method.

Wrong answers (mutants) and how they run: ``exercise_helpers.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from exercise_helpers import S, WrongAnswers, chapter_tests

from minikv import NaiveCacheHandle, NaiveCacheManager
from minikv.exercises import check

WRONG = WrongAnswers()
wrong = WRONG.register


def _naive_variant(name: str, **overrides: Callable) -> type:
    return type(name, (S["NaiveManager"],), overrides)


WRONG["naive.manager"] = [
    _naive_variant("InsertReturnsZero", insert_prefix=lambda self, ids, indices: 0),
    _naive_variant("FloatEmptyTensor", match_prefix=lambda self, ids: (NaiveCacheHandle(0), torch.tensor([]))),
    _naive_variant("EvictPretends", evict=lambda self, size: self.no_slots()),
    _naive_variant("InsertTrustsLengths", insert_prefix=lambda self, ids, indices: len(indices)),
    _naive_variant(
        "InsertReturnsTokensCount", insert_prefix=lambda self, ids, indices: len(ids) - 1 if len(ids) else 0
    ),
]


class SharedEmptyTensor(S["NaiveManager"]):
    """The slip of issue 21: one empty tensor made in __init__ and returned by every method."""

    def __init__(self, device="cpu"):
        super().__init__(device)
        self.empty = torch.empty(0, dtype=torch.int32, device=self.device)

    def no_slots(self):
        return self.empty


WRONG["naive.manager"].append(SharedEmptyTensor)


def test_a_shared_empty_tensor_is_caught_by_its_own_case() -> None:
    result = check("naive.manager", SharedEmptyTensor)
    failure = result.smallest_failure
    assert failure is not None and "the caller's own" in failure.problem, str(result)
    assert "tensor([7, 7, 7]" in failure.got


class NaiveSubclass(NaiveCacheManager):
    """minikv's own manager under the learner's name: its methods are the reference's."""


WRONG["naive.manager"] += [NaiveCacheManager, NaiveSubclass]


def test_the_reference_under_another_name_is_refused() -> None:
    NaiveManager = NaiveCacheManager
    result = check("naive.manager", NaiveManager)
    assert not result.passed and "minikv's own answer" in result.smallest_failure.problem


def test_a_method_still_stubbed_is_named() -> None:
    def evict(self, size):
        raise NotImplementedError

    result = check("naive.manager", _naive_variant("NaiveManager", evict=evict))
    assert not result.passed and not result.not_written
    assert "`test_a_method_still_stubbed_is_named.<locals>.evict` still raises NotImplementedError" in str(result)


class HalfWritten(S["NaiveManager"]):
    def evict(self, size):
        raise NotImplementedError  # the stub, as a learner's class has it


def test_the_stub_method_of_a_class_is_named() -> None:
    result = check("naive.manager", HalfWritten)
    assert not result.passed and result.num_passed > 0
    assert "`HalfWritten.evict` still raises NotImplementedError: that method is still the stub" in str(result)


# issue 26: a device given as a torch.device, or with an index ----------------------------


class DeviceAsText(S["NaiveManager"]):
    """Takes the device apart as a string: fine for "cpu", a crash for torch.device("cpu")."""

    def __init__(self, device="cpu"):
        super().__init__(device.split(":")[0])


class DeviceIgnored(S["NaiveManager"]):
    """Every tensor on the CPU, whatever the manager was given (wrong on a GPU; on a CPU it passes)."""

    def no_slots(self):
        return torch.empty(0, dtype=torch.int32)


WRONG["naive.manager"].append(DeviceAsText)
if torch.cuda.is_available():
    WRONG["naive.manager"].append(DeviceIgnored)


# the two tests of every chapter (after the last wrong answer) -------------------------

test_the_solution_passes, test_a_wrong_answer_fails_with_a_readable_report = chapter_tests("naive", WRONG)
