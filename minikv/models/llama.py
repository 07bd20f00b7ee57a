"""A Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, ...) whose attention reads the paged cache.

What makes it Llama rather than :class:`~minikv.tiny_model.TinyDecoder`:

* **RoPE**: positions are not added to the input; Q and K are rotated by an
  angle that grows with the position. So a cached K row is valid only at the
  position it was computed for, which is why a prefix is reusable only as a
  *prefix* (at the same positions), never as a substring elsewhere.
* **GQA**: ``num_heads`` query heads share ``num_kv_heads`` K/V heads; the cache
  stores only the K/V heads (SmolLM2-135M: 9 query heads over 3 K/V heads,
  so a third of the bytes multi-head attention would need).
* **SwiGLU MLP** and **RMSNorm** with learned scales; an output head that may
  be the token embedding itself (tied weights).

Weights are plain tensors (:class:`LlamaWeights`), projections stored
``(in, out)`` so that every projection reads ``h @ w``. :func:`~minikv.models.load_smollm2` fills
them from a GGUF file; :meth:`LlamaModel.random` draws them, for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import as_count
from ..errors import ArgumentError, ArgumentTypeError
from .base import PagedDecoder

LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
"""The tensors of one layer, by the names :class:`LlamaModel` uses."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-family model (the fields a GGUF file's ``llama.*`` metadata gives)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_positions: int
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "max_positions"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ArgumentError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ArgumentError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads}), "
                f"and num_heads of num_kv_heads ({self.num_kv_heads})"
            )
        if (self.hidden_size // self.num_heads) % 2:
            raise ArgumentError(f"head_dim ({self.hidden_size // self.num_heads}) must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass
class LlamaWeights:
    """Every tensor of a Llama model; projections are stored ``(in, out)``."""

    embed: torch.Tensor
    """``(vocab_size, hidden_size)``: the token embedding."""
    norm: torch.Tensor
    """``(hidden_size,)``: the scale of the last RMSNorm."""
    layers: list[dict[str, torch.Tensor]]
    """One dict per layer, keyed by the names in ``LAYER_WEIGHTS``."""
    lm_head: torch.Tensor | None = None
    """``(hidden_size, vocab_size)``, or ``None`` when the output head is the embedding (tied)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale each row to unit root-mean-square (computed in float32), then by a learned weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaModel(PagedDecoder):
    """A Llama-family decoder over minikv's paged cache (``forward``/``prefill``/``decode`` from :class:`PagedDecoder`).

    ``weights`` are checked against ``config`` and converted to ``dtype``. RoPE
    follows Hugging Face's layout: the first and second halves of each head form
    the rotated pairs.
    """

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, dtype: torch.dtype = torch.float32) -> None:
        if not isinstance(config, LlamaConfig):
            raise ArgumentTypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ArgumentTypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.config = config
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_layers
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.max_positions = config.max_positions
        self.weights = _checked_weights(config, weights, dtype)
        device = self.weights.embed.device
        # RoPE angles for every position, once: position p turns pair i by p * theta^(-2i / head_dim).
        inv_freq = 1.0 / config.rope_theta ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        )
        angles = torch.arange(self.max_positions, device=device).float()[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.rope_cos, self.rope_sin = angles.cos().to(dtype), angles.sin().to(dtype)

    @classmethod
    def random(
        cls, config: LlamaConfig, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> LlamaModel:
        """A model with seeded random weights (drawn on the CPU, so a seed means the same model everywhere)."""
        gen = torch.Generator().manual_seed(as_count(seed, "seed"))
        hidden, ffn = config.hidden_size, config.intermediate_size
        kv_width = config.num_kv_heads * config.head_dim

        def weight(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) / math.sqrt(shape[0])).to(device)

        def norm() -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(device)

        layers = [
            {"attn_norm": norm(), "wq": weight(hidden, hidden), "wk": weight(hidden, kv_width),
             "wv": weight(hidden, kv_width), "wo": weight(hidden, hidden), "mlp_norm": norm(),
             "w_gate": weight(hidden, ffn), "w_up": weight(hidden, ffn), "w_down": weight(ffn, hidden)}
            for _ in range(config.num_layers)
        ]  # fmt: skip
        embed = weight(config.vocab_size, hidden) * hidden**0.5 / 4
        lm_head = None if config.tie_word_embeddings else weight(hidden, config.vocab_size)
        return cls(config, LlamaWeights(embed, norm(), layers, lm_head), dtype)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    # -- the layer --

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.weights.embed[ids]  # no position here: RoPE adds it to Q and K

    def layer_qkv(
        self, x: torch.Tensor, layer: int, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w, n = self.weights.layers[layer], len(x)
        h = rms_norm(x, w["attn_norm"], self.config.rms_norm_eps)
        q = (h @ w["wq"]).view(n, self.num_heads, self.head_dim)
        k = (h @ w["wk"]).view(n, self.num_kv_heads, self.head_dim)
        v = (h @ w["wv"]).view(n, self.num_kv_heads, self.head_dim)
        # RoPE: turn each (first half, second half) pair of Q and K by its position's angle.
        cos = self.rope_cos[positions][:, None, :]
        sin = self.rope_sin[positions][:, None, :]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v  # K rotated: what the cache stores, as in every server

    def finish_layer(self, x: torch.Tensor, attention: torch.Tensor, layer: int) -> torch.Tensor:
        w = self.weights.layers[layer]
        x = x + attention @ w["wo"]
        h = rms_norm(x, w["mlp_norm"], self.config.rms_norm_eps)
        return x + (torch.nn.functional.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, self.weights.norm, self.config.rms_norm_eps)
        if self.weights.lm_head is None:
            return h @ self.weights.embed.T  # tied: the output head is the embedding
        return h @ self.weights.lm_head


def _checked_weights(config: LlamaConfig, weights: LlamaWeights, dtype: torch.dtype) -> LlamaWeights:
    """``weights`` in ``dtype``, if every tensor the config needs is there, in its shape, on one device."""
    if not isinstance(weights, LlamaWeights):
        raise ArgumentTypeError(f"weights must be LlamaWeights, got {type(weights).__name__}")
    hidden, ffn, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    kv_width = config.num_kv_heads * config.head_dim
    layer_shapes = {
        "attn_norm": (hidden,), "wq": (hidden, hidden), "wk": (hidden, kv_width), "wv": (hidden, kv_width),
        "wo": (hidden, hidden), "mlp_norm": (hidden,), "w_gate": (hidden, ffn), "w_up": (hidden, ffn),
        "w_down": (ffn, hidden),
    }  # fmt: skip
    if len(weights.layers) != config.num_layers:
        raise ArgumentError(f"weights: {len(weights.layers)} layers, the config has {config.num_layers}")
    if config.tie_word_embeddings != (weights.lm_head is None):
        raise ArgumentError("weights: give lm_head exactly when the config's tie_word_embeddings is False")
    device = weights.embed.device if isinstance(weights.embed, torch.Tensor) else None

    def checked(tensor: object, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise ArgumentTypeError(f"weights: {name} must be a floating-point tensor")
        if tuple(tensor.shape) != shape:
            raise ArgumentError(f"weights: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        if tensor.device != device:
            raise ArgumentError(f"weights: {name} is on {tensor.device}, embed on {device}")
        return tensor.to(dtype)

    layers = [
        {name: checked(layer.get(name), f"layers[{i}].{name}", shape) for name, shape in layer_shapes.items()}
        for i, layer in enumerate(weights.layers)
    ]
    lm_head = None if weights.lm_head is None else checked(weights.lm_head, "lm_head", (hidden, vocab))
    return LlamaWeights(
        checked(weights.embed, "embed", (vocab, hidden)), checked(weights.norm, "norm", (hidden,)), layers, lm_head
    )
