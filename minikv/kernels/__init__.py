"""The store kernel and where it runs.

* ``minikv.kernels.store``: the Triton kernel, its launcher, :func:`~minikv.store_cache` and its reference;
* :mod:`minikv.kernels.checks`: every check ``store_cache`` makes before it writes;
* :mod:`minikv.kernels.cpu_copy`: the plain-torch copy that ``backend="torch"`` runs;
* :mod:`minikv.kernels.paged_attention`: the read half, a decode-attention kernel that reads K/V
  from the pages in place through each request's slot table;
* ``minikv.kernels.devices``: the rule for where a kernel runs (compiled on CUDA
  tensors, interpreted on CPU tensors), with no environment variable set at import.

Importing this package does not import Triton: the kernel is handed to Triton when it
is first launched.
"""

from .._validate import as_device
from .checks import check_slots, check_store_arguments
from .devices import (
    TRITON_MISSING,
    interpreted,
    require_triton,
    triton_interpreter_requested,
    use_interpreter_without_cuda,
)
from .paged_attention import paged_decode_attention, paged_decode_attention_reference
from .store import (
    BACKENDS,
    SLOT_CHECKS,
    SUPPORTED_DTYPES,
    StoreLaunch,
    launch_store_kernel,
    plan_store_launch,
    store_cache,
    store_cache_reference,
    store_kernel,
)

__all__ = [
    "BACKENDS",
    "SLOT_CHECKS",
    "SUPPORTED_DTYPES",
    "TRITON_MISSING",
    "StoreLaunch",
    "as_device",
    "check_slots",
    "check_store_arguments",
    "interpreted",
    "launch_store_kernel",
    "paged_decode_attention",
    "paged_decode_attention_reference",
    "plan_store_launch",
    "require_triton",
    "store_cache",
    "store_cache_reference",
    "store_kernel",
    "triton_interpreter_requested",
    "use_interpreter_without_cuda",
]
