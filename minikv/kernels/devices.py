"""Where a Triton kernel runs, by one rule: where its tensors are.

* CUDA tensors: the kernel is compiled for the GPU they live on, and launched on that GPU.
* CPU tensors: the same kernel runs in Triton's *interpreter*, which executes its
  Python body with NumPy. It is exact and slow (about a millisecond per program).

The rule is the same on a machine with or without a GPU, and it needs no environment
variable: minikv hands the kernel's Python function to Triton's interpreter itself.
``import minikv`` changes nothing in the process, and does not even import Triton: a
kernel is handed to Triton the first time it is launched.

A kernel *you* write with ``@triton.jit`` is different: Triton reads ``TRITON_INTERPRET``
when the decorator runs, and again at the first launch. On a machine without CUDA, call
:func:`use_interpreter_without_cuda` before defining it (the exercise notebooks do).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from types import ModuleType
from typing import Any

import torch

from ..errors import TritonMissingError

_TRUE = ("1", "true", "on", "yes")


def triton_interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to interpret kernels decorated from now on.

    Read the way Triton reads it (``1``, ``true``, ``on`` or ``yes``, in any case), at the
    time of the call: nothing is remembered from import time.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


TRITON_MISSING = "Triton has no build for this system: do this part on Colab or Linux"


def require_triton() -> tuple[ModuleType, ModuleType]:
    """``(triton, triton.language)``, or :class:`~minikv.errors.TritonMissingError` where Triton is not installed.

    Triton has wheels for Linux only, so on macOS or Windows this raises, and a notebook shows one line,
    ``✗ Triton has no build for this system: do this part on Colab or Linux``, instead of a
    ``ModuleNotFoundError`` followed by a ``NameError`` in every later cell. Exercise 3's kernel cell
    starts with ``triton, tl = require_triton()``; minikv's own kernels call it at their first launch.
    """
    try:
        triton = importlib.import_module("triton")
        language = importlib.import_module("triton.language")
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "triton":
            raise  # Triton is there but one of its own imports is missing: that is a different problem
        raise TritonMissingError(f"{TRITON_MISSING} (no module named {error.name!r} here)", name=error.name) from None
    return triton, language


def use_interpreter_without_cuda() -> bool:
    """On a machine without CUDA, make Triton interpret the kernels decorated after this call.

    Sets ``TRITON_INTERPRET=1`` for this process (and its children) unless the variable is
    already set: an explicit ``TRITON_INTERPRET=0`` is respected. Does nothing where CUDA is
    available. Returns whether kernels decorated from now on run in the interpreter.

    minikv's own kernels do not need this (see the module's docstring); a learner's
    ``@triton.jit`` kernel on a CPU does, because Triton decides at decoration time.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return triton_interpreter_requested()


def interpreted(device: torch.device | str) -> bool:
    """Whether a minikv kernel on tensors of ``device`` runs in Triton's interpreter.

    True for every device but CUDA. On CUDA, also True when ``TRITON_INTERPRET`` is
    set (the interpreter then copies the tensors to the host and back: correct, slow).
    """
    return torch.device(device).type != "cuda" or triton_interpreter_requested()


class TritonKernel:
    """A Triton kernel, written as a plain Python function and handed to Triton when first launched.

    ``kernel[grid](*args)`` launches it where its tensors are (see :func:`interpreted`):
    :attr:`compiled` on CUDA, :attr:`interpreter` on a CPU. ``fn`` is the Python function,
    whose source is the kernel (``inspect.getsource(kernel.fn)``).
    """

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def _python(self) -> Callable[..., None]:
        """The function, with ``triton.language`` bound as ``tl`` in its module and its annotations resolved."""
        _, tl = require_triton()
        namespace = self.fn.__globals__
        namespace.setdefault("tl", tl)
        # The kernel's module uses `from __future__ import annotations`: turn "tl.constexpr" back into the object.
        self.fn.__annotations__ = {
            key: eval(value, namespace) if isinstance(value, str) else value
            for key, value in self.fn.__annotations__.items()
        }
        return self.fn

    @cached_property
    def compiled(self) -> Any:
        """The kernel for GPUs (a ``triton.JITFunction``), compiled per device and specialisation at launch."""
        fn = self._python()  # first: it says in one line when Triton is missing
        from triton.runtime.jit import JITFunction

        return JITFunction(fn)

    @cached_property
    def interpreter(self) -> Any:
        """The kernel in Triton's interpreter: ``kernel.interpreter[grid](*args)`` runs it with NumPy."""
        fn = self._python()
        from triton.runtime.interpreter import InterpretedFunction

        return _Interpreted(InterpretedFunction(fn))

    def on(self, device: torch.device) -> Any:
        """The form of the kernel that runs on ``device``, by the rule of :func:`interpreted`."""
        return self.interpreter if interpreted(device) else self.compiled

    @property
    def __name__(self) -> str:
        return self.fn.__name__


class _Interpreted:
    """An interpreted kernel whose calls to ``triton.language``'s own helpers (``tl.sum``, ``tl.max``) work.

    Those helpers are ``@triton.jit`` functions. Under ``TRITON_INTERPRET=1`` Triton makes every
    such function interpretable when it is defined; minikv interprets only its CPU launches, so
    during each of them the helpers are swapped for interpreted twins, and put back after.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> None:
            with _interpretable_language():
                launch(*args, **kwargs)

        return run


@contextmanager
def _interpretable_language() -> Iterator[None]:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    helpers = {name: value for name, value in vars(tl).items() if isinstance(value, JITFunction)}
    for name, helper in helpers.items():
        setattr(tl, name, InterpretedFunction(helper.fn))
    try:
        yield
    finally:
        for name, helper in helpers.items():
            setattr(tl, name, helper)


def triton_kernel(fn: Callable[..., None]) -> TritonKernel:
    """Decorator: ``fn`` is a Triton kernel that minikv launches where its tensors are."""
    return TritonKernel(fn)
