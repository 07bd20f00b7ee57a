"""``MHAKVCache``: the storage layer for multi-head (and grouped-query) attention.

One allocation holds K and V of every layer. The buffer's first dimension is 2
(``[0]`` is K, ``[1]`` is V), so both share one layout and one free list.
Each tensor-parallel rank stores only its own slice of the KV heads.

``store_kv`` is the engine's path, called once per layer per step. On CPU it checks
every slot before writing, as :func:`~minikv.kernels.store_cache` does. On CUDA it makes
no host-device transfer: the kernel checks each slot's range itself, writes nothing for
a slot outside the cache and counts it; :meth:`MHAKVCache.check_stores` reads that count
(one transfer) when the caller chooses, say once per step. The slots come from the page
pool, which never hands out a slot twice, so on CUDA they are trusted to be distinct.

``MHAKVCache(..., store=fn)`` writes through ``fn`` instead: the course plugs in the
learner's own store kernel (exercise 3's ``store(k_cache, v_cache, indices, k, v)``), so
the engine of chapter 6 runs on it. Every argument is still checked on the host first,
so a bad call is refused before ``fn`` sees it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ._validate import as_count, as_positive
from .base import BaseKVCache, KVCacheLayout
from .errors import ArgumentError, ArgumentTypeError, SlotIndexError
from .kernels import SUPPORTED_DTYPES, as_device, check_slots, check_store_arguments, store_cache
from .language import tr


class StoreFunction(Protocol):
    """``store(k_cache, v_cache, indices, k, v) -> None``: write ``k[i]``, ``v[i]`` to slot ``indices[i]`` of one layer.

    Any function of that shape, such as exercise 3's ``store`` or ``store_torch``.
    """

    def __call__(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /
    ) -> None: ...


def as_store(store: object) -> StoreFunction | None:
    """None (minikv's kernel) or a callable ``store(k_cache, v_cache, indices, k, v)``; else refused by name."""
    if store is not None and not callable(store):
        raise ArgumentTypeError(
            tr("store must be None or a function store(k_cache, v_cache, indices, k, v), got {type}",
               type=type(store).__name__)
        )  # fmt: skip
    return store


class MHAKVCache(BaseKVCache):
    """K/V storage for ``num_layers`` layers of ``num_pages`` pages of ``page_size`` token slots.

    ``kv_layout`` chooses what is adjacent in memory (see :class:`KVCacheLayout`);
    either way ``k_cache(layer)`` is a ``(num_pages, page_size, local_kv_heads, head_dim)``
    view, so attention and ``store_kv`` never need to know which layout was chosen.

    ``store`` (None, or a :class:`~minikv.mha_pool.StoreFunction`) replaces minikv's store kernel in
    ``store_kv``: it is called as ``store(k_cache, v_cache, out_loc, k, v)`` with one
    layer's ``(num_pages, page_size, heads, head_dim)`` views, after every check the
    default path makes. The course passes the store kernel a learner wrote in exercise 3.
    """

    def __init__(
        self,
        num_kv_heads: int,
        num_layers: int,
        head_dim: int,
        num_pages: int,
        dtype: torch.dtype,
        kv_layout: KVCacheLayout,
        device: torch.device | str,
        page_size: int = 1,
        tp_rank: int = 0,
        tp_size: int = 1,
        store: StoreFunction | None = None,
    ) -> None:
        store = as_store(store)
        num_kv_heads = as_positive(num_kv_heads, "num_kv_heads")
        self._num_layers = as_positive(num_layers, "num_layers")
        self.head_dim = as_positive(head_dim, "head_dim")
        self.num_pages = as_positive(num_pages, "num_pages")
        self.page_size = as_positive(page_size, "page_size")
        self.tp_size = as_positive(tp_size, "tp_size")
        self.tp_rank = as_count(tp_rank, "tp_rank")
        if self.tp_rank >= self.tp_size:
            raise ArgumentError(f"tp_rank must be in [0, {self.tp_size}), got {self.tp_rank}")
        if num_kv_heads % self.tp_size:
            raise ArgumentError(
                tr(
                    "num_kv_heads ({num_kv_heads}) must be divisible by tp_size ({tp_size}): "
                    "each rank stores a whole number of heads",
                    num_kv_heads=num_kv_heads,
                    tp_size=self.tp_size,
                )
            )
        if dtype not in SUPPORTED_DTYPES:
            raise ArgumentTypeError(f"dtype must be one of float32/float16/bfloat16, got {dtype}")
        if not isinstance(kv_layout, KVCacheLayout):
            raise ArgumentTypeError(f"kv_layout must be a KVCacheLayout, got {type(kv_layout).__name__}")
        device = as_device(device, "device", cache=True)
        self.num_kv_heads = num_kv_heads
        self.local_kv_heads = num_kv_heads // self.tp_size
        self.kv_layout = kv_layout
        self.store = store
        """The store function ``store_kv`` calls instead of minikv's kernel (None: minikv's own)."""
        L, P, S, H, D = self._num_layers, self.num_pages, self.page_size, self.local_kv_heads, self.head_dim
        if kv_layout is KVCacheLayout.LayerFirst:
            self._kv_buffer = torch.zeros((2, L, P, S, H, D), dtype=dtype, device=device)
        else:
            # Stored page-major; the permuted view is layer-first. No data moves.
            self._kv_buffer = torch.zeros((2, P, L, S, H, D), dtype=dtype, device=device).permute(0, 2, 1, 3, 4, 5)
        self._k_buffer = self._kv_buffer[0]
        self._v_buffer = self._kv_buffer[1]
        # One (K, V) view per layer, made once: store_kv runs once per layer per step.
        self._layer_views = [(self._k_buffer[i], self._v_buffer[i]) for i in range(L)]
        # On CUDA the kernel counts the out_loc slots outside the cache here (see check_stores).
        self._bad_slots = torch.zeros(1, dtype=torch.int32, device=self._kv_buffer.device)

    @property
    def kv_buffer(self) -> torch.Tensor:
        """The whole buffer as a layer-first view ``(2, layers, pages, page_size, heads, head_dim)``."""
        return self._kv_buffer

    @property
    def head_range(self) -> range:
        """The global KV heads this rank stores."""
        return range(self.tp_rank * self.local_kv_heads, (self.tp_rank + 1) * self.local_kv_heads)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        """Size of the one allocation in bytes: 2 * layers * pages * page_size * local heads * head_dim * itemsize."""
        return self._kv_buffer.numel() * self._kv_buffer.element_size()

    def k_cache(self, index: int) -> torch.Tensor:
        return self._k_buffer[self._layer(index, "index")]

    def v_cache(self, index: int) -> torch.Tensor:
        return self._v_buffer[self._layer(index, "index")]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:  # fmt: skip
        """Write ``k[i]``, ``v[i]`` to slot ``out_loc[i]`` of layer ``layer_id``.

        On CPU every slot is checked first (a bad call raises and writes nothing); on
        CUDA the kernel checks the range and :meth:`check_stores` reports what it refused.
        With a ``store`` function, everything is checked on the host (one transfer
        on CUDA) before it is called: it is someone else's kernel, trusted with valid
        calls only.
        """
        k_cache, v_cache = self._layer_views[self._layer(layer_id, "layer_id")]
        if self.store is not None:
            k_cache, v_cache, k, v = check_store_arguments(
                k_cache, v_cache, out_loc, k, v, index_name="out_loc"
            )  # fmt: skip
            check_slots(out_loc, self.num_slots, "out_loc")
            self.store(k_cache, v_cache, out_loc, k, v)
            return
        on_gpu = self._bad_slots.is_cuda
        store_cache(
            k_cache, v_cache, out_loc, k, v,
            slot_check="kernel" if on_gpu else "host",
            error_flag=self._bad_slots if on_gpu else None,
            index_name="out_loc",
        )  # fmt: skip

    def check_stores(self) -> None:
        """Raise :class:`~minikv.errors.SlotIndexError` if a ``store_kv`` since the last check was given
        an ``out_loc`` slot outside the cache (its row was not written); then start counting again.

        One host-device transfer on CUDA; on CPU such a call has already raised, so this finds nothing.
        """
        bad = int(self._bad_slots.item())
        if bad:
            self._bad_slots.zero_()
            raise SlotIndexError(
                f"out_loc: {bad} slot(s) given to store_kv were outside [0, {self.num_slots}); "
                "their rows were not written"
            )

    @property
    def device(self) -> torch.device:
        return self._kv_buffer.device

    @property
    def dtype(self) -> torch.dtype:
        return self._kv_buffer.dtype

    @property
    def num_layers(self) -> int:
        return self._num_layers

    def _layer(self, index: int, name: str) -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise ArgumentTypeError(f"{name} must be an int, got {type(index).__name__}")
        if not 0 <= index < self._num_layers:
            raise SlotIndexError(f"{name} must be in [0, {self._num_layers}), got {index}")
        return index

    def __repr__(self) -> str:
        return (
            f"MHAKVCache(layers={self._num_layers}, pages={self.num_pages}, page_size={self.page_size}, "
            f"heads={self.local_kv_heads}/{self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dtype={self.dtype}, layout={self.kv_layout.name}, device={self.device})"
        )
