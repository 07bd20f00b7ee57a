"""Argument checks shared by the managers, the pool and the store path.

Each helper either returns a canonical value or raises an error that names the
argument. They never mutate their input, so a failed call leaves state as it was.

One rule for every sequence of integers the package accepts (token ids, slot indices):

* a 1-D torch tensor of an integer dtype (``int8``, ``int16``, ``int32``, ``int64``, ``uint8``),
  dense (not sparse) and holding data (not on the ``meta`` device);
* a 1-D NumPy array of any integer dtype, signed or unsigned;
* a list or tuple of Python or NumPy ints (``bool`` is refused: it hides bugs).

Then each kind of value has its own range: a token id must fit in ``int64`` (the tree
compares ids as ``int64``, so a ``uint64`` id of ``2**63`` or more would wrap to a
negative id and collide with another); a slot index must lie in ``[0, 2**31)``.
A slot tensor must also be on the manager's (or pool's) device; NumPy arrays and
lists are host data and are accepted for any device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .errors import ArgumentError, ArgumentTypeError, DeviceMismatchError

INTEGER_DTYPES = frozenset((torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8))
"""The torch dtypes accepted for token ids and slot indices."""

INT64 = np.dtype(np.int64)
"""The dtype of token ids inside the package (keys of the radix tree)."""

INT32 = np.dtype(np.int32)
"""The dtype of slot indices inside the package."""

_INT64_MAX = int(np.iinfo(np.int64).max)
_INT32_MAX = int(np.iinfo(np.int32).max)

IntegerSequence = torch.Tensor | np.ndarray | Sequence[int]
"""What :func:`as_token_ids` and :func:`as_slot_array` accept (``base.TokenIds`` is the same)."""


def canonical_device(device: torch.device | str) -> torch.device:
    """The device as tensors report it: ``"cuda"`` becomes ``cuda:<current>``, ``"cpu:0"`` becomes ``cpu``.

    Tensors always carry the full name, so a manager created with ``"cuda"`` must
    compare equal to the ``cuda:0`` of every tensor it makes. A device that this
    machine does not have (``"cuda"`` without CUDA, ``"cuda:7"`` on one GPU) is refused here,
    with an :class:`~minikv.errors.ArgumentError` that names it.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ArgumentError(f"device: {error}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device: {str(device)!r} was asked for, but CUDA is not available on this machine")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ArgumentError(
                f"device: {str(device)!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    try:
        torch.empty(0, device=device)
    except (RuntimeError, TypeError, NotImplementedError) as error:
        raise ArgumentError(f"device: {str(device)!r} cannot hold tensors here ({error})") from None
    return device


def as_integer_array(value: IntegerSequence, name: str, what: str = "an int") -> np.ndarray:
    """Any accepted integer sequence as a 1-D NumPy integer array, in its own dtype (a view where possible).

    Refuses, naming ``name``: other types, other dtypes, other shapes, sparse and meta tensors.
    Does not check the range of the values: :func:`as_token_ids` and :func:`as_slot_array` do.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise ArgumentTypeError(f"{name} must be a NumPy array of integers, got dtype {value.dtype}")
        if value.ndim != 1:  # (a TypeError for arrays, as BlockManager's callers rely on)
            raise ArgumentTypeError(f"{name} must be a 1-D NumPy array, got shape {value.shape}")
        return value
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise ArgumentTypeError(f"{name} must be a dense tensor, got layout {value.layout}")
        if value.dtype not in INTEGER_DTYPES:
            raise ArgumentTypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
        if value.dim() != 1:
            raise ArgumentError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        if value.is_meta:
            raise ArgumentError(f"{name} is a meta tensor: it has a shape but no values")
        return value.numpy() if value.is_cpu else value.cpu().numpy()
    if isinstance(value, (list, tuple)):
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value):
            raise ArgumentTypeError(f"{name} must contain only ints")
        try:
            return np.asarray(value, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise ArgumentError(f"{name}: {what} does not fit in int64") from None
    raise ArgumentTypeError(
        f"{name} must be a 1-D integer tensor, a NumPy integer array or a list of ints, got {type(value).__name__}"
    )


def as_token_ids(value: IntegerSequence, name: str = "input_ids") -> np.ndarray:
    """Token ids as a 1-D int64 NumPy array on the CPU (the radix tree compares keys there).

    Any id that fits in ``int64`` is valid: the tree only compares ids, it never indexes with them.
    An int64 NumPy array comes back as it is (not copied): keep a copy of what you keep.
    """
    array = as_integer_array(value, name, "a token id")
    if array.dtype == INT64:
        return array
    if array.dtype == np.uint64 and array.size and int(np.maximum.reduce(array)) > _INT64_MAX:
        raise ArgumentError(
            f"{name}: token id {int(np.maximum.reduce(array))} does not fit in int64 (it would wrap to a negative id)"
        )
    return array.astype(INT64)


def as_slot_array(value: IntegerSequence, device: torch.device, name: str = "indices") -> np.ndarray:
    """Slot indices as a 1-D int32 NumPy array, checked: integers, 1-D, none negative, all below ``2**31``.

    A tensor must be on ``device``; NumPy arrays and lists are host data and fit any device.
    The range is checked in the caller's dtype, before any cast to int32 could wrap a bad slot
    round to a valid-looking one. For a CPU int32 tensor or array the result is a view, not a
    copy: keep a copy of what you keep.
    """
    if isinstance(value, torch.Tensor) and value.device != device and value.layout == torch.strided:
        raise DeviceMismatchError(f"{name} is on {value.device}, expected {device}")
    array = as_integer_array(value, name, "a slot index")
    if array.size == 0:
        return array.astype(INT32, copy=False)
    if array.dtype.kind == "i" and int(np.minimum.reduce(array)) < 0:
        raise ArgumentError(f"{name} must not contain negative slot indices")
    if array.dtype != INT32:
        largest = int(np.maximum.reduce(array))
        if largest > _INT32_MAX:
            raise ArgumentError(f"{name}: slot {largest} does not fit in int32")
        array = array.astype(INT32)
    return array


def as_count(value: object, name: str) -> int:
    """A non-negative Python int (bools and floats are refused: they hide bugs)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    return int(value)


def as_positive(value: object, name: str) -> int:
    """A Python int of at least 1."""
    count = as_count(value, name)
    if count == 0:
        raise ArgumentError(f"{name} must be >= 1, got 0")
    return count
