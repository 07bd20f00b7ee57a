"""Argument checks shared by the managers, the pool and the store path.

Each helper either returns a canonical value or raises an error that names the
argument. They never mutate their input, so a failed call leaves state as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .errors import ArgumentError, ArgumentTypeError, DeviceMismatchError

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_INT32_MAX = np.iinfo(np.int32).max
# dtype objects: comparing with them is twice as fast as with the scalar types np.int64 / np.int32.
_INT64, _INT32 = np.dtype(np.int64), np.dtype(np.int32)


def canonical_device(device: torch.device | str) -> torch.device:
    """The device as tensors report it: ``"cuda"`` becomes ``cuda:<current>``, ``"cpu:0"`` becomes ``cpu``.

    Tensors always carry the full name, so a manager created with ``"cuda"`` must
    compare equal to the ``cuda:0`` of every tensor it makes.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ArgumentError(f"device: {error}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def as_token_ids(value: torch.Tensor | Sequence[int], name: str = "input_ids") -> np.ndarray:
    """Token ids as a 1-D int64 NumPy array on the CPU (the radix tree compares keys there).

    Any integer is a valid id: the tree only compares ids, it never indexes with them.
    """
    if isinstance(value, np.ndarray):  # first: the lifecycle passes NumPy arrays
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise ArgumentTypeError(f"{name} must be a 1-D integer array, got {value.dtype} {value.shape}")
        array = value if value.dtype == _INT64 else value.astype(_INT64)
    elif isinstance(value, torch.Tensor):
        if value.dtype not in _INT_DTYPES:
            raise ArgumentTypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
        if value.dim() != 1:
            raise ArgumentError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        array = value.detach().to("cpu", torch.int64).numpy()
    elif isinstance(value, (list, tuple)):
        array = _ints_as_array(value, np.int64, name, "a token id")
    else:
        raise ArgumentTypeError(f"{name} must be a 1-D integer tensor or a list of ints, got {type(value).__name__}")
    return array


def as_slot_array(value: torch.Tensor | Sequence[int], device: torch.device, name: str = "indices") -> np.ndarray:
    """Slot indices as a 1-D int32 NumPy array, checked: integers, 1-D, on ``device``, none negative.

    A NumPy array because the managers check and copy slots on the CPU, where each
    NumPy call costs a fraction of a torch call (and a CUDA tensor is brought over
    once). For a CPU int32 tensor it is a view, not a copy: keep a copy of what you keep.
    """
    if isinstance(value, torch.Tensor):
        if value.dtype not in _INT_DTYPES:
            raise ArgumentTypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
        if value.dim() != 1:
            raise ArgumentError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        if value.device != device:
            raise DeviceMismatchError(f"{name} is on {value.device}, expected {device}")
        array = value.numpy() if value.is_cpu else value.cpu().numpy()
    elif isinstance(value, (list, tuple)):
        array = _ints_as_array(value, np.int32, name, "a slot index")
    else:
        raise ArgumentTypeError(f"{name} must be a 1-D integer tensor or a list of ints, got {type(value).__name__}")
    # Both ends are checked in the caller's dtype, before any cast to int32 could wrap a bad slot
    # round to a valid-looking one. (np.minimum.reduce, not .min(): the method's Python wrapper
    # costs as much as the scan; this runs on every insert.)
    if array.size and np.minimum.reduce(array) < 0:
        raise ArgumentError(f"{name} must not contain negative slot indices")
    if array.dtype != _INT32:
        if array.size and np.maximum.reduce(array) > _INT32_MAX:
            raise ArgumentError(f"{name}: slot {int(np.maximum.reduce(array))} does not fit in int32")
        array = array.astype(np.int32)
    return array


def _ints_as_array(value: Sequence[int], dtype: type[np.integer], name: str, what: str) -> np.ndarray:
    """A list or tuple of ints as a 1-D array of ``dtype``; bools, floats and ints too big for it are refused."""
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value):
        raise ArgumentTypeError(f"{name} must contain only ints")
    try:
        return np.asarray(value, dtype=dtype).reshape(-1)
    except OverflowError:
        raise ArgumentError(f"{name}: {what} does not fit in {np.dtype(dtype).name}") from None


def as_count(value: object, name: str) -> int:
    """A non-negative Python int (bools and floats are refused: they hide bugs)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    return int(value)


def as_positive(value: object, name: str) -> int:
    count = as_count(value, name)
    if count == 0:
        raise ArgumentError(f"{name} must be >= 1, got 0")
    return count
