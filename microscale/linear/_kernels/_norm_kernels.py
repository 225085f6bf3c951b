"""Triton kernel for the RMSNorm in front of quantized projections (private; see
:mod:`microscale.linear.norm_linear`): ``x * rsqrt(mean(x^2) + EPS) * nw [* silu(gate)]`` per row, float32
math, written in x's dtype, one launch for any number of rows."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_rstd(x_ptr, offs_m, m_ok, stride_xm, K, EPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
              ITERS: tl.constexpr):
    """``rsqrt(mean(x[m, :K]^2) + EPS)`` in float32 for the tile's rows [BLOCK_M] (ITERS = cdiv(K, BLOCK_K))."""
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    ko = tl.arange(0, BLOCK_K)
    for it in range(ITERS):
        kk = it * BLOCK_K + ko
        v = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(v * v, axis=1)
    return 1.0 / tl.sqrt(ss / K + EPS)


@triton.jit
def _norm_out(v, gate_ptr, nw_ptr, out_ptr, offs_m, kk, mask, rstd, K, stride_gm, stride_om,
              GATED: tl.constexpr):
    """Store ``v * rstd * nw [* silu(gate)]`` (v: float32 [BLOCK_M, BLOCK_K] at columns kk)."""
    v = v * rstd[:, None] * tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)[None, :]
    if GATED:
        g = tl.load(gate_ptr + offs_m[:, None] * stride_gm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        v = v * (g / (1.0 + tl.exp(-g)))
    tl.store(out_ptr + offs_m[:, None] * stride_om + kk[None, :], v.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_kernel(x_ptr, nw_ptr, gate_ptr, out_ptr, M, K, stride_xm, stride_gm, stride_om,
                    EPS: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    ITERS: tl.constexpr):
    """Rows ``[BLOCK_M]`` of ``out = x * rstd * nw [* silu(gate)]``: a row of at most BLOCK_K elements
    (ITERS = 1) is read once and kept in registers; longer rows take one pass for the sums of squares
    and one for the output (x read twice, from L2)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    ko = tl.arange(0, BLOCK_K)
    if ITERS == 1:
        mask = m_ok[:, None] & (ko < K)[None, :]
        v = tl.load(x_ptr + offs_m[:, None] * stride_xm + ko[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / K + EPS)
        _norm_out(v, gate_ptr, nw_ptr, out_ptr, offs_m, ko, mask, rstd, K, stride_gm, stride_om, GATED)
    else:
        rstd = _row_rstd(x_ptr, offs_m, m_ok, stride_xm, K, EPS, BLOCK_M, BLOCK_K, ITERS)
        for it in range(ITERS):
            kk = it * BLOCK_K + ko
            mask = m_ok[:, None] & (kk < K)[None, :]
            v = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0).to(tl.float32)
            _norm_out(v, gate_ptr, nw_ptr, out_ptr, offs_m, kk, mask, rstd, K, stride_gm, stride_om, GATED)
