"""The store tests in the configurations they must pass in, simulated on this machine.

A GPU machine differs from this one in two ways that matter to the store path: CUDA is
there, and nothing asks Triton for its interpreter (``TRITON_INTERPRET`` is unset or 0).
The tests that run the kernel on CPU tensors must pass there too: minikv runs the
kernel in the interpreter for CPU tensors by its own rule, not by that variable. This
file runs them again in a fresh process with ``TRITON_INTERPRET=0`` (the GPU machine's
setting) and with ``TRITON_INTERPRET=1`` set before anything is imported (what an
exercise notebook does on a CPU). The CUDA half of the GPU configuration needs a GPU:
``scripts/gpu_check.sh`` runs the same files there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AFFECTED = [
    "tests/test_store_kernel.py",
    "tests/test_mha_pool.py",
    "tests/test_bad_input.py",
    "tests/test_tiny_model.py",
    "tests/test_kernel_compile.py",
]


@pytest.mark.skipif("MINIKV_CONFIGURATION" in os.environ, reason="this is already the simulated run")
@pytest.mark.parametrize("interpret", ["0", "1"], ids=["interpreter-forced-off", "interpreter-forced-on"])
def test_the_store_tests_pass_in_this_configuration(interpret: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": interpret, "MINIKV_CONFIGURATION": interpret}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly", *AFFECTED]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"TRITON_INTERPRET={interpret}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and " failed" not in result.stdout
