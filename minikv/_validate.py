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

from collections.abc import Mapping, Sequence
from typing import TypeVar, cast

import numpy as np
import torch

from .errors import ArgumentError, ArgumentTypeError, DeviceMismatchError, MiniKVError, SlotIndexError
from .language import tr

Choice = TypeVar("Choice")

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


CACHE_DEVICE_TYPES = ("cpu", "cuda", "meta")
"""The devices a KV cache may live on (``meta`` to size one without memory)."""


def as_device(device: torch.device | str, name: str = "device", *, cache: bool = False) -> torch.device:
    """``device`` as tensors report it, once it is known to exist on this machine; else an error naming ``name``.

    ``"cuda"`` becomes ``cuda:<current>`` and ``"cpu:0"`` becomes ``cpu``: tensors always carry
    the full name, so a manager created with ``"cuda"`` compares equal to the ``cuda:0`` of
    every tensor it makes. Refused, before any memory is allocated: what is not a string or a
    :class:`torch.device`, names torch does not know (``"gpu"``), ``"cuda"`` on a machine without
    CUDA, ``"cuda:3"`` on a machine with two GPUs, and a device that cannot hold tensors here.
    With ``cache=True`` only ``CACHE_DEVICE_TYPES`` are accepted: ``"meta"`` gives a cache
    shapes and sizes but no data (``store_cache`` refuses it).
    """
    if not isinstance(device, (str, torch.device)):
        raise ArgumentTypeError(f"{name} must be a torch.device or a string such as 'cpu', got {type(device).__name__}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ArgumentError(f"{name}: {device!r} is not a device torch knows ({error})") from None
    if cache and parsed.type not in CACHE_DEVICE_TYPES:
        raise ArgumentError(
            f"{name} is {device!r}: minikv stores its caches on 'cpu' or 'cuda' (or 'meta', to size them)"
        )
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"{name} is {device!r}, but CUDA is not available on this machine")
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ArgumentError(f"{name} is {device!r}, but this machine has {count} CUDA device(s)")
        return torch.device("cuda", index)
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, TypeError, NotImplementedError) as error:
        raise ArgumentError(f"{name} is {device!r}, which cannot hold tensors here ({error})") from None
    return parsed


