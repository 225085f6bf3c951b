"""Decode-path GEMV for 4-bit minifloat weights (E2M1: nvfp4, mxfp4, fp4_*), private.

Reads the QTensor's canonical layout directly (no repack): each row of packed codes is
viewed as int32 words of 8 nibbles, element ``i`` of the word in bits ``[4i, 4i+4)``.
One shift of the word puts nibbles ``j`` and ``j+4`` in the low nibble of each 16-bit
half, so one shift + two masks build an f16x2 pair of weights by bit placement
(sign -> bit 15, exponent|mantissa -> bits ``10-MBITS ..``; the value is the element
times ``2^(1 - BIAS - 14)``, subnormals included). The activations are prepared per
call (:func:`_prep_x_kernel`): scaled by a power of two per row so their amax lies in
``[2^13, 2^14)``, converted to f16 and permuted within groups of 8 to
``x0,x4,x1,x5,x2,x6,x3,x7`` so pair ``j`` of a word meets the f16x2 ``(x_j, x_{j+4})``.
Four ``fma.rn.f16x2`` accumulate a word's 8 products (|sum| <= 48 by construction), one
conversion pair + add gives its float32 partial; block scales, the global scale and the
row's power of two are applied in float32. About 3 instructions per weight element
(2 of them integer), within the H200's budget at full HBM bandwidth.

Without a GPU (``TRITON_INTERPRET=1``) the same arithmetic runs in plain Triton ops
(``USE_ASM=False``): decode each nibble to float32 and accumulate in float32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._linear_kernels import _decode_scale

# f16x2 decode of pair j of a word + HFMA2 accumulation over the word's 4 pairs,
# then the two halves summed in float32.  $0: f32 out; $1: word; $2..$5: x pairs.
_ASM_WORD = """
{
.reg .b32 m, s, p, acc;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
shl.b32 m, $1, MS0; and.b32 m, m, MMASK; shl.b32 s, $1, SS0; and.b32 s, s, 0x80008000; or.b32 p, m, s;
mul.rn.f16x2 acc, p, $2;
shl.b32 m, $1, MS1; and.b32 m, m, MMASK; shl.b32 s, $1, SS1; and.b32 s, s, 0x80008000; or.b32 p, m, s;
fma.rn.f16x2 acc, p, $3, acc;
SH2 m, $1, MS2; and.b32 m, m, MMASK; shl.b32 s, $1, SS2; and.b32 s, s, 0x80008000; or.b32 p, m, s;
fma.rn.f16x2 acc, p, $4, acc;
SH3 m, $1, MS3; and.b32 m, m, MMASK; and.b32 s, $1, 0x80008000; or.b32 p, m, s;
fma.rn.f16x2 acc, p, $5, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}
"""


def word_asm(mbits: int) -> str:
    """The PTX for a 4-bit minifloat with ``mbits`` mantissa bits (E2M1: 1)."""
    pos = 10 - mbits  # bit where the 3 magnitude bits start in an f16
    shifts = [pos - 4 * j for j in range(4)]
    mask = ((0b111 << pos) | (0b111 << (pos + 16)))
    out = _ASM_WORD.replace("MMASK", hex(mask))
    for j, sh in enumerate(shifts):
        op = "shl.b32" if sh >= 0 else "shr.u32"
        out = out.replace(f"MS{j}", str(abs(sh)))
        if j >= 2:
            out = out.replace(f"SH{j}", op)
    for j in range(3):
        out = out.replace(f"SS{j}", str(12 - 4 * j))
    return out


@triton.jit
def _prep_x_kernel(x_ptr, xp_ptr, xs_ptr, stride_x, K: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``m`` of x -> f16 pairs (int32) permuted within groups of 8, scaled by 2^(13 - E)
    with E the exponent of the row amax; writes the float32 undo factor 2^(E - 13)."""
    m = tl.program_id(0)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + m * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    a = tl.max(amax, 0)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -100), 100)
    up = ((127 + 13 - e) << 23).to(tl.float32, bitcast=True)
    tl.store(xs_ptr + m, ((127 - 13 + e) << 23).to(tl.float32, bitcast=True))
    for k0 in range(0, K, BLOCK):
        p = k0 + tl.arange(0, BLOCK)  # output position
        src = (p // 8) * 8 + (p % 8) // 2 + 4 * (p % 2)
        v = tl.load(x_ptr + m * stride_x + src, mask=p < K, other=0.0).to(tl.float32)
        tl.store(xp_ptr + m * K + p, (v * up).to(tl.float16), mask=p < K)


@triton.jit
def _word_dot_ref(w, x0, x1, x2, x3, MBITS: tl.constexpr):
    """Plain-Triton twin of the PTX (interpreter): the f32 sum of a word's 8 products,
    weights as element * 2^(1 - BIAS - 14) like the f16 bit placement."""
    acc = tl.zeros(w.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        for h in tl.static_range(2):
            nib = (w >> (4 * j + 16 * h)) & 0xF
            bits = ((nib >> 3) << 31) | ((nib & 7) << (23 - MBITS))
            # float32 bits with exponent field e -> 2^(e-127); f16 placement gives 2^(e-15):
            v = bits.to(tl.float32, bitcast=True) * 5.192296858534828e33  # 2^112
            xv = tl.where(j == 0, x0, tl.where(j == 1, x1, tl.where(j == 2, x2, x3)))
            xh = ((xv >> (16 * h)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            acc += v * xh
    return acc


@triton.jit
def _gemv_e2m1_kernel(
    xp_ptr, xs_ptr, w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr,
    N, stride_w, stride_s, stride_o, M: tl.constexpr, K: tl.constexpr,
    MBITS: tl.constexpr, BIAS: tl.constexpr, SCALE_KIND: tl.constexpr,
    GROUP: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, KW_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
    USE_ASM: tl.constexpr, ASM: tl.constexpr,
):
    """out[m, n] (+)= sum_k x[m, k] * W[n, k] for a slice of K (split-K: fp32 atomics into
    a zeroed fp32 ``out``; without split the final dtype is written directly)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    kw_total = K // 8
    WPG: tl.constexpr = GROUP // 8  # words per scale block
    NG: tl.constexpr = BLOCK_KW // WPG
    # an element's bits placed in an f16 read as its value times 2^(BIAS - 15)
    ELEM_C: tl.constexpr = 2.0 ** (15 - BIAS)
    k_lo = pid_k * KW_PER_SPLIT
    for m in range(0, M):
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i in range(0, KW_PER_SPLIT, BLOCK_KW):
            kw = k_lo + i + tl.arange(0, BLOCK_KW)
            kw_ok = kw < kw_total
            w = tl.load(w_ptr + offs_n[:, None] * stride_w + kw[None, :],
                        mask=n_ok[:, None] & kw_ok[None, :], other=0)
            xq = tl.load(xp_ptr + m * (K // 2) + kw[:, None] * 4 + tl.arange(0, 4)[None, :],
                         mask=kw_ok[:, None], other=0)
            xa, xb = tl.split(tl.reshape(xq, [BLOCK_KW, 2, 2]))
            x0, x2 = tl.split(xa)
            x1, x3 = tl.split(xb)
            if USE_ASM:
                part = tl.inline_asm_elementwise(
                    ASM, "=f,r,r,r,r,r", [w, x0[None, :], x1[None, :], x2[None, :], x3[None, :]],
                    dtype=tl.float32, is_pure=True, pack=1)
            else:
                part = _word_dot_ref(w, x0[None, :], x1[None, :], x2[None, :], x3[None, :], MBITS)
            part = tl.sum(tl.reshape(part, [BLOCK_N, NG, WPG]), 2)
            g = (k_lo + i) // WPG + tl.arange(0, NG)
            raw = tl.load(s_ptr + offs_n[:, None] * stride_s + g[None, :],
                          mask=n_ok[:, None] & (g < kw_total // WPG)[None, :], other=0).to(tl.int32)
            acc += tl.sum(part * _decode_scale(raw, SCALE_KIND), 1)
        acc = acc * (tl.load(xs_ptr + m) * ELEM_C)
        if HAS_GS:
            acc = acc * tl.load(gs_ptr)
        if SPLIT_K == 1:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + m * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
        else:
            if HAS_BIAS:
                if pid_k == 0:
                    acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            tl.atomic_add(out_ptr + m * stride_o + offs_n, acc, mask=n_ok, sem="relaxed")
