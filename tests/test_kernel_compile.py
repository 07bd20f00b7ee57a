"""Every Triton kernel of the repository compiles for the GPUs learners have, checked without a GPU.

``triton.compile`` turns a kernel into PTX and a cubin for a *target* (a CUDA compute
capability), and needs no GPU to do it. The kernel is compiled exactly as a launch would
compile it: the launcher's own block sizes and arguments (:func:`plan_store_launch`,
:func:`store_kernel_arguments`), specialised by Triton's own rules (which integer
arguments are 1 or divisible by 16, which pointers are 16-byte aligned).

For each compile the test asserts that ``ptxas`` spills no register to local memory and,
since every row here is contiguous, that K and V are read and written as 16-byte vectors
(``ld.global.v4`` / ``st.global.v4`` in the PTX).

Targets: sm_75 (Colab's T4), sm_80 (A100), sm_89 (L4, RTX 40xx), sm_90 (H100/H200).
Head shapes, dtypes, slot dtypes and layouts are spread over the targets so that each target
compiles every head shape and the whole matrix covers every (dtype, slot dtype, layout) triple.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from minikv.kernels import plan_store_launch, store_kernel
from minikv.kernels.paged_attention import paged_decode_arguments, paged_decode_kernel, plan_block_n
from minikv.kernels.store import store_kernel_arguments

triton = pytest.importorskip("triton")
try:  # Triton's own compile-time pieces (3.9's layout): without them this test cannot rebuild a launch
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
except ImportError as error:  # pragma: no cover - another Triton layout
    pytest.skip(f"this Triton has another internal layout ({error})", allow_module_level=True)
if not hasattr(JITFunction, "_pack_args"):  # pragma: no cover - checked with Triton 3.9
    pytest.skip("this Triton packs launch arguments differently", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
CAPABILITIES = (75, 80, 89, 90)
HEAD_SHAPES = ((8, 128), (32, 128), (1, 64), (5, 96), (40, 128))
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
LAYOUTS = ("paged page-first layer", "fused QKV sources")
COMBOS = [(d, i, lay) for d in DTYPES for i in INDEX_DTYPES for lay in LAYOUTS]


@pytest.fixture(autouse=True)
def as_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch plans as a GPU machine makes them, where nothing asks for Triton's interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def compile_for(jit_fn: Any, capability: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What ``jit_fn[grid](*args, **kwargs)`` would compile on a GPU of ``capability``."""
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, dict(kwargs), bound, specialization, options)
    return triton.compile(ASTSource(jit_fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def ptxas_report(ptx: str, capability: int) -> str:
    """``ptxas -v`` on the PTX: registers, stack frame, spill stores and loads."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        result = subprocess.run(
            [get_ptxas(capability).path, "-v", f"--gpu-name={sm_arch_from_capability(capability)}", str(source),
             "-o", str(Path(folder) / "kernel.o")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return result.stdout + result.stderr


def assert_fast_code(compiled: Any, capability: int, what: str) -> None:
    report = ptxas_report(compiled.asm["ptx"], capability)
    assert "Used" in report and "registers" in report, f"{what}: no ptxas report:\n{report}"
    assert " 0 bytes spill stores, 0 bytes spill loads" in report, f"{what} spills registers:\n{report}"
    ptx = compiled.asm["ptx"]
    assert "ld.global.v4" in ptx, f"{what}: rows are not read as 16-byte vectors"
    assert "st.global.v4" in ptx, f"{what}: rows are not written as 16-byte vectors"


def store_case(heads: int, head_dim: int, dtype: torch.dtype, index_dtype: torch.dtype, layout: str, check: bool):
    """CPU tensors with the shapes, strides and alignment the engine's CUDA tensors would have."""
    n = 64
    if layout == "paged page-first layer":
        layers, pages, page_size = 4, 32, 16
        buffer = torch.empty(2, pages, layers, page_size, heads, head_dim, dtype=dtype).permute(0, 2, 1, 3, 4, 5)
        k_cache, v_cache = buffer[0, 1], buffer[1, 1]
        k, v = torch.empty(n, heads, head_dim, dtype=dtype), torch.empty(n, heads, head_dim, dtype=dtype)
    else:
        k_cache = torch.empty(512, 1, heads, head_dim, dtype=dtype)
        v_cache = torch.empty_like(k_cache)
        qkv = torch.empty(n, 3 * heads, head_dim, dtype=dtype)  # q, k, v heads side by side
        k, v = qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]
    indices = torch.arange(n, dtype=index_dtype)
    error_flag = torch.zeros(1, dtype=torch.int32) if check else None
    launch = plan_store_launch(n, heads, head_dim, "cuda")
    assert not launch.interpreted
    return store_kernel_arguments(k_cache, v_cache, indices, k, v, error_flag, launch)


MATRIX = [
    pytest.param(
        cap, heads, head_dim, *COMBOS[(a * len(HEAD_SHAPES) + s) % len(COMBOS)], (a + s) % 2 == 0,
        id=f"sm_{cap}-{heads}x{head_dim}-{COMBOS[(a * len(HEAD_SHAPES) + s) % len(COMBOS)][0]}".replace("torch.", ""),
    )
    for a, cap in enumerate(CAPABILITIES)
    for s, (heads, head_dim) in enumerate(HEAD_SHAPES)
]  # fmt: skip


def test_the_matrix_covers_every_combination() -> None:
    assert len(MATRIX) >= len(COMBOS)
    assert {tuple(p.values[3:6]) for p in MATRIX} == set(COMBOS)


@pytest.mark.parametrize(("capability", "heads", "head_dim", "dtype", "index_dtype", "layout", "check"), MATRIX)
def test_the_store_kernel_compiles_without_spills_to_vector_copies(
    capability: int, heads: int, head_dim: int, dtype: torch.dtype, index_dtype: torch.dtype, layout: str, check: bool
) -> None:
    args, kwargs = store_case(heads, head_dim, dtype, index_dtype, layout, check)
    compiled = compile_for(store_kernel.compiled, capability, args, kwargs)
    assert_fast_code(compiled, capability, f"store_kernel {heads}x{head_dim} {dtype} on sm_{capability}")


def _exercise_kernel() -> Any:
    """The reference ``store_kernel`` of exercise 3, taken from its solution file and decorated."""
    path = REPO / "exercises" / "solutions" / "ex3_storage.py"
    tree = ast.parse(path.read_text())
    (kernel,) = (node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "store_kernel")
    source = "import triton\nimport triton.language as tl\n\n\n" + ast.get_source_segment(path.read_text(), kernel)
    source = source.replace("def store_kernel", "@triton.jit\ndef store_kernel", 1)
    folder = Path(tempfile.mkdtemp())
    module_path = folder / "ex3_store_kernel.py"
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location("ex3_store_kernel", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.store_kernel


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm_{c}")
def test_the_exercise_reference_kernel_compiles(capability: int) -> None:
    jit_fn = _exercise_kernel()
    if not hasattr(jit_fn, "params"):  # TRITON_INTERPRET was set: Triton gave an interpreted function
        jit_fn = JITFunction(jit_fn.fn)
    heads, head_dim, n = 8, 128, 64
    k_cache = torch.empty(32, 16, heads, head_dim, dtype=torch.bfloat16)
    v_cache = torch.empty_like(k_cache)
    k, v = torch.empty(n, heads, head_dim, dtype=torch.bfloat16), torch.empty(n, heads, head_dim, dtype=torch.bfloat16)
    indices = torch.arange(n, dtype=torch.int32)
    # As the solution's launcher calls it on CUDA (BLOCK_T = 8).
    args = (k, v, k_cache, v_cache, indices, n, 16, heads, head_dim, *k.stride(), *v.stride(), *k_cache.stride())
    compiled = compile_for(jit_fn, capability, args, {"BLOCK_T": 8, "BLOCK_H": heads, "BLOCK_D": head_dim})
    assert_fast_code(compiled, capability, f"exercise 3's store_kernel on sm_{capability}")


# (heads, kv_heads, head_dim, dtype): Llama-8B-like GQA in bf16, odd heads in fp16, MHA in fp32.
DECODE_SHAPES = ((32, 8, 128, torch.bfloat16), (9, 3, 80, torch.float16), (8, 8, 64, torch.float32))


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "dtype"), DECODE_SHAPES, ids=lambda v: str(v))
def test_the_paged_attention_kernel_compiles_without_spills(
    capability: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    batch, pages, page_size, width = 4, 64, 16, 1024
    q = torch.empty(batch, heads, head_dim, dtype=dtype)
    k_cache = torch.empty(pages, page_size, kv_heads, head_dim, dtype=dtype)
    table = torch.zeros(batch, width, dtype=torch.int32)
    lens = torch.full((batch,), width, dtype=torch.int32)
    out = torch.empty_like(q)
    args, kwargs = paged_decode_arguments(q, k_cache, torch.empty_like(k_cache), table, lens, out)
    kwargs["BLOCK_N"] = plan_block_n(torch.device("cuda"))  # as a launch on a GPU plans it
    compiled = compile_for(paged_decode_kernel.compiled, capability, args, kwargs)
    report = ptxas_report(compiled.asm["ptx"], capability)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", report)  # ptxas omits the line when there are none
    assert "Used" in report and all(n == "0" for n in spills), (
        f"paged_decode_kernel spills on sm_{capability}:\n{report}"
    )
