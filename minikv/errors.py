"""One error hierarchy for the whole package.

Every error minikv raises on bad input derives from :class:`MiniKVError`, and
also from the built-in exception a Python programmer would expect
(``ValueError`` for a bad value, ``TypeError`` for a wrong type or dtype,
``IndexError`` for an out-of-range slot), so ``except ValueError`` keeps working.
Messages always name the argument and say what is wrong with it.
"""

from __future__ import annotations

from .language import tr


class MiniKVError(Exception):
    """Base class of every error raised by minikv."""


class ArgumentError(MiniKVError, ValueError):
    """An argument has the wrong value, length or shape."""


class ArgumentTypeError(MiniKVError, TypeError):
    """An argument has the wrong Python type or tensor dtype."""


class DeviceMismatchError(ArgumentError):
    """Tensors that must live on one device do not."""


class SlotIndexError(MiniKVError, IndexError):
    """A slot or page index lies outside the storage it addresses."""


class LockError(MiniKVError, RuntimeError):
    """A lock operation that would corrupt the reference counts."""


class StaleHandleError(LockError):
    """A handle whose node is no longer part of the tree (it was evicted or reset)."""


class EvictionError(MiniKVError, RuntimeError):
    """An eviction that cannot be satisfied, e.g. more than is evictable."""


class EvictionUnsupportedError(EvictionError, NotImplementedError):
    """The manager keeps nothing, so it cannot evict (``NaiveCacheManager.evict(n > 0)``).

    Both an :class:`EvictionError` (the contract: evicting more than is evictable) and a
    ``NotImplementedError`` (what mini-sglang raises here), so either ``except`` catches it.
    """


class OutOfSlotsError(MiniKVError, RuntimeError):
    """The page pool cannot supply the requested slots, even after eviction."""


class StepLimitError(MiniKVError, RuntimeError):
    """The engine still had work after the number of steps it was given (``Engine.run(max_steps)``)."""


class DoubleFreeError(MiniKVError, RuntimeError):
    """Slots returned to the pool that were already free (or returned twice)."""


class ModelFileError(MiniKVError, FileNotFoundError):
    """A model's weights are not installed, or the file is not the one minikv expects (its SHA-256 differs)."""


class TritonMissingError(MiniKVError, ModuleNotFoundError):
    """Triton is not installed here: it has wheels for Linux only (none for macOS or Windows).

    Raised by :func:`minikv.kernels.require_triton`, and so by every launch of a Triton kernel. A
    ``ModuleNotFoundError`` too, so ``except ImportError`` keeps working. In a notebook it shows as
    its one-line message, without a traceback (IPython's ``_render_traceback_`` hook).
    """

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


class IntegrityError(MiniKVError, RuntimeError):
    """A broken invariant found by ``check_integrity``.

    ``invariant`` names the rule that failed and ``node`` is the offending node
    (``None`` when the problem is global, such as a size counter).
    """

    def __init__(self, invariant: str, detail: str, node: object | None = None) -> None:
        self.invariant = invariant
        self.node = node
        if node is None:
            super().__init__(tr("[{invariant}]: {detail}", invariant=invariant, detail=detail))
        else:
            super().__init__(
                tr("[{invariant}] at {node}: {detail}", invariant=invariant, node=repr(node), detail=detail)
            )
