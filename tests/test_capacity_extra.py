"""Weights beside the KV cache: parameter counts from configs, and the tokens left over.

Chapter 1 subtracts a model's weights from GPU memory before counting tokens;
these tests pin the counts to the published sizes and check the arithmetic's edges.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minikv.capacity import MODELS, ModelShape, tokens_that_fit, tokens_that_fit_beside_weights
from minikv.errors import ArgumentError, ArgumentTypeError

LLAMA2 = MODELS["Llama-2-7B"]
LLAMA3 = MODELS["Llama-3-8B"]


@pytest.mark.parametrize(
    ("shape", "published"),
    # The exact counts published with the checkpoints ("6.74B" and "8.03B" parameters).
    [(LLAMA2, 6_738_415_616), (LLAMA3, 8_030_261_248)],
)
def test_parameter_count_matches_the_published_checkpoint(shape: ModelShape, published: int) -> None:
    assert shape.num_parameters() == published


def test_kv_bytes_per_token_of_the_three_attention_kinds() -> None:
    # MHA keeps every head: 2 (K and V) x 32 layers x 32 heads x 128 dims x 2 bytes = 512 KiB.
    assert LLAMA2.bytes_per_token(torch.bfloat16) == 512 * 1024
    # GQA keeps 8 of the 32 heads: a quarter of that.
    assert LLAMA3.bytes_per_token(torch.bfloat16) == 128 * 1024
    # MLA keeps one 512-wide latent plus a 64-wide RoPE key per layer, no separate V.
    assert MODELS["DeepSeek-V3"].bytes_per_token(torch.bfloat16) == 61 * (512 + 64) * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_weight_bytes_scale_with_the_element_size(dtype: torch.dtype) -> None:
    element = torch.empty((), dtype=dtype).element_size()
    assert LLAMA3.weight_bytes(dtype) == LLAMA3.num_parameters() * element


def test_tied_embeddings_drop_one_vocabulary_matrix() -> None:
    tied = dataclasses.replace(LLAMA3, tie_word_embeddings=True)
    assert LLAMA3.num_parameters() - tied.num_parameters() == LLAMA3.vocab_size * LLAMA3.hidden_size


def test_gqa_narrows_the_k_and_v_projections_only() -> None:
    as_mha = dataclasses.replace(LLAMA3, num_kv_heads=LLAMA3.num_attention_heads)
    missing_heads = LLAMA3.num_attention_heads - LLAMA3.num_kv_heads
    saved = LLAMA3.num_layers * 2 * LLAMA3.hidden_size * missing_heads * LLAMA3.head_dim
    assert as_mha.num_parameters() - LLAMA3.num_parameters() == saved


def test_mla_and_unrecorded_shapes_are_refused_by_name() -> None:
    with pytest.raises(ArgumentError, match="MLA"):
        MODELS["DeepSeek-V3"].num_parameters()
    no_vocab = dataclasses.replace(LLAMA2, vocab_size=0)
    with pytest.raises(ArgumentError, match="vocab_size"):
        no_vocab.weight_bytes()
    with pytest.raises(ArgumentError, match="intermediate_size"):
        dataclasses.replace(LLAMA2, intermediate_size=0).num_parameters()


@settings(max_examples=60, deadline=None)
@given(
    memory=st.integers(min_value=0, max_value=200 * 10**9),
    name=st.sampled_from(["Llama-2-7B", "Llama-3-8B"]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_tokens_beside_weights_is_the_largest_count_that_fits(memory: int, name: str, dtype: torch.dtype) -> None:
    shape = MODELS[name]
    weights = shape.weight_bytes(dtype)
    per_token = shape.bytes_per_token(dtype)
    if weights > memory:
        with pytest.raises(ArgumentError, match="memory_bytes"):
            tokens_that_fit_beside_weights(memory, shape, dtype)
        return
    tokens = tokens_that_fit_beside_weights(memory, shape, dtype)
    assert weights + tokens * per_token <= memory < weights + (tokens + 1) * per_token
    assert tokens <= tokens_that_fit(memory, per_token)


def test_bad_memory_is_refused_by_name() -> None:
    with pytest.raises(ArgumentError, match="memory_bytes"):
        tokens_that_fit_beside_weights(-1, LLAMA2)
    with pytest.raises(ArgumentTypeError, match="memory_bytes"):
        tokens_that_fit_beside_weights(24e9, LLAMA2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="memory_bytes"):
        tokens_that_fit_beside_weights(LLAMA2.weight_bytes() - 1, LLAMA2)
    assert tokens_that_fit_beside_weights(LLAMA2.weight_bytes(), LLAMA2) == 0
