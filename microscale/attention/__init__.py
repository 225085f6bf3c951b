"""The attention op family: a paged KV cache in block-scaled formats and attention that reads it.

* :class:`PagedKVCache` — pages of K/V codes and block scales along head_dim, page table,
  per-layer sequence lengths; ``append`` quantizes as it writes.
* :func:`decode_attention` / :func:`extend_attention` — flash decoding and causal
  prefill/extend over the pages (Triton on CUDA; :func:`attention_reference` on CPU), with
  GQA, softmax scale, sliding window, attention sinks and logits soft-cap.
* :func:`from_engine_fp8` / :func:`to_engine_fp8` — serving engines' fp8 KV pages to and from a cache
  (vLLM, FlashInfer, SGLang layouts; import lossless; export lossless for one-scale-a-layer fp8 caches, else
  requantized on request).

Importing this package does not import Triton.
"""
from .cache import PagedKVCache, kv_format
from .engines import EngineKV, from_engine_fp8, to_engine_fp8
from .op import AttentionConfig, choose_config, decode_attention, extend_attention
from .reference import attention_reference

__all__ = ["PagedKVCache", "kv_format", "decode_attention", "extend_attention", "attention_reference",
           "AttentionConfig", "choose_config", "EngineKV", "from_engine_fp8", "to_engine_fp8"]
