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


LEARNER_KERNEL_WITHOUT_INTERPRETER = """
import triton, triton.language as tl
from minikv.exercises import check

@triton.jit  # decorated without use_interpreter_without_cuda(): a kernel for a GPU
def store_kernel(k_ptr, kc_ptr, n, B: tl.constexpr):
    t = tl.arange(0, B)
    tl.store(kc_ptr + t, tl.load(k_ptr + t, mask=t < n), mask=t < n)

def store(k_cache, v_cache, indices, k, v):
    store_kernel[(1,)](k, k_cache, 1, B=16)

report = check("storage.store", store)
assert not report.passed
print(report)
"""


@pytest.mark.skipif("MINIKV_CONFIGURATION" in os.environ, reason="this is already the simulated run")
def test_a_learner_kernel_compiled_for_no_gpu_is_explained(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the kernel compiles")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    script = tmp_path / "learner.py"  # Triton reads a kernel's source from its file
    script.write_text(LEARNER_KERNEL_WITHOUT_INTERPRETER)
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "call minikv.kernels.use_interpreter_without_cuda() before defining" in done.stdout
