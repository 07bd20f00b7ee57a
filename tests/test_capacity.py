"""KV bytes per token and tokens that fit: the arithmetic chapter 1 builds on.

(``test_capacity_extra.py`` covers the weight counts; this file covers the KV side.)
"""

from __future__ import annotations

import pytest
import torch
from helpers import REPRODUCIBLE
from hypothesis import given
from hypothesis import strategies as st

import minikv
from minikv import MODELS, ModelShape, kv_bytes_per_token, mla_bytes_per_token, tokens_that_fit
from minikv.capacity import dtype_size
from minikv.errors import ArgumentError, ArgumentTypeError


@pytest.mark.parametrize(
    ("dtype", "size"),
    [(torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2), (torch.float8_e4m3fn, 1), (torch.float64, 8)],
    ids=str,
)
def test_dtype_size(dtype: torch.dtype, size: int) -> None:
    assert dtype_size(dtype) == size


def test_dtype_size_refuses_a_name() -> None:
    with pytest.raises(ArgumentTypeError, match="dtype"):
        dtype_size("float16")  # type: ignore[arg-type]


def test_kv_bytes_per_token_is_k_and_v_over_every_layer_and_head() -> None:
    assert kv_bytes_per_token(num_layers=2, num_kv_heads=3, head_dim=5, dtype=torch.float16) == 2 * 2 * 3 * 5 * 2


@REPRODUCIBLE
@given(
    layers=st.integers(1, 128),
    heads=st.integers(1, 64),
    dim=st.integers(1, 512),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e5m2]),
)
def test_kv_bytes_per_token_scales_linearly(layers: int, heads: int, dim: int, dtype: torch.dtype) -> None:
    one = kv_bytes_per_token(layers, heads, dim, dtype)
    assert one == 2 * layers * heads * dim * dtype_size(dtype)
    assert kv_bytes_per_token(2 * layers, heads, dim, dtype) == 2 * one
    assert kv_bytes_per_token(layers, 2 * heads, dim, dtype) == 2 * one


def test_gqa_saves_the_ratio_of_query_to_kv_heads() -> None:
    mha = kv_bytes_per_token(32, 32, 128, torch.bfloat16)
    gqa = kv_bytes_per_token(32, 8, 128, torch.bfloat16)
    assert mha == 4 * gqa


def test_mla_stores_one_latent_and_one_rope_key_per_layer() -> None:
    assert mla_bytes_per_token(61, 512, 64, torch.bfloat16) == 61 * 576 * 2
    assert mla_bytes_per_token(2, 16, 0, torch.float32) == 2 * 16 * 4  # a RoPE dim of 0 is allowed


@pytest.mark.parametrize(
    ("args", "name"),
    [((0, 512, 64), "num_layers"), ((61, 0, 64), "kv_lora_rank"), ((61, 512, -1), "qk_rope_head_dim")],
)
def test_mla_bytes_refuses_bad_sizes(args: tuple[int, int, int], name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        mla_bytes_per_token(*args, torch.bfloat16)


@pytest.mark.parametrize(
    ("args", "name"),
    [((0, 8, 128), "num_layers"), ((32, 0, 128), "num_kv_heads"), ((32, 8, -1), "head_dim")],
)
def test_kv_bytes_refuses_bad_sizes(args: tuple[int, int, int], name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        kv_bytes_per_token(*args, torch.bfloat16)


def test_kv_bytes_refuses_float_sizes() -> None:
    with pytest.raises(ArgumentTypeError, match="head_dim"):
        kv_bytes_per_token(32, 8, 128.0, torch.bfloat16)  # type: ignore[arg-type]


def test_tokens_that_fit_rounds_down_to_whole_tokens() -> None:
    assert tokens_that_fit(1000, 300) == 3
    assert tokens_that_fit(900, 300) == 3
    assert tokens_that_fit(0, 300) == 0
    # An 80 GB card with 60 GiB left for KV holds 122,880 tokens of Llama-2-7B in bf16.
    assert tokens_that_fit(60 * 2**30, MODELS["Llama-2-7B"].bytes_per_token()) == 122_880


@pytest.mark.parametrize(("args", "name"), [((-1, 10), "memory_bytes"), ((10, 0), "bytes_per_token")])
def test_tokens_that_fit_refuses_bad_sizes(args: tuple[int, int], name: str) -> None:
    with pytest.raises(ArgumentError, match=name):
        tokens_that_fit(*args)


def test_models_are_the_three_attention_kinds_with_published_sizes() -> None:
    assert set(MODELS) >= {"Llama-2-7B", "Llama-3-8B", "DeepSeek-V3"}
    assert [MODELS[n].attention for n in ("Llama-2-7B", "Llama-3-8B", "DeepSeek-V3")] == ["MHA", "GQA", "MLA"]
    assert MODELS["Llama-2-7B"].bytes_per_token() == 524_288  # 512 KiB per token
    assert MODELS["Llama-3-8B"].bytes_per_token() == 131_072  # 128 KiB
    assert MODELS["DeepSeek-V3"].bytes_per_token() == 70_272  # about 69 KiB
    for shape in MODELS.values():
        assert shape.source and shape.name in MODELS and MODELS[shape.name] is shape


def test_bytes_per_token_follows_the_dtype_and_the_attention_kind() -> None:
    llama = MODELS["Llama-3-8B"]
    assert llama.bytes_per_token(torch.float32) == 2 * llama.bytes_per_token(torch.bfloat16)
    assert llama.bytes_per_token(torch.float8_e4m3fn) == llama.bytes_per_token(torch.bfloat16) // 2
    mla = ModelShape("tiny-MLA", "MLA", num_layers=2, num_kv_heads=1, head_dim=0, kv_lora_rank=8, qk_rope_head_dim=4)
    assert mla.bytes_per_token(torch.float16) == 2 * (8 + 4) * 2
    mha = ModelShape("tiny-MHA", "MHA", num_layers=2, num_kv_heads=4, head_dim=8)
    assert mha.bytes_per_token(torch.float16) == 2 * 2 * 4 * 8 * 2


def test_the_package_exports_the_capacity_api() -> None:
    for name in ("MODELS", "ModelShape", "kv_bytes_per_token", "mla_bytes_per_token", "tokens_that_fit"):
        assert getattr(minikv, name) is getattr(minikv.capacity, name)