def as_integer_array(
    value: IntegerSequence, name: str, what: str = "an int", too_big: type[MiniKVError] = ArgumentError
) -> np.ndarray:
    """Any accepted integer sequence as a 1-D NumPy integer array, in its own dtype (a view where possible).

    Refuses, naming ``name``: other types, other dtypes, other shapes, sparse and meta tensors.
    Does not check the range of the values: :func:`as_token_ids` and :func:`as_slot_array` do. A list
    holding an int past ``int64`` is refused with ``too_big``.
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
            raise too_big(f"{name}: {what} does not fit in int64") from None
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
    check_fits_int64(array, name)
    return array.astype(INT64)


def check_fits_int64(array: np.ndarray, name: str) -> None:
    """Refuse a ``uint64`` id of ``2**63`` or more: cast to ``int64`` it would wrap to a negative id."""
    if array.dtype == np.uint64 and array.size and int(np.maximum.reduce(array)) > _INT64_MAX:
        raise ArgumentError(
            f"{name}: token id {int(np.maximum.reduce(array))} does not fit in int64 (it would wrap to a negative id)"
        )


def as_slot_array(
    value: IntegerSequence,
    device: torch.device | None = None,
    name: str = "indices",
    *,
    length: int | None = None,
    below: int | None = None,
) -> np.ndarray:
    """Slot indices as a 1-D int32 NumPy array, checked: integers, 1-D, none negative, all below ``2**31``.

    The one rule for slots, for the managers and the page pool. A tensor must be on ``device``
    (any device when ``None``); NumPy arrays and lists are host data and fit any device. With
    ``length``, there must be that many slots, one per token of ``input_ids``. With ``below``
    (a pool's size), a slot outside ``[0, below)`` is a :class:`~minikv.errors.SlotIndexError`.
    The range is checked in the caller's dtype, before any cast to int32 could wrap a bad slot
    round to a valid-looking one. For a CPU int32 tensor or array the result is a view, not a
    copy: keep a copy of what you keep.
    """
    elsewhere = isinstance(value, torch.Tensor) and value.layout == torch.strided and value.device != device
    if device is not None and elsewhere:
        raise DeviceMismatchError(f"{name} is on {value.device}, expected {device}")  # type: ignore[union-attr]
    array = as_integer_array(value, name, "a slot index", ArgumentError if below is None else SlotIndexError)
    if length is not None and len(array) != length:
        raise ArgumentError(
            tr("input_ids has {length} tokens but {name} has {slots} slots", length=length, name=name, slots=len(array))
        )
    if array.size == 0:
        return array.astype(INT32, copy=False)
    if below is not None:
        check_slot_range(array, below, name)
    elif array.dtype.kind == "i" and int(np.minimum.reduce(array)) < 0:
        raise ArgumentError(f"{name} must not contain negative slot indices")
    if array.dtype != INT32:
        largest = int(np.maximum.reduce(array))
        if largest > _INT32_MAX:
            raise ArgumentError(f"{name}: slot {largest} does not fit in int32")
        array = array.astype(INT32)
    return array


def check_slot_range(slots: np.ndarray, below: int, name: str) -> None:
    """Every slot in ``[0, below)``, or a :class:`~minikv.errors.SlotIndexError` naming the first outside."""
    if int(np.minimum.reduce(slots)) < 0 or int(np.maximum.reduce(slots)) >= below:
        bad = slots[(slots < 0) | (slots >= below)][0]
        raise SlotIndexError(tr("{name}: slot {slot} is outside [0, {below})", name=name, slot=int(bad), below=below))


def check_new_slots(slots: np.ndarray, held: np.ndarray, page_size: int, name: str = "indices") -> None:
    """Slots a new leaf can own: none listed twice, none the tree holds (``held[s]``), whole pages in order."""
    if slots.size == 0:
        return
    ordered = np.sort(slots)
    if np.count_nonzero(ordered[1:] == ordered[:-1]):
        raise ArgumentError(f"{name}: the same slot is listed twice among the tokens to insert")
    if ordered[-1] < len(held):
        taken = held[slots]
    else:  # slots past the end of the record are not held
        taken = slots < len(held)
        taken[taken] = held[slots[taken]]
    if np.count_nonzero(taken):
        raise ArgumentError(
            tr(
                "{name}: slot {slot} is already held by another node of the tree",
                name=name,
                slot=int(slots[taken][0]),
            )
        )
    if page_size > 1:
        firsts = slots[::page_size]
        whole_pages = (firsts[:, None] + np.arange(page_size, dtype=INT32)).reshape(-1)
        if np.count_nonzero(firsts % page_size) or not np.array_equal(whole_pages, slots):
            raise ArgumentError(
                f"{name}: with page_size {page_size}, each page of tokens must get one whole page of slots"
            )


def check_cached_len(cached_len: int, num_tokens: int, page_size: int) -> None:
    """A handle's ``cached_len`` can be a match of ``num_tokens`` ids: no longer than them, whole pages."""
    if cached_len > num_tokens or cached_len % page_size:
        raise ArgumentError(f"handle: cached_len {cached_len} cannot be a match of these {num_tokens} ids")


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


def as_named_choice(value: object, kind: type, choices: Mapping[str, type[Choice]], name: str) -> Choice:
    """``value`` if it is a ``kind``, else a fresh one for its short name in ``choices``; anything else is refused.

    The engine's policies are given this way (``policy="lpm"`` or ``LongestPrefixMatch()``).
    """
    if isinstance(value, kind):
        return cast(Choice, value)
    article = "an" if kind.__name__[0] in "AEIOU" else "a"
    if isinstance(value, str):
        if value not in choices:
            raise ArgumentError(f"{name} must be one of {sorted(choices)} or {article} {kind.__name__}, got {value!r}")
        return choices[value]()
    raise ArgumentTypeError(f"{name} must be {article} {kind.__name__} or its name, got {type(value).__name__}")
