"""What the engine needs from a model, and the cache-reading loop every model of the course shares.

:class:`PagedModel` is the interface: the shape of the K/V a model stores per
token (``num_layers``, ``num_kv_heads``, ``head_dim``, ``dtype``, ``device``),
how long a sequence may grow (``max_positions``), and three passes: ``forward``
recomputes everything and never touches a cache (the yardstick), ``prefill``
computes the tokens after a cached prefix, ``decode`` one new token per request.

:class:`PagedDecoder` implements ``forward``, ``prefill`` and ``decode`` once,
for any decoder-only transformer: a subclass says how a layer turns hidden
states into Q, K and V and finishes (``layer_qkv``, ``finish_layer``), how
tokens become hidden states (``embed``) and hidden states logits (``logits``).
The three passes then differ only in where K and V come from: computed in
place (``forward``) or written to slots and read back by slot (``prefill``,
``decode``, through :func:`~minikv.models.paged_attention`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from .._validate import as_count, as_token_ids
from ..base import BaseKVCache
from ..errors import ArgumentError, ArgumentTypeError
from ..kernels.store import BACKENDS, store_cache
from .attention import causal_attention, decode_attention, paged_attention

TokenInput = torch.Tensor | Sequence[int]


@runtime_checkable
class PagedModel(Protocol):
    """The model interface :class:`~minikv.engine.Engine` and :func:`~minikv.engine.recompute` rely on."""

    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def forward(self, input_ids: TokenInput) -> torch.Tensor:
        """Logits ``(len(input_ids), vocab_size)``, computed from scratch."""
        ...

    def prefill(
        self, input_ids: TokenInput, kv_cache: BaseKVCache, indices: torch.Tensor, cached_len: int
    ) -> torch.Tensor:
        """Logits of the tokens after the first ``cached_len``, whose K/V are read from ``indices``."""
        ...

    def decode(
        self,
        input_ids: TokenInput,
        positions: Sequence[int],
        kv_cache: BaseKVCache,
        out_loc: torch.Tensor,
        slots: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """Logits ``(batch, vocab_size)`` for one new token per request."""
        ...


class PagedDecoder:
    """``forward``, ``prefill`` and ``decode`` for a decoder-only transformer, written once.

    Subclasses set ``vocab_size``, ``num_layers``, ``num_heads``, ``num_kv_heads``,
    ``head_dim`` and ``max_positions``, and implement the four methods of the layer
    below the ``--`` line. Positions are passed everywhere, so a model may add
    them to the input (``TinyDecoder``) or rotate Q and K by them (RoPE, Llama).
    """

    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    def forward(self, input_ids: TokenInput) -> torch.Tensor:
        """Logits ``(len(input_ids), vocab_size)`` with no cache at all: the reference ``prefill`` must match."""
        ids = self.check_token_ids(input_ids)
        positions = torch.arange(len(ids), device=self.device)
        x = self.embed(ids, positions)
        for layer in range(self.num_layers):
            q, k, v = self.layer_qkv(x, layer, positions)
            x = self.finish_layer(x, causal_attention(q, k, v, q_start=0), layer)
        return self.logits(x)

    def prefill(
        self,
        input_ids: TokenInput,
        kv_cache: BaseKVCache,
        indices: torch.Tensor,
        cached_len: int,
        store_backend: str = "auto",
    ) -> torch.Tensor:
        """Logits ``(len(input_ids) - cached_len, vocab_size)`` for the tokens after the cached prefix.

        ``indices[i]`` is the slot of token ``i``: the first ``cached_len`` hold
        K/V computed earlier (by whichever request inserted that prefix), the
        rest are this request's own and are written here, layer by layer, before
        attention reads all ``len(input_ids)`` rows back. ``store_backend``
        ``"auto"`` stores through ``kv_cache.store_kv``; ``"triton"`` or
        ``"torch"`` call :func:`~minikv.store_cache` with that backend.
        """
        ids = self.check_token_ids(input_ids)
        self.check_cache(kv_cache)
        indices = self.check_slots(indices, len(ids), kv_cache)
        cached_len = as_count(cached_len, "cached_len")
        if cached_len >= len(ids):
            raise ArgumentError(
                f"cached_len must be < len(input_ids) ({len(ids)}): at least one token must be computed, "
                f"got {cached_len}"
            )
        if store_backend not in BACKENDS:
            raise ArgumentError(f"store_backend must be one of {BACKENDS}, got {store_backend!r}")
        out_loc = indices[cached_len:]
        positions = torch.arange(cached_len, len(ids), device=self.device)
        x = self.embed(ids[cached_len:], positions)
        for layer in range(self.num_layers):
            q, k, v = self.layer_qkv(x, layer, positions)
            if store_backend == "auto":
                kv_cache.store_kv(k, v, out_loc, layer)
            else:
                store_cache(kv_cache.k_cache(layer), kv_cache.v_cache(layer), out_loc, k, v, backend=store_backend)
            x = self.finish_layer(x, paged_attention(q, kv_cache, layer, indices, q_start=cached_len), layer)
        return self.logits(x)

    def decode(
        self,
        input_ids: TokenInput,
        positions: Sequence[int],
        kv_cache: BaseKVCache,
        out_loc: torch.Tensor,
        slots: Sequence[torch.Tensor],
        attention_backend: str = "auto",
    ) -> torch.Tensor:
        """Logits ``(batch, vocab_size)`` for one new token per request of a decode batch.

        Request ``b``'s token ``input_ids[b]`` sits at position ``positions[b]``.
        Its K/V are written to slot ``out_loc[b]``, then it attends over
        ``slots[b]``: the slots of that request's tokens ``0..positions[b]``, in
        order, the last one being ``out_loc[b]`` (a server's ``req_to_token`` row).
        The batch shares every matrix multiply; only attention runs per request,
        over that request's own slots: on a GPU in one launch of the paged-attention
        kernel, which reads the pages in place (``attention_backend``: see
        :func:`~minikv.models.decode_attention`).
        """
        ids = self.check_token_ids(input_ids)
        self.check_cache(kv_cache)
        batch = len(ids)
        if len(positions) != batch or len(slots) != batch:
            raise ArgumentError(
                f"positions and slots need one entry per token ({batch}), got {len(positions)} and {len(slots)}"
            )
        starts = [as_count(p, "positions") for p in positions]
        if max(starts) >= self.max_positions:
            raise ArgumentError(f"positions: {max(starts)} is beyond max_positions ({self.max_positions})")
        out_loc = self.check_slots(out_loc, batch, kv_cache)
        tables = [self.check_slots(s, start + 1, kv_cache) for s, start in zip(slots, starts, strict=True)]
        position_ids = torch.tensor(starts, device=self.device)
        x = self.embed(ids, position_ids)
        for layer in range(self.num_layers):
            q, k, v = self.layer_qkv(x, layer, position_ids)
            kv_cache.store_kv(k, v, out_loc, layer)  # every request's new row, in one store
            x = self.finish_layer(x, decode_attention(q, kv_cache, layer, tables, attention_backend), layer)
        return self.logits(x)

    # -- the layer: what a subclass defines ------------------------------------------------------

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states ``(len(ids), hidden)`` of tokens ``ids`` at ``positions``."""
        raise NotImplementedError

    def layer_qkv(
        self, x: torch.Tensor, layer: int, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q ``(n, num_heads, head_dim)``; K and V ``(n, num_kv_heads, head_dim)``, what the cache stores."""
        raise NotImplementedError

    def finish_layer(self, x: torch.Tensor, attention: torch.Tensor, layer: int) -> torch.Tensor:
        """The rest of the layer: output projection and MLP, with their residuals."""
        raise NotImplementedError

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, vocab_size)`` from the last layer's hidden states."""
        raise NotImplementedError

    # -- argument checks, shared by every model ---------------------------------------------------

    def check_token_ids(self, input_ids: TokenInput) -> torch.Tensor:
        """``input_ids`` as an int64 tensor on the model's device, or a clear error naming it."""
        array = as_token_ids(input_ids)
        if len(array) == 0:
            raise ArgumentError("input_ids must hold at least one token")
        if len(array) > self.max_positions:
            raise ArgumentError(f"input_ids: {len(array)} tokens exceed max_positions ({self.max_positions})")
        if array.min() < 0 or array.max() >= self.vocab_size:
            raise ArgumentError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        return torch.from_numpy(array).to(self.device)

    def check_cache(self, kv_cache: BaseKVCache) -> None:
        """Refuse a cache whose rows this model cannot write (see :func:`check_cache_fits`)."""
        check_cache_fits(self, kv_cache)

    def check_slots(self, indices: torch.Tensor, num_tokens: int, kv_cache: BaseKVCache) -> torch.Tensor:
        """``indices`` on the cache's device, if it holds ``num_tokens`` slots that exist in ``kv_cache``."""
        if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
            raise ArgumentTypeError("indices must be an int32 or int64 tensor")
        if indices.shape != (num_tokens,):
            raise ArgumentError(
                f"indices must hold one slot per token ({num_tokens}), got shape {tuple(indices.shape)}"
            )
        pages, page_size = kv_cache.k_cache(0).shape[:2]
        if num_tokens and (int(indices.min()) < 0 or int(indices.max()) >= pages * page_size):
            raise ArgumentError(f"indices: slots must be in [0, {pages * page_size})")
        return indices.to(kv_cache.device)


def check_cache_fits(model: PagedModel, kv_cache: object) -> None:
    """Refuse, naming ``kv_cache``, storage whose rows ``model`` cannot write.

    Its layers, KV heads, head size, dtype and device must be the model's: the engine checks
    this when it is built, before any request holds a slot, and every pass checks it again.
    """
    if not isinstance(kv_cache, BaseKVCache):
        raise ArgumentTypeError(f"kv_cache must be a BaseKVCache, got {type(kv_cache).__name__}")
    if kv_cache.num_layers != model.num_layers:
        raise ArgumentError(f"kv_cache has {kv_cache.num_layers} layers, the model has {model.num_layers}")
    heads, dim = kv_cache.k_cache(0).shape[2:]
    if (heads, dim) != (model.num_kv_heads, model.head_dim):
        raise ArgumentError(
            f"kv_cache stores {heads} KV heads of dim {dim}, "
            f"the model needs {model.num_kv_heads} of dim {model.head_dim}"
        )
    if kv_cache.dtype != model.dtype or kv_cache.device != model.device:
        raise ArgumentError(
            f"kv_cache is {kv_cache.dtype} on {kv_cache.device}, the model is {model.dtype} on {model.device}"
        )
