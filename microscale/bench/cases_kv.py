"""The ``kv_decode`` case: :func:`microscale.attention.decode_attention` over a paged KV cache
in a block-scaled format, one query token per sequence.

Shape ``(B, L, Hq, Hkv, D, W)``: batch, context tokens per sequence, query heads, KV heads,
head_dim, sliding window (0: none). Bytes model: the KV bytes read (codes + scales of the
visible tokens) + q + out. Checked against :func:`microscale.attention.attention_reference`
(float32 over the dequantized cache) on the first and last sequence before timing. Peers:
bf16 K/V through ``torch.nn.functional.scaled_dot_product_attention`` (GQA), and
FlashAttention's ``flash_attn_with_kvcache`` on bf16 K/V when importable.
"""
from __future__ import annotations

from typing import Any

import torch

from ._peers import Skip
from .cases import Case, Context, Peer, _format, _lookup
from .checks import Check, rel_fro
from .suites import CaseSpec

__all__ = ["build_kv_decode", "KV_TOL"]

#: relative Frobenius error allowed against the float32 reference (bf16 MMA operands)
KV_TOL = 1e-2
_FILL = 8192  # tokens per append while filling the cache


def _bf16_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, D], k/v [B, Hkv, L, D] -> [B, Hq, D]."""
    out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)
    return out.squeeze(2)


def build_kv_decode(spec: CaseSpec, ctx: Context) -> Case:
    """A decode step of one layer over ``B`` sequences of ``L`` cached tokens (see the module docstring)."""
    attn = _lookup("attention")
    fmt = _format(spec.format)
    if len(spec.shape) != 6:
        raise Skip(f"kv_decode shapes are B x L x Hq x Hkv x D x W, got {spec.shape}")
    b, length, hq, hkv, d, w = spec.shape
    window = w or None
    per_token = d % fmt.block_size != 0 or fmt.block_size > d
    try:
        kvf = attn.kv_format(fmt, d, per_token)
    except (ValueError, NotImplementedError) as e:
        raise Skip(f"{spec.format} as KV: {e}") from None
    page = 16
    pages = -(-length // page)
    gs = 1.0 if kvf.global_scale else None
    visible = min(length, window) if window else length
    probe = attn.PagedKVCache(kvf, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=1, page_size=page)
    kv_bytes = b * visible * probe.nbytes_per_token
    cache_bytes = b * length * probe.nbytes_per_token
    dense_bytes = 2 * b * length * hkv * d * 2
    if not ctx.cpu:
        free, _ = torch.cuda.mem_get_info(ctx.device)
        if 2 * cache_bytes + dense_bytes > 0.8 * free:
            raise Skip(f"{cache_bytes / 2**30:.1f} GiB cache + {dense_bytes / 2**30:.1f} GiB bf16 peer exceed free "
                       f"memory {free / 2**30:.1f} GiB")
    sinks = torch.randn(hq, generator=ctx.generator, device=ctx.device) if window else None

    def kv_chunk(n: int) -> torch.Tensor:
        return torch.randn((n, hkv, d), generator=ctx.generator, device=ctx.device, dtype=torch.float32).to(
            torch.bfloat16)

    def make() -> tuple:
        cache = attn.PagedKVCache(kvf, num_layers=1, num_kv_heads=hkv, head_dim=d, num_pages=b * pages,
                                  page_size=page, max_seqs=b, max_pages_per_seq=pages, device=ctx.device,
                                  global_scale=gs, per_token=False)
        for s in range(b):
            for t in range(0, length, _FILL):
                n = min(_FILL, length - t)
                cache.append(0, kv_chunk(n), kv_chunk(n), seqs=[s])
        q = torch.randn((b, hq, d), generator=ctx.generator, device=ctx.device).to(torch.bfloat16)
        return (q, cache)

    def fn(q: torch.Tensor, cache: Any) -> torch.Tensor:
        return attn.decode_attention(q, cache, 0, sliding_window=window, sinks=sinks)

    def check(inputs: tuple, y: torch.Tensor) -> Check:
        q, cache = inputs
        sel = sorted({0, b - 1})
        ref = attn.attention_reference(q[sel], cache, 0, seqs=sel, sliding_window=window, sinks=sinks)
        err = rel_fro(y[sel], ref)
        return Check(err < KV_TOL, "rel_fro", err, f"rel Frobenius error {err:.3g} on sequences {sel} "
                                                   f"(tolerance {KV_TOL:g})")

    def dense() -> tuple:
        k = torch.randn((b, hkv, length, d), generator=ctx.generator, device=ctx.device, dtype=torch.bfloat16)
        v = torch.randn((b, hkv, length, d), generator=ctx.generator, device=ctx.device, dtype=torch.bfloat16)
        q = torch.randn((b, hq, d), generator=ctx.generator, device=ctx.device, dtype=torch.bfloat16)
        return (q, k, v)

    peer_bytes = 2 * b * visible * hkv * d * 2 + 4 * b * hq * d

    def dense_check(inputs: tuple, y: torch.Tensor) -> Check:
        q, k, v = inputs
        if window:
            k, v = k[:, :, -window:], v[:, :, -window:]
        ref = _bf16_sdpa(q[:1].float(), k[:1].float(), v[:1].float())
        err = rel_fro(y[:1], ref)
        return Check(err < KV_TOL, "rel_fro", err, f"rel Frobenius error {err:.3g} vs fp32 SDPA (sequence 0)")

    def sdpa_peer() -> Peer:
        if ctx.cpu:
            raise Skip("timed on CUDA only")

        def run(q, k, v):
            if window:
                k, v = k[:, :, -window:], v[:, :, -window:]
            return _bf16_sdpa(q, k, v)
        return Peer("SDPA bf16 KV", run, dense_check, make_inputs=dense, set_bytes=dense_bytes, nbytes=peer_bytes)

    def flash_peer() -> Peer:
        if ctx.cpu:
            raise Skip("CUDA only")
        try:
            from flash_attn import flash_attn_with_kvcache
        except Exception as e:  # noqa: BLE001
            raise Skip(f"flash_attn not importable ({type(e).__name__})") from None

        def make_nhd() -> tuple:
            q, k, v = dense()
            return (q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())

        def run(q, k, v):
            ws = (window - 1, 0) if window else (-1, -1)
            return flash_attn_with_kvcache(q.unsqueeze(1), k, v, causal=True, window_size=ws).squeeze(1)

        def chk(inputs: tuple, y: torch.Tensor) -> Check:
            q, k, v = inputs
            return dense_check((q, k.transpose(1, 2), v.transpose(1, 2)), y)
        return Peer("FlashAttention bf16 KV", run, chk, make_inputs=make_nhd, set_bytes=dense_bytes,
                    nbytes=peer_bytes)

    return Case(spec, fn, make, check, nbytes=kv_bytes + 4 * b * hq * d, flops=4 * b * hq * visible * d,
                compute_kind=None, set_bytes=cache_bytes + 4 * b * hq * d,
                peers=[("SDPA bf16 KV", sdpa_peer), ("FlashAttention bf16 KV", flash_peer)])
