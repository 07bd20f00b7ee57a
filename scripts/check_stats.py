"""Per exercise id: cases drawn, CPU time of the reference solution, and the project's wrong answers caught.

    .venv/bin/python scripts/check_stats.py [ID_PREFIX ...]

The numbers issue 26 asks for: a check must draw enough inputs to catch its wrong answers and stay
within its time budget (``tests/test_exercises_core.py`` fails a check that runs past it). CPU time
is the better of two runs of ``check`` with the reference solution from ``exercises/solutions``;
the wrong answers are the ``WRONG`` lists of ``tests/test_exercises_<chapter>.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from exercise_helpers import all_wrong_answers, solution_for  # noqa: E402

from minikv.exercises import check, exercise_ids  # noqa: E402


def main(prefixes: list[str]) -> None:
    wrong = all_wrong_answers()
    print(f"{'exercise id':36} {'cases':>6} {'CPU s':>6}  wrong answers caught")
    for exercise_id in exercise_ids():
        if prefixes and not exercise_id.startswith(tuple(prefixes)):
            continue
        seconds = []
        for _ in range(2):
            start = time.process_time()
            result = check(exercise_id, solution_for(exercise_id))
            seconds.append(time.process_time() - start)
        assert result.passed, str(result)
        mutants = wrong.get(exercise_id, [])
        caught = sum(not check(exercise_id, fn).passed for fn in mutants)
        print(f"{exercise_id:36} {len(result.cases):6d} {min(seconds):6.2f}  {caught}/{len(mutants)}")


if __name__ == "__main__":
    main(sys.argv[1:])
