"""Attention over a :class:`~.cache.PagedKVCache` in PyTorch: dequantize each sequence's K/V
and compute attention in ``dtype`` (float32 by default, float64 for tests). The oracle of the
Triton kernels; slow is fine, wrong is not.
"""
from __future__ import annotations

import math

import torch

from .cache import PagedKVCache

__all__ = ["attention_reference", "check_attention_args"]

OP = "attention"


def check_attention_args(q: torch.Tensor, cache: PagedKVCache, layer: int, q_lens: list[int] | None,
                         seqs: list[int] | None, sinks: torch.Tensor | None, sliding_window: int | None,
                         softcap: float | None, op: str = OP) -> tuple[list[int], list[int]]:
    """Validate the common arguments; returns (seqs, q_lens) as lists."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"{op}: q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"{op}: q must be [tokens, q_heads, head_dim], got shape {tuple(q.shape)}")
    hq, d = q.shape[1], q.shape[2]
    if d != cache.head_dim:
        raise ValueError(f"{op}: q head_dim={d}, the cache's is {cache.head_dim}")
    if hq % cache.num_kv_heads:
        raise ValueError(f"{op}: q_heads={hq} is not a multiple of the cache's kv heads {cache.num_kv_heads}")
    if not 0 <= layer < cache.num_layers:
        raise ValueError(f"{op}: layer={layer} is out of range [0, {cache.num_layers})")
    if q_lens is None:
        q_lens = [1] * q.shape[0]
    q_lens = [int(n) for n in q_lens]
    seqs = list(range(len(q_lens))) if seqs is None else [int(s) for s in seqs]
    if len(seqs) != len(q_lens):
        raise ValueError(f"{op}: {len(seqs)} seqs but {len(q_lens)} q_lens")
    if sum(q_lens) != q.shape[0]:
        raise ValueError(f"{op}: q has {q.shape[0]} tokens, q_lens sum to {sum(q_lens)}")
    lens = cache.lengths(layer)
    for s, n in zip(seqs, q_lens):
        if not 0 <= s < cache.max_seqs:
            raise ValueError(f"{op}: sequence {s} is out of range [0, {cache.max_seqs})")
        if not 1 <= n <= lens[s]:
            raise ValueError(f"{op}: sequence {s} has {n} queries but holds {lens[s]} tokens in layer {layer}; "
                             "append its K/V first (queries are its last tokens)")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.shape != (hq,)):
        raise ValueError(f"{op}: sinks must be a tensor of shape ({hq},) (one logit per query head), got "
                         f"{getattr(sinks, 'shape', sinks)}")
    if sliding_window is not None and (isinstance(sliding_window, bool) or int(sliding_window) < 1):
        raise ValueError(f"{op}: sliding_window={sliding_window!r} must be a positive int or None")
    if softcap is not None and not float(softcap) > 0:
        raise ValueError(f"{op}: softcap={softcap!r} must be > 0 or None")
    return seqs, q_lens


def attention_reference(q: torch.Tensor, cache: PagedKVCache, layer: int, *, q_lens: list[int] | None = None,
                        seqs: list[int] | None = None, softmax_scale: float | None = None,
                        sliding_window: int | None = None, sinks: torch.Tensor | None = None,
                        softcap: float | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Causal attention of new queries over the cache (decode: one query per sequence).

    Args:
        q: ``[sum(q_lens), Hq, D]``, the queries of ``seqs`` concatenated; the queries of a
            sequence are its last ``q_lens[i]`` tokens (their K/V already appended).
        cache, layer: the KV cache and the layer read.
        q_lens: queries per sequence (default: one each, decode).
        seqs: the cache sequences (default ``0..len(q_lens)-1``).
        softmax_scale: default ``1/sqrt(D)``.
        sliding_window: a query at position i sees keys j with ``i - j < sliding_window``.
        sinks: ``[Hq]`` logits of an extra key with no value (gpt-oss): it joins the softmax
            denominator only.
        softcap: logits become ``softcap * tanh(logits / softcap)`` before masking.
        dtype: compute dtype.

    Returns:
        ``[sum(q_lens), Hq, D]`` in ``dtype``. Query head ``h`` reads KV head ``h // (Hq / Hkv)``.
    """
    seqs, q_lens = check_attention_args(q, cache, layer, q_lens, seqs, sinks, sliding_window, softcap)
    hq, d = q.shape[1], q.shape[2]
    group = hq // cache.num_kv_heads
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    out, start = [], 0
    for s, n in zip(seqs, q_lens):
        k, v = cache.dequantize(layer, s, dtype)  # [L, Hkv, D]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        length = k.shape[1]
        qs = q[start:start + n].to(dtype).transpose(0, 1)  # [Hq, n, D]
        start += n
        logits = (qs @ k.transpose(1, 2)) * scale  # [Hq, n, L]
        if softcap is not None:
            logits = float(softcap) * torch.tanh(logits / float(softcap))
        qpos = torch.arange(length - n, length, device=q.device)[:, None]
        kpos = torch.arange(length, device=q.device)[None, :]
        visible = kpos <= qpos
        if sliding_window is not None:
            visible &= qpos - kpos < int(sliding_window)
        logits = logits.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sk = sinks.to(device=q.device, dtype=dtype).reshape(hq, 1, 1).expand(hq, n, 1)
            probs = torch.softmax(torch.cat([logits, sk], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        out.append((probs @ v).transpose(0, 1))
    return torch.cat(out)
