"""``TinyDecoder``: a few-layer transformer whose attention reads K/V from the paged cache.

The rest of minikv moves slot indices around; this module is where they are
*used*. ``prefill`` computes only the tokens after the cached prefix, writes
their K/V into their slots with ``store_kv``, and then attends over the whole
prompt by gathering K/V rows back out of the cache by slot. ``decode`` does the
same for one new token per request of a batch, each attending over its own
slots. If the slot bookkeeping is right, their logits equal ``forward``'s, which
recomputes every token and never touches a cache; if a slot was handed to
someone else, they do not.

The weights are random (seeded): the model predicts nothing useful, but every
logit depends on every earlier token's K/V, which is all a cache test needs.
Positions are learned absolute embeddings added to the input, so a token's K
depends on where it sits: a prefix's K/V is valid only at the same positions,
as with RoPE in real models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ._validate import as_count, as_positive, as_token_ids
from .base import BaseKVCache
from .errors import ArgumentError, ArgumentTypeError
from .kernels.store import BACKENDS, store_cache


def gather_kv(
    kv_cache: BaseKVCache,
    layer: int,
    indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the K and V rows of slots ``indices`` from one layer's cache.

    Slot ``s`` is row ``s % page_size`` of page ``s // page_size``: the
    store kernel's arithmetic, run backwards. This is the read half of paged
    attention; real kernels fuse it into the attention loop, without a copy.
    Returns two ``(len(indices), heads, head_dim)`` tensors.
    """
    k_pages, v_pages = kv_cache.k_cache(layer), kv_cache.v_cache(layer)
    page_size = k_pages.shape[1]
    slots = indices.long()
    pages, rows = slots // page_size, slots % page_size
    return k_pages[pages, rows], v_pages[pages, rows]


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TinyDecoder:
    """A seeded random decoder-only transformer with grouped-query attention.

    Per layer: pre-norm attention (``num_heads`` query heads sharing
    ``num_kv_heads`` K/V heads, as in GQA models) and a pre-norm MLP, both
    residual. The cache stores one ``(num_kv_heads, head_dim)`` K row and V row
    per token per layer, exactly what an ``MHAKVCache`` with the same shape holds.
    """

    def __init__(
        self,
        vocab_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        head_dim: int = 16,
        max_positions: int = 256,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.vocab_size = as_positive(vocab_size, "vocab_size")
        self.num_layers = as_positive(num_layers, "num_layers")
        self.num_heads = as_positive(num_heads, "num_heads")
        self.num_kv_heads = as_positive(num_kv_heads, "num_kv_heads")
        self.head_dim = as_positive(head_dim, "head_dim")
        self.max_positions = as_positive(max_positions, "max_positions")
        if self.num_heads % self.num_kv_heads:
            raise ArgumentError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ArgumentTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        hidden, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # Drawn on the CPU, then moved: the same seed gives the same model on every device.
        gen = torch.Generator().manual_seed(as_count(seed, "seed"))

        def weight(fan_in: int, fan_out: int, scale: float | None = None) -> torch.Tensor:
            # 1/sqrt(fan_in) keeps activations near unit size, so logits stay O(1) at any depth.
            scale = fan_in**-0.5 if scale is None else scale
            return (torch.randn(fan_in, fan_out, generator=gen) * scale).to(device=device, dtype=dtype)

        self.embed = weight(self.vocab_size, hidden, scale=1.0)
        self.positions = weight(self.max_positions, hidden, scale=1.0)
        self.layers = [
            {
                "wq": weight(hidden, hidden), "wk": weight(hidden, kv_width), "wv": weight(hidden, kv_width),
                "wo": weight(hidden, hidden), "w_up": weight(hidden, 2 * hidden), "w_down": weight(2 * hidden, hidden),
            }
            for _ in range(self.num_layers)
        ]  # fmt: skip
        self.lm_head = weight(hidden, self.vocab_size)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def forward(self, input_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Logits ``(len(input_ids), vocab_size)`` with no cache at all: the reference ``prefill`` must match."""
        ids = self._token_ids(input_ids)
        x = self._embed(ids, start=0)
        for layer in range(self.num_layers):
            q, k, v = self._qkv(x, layer)
            x = self._finish_layer(x, self._attend(q, k, v, q_start=0), layer)
        return _rms_norm(x) @ self.lm_head

    def prefill(
        self,
        input_ids: torch.Tensor | Sequence[int],
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
        ids = self._token_ids(input_ids)
        self._check_cache(kv_cache)
        indices = self._slot_indices(indices, len(ids), kv_cache)
        cached_len = as_count(cached_len, "cached_len")
        if cached_len >= len(ids):
            raise ArgumentError(
                f"cached_len must be < len(input_ids) ({len(ids)}): at least one token must be computed, "
                f"got {cached_len}"
            )
        if store_backend not in BACKENDS:
            raise ArgumentError(f"store_backend must be one of {BACKENDS}, got {store_backend!r}")
        out_loc = indices[cached_len:]
        x = self._embed(ids[cached_len:], start=cached_len)
        for layer in range(self.num_layers):
            q, k, v = self._qkv(x, layer)
            if store_backend == "auto":
                kv_cache.store_kv(k, v, out_loc, layer)
            else:
                store_cache(kv_cache.k_cache(layer), kv_cache.v_cache(layer), out_loc, k, v, backend=store_backend)
            k_all, v_all = gather_kv(kv_cache, layer, indices)
            x = self._finish_layer(x, self._attend(q, k_all, v_all, q_start=cached_len), layer)
        return _rms_norm(x) @ self.lm_head

    def decode(
        self,
        input_ids: torch.Tensor | Sequence[int],
        positions: Sequence[int],
        kv_cache: BaseKVCache,
        out_loc: torch.Tensor,
        slots: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """Logits ``(batch, vocab_size)`` for one new token per request of a decode batch.

        Request ``b``'s token ``input_ids[b]`` sits at position ``positions[b]``.
        Its K/V are written to slot ``out_loc[b]``, then it attends over
        ``slots[b]``: the slots of that request's tokens ``0..positions[b]``, in
        order, the last one being ``out_loc[b]`` (a server's ``req_to_token`` row).
        The batch shares every matrix multiply; only attention runs per request,
        over that request's own slots (real servers do this in one varlen kernel).
        """
        ids = self._token_ids(input_ids)
        self._check_cache(kv_cache)
        batch = len(ids)
        if len(positions) != batch or len(slots) != batch:
            raise ArgumentError(
                f"positions and slots need one entry per token ({batch}), got {len(positions)} and {len(slots)}"
            )
        starts = [as_count(p, "positions") for p in positions]
        if max(starts) >= self.max_positions:
            raise ArgumentError(f"positions: {max(starts)} is beyond max_positions ({self.max_positions})")
        out_loc = self._slot_indices(out_loc, batch, kv_cache)
        tables = [self._slot_indices(s, start + 1, kv_cache) for s, start in zip(slots, starts, strict=True)]
        x = self.embed[ids] + self.positions[torch.tensor(starts, device=self.device)]
        for layer in range(self.num_layers):
            q, k, v = self._qkv(x, layer)
            kv_cache.store_kv(k, v, out_loc, layer)  # every request's new row, in one store
            attention = []
            for b, table in enumerate(tables):
                k_all, v_all = gather_kv(kv_cache, layer, table)
                attention.append(self._attend(q[b : b + 1], k_all, v_all, q_start=starts[b]))
            x = self._finish_layer(x, torch.cat(attention), layer)
        return _rms_norm(x) @ self.lm_head

    # -- the layer, shared by forward, prefill and decode so that they differ only in where K/V come from --

    def _embed(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        return self.embed[ids] + self.positions[start : start + len(ids)]

    def _qkv(self, x: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w, h = self.layers[layer], _rms_norm(x)
        n = len(x)
        q = (h @ w["wq"]).view(n, self.num_heads, self.head_dim)
        k = (h @ w["wk"]).view(n, self.num_kv_heads, self.head_dim)
        v = (h @ w["wv"]).view(n, self.num_kv_heads, self.head_dim)
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
        """Causal attention of queries at positions ``q_start..`` over keys at positions ``0..len(k)-1``."""
        group = self.num_heads // self.num_kv_heads
        # Each KV head serves `group` query heads: that sharing is all GQA is.
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
        q_pos = torch.arange(q_start, q_start + len(q), device=q.device)[:, None]
        k_pos = torch.arange(len(k), device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
        return out.reshape(len(q), self.num_heads * self.head_dim)

    def _finish_layer(self, x: torch.Tensor, attention: torch.Tensor, layer: int) -> torch.Tensor:
        w = self.layers[layer]
        x = x + attention @ w["wo"]
        return x + torch.nn.functional.silu(_rms_norm(x) @ w["w_up"]) @ w["w_down"]

    # -- validation --

    def _token_ids(self, input_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        array = as_token_ids(input_ids)
        if len(array) == 0:
            raise ArgumentError("input_ids must hold at least one token")
        if len(array) > self.max_positions:
            raise ArgumentError(f"input_ids: {len(array)} tokens exceed max_positions ({self.max_positions})")
        if array.min() < 0 or array.max() >= self.vocab_size:
            raise ArgumentError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        return torch.from_numpy(array).to(self.device)

    def _check_cache(self, kv_cache: BaseKVCache) -> None:
        if not isinstance(kv_cache, BaseKVCache):
            raise ArgumentTypeError(f"kv_cache must be a BaseKVCache, got {type(kv_cache).__name__}")
        if kv_cache.num_layers != self.num_layers:
            raise ArgumentError(f"kv_cache has {kv_cache.num_layers} layers, the model has {self.num_layers}")
        heads, dim = kv_cache.k_cache(0).shape[2:]
        if (heads, dim) != (self.num_kv_heads, self.head_dim):
            raise ArgumentError(
                f"kv_cache stores {heads} KV heads of dim {dim}, "
                f"the model needs {self.num_kv_heads} of dim {self.head_dim}"
            )
        if kv_cache.dtype != self.dtype or kv_cache.device != self.device:
            raise ArgumentError(
                f"kv_cache is {kv_cache.dtype} on {kv_cache.device}, the model is {self.dtype} on {self.device}"
            )

    def _slot_indices(self, indices: torch.Tensor, num_tokens: int, kv_cache: BaseKVCache) -> torch.Tensor:
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
