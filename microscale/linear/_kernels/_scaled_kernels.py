"""Triton kernel for the both-quantized matmul ``out = a @ b^T`` (private; see
:mod:`microscale.linear.scaled` and the oracle :mod:`microscale.reference_scaled`).

One kernel, parametric over both operands' formats through constexprs (the linear op's
:func:`~microscale.linear.packed.format_constexprs`, one set per operand), never one copy per
format. Operands arrive as the QTensors' own tensors: packed codes ``[rows, bytes]`` (each row a
little-endian stream of ``BITS``-bit codes, :func:`microscale.formats.pack_codes`) and raw scale
bits in their storage width ``SB`` ``[block rows, blocks]``; nothing is unpacked or widened before
the launch. Per output tile ``BLOCK_M x BLOCK_N`` it walks K in chunks of ``KB`` = the smaller
block size: both chunks are decoded to their unscaled element values with the linear decoders and
converted exactly to the MMA's operand type (``FP8``: bf16 for any element of at most 8
significant bits; e4m3 when both elements are exact in E4M3 — E2M1, E2M3, E3M2, E4M3 — and e5m2
for E5M2 x E5M2, on fp8 tensor cores), multiplied into a fresh float32 tile (every product exact,
float32 sums), scaled by ``fp32(s_a * s_b)`` and added to the float32 accumulator; then
``fp32(g_a * g_b)``, bias and one rounding to the output dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._linear_kernels import _decode_elem, _decode_scale, _mma


@triton.jit
def _load_codes(c_ptr, rows, row_ok, k0, K, stride_c, R: tl.constexpr, KB: tl.constexpr, BITS: tl.constexpr):
    """Codes (int32) ``[R, KB]`` of elements ``k0 .. k0+KB`` of ``rows`` of packed codes (0 at and
    beyond K). Rows are little-endian bit streams of BITS-bit codes."""
    base = c_ptr + rows[:, None] * stride_c
    if BITS == 8:
        offs_k = k0 + tl.arange(0, KB)
        codes = tl.load(base + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :], other=0).to(tl.int32)
    elif BITS == 4:  # two codes a byte, the first in the low nibble: one load per byte, then interleave
        offs_b = k0 // 2 + tl.arange(0, KB // 2)
        b = tl.load(base + offs_b[None, :], mask=row_ok[:, None] & (offs_b * 2 < K)[None, :], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(b & 15, b >> 4), [R, KB])
    else:  # 2, 3, 5, 6 bits: a code spans at most two bytes
        offs_k = k0 + tl.arange(0, KB)
        bit = offs_k * BITS
        p = base + (bit >> 3)[None, :]
        sh = (bit & 7)[None, :]
        m2 = row_ok[:, None] & (offs_k < K)[None, :]
        lo = tl.load(p, mask=m2, other=0).to(tl.int32)
        hi = tl.load(p + 1, mask=m2 & (sh + BITS > 8), other=0).to(tl.int32)  # (never past the row)
        codes = ((lo | (hi << 8)) >> sh) & ((1 << BITS) - 1)
    return codes


@triton.jit
def _chunk_scale(s_ptr, rows, row_ok, blk, stride_s, SCALE_KIND: tl.constexpr, SB: tl.constexpr,
                 GROUP_ROWS: tl.constexpr):
    """float32 block scales ``[R]`` of ``rows`` at K block ``blk`` (raw bits in their storage width)."""
    raw = tl.load(s_ptr + (rows // GROUP_ROWS) * stride_s + blk, mask=row_ok, other=0).to(tl.int32)
    if SB < 4:  # (an int16 view sign-extends)
        raw = raw & ((1 << (SB * 8)) - 1)
    return _decode_scale(raw, SCALE_KIND)


@triton.jit
def _operand_chunk(c_ptr, s_ptr, z_ptr, rows, row_ok, k0, K, stride_c, stride_s, stride_z,
                   R: tl.constexpr, KB: tl.constexpr, BITS: tl.constexpr, IS_FLOAT: tl.constexpr,
                   MBITS: tl.constexpr, SIGNED: tl.constexpr, ELEM_C: tl.constexpr, SPECIALS: tl.constexpr,
                   INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr, HAS_ZP: tl.constexpr, SCALE_KIND: tl.constexpr,
                   SB: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr):
    """Unscaled bf16 values ``[R, KB]`` of the chunk at ``k0`` (zero at and beyond K) and the
    float32 block scales ``[R]`` of its rows."""
    offs_k = k0 + tl.arange(0, KB)
    m2 = row_ok[:, None] & (offs_k < K)[None, :]
    codes = _load_codes(c_ptr, rows, row_ok, k0, K, stride_c, R, KB, BITS)
    blk = k0 // GROUP
    scale = _chunk_scale(s_ptr, rows, row_ok, blk, stride_s, SCALE_KIND, SB, GROUP_ROWS)
    if HAS_ZP:
        zp = tl.load(z_ptr + (rows // GROUP_ROWS) * stride_z + blk, mask=row_ok, other=0).to(tl.float32)
        v = _decode_elem(codes, 1.0, zp[:, None], BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS,
                         INF_MAG, NAN_MAG, HAS_ZP)
    else:
        v = _decode_elem(codes, 1.0, 0.0, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS,
                         INF_MAG, NAN_MAG, HAS_ZP)
    v = tl.where(m2, v, 0.0)  # (a zero point would make padding nonzero)
    return v, scale


@triton.jit
def _mma_operand(v, FP8: tl.constexpr):
    """Unscaled values -> the MMA's operand type, exactly: 0 bf16, 1 e4m3, 2 e5m2."""
    if FP8 == 1:  # one return below: Triton rejects returns of different types, even constexpr-dead ones
        out = v.to(tl.float8e4nv)
    elif FP8 == 2:
        out = v.to(tl.float8e5)
    else:
        out = v.to(tl.bfloat16)
    return out


