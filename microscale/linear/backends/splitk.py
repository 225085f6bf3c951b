"""The split-K tensor-core kernel on the packed layout (:mod:`microscale.linear.packed`): any
format; the ``torch.compile`` route (device code: ``_linear_kernels._linear_splitk_kernel``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...runtime import target
from ...runtime.launch import cdiv, launch, next_pow2
from ...runtime.workspace import workspace
from ..eligibility import OP
from ..packed import PackedLinearWeight


@dataclass(frozen=True)
class LinearConfig:
    """Kernel config: an out^T tile of ``block_n`` weight rows x ``block_m`` tokens (the MMA's
    N side, padded to 16), ``block_kw`` int32 words of codes per row per step, K split
    ``split_k`` ways across programs."""

    block_n: int = 128
    block_m: int = 16
    block_kw: int = 32
    split_k: int = 1
    pair: bool = False  # two-elements-per-operation decode (4-bit containers, bf16 x)
    num_warps: int = 4
    num_stages: int = 4


def choose_config(m: int, pw: PackedLinearWeight, x_dtype: torch.dtype, device: torch.device) -> LinearConfig:
    """The heuristic, per M bucket. Decode (m <= 64): 16..64 tokens on the N side, K split
    so about four programs per SM stream the weight. Prefill: 128 or 256 tokens per tile,
    each weight tile decoded once per K-strip for all of them, no split."""
    n = pw.n
    cb = pw.container_bits
    kw = pw.codes.shape[1]
    pair = cb == 4 and x_dtype == torch.bfloat16
    bn = 128 if n >= 128 else 64
    if m <= 64:
        bm = max(16, next_pow2(m))
        bkw = 32 if cb == 4 else 64
        tiles = math.ceil(n / bn) * math.ceil(m / bm)
        want = 4 * target.num_sms(device)
        split = max(1, min(math.ceil(want / tiles), kw // bkw))
        # (8-bit containers with 64 tokens need 237 KB of shared memory at 4 stages: 3)
        return LinearConfig(block_n=bn, block_m=bm, block_kw=bkw, split_k=split, pair=pair, num_warps=4,
                            num_stages=3 if cb == 8 and bm >= 64 else 4)
    bm = 128 if m <= 256 else 256
    return LinearConfig(block_n=bn, block_m=bm, block_kw=16 if cb == 4 else 32, split_k=1, pair=pair,
                        num_warps=8, num_stages=3)


def splitk_run(x2: torch.Tensor, pw: PackedLinearWeight, bias: torch.Tensor | None,
            config: LinearConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the kernel on 2-D x ``[M, K]`` (contiguous last dim). ``out`` may be passed (tests poison it)."""
    from .._kernels import _linear_kernels as kern

    m, k = x2.shape
    n = pw.n
    if out is None:
        out = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return out
    c = config if config is not None else choose_config(m, pw, x2.dtype, x2.device)
    if c.pair and pw.container_bits != 4:
        raise ValueError(f"{OP}: pair decode needs 4-bit containers, not {pw.container_bits}")
    kw = pw.codes.shape[1]
    if kw % c.block_kw or c.block_kw % 8:
        raise ValueError(f"{OP}: block_kw={c.block_kw} must be a multiple of 8 dividing {kw} words per row")
    ce = pw.constexprs()
    dummy = pw.scales
    zp = pw.zero_points if pw.zero_points is not None else dummy
    gs = pw.global_scale if pw.global_scale is not None else dummy
    b = bias if bias is not None else dummy
    stride_z = zp.stride(0) if pw.zero_points is not None else 0
    grid_n, grid_m = cdiv(n, c.block_n), cdiv(m, c.block_m)
    if c.split_k > 1:
        ws, cnt = workspace(x2.device, c.split_k * grid_n * grid_m * c.block_n * c.block_m, grid_n * grid_m)
    else:
        ws, cnt = dummy, dummy
    s = 32 // pw.container_bits
    launch(kern._linear_splitk_kernel, (grid_n, c.split_k, grid_m),
        x2, pw.codes, pw.scales, zp, gs, b, out, ws, cnt, m, n, k, kw, x2.stride(0), out.stride(0),
        pw.codes.stride(0), pw.scales.stride(0), stride_z, **ce, HAS_BIAS=bias is not None,
        BLOCK_N=c.block_n, BLOCK_M=c.block_m, BLOCK_KW=c.block_kw, SPLIT_K=c.split_k, PAIR=c.pair,
        INTERP=target.interpreting(), ITERS=cdiv(cdiv(kw, c.split_k), c.block_kw),
        EVEN_K=k == kw * s, num_warps=c.num_warps, num_stages=c.num_stages)
    return out
