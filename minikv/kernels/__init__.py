"""GPU kernels, with a CPU path through Triton's interpreter.

Importing this package on a machine without CUDA sets ``TRITON_INTERPRET=1``
(unless it is already set) *before* any kernel is decorated: Triton reads the
variable when ``@triton.jit`` runs, and again at launch, so it is never unset.
"""

from .store import INTERPRETED, store_cache, store_cache_reference

__all__ = ["INTERPRETED", "store_cache", "store_cache_reference"]
