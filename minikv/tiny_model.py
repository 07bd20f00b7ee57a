"""``TinyDecoder``: a few-layer transformer whose attention reads K/V from the paged cache.

The rest of minikv moves slot indices around; this model is where they are
*used*. ``prefill`` computes only the tokens after the cached prefix, writes
their K/V into their slots with ``store_kv``, and then attends over the whole
prompt by gathering K/V rows back out of the cache by slot. ``decode`` does the
same for one new token per request of a batch, each attending over its own
slots. If the slot bookkeeping is right, their logits equal ``forward``'s, which
recomputes every token and never touches a cache; if a slot was handed to
someone else, they do not. Those three passes are
:class:`~minikv.models.PagedDecoder`'s, shared with the real Llama model of
:mod:`minikv.models`; this file holds only the layer.

The weights are random (seeded): the model predicts nothing useful, but every
logit depends on every earlier token's K/V, which is all a cache test needs.
Positions are learned absolute embeddings added to the input, so a token's K
depends on where it sits: a prefix's K/V is valid only at the same positions,
as with RoPE in real models.
"""

from __future__ import annotations

import torch

from ._validate import as_count, as_positive
from .errors import ArgumentError, ArgumentTypeError
from .models.attention import gather_kv
from .models.base import PagedDecoder

__all__ = ["TinyDecoder", "gather_kv"]


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TinyDecoder(PagedDecoder):
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

        self.embed_tokens = weight(self.vocab_size, hidden, scale=1.0)
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
        return self.embed_tokens.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    # -- the layer (forward, prefill and decode are PagedDecoder's) --

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Learned absolute positions, added to the input: a token's K depends on where it sits.
        return self.embed_tokens[ids] + self.positions[positions]

    def layer_qkv(
        self, x: torch.Tensor, layer: int, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w, h = self.layers[layer], _rms_norm(x)
        n = len(x)
        q = (h @ w["wq"]).view(n, self.num_heads, self.head_dim)
        k = (h @ w["wk"]).view(n, self.num_kv_heads, self.head_dim)
        v = (h @ w["wv"]).view(n, self.num_kv_heads, self.head_dim)
        return q, k, v

    def finish_layer(self, x: torch.Tensor, attention: torch.Tensor, layer: int) -> torch.Tensor:
        w = self.layers[layer]
        x = x + attention @ w["wo"]
        return x + torch.nn.functional.silu(_rms_norm(x) @ w["w_up"]) @ w["w_down"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x) @ self.lm_head