@triton.jit
def _global_scaled(acc, ag_ptr, bg_ptr, HAS_GA: tl.constexpr, HAS_GB: tl.constexpr):
    """``acc * fp32(g_a * g_b)`` with the operands' float32 global scales where they have one (the oracle's
    order; also called from the Gluon fp8 kernel)."""
    if HAS_GA:
        if HAS_GB:
            acc = acc * (tl.load(ag_ptr) * tl.load(bg_ptr))
        else:
            acc = acc * tl.load(ag_ptr)
    elif HAS_GB:
        acc = acc * tl.load(bg_ptr)
    return acc


@triton.jit
def _epilogue(acc, ag_ptr, bg_ptr, bias_ptr, out_ptr, offs_m, offs_n, m_ok, n_ok, stride_om,
              HAS_GA: tl.constexpr, HAS_GB: tl.constexpr, HAS_BIAS: tl.constexpr):
    """After the last chunk, as the oracle orders it: ``acc * fp32(g_a * g_b)``, ``+ bias`` in float32, one
    rounding to the output's dtype, stored where the tile is in bounds."""
    acc = _global_scaled(acc, ag_ptr, bg_ptr, HAS_GA, HAS_GB)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scaled_mm_kernel(
    ac_ptr, as_ptr, az_ptr, ag_ptr, bc_ptr, bs_ptr, bz_ptr, bg_ptr, bias_ptr, out_ptr,
    M, N, K, stride_ac, stride_as, stride_az, stride_bc, stride_bs, stride_bz, stride_om,
    A_BITS: tl.constexpr, A_IS_FLOAT: tl.constexpr, A_MBITS: tl.constexpr, A_SIGNED: tl.constexpr,
    A_ELEM_C: tl.constexpr, A_SPECIALS: tl.constexpr, A_INF_MAG: tl.constexpr, A_NAN_MAG: tl.constexpr,
    A_HAS_ZP: tl.constexpr, A_SCALE_KIND: tl.constexpr, A_SB: tl.constexpr, A_GROUP: tl.constexpr,
    A_GROUP_ROWS: tl.constexpr,
    B_BITS: tl.constexpr, B_IS_FLOAT: tl.constexpr, B_MBITS: tl.constexpr, B_SIGNED: tl.constexpr,
    B_ELEM_C: tl.constexpr, B_SPECIALS: tl.constexpr, B_INF_MAG: tl.constexpr, B_NAN_MAG: tl.constexpr,
    B_HAS_ZP: tl.constexpr, B_SCALE_KIND: tl.constexpr, B_SB: tl.constexpr, B_GROUP: tl.constexpr,
    B_GROUP_ROWS: tl.constexpr,
    HAS_GA: tl.constexpr, HAS_GB: tl.constexpr, HAS_BIAS: tl.constexpr, KB: tl.constexpr, CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, INTERP: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c in range(0, CHUNKS):  # (a constexpr trip count, as the linear kernels use)
        k0 = c * KB
        va, sa = _operand_chunk(ac_ptr, as_ptr, az_ptr, offs_m, m_ok, k0, K, stride_ac, stride_as, stride_az,
                                BLOCK_M, KB, A_BITS, A_IS_FLOAT, A_MBITS, A_SIGNED, A_ELEM_C, A_SPECIALS,
                                A_INF_MAG, A_NAN_MAG, A_HAS_ZP, A_SCALE_KIND, A_SB, A_GROUP, A_GROUP_ROWS)
        vb, sb = _operand_chunk(bc_ptr, bs_ptr, bz_ptr, offs_n, n_ok, k0, K, stride_bc, stride_bs, stride_bz,
                                BLOCK_N, KB, B_BITS, B_IS_FLOAT, B_MBITS, B_SIGNED, B_ELEM_C, B_SPECIALS,
                                B_INF_MAG, B_NAN_MAG, B_HAS_ZP, B_SCALE_KIND, B_SB, B_GROUP, B_GROUP_ROWS)
        part = _mma(_mma_operand(va, FP8), tl.trans(_mma_operand(vb, FP8)), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), INTERP)
        acc += part * (sa[:, None] * sb[None, :])
    _epilogue(acc, ag_ptr, bg_ptr, bias_ptr, out_ptr, offs_m, offs_n, m_ok, n_ok, stride_om, HAS_GA, HAS_GB, HAS_BIAS)
