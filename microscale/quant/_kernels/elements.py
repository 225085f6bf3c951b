"""Element codecs, generic over an :class:`~microscale.formats.ElementCodec`'s fields (as
constexprs): the float32 encoder that ports the reference's bit-pattern rounding, the packed
bf16x2 encoder (two elements per 32-bit operation), code packing, the bit-placement decoder
and the E4M3 codec of UE4M3 scales."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _bits, _flt, _isfinite, _markstein_div, _round_int


@triton.jit
def _encode(x, BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, FRAC_SCALE: tl.constexpr,
            MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
            OVF_CODE: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_C: tl.constexpr, SUB_C_BITS: tl.constexpr,
            INV_MIN_SUB: tl.constexpr, ROUNDING: tl.constexpr, NONFIN: tl.constexpr):
    """float32 -> int32 code (low BITS bits), exactly as ``ElementCodec.encode``.

    NONFIN: 0 propagate, 1 zero (NaN/Inf -> +0 first), 3 the caller guarantees no NaN."""
    if NONFIN == 1:
        x = tl.where(_isfinite(x), x, 0.0)
    if IS_INT:
        if NONFIN != 3:
            x = tl.where(x != x, 0.0, x)
        t = x * FRAC_SCALE
        if SIGNED:
            t = tl.minimum(tl.maximum(t, -MAX_CODE - 1.0), MAX_CODE + 1.0)
        else:
            t = tl.minimum(tl.maximum(t, -1.0), MAX_CODE + 1.0)
        r = _round_int(t, ROUNDING)
        if SIGNED:
            r = tl.minimum(tl.maximum(r, -MAX_CODE * 1.0), MAX_CODE * 1.0)
        else:
            r = tl.minimum(tl.maximum(r, 0.0), MAX_CODE * 1.0)
        code = r.to(tl.int32) & ((1 << BITS) - 1)
    else:
        SH: tl.constexpr = 23 - MBITS
        xb = _bits(x)
        b = xb & 0x7FFFFFFF
        a = _flt(b)
        if ROUNDING == 0:
            code = ((b >> SH) & 1) + ((1 << (SH - 1)) - 1) + b
        else:
            code = b + (1 << (SH - 1))
        code = (code >> SH) - ((127 - BIAS) << MBITS)
        if ROUNDING == 0:
            k = _bits(a + SUB_C) - SUB_C_BITS
        else:
            k = tl.floor(a * INV_MIN_SUB + 0.5).to(tl.int32)
        code = tl.where(a < MIN_NORMAL, k, code)
        if OVF_CODE == MAX_CODE:
            code = tl.minimum(code, MAX_CODE)
        else:
            code = tl.where(code > MAX_CODE, OVF_CODE, code)
        sign = (xb >> (32 - BITS)) & (1 << (BITS - 1))
        if NONFIN == 0 or NONFIN == 2:
            isnan = x != x
            if NAN_CODE >= 0:
                code = tl.where(isnan, NAN_CODE, code)
            else:  # ml_dtypes: NaN -> zero with the NaN's sign bit inverted
                code = tl.where(isnan, 0, code)
                sign = sign ^ (isnan.to(tl.int32) << (BITS - 1))
        code = code | sign
    return code


@triton.jit
def _encode_mag_rne(a, MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr):
    """Magnitude code of a float32 ``a`` (>= 0, < 2^100) for a float codec with RNE and
    saturation, equal to ``_encode``'s: one float add does the rounding.

    With e' = max(exponent(a), emin) and M = 2^(e' + 23 - MBITS), the float32 sum a + M
    lies in M's binade (a < 2^(e'+1)), whose ulp is 2^(e' - MBITS): the element's
    quantum at a (normal, or the subnormal step at emin), so the hardware rounds a to
    the element grid, ties to even, and bits(a + M) - bits(M) = q = round(a / quantum).
    The code is q + ((e' - emin) << MBITS) (q = 2^MBITS + mantissa for normals; q alone
    for subnormals; a carry into the next binade gives the next code by itself). M is
    built from the exponent bits (``mb``, a power of two, times 2^(23-MBITS) inside the
    fma: the product is exact, so the fma is a single IEEE add, also under the
    interpreter) and (mb >> (23 - MBITS)) is (e' + 127) << MBITS."""
    SH: tl.constexpr = 23 - MBITS
    EMINB: tl.constexpr = (128 - BIAS) << 23  # bits of 2^emin
    P2SH: tl.constexpr = 2.0 ** SH
    mb = tl.maximum(_bits(a) & 0x7F800000, EMINB)
    s = _bits(tl.math.fma(_flt(mb), P2SH, a))
    code = s - mb + ((mb >> SH) - ((SH << 23) + ((128 - BIAS) << MBITS)))
    return tl.minimum(code, MAX_CODE)


@triton.jit
def _encode_mag_rne_p2(a, bb, MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr, ASM: tl.constexpr):
    """``_encode_mag_rne(a * 2^(127 - bb))`` for an E8M0 scale byte ``bb`` without the
    multiply: the one-add encoder run on the unscaled ``a`` (>= 0, < 2^100) with its
    magic number scaled by 2^k, k = bb - 127. Binary rounding commutes with exact scaling
    by 2^k while the numbers stay normal: the floor of the magic exponent is
    LO = 2^(emin + k) (bits (bb + 1 - BIAS) << 23, normal when bb >= BIAS; the caller
    sends other blocks to the slow path unless they are all zeros, whose codes are 0 for
    any LO) and the magic number stays below 2^128 (clean blocks: a < 2^100 and amax < 2^100,
    so k <= 100 - emax for every E8M0 rule). So with mb = max(exponent
    bits of a, LO), bits(a + mb 2^(23-MBITS)) - bits(mb 2^(23-MBITS)) is the scaled
    encoder's q (a tiny a, whose scaled value the reference would round to a float32
    subnormal, gives q = 0 in both), and (mb - LO) >> (23 - MBITS) is
    ((e' - emin) << MBITS) with e' the scaled exponent."""
    SH: tl.constexpr = 23 - MBITS
    P2SH: tl.constexpr = 2.0 ** SH
    lo = tl.maximum(bb + (1 - BIAS), 1) << 23
    mb = tl.maximum(_bits(a) & 0x7F800000, lo)
    s = _bits(tl.math.fma(_flt(mb), P2SH, a))
    t = (mb >> SH) - ((lo >> SH) + (SH << 23))
    if ASM:  # keep LLVM from reassociating into three adds: LEA.HI + IADD3
        code = tl.inline_asm_elementwise("add.s32 $0, $1, $2;", "=r,r,r", [s - mb, t], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        code = (s - mb) + t
    return tl.minimum(code, MAX_CODE)


# ---- two bf16 per int32 word (the packed MX path): 16-bit lanes, no carries across them
@triton.jit
def _u16x2(a, b, MAX: tl.constexpr, ASM: tl.constexpr):
    """Lane-wise unsigned 16-bit maximum (``MAX``) or minimum of int32 words: PTX
    ``max/min.u16x2`` (sm_90, one instruction), or its model."""
    if ASM:
        if MAX:
            r = tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                          pack=1)
        else:
            r = tl.inline_asm_elementwise("min.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                          pack=1)
    else:
        al, bl = a & 0xFFFF, b & 0xFFFF
        ah, bh = (a >> 16) & 0xFFFF, (b >> 16) & 0xFFFF
        if MAX:
            r = tl.maximum(al, bl) | (tl.maximum(ah, bh) << 16)
        else:
            r = tl.minimum(al, bl) | (tl.minimum(ah, bh) << 16)
    return r


@triton.jit
def _fma_bf16x2(a, b, c, ASM: tl.constexpr):
    """Lane-wise bf16 ``a * b + c`` of words of bf16 pairs, rounded once to nearest even:
    PTX ``fma.rn.bf16x2``. The model computes in float32 and rounds to bf16: the same
    result whenever the float32 value is exact (the encoder's: a power-of-two product plus
    an 8-bit significand, <= 15 bits)."""
    if ASM:
        r = tl.inline_asm_elementwise("fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                      is_pure=True, pack=1)
    else:
        lo = _bits(_flt(a << 16) * _flt(b << 16) + _flt(c << 16))
        hi = _bits(_flt(a & -65536) * _flt(b & -65536) + _flt(c & -65536))
        lo = (lo + 0x7FFF + ((lo >> 16) & 1)) >> 16
        hi = (hi + 0x7FFF + ((hi >> 16) & 1)) >> 16
        r = (lo & 0xFFFF) | (hi << 16)
    return r


@triton.jit
def _encode_p2_bf16x2(a, sgn, lo2, BITS: tl.constexpr, MBITS: tl.constexpr, MAX_CODE: tl.constexpr,
                      ASM: tl.constexpr):
    """``_encode_mag_rne_p2`` on a word ``a`` of two non-negative bf16, in 16-bit lanes: each
    lane's code in its top BITS bits, with the sign bit of that lane of ``sgn``.

    bf16 has float32's exponent field, so the one-add encoder carries over with 7 mantissa
    bits instead of 23: ``mb`` = max(exponent bits, LO) per lane (``lo2``: the floor
    2^(emin + k), (bb + 1 - bias) << 7 in both lanes; k = 0 for an unscaled ``a``), and the
    bf16 value a + mb 2^(7 - MBITS) (one ``fma.rn.bf16x2``; exact in float32,
    a < 2^(e'+1)) rounds a to the scaled element grid. The integer steps are linear in the
    32-bit word and every lane's result lies in [0, 2^16) (the codes before saturation are
    < 2^BITS: a < 2^(k + emax + 1)), so one 32-bit op serves both lanes; the code is built
    already shifted to the lane's top (times 2^(16 - BITS), where the sign bit is)."""
    SH: tl.constexpr = 7 - MBITS
    C2: tl.constexpr = (SH << 7) * 0x10001  # bits(M) - mb in both lanes
    UP: tl.constexpr = 1 << (16 - BITS)
    mb = _u16x2(a & 0x7F807F80, lo2, True, ASM)
    s = _fma_bf16x2(mb, tl.full(mb.shape, (127 + SH) * 0x800080, tl.int32), a, ASM)  # mb 2^SH + a, both lanes
    # code = s - bits(M) + (mb - lo2) >> SH, times UP (mb has no bits below 7: (mb >> SH) UP = mb (UP >> SH))
    t = mb * ((UP >> SH) - UP) - ((C2 + (lo2 >> SH)) * UP)
    if ASM:  # one mad (LLVM would split a constant t into an IMAD and an add)
        code = tl.inline_asm_elementwise(f"mad.lo.s32 $0, $1, {UP}, $2;", "=r,r,r", [s, t], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        code = s * UP + t
    code = _u16x2(code, (MAX_CODE * UP) * 0x10001, False, ASM)
    return code | (sgn & -2147450880)  # | sign bits (0x80008000)


@triton.jit
def _rto_bf16x2(lo, hi, ASM: tl.constexpr):
    """Two float32 -> one word of the two magnitudes as bf16 rounded to odd (truncated; the
    lowest bit set when inexact; sign bits cleared). Rounding to odd at >= 2 bits more
    than the element's significand, then to nearest even, is rounding to nearest even once
    (E2M1: 8 bits against 2)."""
    lb = _bits(lo)
    hb = _bits(hi)
    if ASM:
        r = tl.inline_asm_elementwise(
            "{\n.reg .b32 t, l, one;\nprmt.b32 t, $1, $2, 0x7632;\nprmt.b32 l, $1, $2, 0x5410;\n"
            "mov.b32 one, 0x00010001;\nmin.u16x2 l, l, one;\nor.b32 t, t, l;\nand.b32 $0, t, 0x7FFF7FFF;\n}",
            "=r,r,r", [lb, hb], dtype=tl.int32, is_pure=True, pack=1)
    else:
        t = ((lb >> 16) & 0xFFFF) | (hb & -65536)
        r = t | ((lb & 0xFFFF) != 0).to(tl.int32) | (((hb & 0xFFFF) != 0).to(tl.int32) << 16)
        r = r & 0x7FFF7FFF
    return r


@triton.jit
def _absmax_bf16x2(a, b, ASM: tl.constexpr):
    """Lane-wise larger magnitude of words of bf16 pairs, NaN winning (PTX
    ``max.NaN.xorsign.abs.bf16x2``; its sign bits, the XOR of the inputs', are not
    meaningful: callers clear them). The model: ``max.u16x2`` of the magnitudes' bits (NaN
    > Inf > finite; a NaN's payload may differ from the hardware's canonical one)."""
    if ASM:
        r = tl.inline_asm_elementwise("max.NaN.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                      is_pure=True, pack=1)
    else:
        r = _u16x2(a & 0x7FFF7FFF, b & 0x7FFF7FFF, True, False)
    return r


@triton.jit
def _mag_max(a, b, ABS: tl.constexpr, ASM: tl.constexpr):
    """Lane-wise larger bf16 magnitude of words of bf16 pairs (NaN > Inf > finite): ``ABS``,
    of signed words (``_absmax_bf16x2``; the result's sign bits are not meaningful), else of
    words whose sign bits are clear (``max.u16x2``)."""
    if ABS:
        r = _absmax_bf16x2(a, b, ASM)
    else:
        r = _u16x2(a, b, True, ASM)
    return r


@triton.jit
def _pk_codes(w, a, lo2, op, nop, r, TWO_LEVEL: tl.constexpr, DIV: tl.constexpr, MARKSTEIN: tl.constexpr,
              BITS: tl.constexpr, MBITS: tl.constexpr, MAX_CODE: tl.constexpr, ASM: tl.constexpr):
    """Codes of a word ``w`` of two bf16 (``a``: without sign bits; MX only) for the packed path. MX
    (power-of-two) scales are folded into the encoder; the two-level formats first scale
    in float32 as the general path does (Markstein's correctly rounded x / op, ``nop`` = -op,
    ``r`` = RN(1/op); or x * op), then round the pair to odd in bf16 and encode unscaled."""
    if TWO_LEVEL != 0:  # (``a`` is unused: the signed x, whose sign ``_rto_bf16x2`` clears)
        if ASM:  # (opaque to LLVM: the general path's identical unpack must not be merged with this
            # one and hoisted above the clean-tile branch, which costs ~25 registers per thread)
            xl, xh = tl.inline_asm_elementwise("{\nshl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xFFFF0000;\n}", "=r,=r,r",
                                               [w], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
        else:
            xl = _flt(w << 16)
            xh = _flt(w & -65536)
        if DIV:
            if MARKSTEIN:
                ql = _markstein_div(xl, r, nop)
                qh = _markstein_div(xh, r, nop)
            else:  # the interpreter's fma rounds twice: divide
                ql = tl.math.div_rn(xl, op + tl.zeros_like(xl))
                qh = tl.math.div_rn(xh, op + tl.zeros_like(xh))
        else:
            ql = xl * op
            qh = xh * op
        a = _rto_bf16x2(ql, qh, ASM)
    return _encode_p2_bf16x2(a, w, lo2, BITS, MBITS, MAX_CODE, ASM)


@triton.jit
def _pk_words(x_ptr, rows64, stride_x, k0, NB: tl.constexpr, B: tl.constexpr):
    """Pointers to the packed path's first int32 word of each 4-word vector of a tile's
    blocks, ``[TR, NB, 4]`` (bf16 pairs; rows contiguous, K a multiple of B: 8 divides
    stride_x / 2 and k0 / 2). Words +4, +8, +12 are the rest of each block."""
    wblk = tl.multiple_of(k0 // 2, 8) + tl.arange(0, NB)[None, :, None] * (B // 2)
    return x_ptr.to(tl.pointer_type(tl.int32)) + rows64[:, None, None] * tl.multiple_of(stride_x // 2, 8) + \
        wblk + tl.arange(0, 4)[None, None, :]


@triton.jit
def _pk_load(pw, mask, QW: tl.constexpr):
    """The words of a tile's blocks at ``_pk_words`` pointers ``pw``: four ``[TR, NB, 4]``
    loads for 32-element blocks (QW = 4), two for 16 (then the last two results repeat the
    first two, unused). ``mask`` None: whole tiles, no masks."""
    other = None if mask is None else 0
    w0 = tl.load(pw, mask=mask, other=other)
    w1 = tl.load(pw + 4, mask=mask, other=other)
    if QW == 4:
        w2 = tl.load(pw + 8, mask=mask, other=other)
        w3 = tl.load(pw + 12, mask=mask, other=other)
    else:
        w2 = w0
        w3 = w1
    return w0, w1, w2, w3


@triton.jit
def _st_u8(ptr, v, mask, EVEN: tl.constexpr):
    """GPU: ``tl.store(ptr, v.to(uint8), mask)`` by ``st.global.u8`` in the layout of ``v``."""
    addr = ptr.to(tl.int64, bitcast=True)
    if EVEN:
        tl.inline_asm_elementwise("st.global.u8 [$1], $2;\nmov.b32 $0, 0;", "=r,l,r", [addr, v], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("{\n.reg .pred p;\nsetp.ne.b32 p, $3, 0;\n@p st.global.u8 [$1], $2;\n"
                                  "mov.b32 $0, 0;\n}", "=r,l,r,r", [addr, v, mask.to(tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _split4(t):
    """[M, N, 4] -> its four [M, N] slices (in-thread: the last axis is one 16-byte vector)."""
    a, b = tl.split(tl.reshape(t, [t.shape[0], t.shape[1], 2, 2]))  # a: 0, 2; b: 1, 3
    t0, t2 = tl.split(a)
    t1, t3 = tl.split(b)
    return t0, t1, t2, t3


@triton.jit
def _pack8_nibbles(c0, c1, c2, c3, ASM: tl.constexpr):
    """Four words of two 4-bit codes (bits 12-15 and 28-31: elements 2i, 2i+1 of ``ci``) ->
    one word of eight codes, element j in bits 4j..4j+3."""
    # (c >> 12) + (c >> 24) in one high multiply (c has no bits below 12): byte 0 = both codes
    t0 = tl.umulhi(c0.to(tl.uint32, bitcast=True), 0x100100).to(tl.int32, bitcast=True)
    t1 = tl.umulhi(c1.to(tl.uint32, bitcast=True), 0x100100).to(tl.int32, bitcast=True)
    t2 = tl.umulhi(c2.to(tl.uint32, bitcast=True), 0x100100).to(tl.int32, bitcast=True)
    t3 = tl.umulhi(c3.to(tl.uint32, bitcast=True), 0x100100).to(tl.int32, bitcast=True)
    if ASM:  # the four bytes 0 by three byte permutes
        r = tl.inline_asm_elementwise(
            "{\n.reg .b32 u, v;\nprmt.b32 u, $1, $2, 0x0040;\nprmt.b32 v, $3, $4, 0x0040;\n"
            "prmt.b32 $0, u, v, 0x5410;\n}", "=r,r,r,r,r", [t0, t1, t2, t3], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = (t0 & 0xFF) | ((t1 & 0xFF) << 8) | ((t2 & 0xFF) << 16) | (t3 << 24)
    return r


@triton.jit
def _decode(code, BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, STEP: tl.constexpr,
            MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr, INF_CODE: tl.constexpr):
    """int32 code -> float32 value, exactly as ``ElementCodec.decode``'s table.

    Float codes by bit placement (DESIGN.md): sign, exponent and mantissa go to their
    float32 positions and one multiply by ``POW = 2^(127 - bias)`` rebiases (exact;
    subnormal codes are float32 subnormals before it, and the GPU multiply keeps them:
    no ``.ftz``). NaN codes are ``[NAN_MIN, 2^(BITS-1))``; signed like the table."""
    if IS_INT:
        if SIGNED:
            v = ((code << (32 - BITS)) >> (32 - BITS)).to(tl.float32)
        else:
            v = code.to(tl.float32)
        v = v * STEP
    else:
        mag = code & ((1 << (BITS - 1)) - 1)
        sbit = (code << (32 - BITS)) & -2147483648
        v = _flt(sbit | (mag << (23 - MBITS))) * POW
        if NAN_MIN >= 0 or INF_CODE >= 0:
            vb = _bits(v)
            if NAN_MIN >= 0:
                vb = tl.where(mag >= NAN_MIN, sbit | 0x7FC00000, vb)
            if INF_CODE >= 0:
                vb = tl.where(mag == INF_CODE, sbit | 0x7F800000, vb)
            v = _flt(vb)
    return v


# ---- the E4M3 codec used for UE4M3 scales ----------------------------------------------
@triton.jit
def _e4m3_encode(v):
    return _encode(v, 8, False, True, 1.0, 3, 7, 126, 127, 126, 0.015625, 16384.0, 0x46800000, 512.0, 0, 0)


@triton.jit
def _e4m3_decode(code):
    return _decode(code, 8, False, True, 1.0, 3, 1.329227995784916e36, 127, -1)
