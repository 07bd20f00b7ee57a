"""minikv: how an LLM server manages its KV cache, as a small real package.

Storage layer: :class:`MHAKVCache` and :func:`store_cache`.
Management layer: :class:`NaiveCacheManager` and :class:`RadixCacheManager`.
Around them: :class:`PagePool`, the request lifecycle (:mod:`minikv.lifecycle`) and a
small serving engine (:class:`Engine`, :mod:`minikv.engine`).
"""

from . import block_manager, engine, errors, tiny_model
from .base import BaseCacheHandle, BaseCacheManager, BaseKVCache, KVCacheLayout, SizeInfo
from .capacity import (
    MODELS,
    ModelShape,
    kv_bytes_per_token,
    mla_bytes_per_token,
    tokens_that_fit,
    tokens_that_fit_beside_weights,
)
from .engine import Engine, EngineRequest
from .kernels import store_cache, store_cache_reference
from .language import get_language, set_language
from .lifecycle import Request, admit, finish, serve
from .mha_pool import MHAKVCache
from .naive_manager import NaiveCacheHandle, NaiveCacheManager
from .page_pool import PagePool
from .radix_manager import RadixCacheHandle, RadixCacheManager, RadixTreeNode

__version__ = "0.1.0"

__all__ = [
    "MODELS",
    "BaseCacheHandle",
    "BaseCacheManager",
    "BaseKVCache",
    "Engine",
    "EngineRequest",
    "KVCacheLayout",
    "MHAKVCache",
    "ModelShape",
    "NaiveCacheHandle",
    "NaiveCacheManager",
    "PagePool",
    "RadixCacheHandle",
    "RadixCacheManager",
    "RadixTreeNode",
    "Request",
    "SizeInfo",
    "admit",
    "block_manager",
    "engine",
    "errors",
    "finish",
    "get_language",
    "kv_bytes_per_token",
    "mla_bytes_per_token",
    "serve",
    "set_language",
    "store_cache",
    "store_cache_reference",
    "tiny_model",
    "tokens_that_fit",
    "tokens_that_fit_beside_weights",
]  # fmt: skip
