"""How many bytes one token's KV costs, and how many tokens fit in a GPU.

This is why a KV cache needs managing at all: one token costs tens to hundreds of
kilobytes of GPU memory, a long prompt hundreds of megabytes, and the memory left
after the weights runs out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._validate import as_count, as_positive
from .errors import ArgumentError, ArgumentTypeError


def dtype_size(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of K *and* V for one token across all layers (MHA and GQA)."""
    layers = as_positive(num_layers, "num_layers")
    heads = as_positive(num_kv_heads, "num_kv_heads")
    dim = as_positive(head_dim, "head_dim")
    return 2 * layers * heads * dim * dtype_size(dtype)


def mla_bytes_per_token(num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: torch.dtype) -> int:
    """Bytes per token for multi-head latent attention: one compressed latent plus the RoPE key, no separate V."""
    layers = as_positive(num_layers, "num_layers")
    rank = as_positive(kv_lora_rank, "kv_lora_rank")
    rope = as_count(qk_rope_head_dim, "qk_rope_head_dim")
    return layers * (rank + rope) * dtype_size(dtype)


@dataclass(frozen=True)
class ModelShape:
    """The config numbers that decide a model's KV size (from its published ``config.json``)."""

    name: str
    attention: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    source: str = ""
    # Only needed to count the weights of a dense (Llama-style) decoder; 0 = not recorded.
    hidden_size: int = 0
    num_attention_heads: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False

    def bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> int:
        if self.attention == "MLA":
            return mla_bytes_per_token(self.num_layers, self.kv_lora_rank, self.qk_rope_head_dim, dtype)
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype)

    def num_parameters(self) -> int:
        """Parameters of a dense Llama-style decoder, counted from its config.

        The weights share the GPU with the KV cache, so they decide how much is
        left for it. Per layer: the Q, K, V and O projections (K and V are as
        narrow as the KV heads, which is where GQA saves weights too), a gated
        MLP of three matrices and two RMSNorm vectors; plus the embedding, the
        output head (unless tied to the embedding) and the final norm. No biases.
        Mixture-of-experts models such as DeepSeek-V3 are not covered.
        """
        if self.attention not in ("MHA", "GQA"):
            raise ArgumentError(f"shape: {self.name} uses {self.attention}; only dense MHA/GQA decoders are counted")
        hidden = as_positive(self.hidden_size, "hidden_size")
        q_width = as_positive(self.num_attention_heads, "num_attention_heads") * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        mlp = as_positive(self.intermediate_size, "intermediate_size")
        vocab = as_positive(self.vocab_size, "vocab_size")
        attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
        per_layer = attention + 3 * hidden * mlp + 2 * hidden
        embeddings = vocab * hidden * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + hidden

    def weight_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes of the weights when every parameter is stored as ``dtype``."""
        return self.num_parameters() * dtype_size(dtype)


MODELS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape(
            "Llama-2-7B", "MHA", num_layers=32, num_kv_heads=32, head_dim=128,
            source=(
                "meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32, num_key_value_heads 32, "
                "hidden_size 4096 / num_attention_heads 32; intermediate_size 11008, vocab_size 32000"
            ),
            hidden_size=4096, num_attention_heads=32, intermediate_size=11008, vocab_size=32000,
        ),
        ModelShape(
            "Llama-3-8B", "GQA", num_layers=32, num_kv_heads=8, head_dim=128,
            source=(
                "meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, num_key_value_heads 8, "
                "hidden_size 4096 / num_attention_heads 32; intermediate_size 14336, vocab_size 128256"
            ),
            hidden_size=4096, num_attention_heads=32, intermediate_size=14336, vocab_size=128256,
        ),
        ModelShape(
            "DeepSeek-V3", "MLA", num_layers=61, num_kv_heads=1, head_dim=0, kv_lora_rank=512, qk_rope_head_dim=64,
            source="deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, kv_lora_rank 512, qk_rope_head_dim 64",
        ),
    )
}  # fmt: skip


def tokens_that_fit(memory_bytes: int, bytes_per_token: int) -> int:
    """Whole tokens whose KV fits in ``memory_bytes``."""
    return as_count(memory_bytes, "memory_bytes") // as_positive(bytes_per_token, "bytes_per_token")


def tokens_that_fit_beside_weights(memory_bytes: int, shape: ModelShape, dtype: torch.dtype = torch.bfloat16) -> int:
    """Whole tokens whose KV fits in what ``memory_bytes`` leaves after the weights (both in ``dtype``).

    Still an upper bound: activations, the CUDA context and allocator slack
    take their share too, which is why servers reserve a fraction of memory.
    """
    memory = as_count(memory_bytes, "memory_bytes")
    weights = shape.weight_bytes(dtype)
    if weights > memory:
        raise ArgumentError(f"memory_bytes: {memory} bytes cannot hold the {weights} bytes of {shape.name}'s weights")
    return tokens_that_fit(memory - weights, shape.bytes_per_token(dtype))
