"""The Triton prefill kernel on the canonical layout (4/8-bit codes, from a few tokens up;
device code: ``_linear_kernels._linear_prefill_kernel``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...formats import Format
from ...qtensor import QTensor
from ...runtime import target
from ...runtime.launch import cdiv, launch, next_pow2
from ...runtime.workspace import workspace
from .. import tuning
from ..eligibility import OP
from ..packed import format_constexprs
from ..weight_state import INT_VIEW, has_specials


@dataclass(frozen=True)
class PrefillConfig:
    """Tiles of :func:`prefill`: ``block_m`` tokens x ``block_n`` weight rows per program,
    ``block_k`` elements per K step; ``group_m`` row tiles per L2-sharing group;
    ``split_k``: K cut into that many equal ranges, one program each, partial sums
    reduced in a fixed order by the last of them (for few tokens, so all SMs stream)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    swap: bool = False  # weights as the MMA's A operand (out^T tiles)
    pair: bool = False  # E2M1 codes with E8M0/UE4M3 scales and bf16 x: bf16x2 pair decode
    split_k: int = 1


def choose_prefill_config(m: int, fmt: Format, k: int | None = None) -> PrefillConfig:
    """Best of the H200 sweeps (docs/decisions/linear-prefill-ws.md). Up to 32 tokens: 16/32
    tokens x 64 weight rows, 128-element K steps, K split in two; affine formats 256-element
    steps split in four. 33-255 tokens: up to 64 tokens x 64 rows, 128-element steps (affine:
    64). From 256 tokens, 8 warps: minifloats with E8M0/UE4M3 scales decode by bf16x2 pairs
    into the register operand (256 x 128 tiles, 4 stages); affine formats likewise without the
    pair decode; the rest 256 x 128 tiles from 2048 tokens on, else 128 x 128. ``pair`` is asked for every
    minifloat with E8M0/UE4M3 scales; :func:`prefill` uses it where it is exact. Given
    ``k``, the K step and split shrink until they tile K (``prefill_supported`` shapes)."""
    c = _prefill_tiles(m, fmt)
    if k is not None:
        while k % (c.split_k * c.block_k) and c.split_k > 1:
            c = replace(c, split_k=c.split_k // 2)
        while k % c.block_k and c.block_k > max(64, fmt.block_size):
            c = replace(c, block_k=c.block_k // 2)
    return c


def _prefill_tiles(m: int, fmt: Format) -> PrefillConfig:
    el = fmt.element
    pair = el.kind == "float" and el.bits in (4, 8) and fmt.scale.name in ("e8m0", "ue4m3")
    if m <= 32:  # few tokens on the MMA's N side; K split so that all SMs stream the weight
        bm = max(16, next_pow2(m))
        if fmt.zero_point:
            return PrefillConfig(block_m=bm, block_n=64, block_k=256, group_m=1, num_warps=4, num_stages=3,
                                 swap=True, split_k=4)
        return PrefillConfig(block_m=bm, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4, swap=True,
                             pair=pair, split_k=2)
    if m < 256:
        bm = min(64, next_pow2(m))
        if fmt.zero_point:
            return PrefillConfig(block_m=bm, block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=4, swap=True)
        return PrefillConfig(block_m=bm, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3, swap=True,
                             pair=pair)
    if pair:  # minifloat pairs into the register operand
        return PrefillConfig(block_m=256, block_n=128, block_k=64, num_stages=4, swap=True, pair=True)
    if fmt.zero_point:
        return PrefillConfig(block_m=256, block_n=128, block_k=64, num_stages=4, swap=True)
    return PrefillConfig(block_m=256 if m >= 2048 else 128, block_n=128, block_k=64)


def prefill_supported(q: QTensor, x: torch.Tensor) -> bool:
    """Whether :func:`prefill` serves ``x @ dequant(q)^T``: a CUDA weight with 4- or 8-bit
    codes in 1-D blocks, unpadded, K a multiple of 64, at least ``tuning.prefill_min_m`` tokens."""
    f = q.fmt
    return (x.is_cuda and q.data.is_cuda and len(q.shape) == 2 and x.dim() >= 1
            and x.shape[-1] == q.shape[-1] and x.numel() // max(x.shape[-1], 1) >= tuning.get().prefill_min_m
            and x.dtype in (torch.bfloat16, torch.float16) and f.element.bits in (4, 8) and f.block_rows == 1
            and q.shape[1] % max(64, f.block_size) == 0 and f.block_size % 16 == 0
            and tuple(q.padded_shape) == tuple(q.shape))


def prefill(x2: torch.Tensor, q: QTensor, bias: torch.Tensor | None = None,
            config: PrefillConfig | None = None) -> torch.Tensor:
    """``x2 [M, K] @ dequant(q)^T (+ bias)`` for many tokens on tensor cores, reading q's
    canonical layout: each weight tile is decoded once per K step in registers and
    reused by all ``block_m`` tokens of the tile (``_linear_kernels._linear_prefill_kernel``)."""
    from .._kernels import _linear_kernels as kern

    m, k = x2.shape
    n = q.shape[0]
    f = q.fmt
    if k != q.shape[1]:
        raise ValueError(f"{OP}: x has K={k} but the weight has K={q.shape[1]}")
    if f.element.bits not in (4, 8) or f.block_rows != 1:
        raise ValueError(f"{OP}: the prefill kernel takes 4/8-bit codes in 1-D blocks, not {f.name}")
    c = config or choose_prefill_config(m, f, k)
    if k % c.block_k or (c.block_k % f.block_size and f.block_size % c.block_k):
        raise ValueError(f"{OP}: K={k} must be a multiple of block_k={c.block_k}, and block_k and the "
                         f"block ({f.block_size}) must divide one another")
    if c.split_k < 1 or k % (c.split_k * c.block_k):
        raise ValueError(f"{OP}: K={k} must be a multiple of split_k*block_k={c.split_k}*{c.block_k}")
    el = f.element
    # the pair decode's bf16 products are exact: 2-bit E2M1 significands times power-of-two
    # or E4M3 scales (a float16/float32 scale would be rounded to bf16)
    # 8-bit minifloats likewise (<= 4-bit significands), unless the weight holds NaN/Inf codes
    pair = (c.pair and x2.dtype == torch.bfloat16 and el.kind == "float" and f.scale.name in ("e8m0", "ue4m3")
            and c.block_k % 8 == 0
            and ((el.bits == 4 and el.mbits == 1 and not el.has_nan and not el.has_inf)
                 or (el.bits == 8 and el.mbits <= 3 and not has_specials(q))))
    x2 = x2.contiguous()
    out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    scales = q.scales.contiguous()
    sb = scales.element_size()
    scales, wide_s = word_rows(scales.view(INT_VIEW[sb]))
    zp, wide_z = word_rows(q.zero_points.contiguous()) if f.zero_point else (scales, False)
    gs = q.global_scale if q.global_scale is not None else scales
    b = bias if bias is not None else scales
    cons = format_constexprs(f, bool(f.element.has_nan or f.element.has_inf))
    tiles = cdiv(m, c.block_m) * cdiv(n, c.block_n)
    ws = cnt = None
    if c.split_k > 1:  # partials as [split_k, m, n]
        ws, cnt = workspace(x2.device, c.split_k * m * n, tiles)
    launch(kern._linear_prefill_kernel, (tiles, c.split_k),
        x2, q.data.contiguous(), scales, zp, gs, b, out, m, n, x2.stride(0), q.data.stride(0), scales.stride(0),
        zp.stride(0), out.stride(0), K=k, BITS=cons["BITS"], IS_FLOAT=cons["IS_FLOAT"], MBITS=cons["MBITS"],
        SIGNED=cons["SIGNED"], ELEM_C=cons["ELEM_C"], SPECIALS=cons["SPECIALS"], INF_MAG=cons["INF_MAG"],
        NAN_MAG=cons["NAN_MAG"], SCALE_KIND=cons["SCALE_KIND"], GROUP=f.block_size, HAS_ZP=f.zero_point,
        HAS_GS=f.global_scale, HAS_BIAS=bias is not None, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, GROUP_M=c.group_m, INTERP=target.interpreting(), SWAP=c.swap, PAIR=pair,
        SB=sb, WIDE_S=wide_s, WIDE_Z=wide_z, SPLIT_K=c.split_k, ws_ptr=ws, cnt_ptr=cnt,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def word_rows(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t`` [rows, entries] as an int32 view when its rows are whole 4-byte words, so the
    kernel loads entries as words (wide enough for asynchronous copies); else ``t``."""
    row_bytes = t.shape[-1] * t.element_size()
    if t.dim() == 2 and row_bytes % 4 == 0 and t.data_ptr() % 4 == 0:
        return t.view(torch.int32), True
    return t, False
