"""transformers integration through its own extension points: :class:`MicroscaleKVCache`, a
``transformers.Cache`` whose layers keep K/V in a :class:`~.cache.PagedKVCache`, and
``"microscale"``, an attention function registered with ``AttentionInterface`` that reads the
pages directly (:func:`~.op.decode_attention` / :func:`~.op.extend_attention`)::

    from microscale.attention.hf import MicroscaleKVCache, register
    register()                                   # AttentionInterface["microscale"]
    model.set_attn_implementation("microscale")
    cache = MicroscaleKVCache(model.config, "nvfp4", max_cache_len=4096)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=64)

With another attention implementation (``sdpa``, ``eager``) the cache returns the decoded
K/V of the whole sequence from ``update``, as transformers' quantized caches do. The
registered attention has no mask: batches of equal-length prompts (no padding).
Importing this module imports transformers.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..formats import Format
from .cache import PagedKVCache
from .op import decode_attention, extend_attention

__all__ = ["MicroscaleKVCache", "MicroscaleKVLayer", "microscale_attention", "register", "ATTENTION_NAME"]

ATTENTION_NAME = "microscale"
_TAG = "_microscale_kv"  # attribute naming (paged cache, layer) on the tensors update() returns


class MicroscaleKVLayer(CacheLayerMixin):
    """One model layer's view of the shared :class:`PagedKVCache` (sequence ``i`` = batch row ``i``)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "MicroscaleKVCache", layer_idx: int) -> None:
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner._allocate(key_states)
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[B, H, T, D]`` new K/V (quantized on write). Returns them tagged for the
        ``microscale`` attention, or the whole sequences decoded for any other attention."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        paged = self.owner.paged
        paged.append(self.layer_idx, key_states.transpose(1, 2), value_states.transpose(1, 2))
        if self.owner.materialize:
            b = key_states.shape[0]
            kv = [paged.dequantize(self.layer_idx, s, key_states.dtype) for s in range(b)]
            return (torch.stack([k for k, _ in kv]).transpose(1, 2), torch.stack([v for _, v in kv]).transpose(1, 2))
        setattr(key_states, _TAG, (paged, self.layer_idx))
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return self.owner.paged.lengths(self.layer_idx)[0]

    def get_max_length(self) -> int:
        return self.owner.max_cache_len

    def reset(self) -> None:
        if self.is_initialized and self.layer_idx == 0:
            self.owner.paged.reset()


class MicroscaleKVCache(Cache):
    """A ``transformers.Cache`` holding K/V in a block-scaled format in microscale's pages.

    Args:
        config: the model's (text) config: layers, KV heads, head_dim.
        fmt: KV format (preset name or :class:`~microscale.formats.Format`), e.g. ``"nvfp4"``,
            ``"mxfp4"``, ``"fp8_e4m3_fp32"`` with ``per_token=True``.
        max_cache_len: tokens per sequence the pages are sized for.
        page_size: token slots per page.
        per_token, global_scale: as :class:`PagedKVCache`.
        materialize: return decoded K/V from ``update`` (for attentions other than
            ``"microscale"``); default: unless the config's attention is ``"microscale"``.
    """

    def __init__(self, config, fmt: str | Format = "fp8_e4m3_fp32", *, max_cache_len: int = 4096,
                 page_size: int = 16, per_token: bool = False, global_scale: float | None = None,
                 materialize: bool | None = None) -> None:
        cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.fmt, self.per_token, self.global_scale = fmt, per_token, global_scale
        self.max_cache_len, self.page_size = int(max_cache_len), int(page_size)
        self.materialize = (getattr(cfg, "_attn_implementation", None) != ATTENTION_NAME
                            if materialize is None else bool(materialize))
        self.paged: PagedKVCache | None = None
        super().__init__(layers=[MicroscaleKVLayer(self, i) for i in range(self.num_layers)])

    def _allocate(self, key_states: torch.Tensor) -> None:
        if self.paged is not None:
            return
        b = key_states.shape[0]
        pages = -(-self.max_cache_len // self.page_size)
        self.paged = PagedKVCache(self.fmt, num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                                  head_dim=self.head_dim, num_pages=b * pages, page_size=self.page_size, max_seqs=b,
                                  max_pages_per_seq=pages, device=key_states.device, global_scale=self.global_scale,
                                  per_token=self.per_token)


def microscale_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                         sliding_window: int | None = None, softcap: float | None = None,
                         s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function: ``query [B, Hq, T, D]`` attends causally over the
    pages that :class:`MicroscaleKVCache` wrote for this layer (``key`` carries the tag);
    gpt-oss sinks come as ``s_aux``. Returns ``([B, T, Hq, D], None)``."""
    ctx = getattr(key, _TAG, None)
    if ctx is None:
        raise ValueError("microscale attention: key was not returned by a MicroscaleKVCache built with "
                         "materialize=False; pass past_key_values=MicroscaleKVCache(config, ...) to generate/forward")
    if dropout:
        raise ValueError(f"microscale attention: dropout={dropout} is not supported (inference only)")
    paged, layer = ctx
    b, hq, t, d = query.shape
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    opts = dict(softmax_scale=scaling, sliding_window=sliding_window, softcap=softcap, sinks=s_aux)
    if t == 1:
        out = decode_attention(q, paged, layer, **opts)
    else:
        out = extend_attention(q, paged, layer, [t] * b, **opts)
    return out.reshape(b, t, hq, d), None


def register() -> None:
    """Register ``"microscale"`` with transformers' ``AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, microscale_attention)
