"""Triton kernel for ``out = a @ b^T`` on fp8 tensor cores when both operands' codes are fp8 bytes
(private; see :mod:`microscale.linear.backends.scaled_fp8`).

Both operands are 8-bit codes whose bytes are E4M3 (OCP ``e4m3fn``) or E5M2 values: fp8 block-128
activations and 128x128-block weights (DeepSeek-V3), MXFP8. The codes go to the MMA as they are stored
(the byte tensors viewed as the fp8 dtype, no decode); per output tile ``BLOCK_M x BLOCK_N`` the K loop takes one chunk of ``KB`` (the
smaller block size) per step, multiplies it into a fresh float32 tile and promotes it: ``acc += part *
(s_a * s_b)``, DeepGEMM's promotion every 128 K for block-128 operands. Hopper's fp8 MMA keeps fewer
bits than float32 while it adds inside one instruction, so the sums differ from the exact oracle by
more than float32 ordering (docs/decisions/scaled-mm-operands.md); the caller opts in. The tiles come
through TMA descriptors or pointer loads (``TMA``), pipelined by the compiler over ``num_stages``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._linear_kernels import _grouped_tile, _mma
from ._scaled_kernels import _chunk_scale, _epilogue


@triton.jit
def _tile(ptr, row0, rows, row_ok, k0, K, stride, KB: tl.constexpr, TMA: tl.constexpr):
    """The fp8 codes ``[BLOCK, KB]`` of ``rows`` (``row0 ..``) at ``k0`` (zero past the ends): through a TMA
    descriptor (``ptr`` one, its out-of-bounds box filled with zeros) or pointer loads (an fp8-typed pointer)."""
    if TMA:
        v = ptr.load([row0, k0])
    else:
        offs_k = k0 + tl.arange(0, KB)
        v = tl.load(ptr + rows[:, None] * stride + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :],
                    other=0.0)
    return v


@triton.jit
def _scaled_fp8_kernel(
    a_ptr, as_ptr, ag_ptr, b_ptr, bs_ptr, bg_ptr, bias_ptr, out_ptr,
    M, N, K, stride_a, stride_as, stride_b, stride_bs, stride_om,
    A_SCALE_KIND: tl.constexpr, A_SB: tl.constexpr, A_GROUP: tl.constexpr, A_GROUP_ROWS: tl.constexpr,
    B_SCALE_KIND: tl.constexpr, B_SB: tl.constexpr, B_GROUP: tl.constexpr, B_GROUP_ROWS: tl.constexpr,
    HAS_GA: tl.constexpr, HAS_GB: tl.constexpr, HAS_BIAS: tl.constexpr, KB: tl.constexpr, CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    WS: tl.constexpr, TMA: tl.constexpr, INTERP: tl.constexpr,
):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c in tl.range(0, CHUNKS, warp_specialize=WS):  # (a constexpr trip count: the interpreter needs one)
        k0 = c * KB
        a = _tile(a_ptr, pid_m * BLOCK_M, offs_m, m_ok, k0, K, stride_a, KB, TMA)
        b = _tile(b_ptr, pid_n * BLOCK_N, offs_n, n_ok, k0, K, stride_b, KB, TMA)
        sa = _chunk_scale(as_ptr, offs_m, m_ok, k0 // A_GROUP, stride_as, A_SCALE_KIND, A_SB, A_GROUP_ROWS)
        sb = _chunk_scale(bs_ptr, offs_n, n_ok, k0 // B_GROUP, stride_bs, B_SCALE_KIND, B_SB, B_GROUP_ROWS)
        part = _mma(a, tl.trans(b), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERP)
        acc += part * (sa[:, None] * sb[None, :])  # promotion: float32 from here on
    _epilogue(acc, ag_ptr, bg_ptr, bias_ptr, out_ptr, offs_m, offs_n, m_ok, n_ok, stride_om, HAS_GA, HAS_GB, HAS_BIAS)
