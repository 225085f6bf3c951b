"""Triton kernels for block-scaled quantize / dequantize (private; see ``quantize.py``).

One quantize kernel and one dequantize kernel serve every :class:`~microscale.formats.Format`:
the format's fields arrive as ``tl.constexpr`` parameters (built once per format by
``quantize._Params``), so each format compiles to its own specialised code without a
copy of the source per format and without branches on names.

Exactness: every step ports :mod:`microscale.reference` operation for operation in
float32 — divisions use ``tl.math.div_rn`` (IEEE, never ``div.full``), fp contraction is
disabled at launch (``enable_fp_fusion=False``), power-of-two scales are applied by an
exact multiply with their exact reciprocal (subnormal reciprocals included: the
generated PTX uses plain ``mul.f32``, no ``.ftz``), element rounding is the reference's
bit-pattern rounding (:meth:`ElementCodec._encode_float`), and the sign of a NaN
produced by a division/multiply follows the host CPU's rule (a NaN operand
propagates, first operand first; an invalid operation gives ``DEFAULT_NAN``, the host's
default NaN: negative on x86) because the sign decides the E4M3/E5M2/E2M1 code.

Two paths per tile, chosen at run time from the block amaxes (no host sync): a *clean*
tile (all inputs finite; when dividing, |x| < 2^60 and every divisor in [2^-60, 2^60])
cannot produce a NaN, so it skips the NaN bookkeeping, divides by Markstein's correctly
rounded sequence (``r = RN(1/d); q = RN(x*r); e = fma(-q, d, x); RN(q + e*r) = RN(x/d)``)
and, for E4M3/E5M2 elements with RNE + saturation, uses the hardware
``cvt.rn.satfinite`` conversion; any other tile takes the general path (``div.rn``,
NaN sign rules, full encoder). Both are bit-identical to the reference. Under the
interpreter the fast path divides with ``div_rn`` (its ``fma`` rounds twice) and encodes
FP8 in software; float32 -> bf16 casts are rounded on the bits there too.

Stored float scales that are NaN get the host's NaN bit pattern (GPU casts produce
canonical NaNs with other payloads); NaN *outputs* of dequantize are NaN but their
payload/sign is the GPU's.

Layout of one quantize program: ``TR`` rows x ``TK`` columns of the (2-D, padded)
input, viewed as ``[TR/BR, BR, TK/B, B]`` blocks; the program loops over its column
range in ``TK`` steps (one step unless a row-wise prologue needs the whole row).
Codes of 1/2/4/8 bits are packed into int32 words and stored 4 bytes at a time.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# ----------------------------------------------------------------------------------
# small exact helpers
# ----------------------------------------------------------------------------------


@triton.jit
def _bits(x):
    return x.to(tl.int32, bitcast=True)


@triton.jit
def _flt(b):
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _to_f32(v):
    """Loaded values -> float32, exactly (bf16 by bit placement: the interpreter's cast
    flushes bf16 subnormals; on the GPU this is the same single shift as the cast)."""
    if v.dtype == tl.bfloat16:
        r = _flt(v.to(tl.int16, bitcast=True).to(tl.int32) << 16)
    else:
        r = v.to(tl.float32)
    return r


@triton.jit
def _cast(v, ty: tl.constexpr, MANUAL_BF16: tl.constexpr):
    """float32 -> ``ty`` with round-to-nearest-even. ``MANUAL_BF16``: do the bf16 rounding
    on the bits (the interpreter's bf16 cast does not round to nearest even)."""
    if MANUAL_BF16 and ty == tl.bfloat16:
        b = _bits(v)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(v != v, (b >> 16) | 0x40, r)
        out = r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        out = v.to(ty)
    return out


@triton.jit
def _isfinite(x):
    return (_bits(x) & 0x7FFFFFFF) < 0x7F800000


@triton.jit
def _clamp_nan(v, lo, hi):
    """torch.clamp semantics: NaN stays NaN (PTX min/max would drop it)."""
    return tl.where(v != v, v, tl.minimum(tl.maximum(v, lo), hi))


@triton.jit
def _nan_rule(q, a, b, DEFAULT_NAN: tl.constexpr):
    """Give a NaN result of ``a (op) b`` the sign the host CPU gives it."""
    nb = tl.where(a != a, _bits(a), tl.where(b != b, _bits(b), DEFAULT_NAN))
    return tl.where(q != q, _flt(nb), q)


@triton.jit
def _round_int(t, ROUNDING: tl.constexpr):
    """Round float32 ``t`` (|t| <= 2^22, not NaN) to an integer-valued float32.
    0: nearest-even (magic number, exact IEEE adds); 1: nearest, ties away."""
    if ROUNDING == 0:
        r = (t + 12582912.0) - 12582912.0
    else:
        f = tl.floor(tl.abs(t) + 0.5)
        r = _flt((_bits(f) & 0x7FFFFFFF) | (_bits(t) & -2147483648))
    return r


# ----------------------------------------------------------------------------------
# element codec (generic over the codec's fields)
# ----------------------------------------------------------------------------------


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
def _rcp_rn_normal(d):
    """RN(1/d) for d in [2^-100, 2^100] (GPU only): the in-range branch of ``rcp.rn.f32``
    (an approximate reciprocal and one Newton step, as ptxas expands it), without its
    range test and out-of-line slow path."""
    return tl.inline_asm_elementwise(
        "{\n.reg .f32 y, t;\nrcp.approx.ftz.f32 y, $1;\nfma.rn.f32 t, $1, y, 0fBF800000;\nneg.f32 t, t;\n"
        "fma.rn.f32 $0, y, t, y;\n}", "=f,f", [d], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _markstein_div(a, r, nd):
    """RN(a / d) from r = RN(1/d) and nd = -d: q = RN(a r), e = a - q d (exact by fma),
    RN(q + e r). This is ``div.rn.f32``'s own sequence where its range check passes (a = 0
    or a in [2^-60, 2^60), d in [2^-40, 2^60] are well inside it); GPU only (the
    interpreter's fma rounds twice)."""
    q = a * r
    return tl.math.fma(tl.math.fma(q, nd, a), r, q)


@triton.jit
def _modelopt_scale(amax, s_dec, d6, rd6, FBS: tl.constexpr, SCALE_KIND: tl.constexpr, SCALE_MAX: tl.constexpr,
                    st_ty: tl.constexpr, SNAN: tl.constexpr, SIBITS: tl.constexpr, MANUAL_BF16: tl.constexpr,
                    ASM: tl.constexpr):
    """ModelOpt's block scale: (raw, op, sbf) with sbf = amax / (6 s_dec) (0 -> 1), raw =
    E4M3(sbf) and op = decode(raw) s_dec, the divisor of the block's elements.

    ``FBS`` (GPU): the division by Markstein's sequence with the program's ``rd6`` = RN(1 /
    d6), d6 = 6 s_dec, and the hardware's E4M3 conversion without NaN handling: exact for
    blocks whose sbf lies in (2^-10, 2048) when s_dec is in [2^-30, 2^50] (the caller's
    fast-path test; amax then lies in [2^-37, 2^64) and Markstein's range holds). The
    zero test is on amax: an sbf that underflows to 0 fails that test instead of becoming 1."""
    if FBS:
        sbf = _markstein_div(amax, rd6, 0.0 - d6)
        sbf = tl.where(amax == 0, 1.0, sbf)
        raw, f = _scale_encode(sbf, SCALE_KIND, SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16, True, True)
    else:
        sbf = tl.math.div_rn(amax, (6.0 * s_dec) + tl.zeros_like(amax))
        sbf = tl.where(sbf == 0, 1.0, sbf)
        raw, f = _scale_encode(sbf, SCALE_KIND, SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16, ASM)
    return raw, f * s_dec, sbf


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


# ----------------------------------------------------------------------------------
# scale codecs
# ----------------------------------------------------------------------------------


@triton.jit
def _e8m0_value(bb):
    """E8M0 byte -> 2^(B-127) (0 -> 2^-127, float32 subnormal; 255 -> NaN)."""
    return _flt(tl.where(bb == 0, 0x400000, tl.where(bb == 255, 0x7FC00000, bb << 23)))


@triton.jit
def _e8m0_recip(bb):
    """E8M0 byte -> exact 2^(127-B) (254 -> 2^-127 subnormal; 255 -> NaN)."""
    return _flt(tl.where(bb == 254, 0x400000, tl.where(bb == 255, 0x7FC00000, (254 - bb) << 23)))


@triton.jit
def _e8m0_from_amax(a, RULE: tl.constexpr, EMAX: tl.constexpr, M_ELEM: tl.constexpr, ELEM_MAX: tl.constexpr):
    """``scales.e8m0_from_amax``: RULE 0 floor, 1 ceil, 2 even, 3 rceil."""
    if RULE == 3:
        d = tl.math.div_rn(a, ELEM_MAX + tl.zeros_like(a))
        db = _bits(d)
        e = (db >> 23) & 0xFF
        m = db & 0x7FFFFF
        bb = tl.where(e == 0, (m > 0x400000).to(tl.int32), e + (m != 0).to(tl.int32))
    else:
        ab = _bits(a)
        if RULE == 2:
            ab = (ab + (1 << (22 - M_ELEM))) & -8388608
        e = (ab >> 23) & 0xFF
        m = ab & 0x7FFFFF
        if RULE == 1:
            bb = e + (m != 0).to(tl.int32) - EMAX
        else:
            bb = e - EMAX
    bb = tl.minimum(tl.maximum(bb, 0), 254)
    return tl.where(_isfinite(a), bb, 255)


@triton.jit
def _scale_encode(v, SCALE_KIND: tl.constexpr, SCALE_MAX: tl.constexpr, st_ty: tl.constexpr,
                  SNAN: tl.constexpr = 0, SIBITS: tl.constexpr = 32, MANUAL_BF16: tl.constexpr = False,
                  HW: tl.constexpr = False, NONAN: tl.constexpr = False):
    """``ScaleCodec.encode`` then ``decode``: returns (raw value to store, float32 value).

    SCALE_KIND 0: E8M0 (nearest power of two by the bits, ties up), 1: UE4M3 (E4M3 RNE
    saturating), 2: a float dtype ``st_ty`` (clamp to +-max, RNE cast; a NaN is stored
    as ``SNAN``, the host's cast of the default quiet NaN, since GPU casts canonicalise
    NaN payloads differently). ``NONAN`` (UE4M3 with ``HW``): no NaN handling, for callers
    that never use a NaN input's result."""
    if SCALE_KIND == 0:
        vb = _bits(v)
        e = (vb >> 23) & 0xFF
        m = vb & 0x7FFFFF
        bb = tl.where(e == 0, (m >= 0x600000).to(tl.int32), e + (m >= 0x400000).to(tl.int32))
        bb = tl.minimum(tl.maximum(bb, 0), 254)
        bb = tl.where(_isfinite(v) & (v > 0), bb, 255)
        raw = bb
        val = _e8m0_value(bb)
    elif SCALE_KIND == 1:
        # the NaN codes (0x7F | sign) come from NaN inputs only (saturation stops at 0x7E), so
        # the decode tests v for NaN instead of the code: the code's NaN, sign | 0x7FC00000
        isnan = v != v
        nanb = ((_bits(v) >> 31) << 31) | 0x7FC00000
        if HW:  # the GPU's cvt.rn.satfinite.e4m3x2.f32 is E4M3 RNE with saturation (Inf too); NaN as _encode
            h8 = v.to(tl.float8e4nv)
            raw = h8.to(tl.uint8, bitcast=True).to(tl.int32)
            val = h8.to(tl.float32)  # the exact hardware widening (E4M3 -> f16 -> f32)
            if not NONAN:
                raw = tl.where(isnan, 0x7F | ((_bits(v) >> 24) & 0x80), raw)
                val = tl.where(isnan, _flt(nanb), val)
        else:
            raw = _e4m3_encode(v)
            val = tl.where(isnan, _flt(nanb), _decode(raw, 8, False, True, 1.0, 3, 1.329227995784916e36, -1, -1))
    else:
        raw = _cast(_clamp_nan(v, -SCALE_MAX, SCALE_MAX), st_ty, MANUAL_BF16)
        val = raw.to(tl.float32)
        ity = tl.int16 if SIBITS == 16 else tl.int32
        raw = tl.where(v != v, SNAN, raw.to(ity, bitcast=True)).to(ity).to(st_ty, bitcast=True)
    return raw, val


@triton.jit
def _scale_decode(raw, SCALE_KIND: tl.constexpr):
    if SCALE_KIND == 0:
        val = _e8m0_value(raw.to(tl.int32))
    elif SCALE_KIND == 1:
        val = _e4m3_decode(raw.to(tl.int32))
    else:
        val = raw.to(tl.float32)
    return val


@triton.jit
def _scale_offset(r, c, SC, LAYOUT: tl.constexpr):
    """Flat position of scale (r, c) in a matrix with SC columns: 0 row-major,
    1 swizzled 128x4, 2 swizzled 8x4 (``layouts.ScaleLayout.offset``)."""
    if LAYOUT == 0:
        off = r * SC + c
    elif LAYOUT == 1:
        ct = (SC + 3) // 4
        off = ((r // 128) * ct + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    else:
        ct = (SC + 3) // 4
        off = (r // 8) * ct * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4
    return off


# ----------------------------------------------------------------------------------
# global amax (dynamic two-level): partial maxima, no host sync
# ----------------------------------------------------------------------------------


@triton.jit
def _pdl_start(PDL: tl.constexpr, TRIGGER: tl.constexpr):
    """Launched as a programmatic dependent (Hopper+): wait for the previous kernel's results
    before any read (every read and write stays after the wait, so the stream order is what
    it was) and, with ``TRIGGER``, let the next kernel launch once every program of this
    grid runs, which hides the launch and ramp of back-to-back kernels. Quantize does not
    trigger: its codes may be a weight that the decode GEMV reads before its own wait
    (``qlinear._PDL_CHAIN``); dequantize writes dense tensors only."""
    if PDL:
        if TRIGGER:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _finite_amax_partials_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                                 ATOMIC: tl.constexpr = False):
    """``part[pid]`` = float32 bits of max |x| over the finite elements of this program's
    ``ITERS`` consecutive chunks of ``BLOCK`` elements (non-negative float bits order as ints).
    ``ATOMIC``: instead, an atomic max of those bits into ``part[0]`` (zeroed by the caller;
    max is order-independent, so the result is the same in any order)."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = _to_f32(tl.load(x_ptr + offs, mask=offs < n, other=0.0))
        b = _bits(x) & 0x7FFFFFFF
        acc = tl.maximum(acc, tl.where(b < 0x7F800000, b, 0))
    if ATOMIC:
        tl.atomic_max(part_ptr, tl.max(acc, axis=0))
    else:
        tl.store(part_ptr + pid, tl.max(acc, axis=0))


@triton.jit
def _global_from_partials(part_ptr, n_part, TWO_LEVEL: tl.constexpr, NP: tl.constexpr):
    """(s_dec, gs) from the partial maxima: ``reference.nvfp4_global_scale`` /
    ``compressed_tensors_global_scale``."""
    if NP == 1:  # one (atomically reduced) maximum
        amax = _flt(tl.load(part_ptr))
    else:
        o = tl.arange(0, NP)
        amax = _flt(tl.max(tl.load(part_ptr + o, mask=o < n_part, other=0), axis=0))
    if TWO_LEVEL == 3:
        # torch evaluates ``2688.0 / t`` as ``t.reciprocal() * 2688.0`` (two roundings)
        gs = tl.math.div_rn(1.0, tl.maximum(amax, 1.1754943508222875e-38)) * 2688.0
        gs = tl.where(_isfinite(gs) & (amax > 0), gs, 1.0)
        s = tl.math.div_rn(1.0, gs)
    else:
        s = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
        gs = tl.math.div_rn(1.0, s)
    return s, gs


# ----------------------------------------------------------------------------------
# quantize
# ----------------------------------------------------------------------------------


@triton.jit
def _quantize_kernel(
    x_ptr, y_ptr, w_ptr,  # input; second input (silu: up) ; rmsnorm weight
    data_ptr, scale_ptr, zp_ptr, gscale_ptr, part_ptr, gs_out_ptr, flag_ptr,
    R, K, stride_x, stride_y, SC, n_part, k_per_prog, eps,
    # tiling
    TR: tl.constexpr, TK: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    # element
    BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, FRAC_SCALE: tl.constexpr,
    MBITS: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr,
    OVF_CODE: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_C: tl.constexpr, SUB_C_BITS: tl.constexpr,
    INV_MIN_SUB: tl.constexpr, ELEM_MAX: tl.constexpr, EMAX: tl.constexpr, M_ELEM: tl.constexpr,
    # scale
    SCALE_KIND: tl.constexpr, SCALE_MAX: tl.constexpr, SNAN: tl.constexpr, SIBITS: tl.constexpr,
    RULE: tl.constexpr,
    TWO_LEVEL: tl.constexpr, GS_DYNAMIC: tl.constexpr, NP: tl.constexpr, LAYOUT: tl.constexpr,
    # policies
    ROUNDING: tl.constexpr, NONFIN: tl.constexpr, DEFAULT_NAN: tl.constexpr, MUL_NAN_SECOND: tl.constexpr,
    # fused prologue: 0 none, 1 rmsnorm(x) * w, 2 silu(x) * y
    PROLOGUE: tl.constexpr, N_ITER: tl.constexpr, MANUAL_BF16: tl.constexpr, PACK32: tl.constexpr,
    FAST: tl.constexpr, MARKSTEIN: tl.constexpr, HW_FP8: tl.constexpr, ASM: tl.constexpr,
    PK: tl.constexpr = False, EVEN: tl.constexpr = False, PREFETCH: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL, False)
    RB: tl.constexpr = TR // BR
    NB: tl.constexpr = TK // B
    # SPLIT: load each block's B elements as B / VEC vectors of VEC (16 bytes) along a slow
    # tensor axis, so that one thread holds whole blocks: block amaxes without shuffles and
    # each block scale computed once (the row-major load gives a 16-element block to two threads)
    VEC: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth
    QV: tl.constexpr = B // VEC
    SPLIT: tl.constexpr = FAST & (PROLOGUE == 0) & (BR == 1) & (BITS != 8) & ((QV * VEC == B) & ((QV == 2) | (QV == 4)))
    PACK_WORD: tl.constexpr = (8 % BITS) != 0  # 3/5/6-bit codes: 8 codes -> BITS bytes
    G: tl.constexpr = 8 if PACK_WORD else 8 // BITS  # codes per packing group
    st_ty = scale_ptr.dtype.element_ty

    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * TR + tl.arange(0, TR)
    rmask = rows < R
    rows64 = rows.to(tl.int64)

    # ---- two-level global scale (s_dec, and the reciprocal gs of compressed-tensors)
    if TWO_LEVEL != 0:
        if GS_DYNAMIC:
            s_dec, gs = _global_from_partials(part_ptr, n_part, TWO_LEVEL, NP)
            if (pid_r == 0) & (pid_k == 0):
                tl.store(gs_out_ptr, s_dec)
                tl.store(gs_out_ptr + 1, gs)
        else:
            s_dec = tl.load(gscale_ptr)
            gs = tl.math.div_rn(1.0, s_dec)
    # ModelOpt's block scales amax / (6 s_dec) by Markstein's sequence with one reciprocal per
    # program (FBS; the GPU's packed path), where its range holds (else the tile is not clean)
    FBS: tl.constexpr = PK & MARKSTEIN & ASM & (TWO_LEVEL == 1) & (SCALE_KIND == 1)
    d6 = 0.0
    rd6 = 0.0
    sdec_ok = True
    if FBS:
        d6 = 6.0 * s_dec
        rd6 = tl.math.div_rn(1.0, d6)
        sdec_ok = (s_dec >= 9.313225746154785e-10) & (s_dec <= 1125899906842624.0)  # [2^-30, 2^50]; not NaN

    # ---- row-wise prologue statistics
    if PROLOGUE == 1:
        ss = tl.zeros([TR], dtype=tl.float32)
        for it in range(0, N_ITER):
            cols = it * TK + tl.arange(0, TK)
            m2 = rmask[:, None] & (cols < K)[None, :]
            xv = _to_f32(tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=m2, other=0.0))
            ss += tl.sum(xv * xv, axis=1)
        rstd = tl.math.div_rn(tl.full([TR], 1.0, tl.float32), tl.sqrt_rn(ss / K + eps))

    k_lo = pid_k * k_per_prog
    QW: tl.constexpr = B // 8
    # PREF: the packed path loads the next column tile's words before encoding this one's
    # (twice the bytes in flight per warp; whole tiles only)
    PREF: tl.constexpr = PK & EVEN & (N_ITER > 1) & PREFETCH
    if PREF:
        w0n, w1n, w2n, w3n = _pk_load(_pk_words(x_ptr, rows64, stride_x, k_lo, NB, B), None, QW)
    for it in range(0, N_ITER):  # columns >= K are masked
        k0 = k_lo + it * TK
        cols = k0 + tl.arange(0, TK)
        cmask = cols < K
        m2 = rmask[:, None] & cmask[None, :]
        if PREF:
            w0, w1, w2, w3 = w0n, w1n, w2n, w3n
            # the next tile's words (the last iteration reloads its own: cache hits, no branch)
            w0n, w1n, w2n, w3n = _pk_load(
                _pk_words(x_ptr, rows64, stride_x, k0 + tl.where(it + 1 < N_ITER, TK, 0), NB, B), None, QW)
        elif PK:  # bf16 pairs as int32 words, QW loads of [TR, NB, 4]: one thread holds whole blocks
            mw = None
            if not EVEN:  # (whole tiles: no masks, no zero fills before predicated loads)
                mw = rmask[:, None, None] & ((k0 + tl.arange(0, NB) * B) < K)[None, :, None]
            w0, w1, w2, w3 = _pk_load(_pk_words(x_ptr, rows64, stride_x, k0, NB, B), mw, QW)
        if PK:
            # block amax: its bf16 bits (NaN > Inf > finite, as the float bits below). The
            # two-level encoder takes the signed words (abs-max, no masks); the MX encoder the
            # magnitudes
            TL: tl.constexpr = TWO_LEVEL != 0
            a0 = w0 if TL else w0 & 0x7FFF7FFF
            a1 = w1 if TL else w1 & 0x7FFF7FFF
            am = _mag_max(a0, a1, TL, ASM)
            if QW == 4:
                a2 = w2 if TL else w2 & 0x7FFF7FFF
                a3 = w3 if TL else w3 & 0x7FFF7FFF
                am = _mag_max(am, _mag_max(a2, a3, TL, ASM), TL, ASM)
            m0, m1, m2_, m3_ = _split4(am)
            am = _mag_max(_mag_max(m0, m1, TL, ASM), _mag_max(m2_, m3_, TL, ASM), TL, ASM)
            am = _mag_max(am, (am >> 16) & 0xFFFF, TL, ASM)  # lane 0: the block's
            amax = _flt(tl.reshape((am & 0x7FFF) << 16, [RB, NB]))
            # float32 x (element order of the row) for the general path of tiles that are not clean
            x0 = tl.reshape(tl.join(_flt(w0 << 16), _flt(w0 & -65536)), [TR, NB, 8])
            x1 = tl.reshape(tl.join(_flt(w1 << 16), _flt(w1 & -65536)), [TR, NB, 8])
            if QW == 2:
                x = tl.reshape(tl.permute(tl.join(x0, x1), (0, 1, 3, 2)), [TR, TK])
            else:
                x2 = tl.reshape(tl.join(_flt(w2 << 16), _flt(w2 & -65536)), [TR, NB, 8])
                x3 = tl.reshape(tl.join(_flt(w3 << 16), _flt(w3 & -65536)), [TR, NB, 8])
                x = tl.reshape(tl.permute(tl.join(tl.join(x0, x1), tl.join(x2, x3)), (0, 1, 4, 3, 2)), [TR, TK])
        elif SPLIT:  # Q = B / VEC loads of [TR, NB, VEC]: the same layout, so one thread holds whole blocks
            c3 = k0 + tl.arange(0, NB)[None, :, None] * B + tl.arange(0, VEC)[None, None, :]
            p3 = x_ptr + rows64[:, None, None] * stride_x + c3
            m3 = rmask[:, None, None] & (c3 < K)
            x0 = _to_f32(tl.load(p3, mask=m3, other=0.0))
            x1 = _to_f32(tl.load(p3 + VEC, mask=m3, other=0.0))
            if QV == 2:
                x = tl.reshape(tl.permute(tl.join(x0, x1), (0, 1, 3, 2)), [TR, TK])
            else:
                x2 = _to_f32(tl.load(p3 + 2 * VEC, mask=m3, other=0.0))
                x3 = _to_f32(tl.load(p3 + 3 * VEC, mask=m3, other=0.0))
                x = tl.reshape(tl.permute(tl.join(tl.join(x0, x1), tl.join(x2, x3)), (0, 1, 4, 3, 2)), [TR, TK])
        else:
            x = _to_f32(tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=m2, other=0.0))
        if PROLOGUE == 1:
            w = _to_f32(tl.load(w_ptr + cols, mask=cmask, other=0.0))
            x = (x * rstd[:, None]) * w[None, :]
        elif PROLOGUE == 2:
            y = _to_f32(tl.load(y_ptr + rows64[:, None] * stride_y + cols[None, :], mask=m2, other=0.0))
            x = (x * tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + tl.exp(-x))) * y
        if NONFIN == 1:
            x = tl.where(_isfinite(x), x, 0.0)
        if NONFIN == 2:
            bad_in = tl.max(tl.max((~_isfinite(x) & m2).to(tl.int32), axis=1), axis=0)
            tl.store(flag_ptr, 1, mask=bad_in != 0)

        xb = tl.reshape(x, [RB, BR, NB, B])
        # block amax on the float bits (NaN > Inf > finite: propagates like torch.amax)
        ab = _bits(xb) & 0x7FFFFFFF
        if not PK:
            amax = _flt(tl.max(tl.max(ab, axis=3), axis=1))  # [RB, NB]

        if RULE == 5:  # ---- affine (minmax): unsigned codes, x = (code - zp) * s
            # the range from the finite values; NaN -> the zero point, +-Inf -> saturated (as the reference)
            xr = tl.where(_isfinite(xb), xb, 0.0)
            lo = tl.minimum(tl.min(tl.min(xr, axis=3), axis=1), 0.0)
            hi = tl.maximum(tl.max(tl.max(xr, axis=3), axis=1), 0.0)
            raw, s = _scale_encode(tl.math.div_rn(hi - lo, MAX_CODE * 1.0 + tl.zeros_like(hi)), SCALE_KIND,
                                   SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16)
            one_raw, one_val = _scale_encode(tl.full(hi.shape, 1.0, tl.float32), SCALE_KIND, SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16)
            ok = s > 0
            raw = tl.where(ok, raw, one_raw)
            s = tl.where(ok, s, one_val)
            zt = tl.math.div_rn(-lo, s)
            zf = _round_int(tl.minimum(tl.where(zt != zt, 0.0, zt), 4194304.0), 0)
            znan = zt != zt  # the reference's zero point is NaN: all codes become 0, zp 0
            zf = tl.where(znan, 0.0, tl.minimum(tl.maximum(zf, 0.0), MAX_CODE * 1.0))
            q = tl.math.div_rn(xb, s[:, None, :, None])
            qn = q != q
            q = _round_int(tl.minimum(tl.maximum(tl.where(qn, 0.0, q), -4194304.0), 4194304.0), ROUNDING)
            q = q + zf[:, None, :, None]
            q = tl.minimum(tl.maximum(q, 0.0), MAX_CODE * 1.0)
            codes = tl.where(znan[:, None, :, None], 0, q.to(tl.int32))
            clean = False  # (affine blocks have no fast path)
        else:
            # per-block operand: DIV -> xs = x / op (IEEE), else xs = x * op
            if TWO_LEVEL == 1:  # ModelOpt
                raw, op, sbf = _modelopt_scale(amax, s_dec, d6, rd6, FBS, SCALE_KIND, SCALE_MAX, st_ty, SNAN,
                                               SIBITS, MANUAL_BF16, ASM)
            elif TWO_LEVEL == 2:  # torchao
                sbf = tl.math.div_rn(tl.math.div_rn(amax, 6.0 + tl.zeros_like(amax)), s_dec + tl.zeros_like(amax))
                sbf = _clamp_nan(sbf, 0.015625, 448.0)
                raw, f = _scale_encode(sbf, SCALE_KIND, SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16, ASM)
                op = tl.math.div_rn(tl.math.div_rn(1.0, s_dec) + tl.zeros_like(f), f)
            elif TWO_LEVEL == 3:  # compressed-tensors
                sbf = _clamp_nan(gs * tl.math.div_rn(amax, 6.0 + tl.zeros_like(amax)), -float("inf"), 448.0)
                raw, f = _scale_encode(sbf, SCALE_KIND, SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16, ASM)
                r8, f8 = _scale_encode(tl.full(f.shape, 0.125, tl.float32), SCALE_KIND, SCALE_MAX, st_ty, SNAN,
                                       SIBITS, MANUAL_BF16)
                if SCALE_KIND == 0:
                    r8 = tl.zeros_like(r8)
                    f8 = _e8m0_value(r8)
                z = f == 0
                raw = tl.where(z, r8, raw)
                f = tl.where(z, f8, f)
                op = tl.math.div_rn(f, gs + tl.zeros_like(f))
            elif RULE <= 3:  # power-of-two rules: exact multiply by the exact reciprocal
                raw = _e8m0_from_amax(amax, RULE, EMAX, M_ELEM, ELEM_MAX)
                op = _e8m0_recip(raw)
            else:  # RULE == 4, amax: s = codec(amax / max), zero -> 1
                raw, s = _scale_encode(tl.math.div_rn(amax, ELEM_MAX + tl.zeros_like(amax)), SCALE_KIND,
                                       SCALE_MAX, st_ty, SNAN, SIBITS, MANUAL_BF16, ASM)
                op = tl.where(s == 0, 1.0, s)
            DIV: tl.constexpr = (TWO_LEVEL == 1) | (TWO_LEVEL == 3) | ((TWO_LEVEL == 0) & (RULE == 4))
            FAST_ENC: tl.constexpr = (not IS_INT) & (ROUNDING == 0) & (OVF_CODE == MAX_CODE) & (HW_FP8 == 0)
            # power-of-two scale 2^k folded into the one-add encoder (no multiply; ``_encode_mag_rne_p2``)
            P2ENC: tl.constexpr = FAST_ENC & (TWO_LEVEL == 0) & (RULE <= 3)
            opb = op[:, None, :, None]

            # Fast path for clean tiles: every |x| < 2^100 (when dividing or multiplying by a
            # general scale: |x| < 2^60 and every divisor/multiplier in [2^-40, 2^60] / [2^-60,
            # 2^40]), so no NaN can arise and |x / op| < 2^100: no NaN bookkeeping, the
            # division by Markstein's correctly rounded sequence (r = RN(1/d), q = RN(x r),
            # e = x - q d exact by fma, RN(q + e r) = RN(x/d)), hardware FP8 conversion or the
            # one-add RNE encoder of magnitudes (``_encode_mag_rne``). One tile reduction of
            # a per-block flag decides it.
            if FBS:  # sbf in (2^-10, 2048): raw != 0, op in [2^-39, 2^59], amax < 32 op (see _modelopt_scale)
                bad = (_bits(sbf) - 0x3A800001).to(tl.uint32, bitcast=True) > (0x45000000 - 0x3A800001)
            elif DIV:
                opi = _bits(op)  # op > 0 in clean blocks: its bits order as the values; NaN/negative are out of range
                bad = (_bits(amax) >= 0x5D800000) | (opi < 0x2B800000) | (opi > 0x5D800000)
            elif TWO_LEVEL == 2:
                opi = _bits(op)
                bad = (_bits(amax) >= 0x5D800000) | (opi < 0x21800000) | (opi > 0x53800000)
            else:  # power-of-two multipliers: |x op| <= 8
                bad = _bits(amax) >= 0x71800000
                if P2ENC:  # the scale folded into the encoder needs 2^(emin + k) normal (or an all-zero block)
                    bad = bad | ((raw < BIAS) & (amax != 0))
            if PK & (TWO_LEVEL != 0) & (not FBS):  # the packed encoder's lanes hold codes of |x op| < 32 (< 2^(emax+4))
                if DIV:
                    bad = bad | (amax >= 32.0 * op)
                else:
                    bad = bad | (amax * op >= 32.0)
            # one flag per thread first (any order), then one shuffle tree
            clean = tl.max(tl.reshape(bad.to(tl.int32), [RB * NB], can_reorder=True), axis=0) == 0
            if FBS:
                clean = clean & sdec_ok
            if FAST & (NONFIN != 2) & clean:
                if PK:  # two codes per 32-bit op, stored as one 16-/8-byte vector per block
                    if TWO_LEVEL == 0:  # the E8M0 scale folded into the encoder
                        lo16 = tl.maximum(raw + (1 - BIAS), 1) << 7
                        lo2 = tl.reshape(lo16 | (lo16 << 16), [TR, NB])[:, :, None]
                        opw = tl.zeros([TR, NB, 1], tl.float32)
                        nopw = opw
                        rw = opw
                    else:
                        lo2 = tl.full([TR, NB, 1], ((128 - BIAS) << 7) * 0x10001, tl.int32)
                        opw = tl.reshape(op, [TR, NB])[:, :, None]
                        nopw = 0.0 - opw
                        if DIV & MARKSTEIN & ASM:
                            rw = _rcp_rn_normal(opw)
                        else:
                            rw = tl.math.div_rn(tl.full(opw.shape, 1.0, tl.float32), opw)
                    o0 = _pack8_nibbles(*_split4(_pk_codes(w0, a0, lo2, opw, nopw, rw, TWO_LEVEL, DIV, MARKSTEIN, BITS,
                                                           MBITS, MAX_CODE, ASM)), ASM)
                    o1 = _pack8_nibbles(*_split4(_pk_codes(w1, a1, lo2, opw, nopw, rw, TWO_LEVEL, DIV, MARKSTEIN, BITS,
                                                           MBITS, MAX_CODE, ASM)), ASM)
                    blk = k0 + tl.arange(0, NB) * B
                    pdw = data_ptr + rows64[:, None, None] * tl.multiple_of(K // 8, QW) + \
                        tl.multiple_of(blk // 8, QW)[None, :, None]
                    pmask = rmask[:, None, None] & (blk < K)[None, :, None]
                    if EVEN:
                        pmask = None
                    if QW == 2:
                        tl.store(pdw + tl.arange(0, 2)[None, None, :], tl.join(o0, o1), mask=pmask)
                    else:
                        o2 = _pack8_nibbles(*_split4(_pk_codes(w2, a2, lo2, opw, nopw, rw, TWO_LEVEL, DIV, MARKSTEIN,
                                                               BITS, MBITS, MAX_CODE, ASM)), ASM)
                        o3 = _pack8_nibbles(*_split4(_pk_codes(w3, a3, lo2, opw, nopw, rw, TWO_LEVEL, DIV, MARKSTEIN,
                                                               BITS, MBITS, MAX_CODE, ASM)), ASM)
                        ow = tl.permute(tl.join(tl.join(o0, o1), tl.join(o2, o3)), (0, 1, 3, 2))
                        tl.store(pdw + tl.arange(0, 4)[None, None, :], tl.reshape(ow, [TR, NB, 4]), mask=pmask)
                    codes = ab  # (stored)
                else:
                    if FAST_ENC:  # magnitudes (op > 0); the sign bit comes from x
                        xa = _flt(ab)
                    else:
                        xa = xb
                    if DIV:
                        if MARKSTEIN:
                            if ASM:  # RN(1/op) (op in [2^-40, 2^60] here)
                                r = _rcp_rn_normal(op)[:, None, :, None]
                            else:
                                r = tl.math.div_rn(tl.full(op.shape, 1.0, tl.float32), op)[:, None, :, None]
                            xs = _markstein_div(xa, r, (0.0 - op)[:, None, :, None])
                            if not FAST_ENC:  # x = -0: e = +0 and +0 + -0 = +0; x / d keeps x's sign (d > 0)
                                xs = _flt(_bits(xs) | (_bits(xa) & -2147483648))
                        else:  # the interpreter's fma rounds twice: divide
                            xs = tl.math.div_rn(xa, opb)
                    elif P2ENC:
                        xs = xa  # (unused: the encoder applies the scale)
                    else:
                        xs = xa * opb
                    if HW_FP8 == 1:
                        codes = xs.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
                    elif HW_FP8 == 2:
                        codes = xs.to(tl.float8e5).to(tl.uint8, bitcast=True)
                    elif P2ENC:
                        codes = _encode_mag_rne_p2(xa, raw[:, None, :, None], MBITS, BIAS, MAX_CODE, ASM) | \
                            ((_bits(xb) >> (32 - BITS)) & (1 << (BITS - 1)))
                    elif FAST_ENC:
                        codes = _encode_mag_rne(xs, MBITS, BIAS, MAX_CODE) | ((_bits(xb) >> (32 - BITS)) & (1 << (BITS - 1)))
                    else:
                        codes = _encode(xs, BITS, IS_INT, SIGNED, FRAC_SCALE, MBITS, BIAS, MAX_CODE, NAN_CODE, OVF_CODE,
                                        MIN_NORMAL, SUB_C, SUB_C_BITS, INV_MIN_SUB, ROUNDING, 3)
                    if BITS == 8:  # bytes straight to memory (no int32 words, no packing)
                        cols8 = k0 + tl.arange(0, TK)
                        tl.store(data_ptr.to(tl.pointer_type(tl.uint8)) + rows64[:, None] * K + cols8[None, :],
                                 tl.reshape(codes.to(tl.uint8), [TR, TK]), mask=m2)
                        codes = ab  # (stored)
                    else:
                        codes = codes.to(tl.int32)
            else:
                if FBS:  # the block scales again, by IEEE division (Markstein's range may not hold here)
                    raw, op, sbf = _modelopt_scale(amax, s_dec, d6, rd6, False, SCALE_KIND, SCALE_MAX, st_ty, SNAN,
                                                   SIBITS, MANUAL_BF16, ASM)
                    opb = op[:, None, :, None]
                if DIV:
                    xs = _nan_rule(tl.math.div_rn(xb, opb), xb, opb, DEFAULT_NAN)
                elif (TWO_LEVEL == 2) & MUL_NAN_SECOND:  # which NaN the host's broadcast multiply keeps
                    xs = _nan_rule(xb * opb, opb, xb, DEFAULT_NAN)
                else:  # power-of-two scales follow the reference's division x / 2^k
                    xs = _nan_rule(xb * opb, xb, opb, DEFAULT_NAN)
                if NONFIN == 2:
                    vm = tl.reshape(m2, [RB, BR, NB, B])
                    bad_enc = tl.max(tl.max(tl.max(tl.max((~_isfinite(xs) & vm).to(tl.int32), axis=3), axis=2),
                                            axis=1), axis=0)
                    tl.store(flag_ptr + 1, 1, mask=bad_enc != 0)
                codes = _encode(xs, BITS, IS_INT, SIGNED, FRAC_SCALE, MBITS, BIAS, MAX_CODE, NAN_CODE, OVF_CODE,
                                MIN_NORMAL, SUB_C, SUB_C_BITS, INV_MIN_SUB, ROUNDING, NONFIN)

        # ---- pack and store codes (the fast path stored 8-bit codes already)
        # (``clean`` is a run-time value, so this chain is a run-time ``if``: the compiler
        # (unlike the interpreter) needs every variable assigned in a branch to keep its
        # type and shape, hence new names (``cg``) instead of reshaping ``codes`` in place;
        # likewise ``bad`` / ``bad_enc`` above. tools/compile_check.py compiles them all.)
        if ((BITS == 8) | PK) & (RULE != 5) & FAST & (NONFIN != 2) & clean:
            pass
        elif SPLIT & PACK32 & (BITS == 4) & (VEC == 8):  # a block's QV words side by side in one thread
            cq = tl.reshape(codes, [TR, NB, QV, VEC])
            words = tl.sum(cq << (tl.arange(0, VEC) * 4)[None, None, None, :], axis=3)  # disjoint bits: sum == or
            blk = k0 + tl.arange(0, NB) * B
            wc = tl.multiple_of(blk // 8, QV)[None, :, None] + tl.arange(0, QV)[None, None, :]
            kw = tl.multiple_of(K // 8, QV)  # rows of words: K is a multiple of B = 8 QV
            tl.store(data_ptr + rows64[:, None, None] * kw + wc, words,
                     mask=rmask[:, None, None] & (blk < K)[None, :, None])
        elif PACK32:  # codes of 1/2/4/8 bits: one int32 word per 32 bits (coalesced 4-byte stores)
            W: tl.constexpr = 32 // BITS
            cw = tl.reshape(codes, [TR, TK // W, W])
            words = tl.sum(cw << (tl.arange(0, W) * BITS)[None, None, :], axis=2)  # disjoint bits: sum == or
            # a run-time 0 hides the columns' alignment: the words stay in the registers that
            # packed them (one 4-byte store per row and thread, coalesced per warp) instead of
            # a shared-memory layout conversion to wider vector stores
            wcols = (k0 // W) + tl.arange(0, TK // W) + ((K // K - 1) if BITS == 4 else 0)
            tl.store(data_ptr + rows64[:, None] * (K // W) + wcols[None, :], words,
                     mask=rmask[:, None] & (wcols * W < K)[None, :])
        elif PACK_WORD:
            cg = tl.reshape(codes, [TR, TK // G, G])
            sh = (tl.arange(0, 8) * BITS).to(tl.int64)
            word = tl.sum(cg.to(tl.int64) << sh[None, None, :], axis=2)  # [TR, TK/8]
            j = tl.arange(0, 8)
            byts = ((word[:, :, None] >> (j * 8).to(tl.int64)[None, None, :]) & 0xFF).to(tl.uint8)
            grp = (k0 // 8) + tl.arange(0, TK // 8)
            boff = rows64[:, None, None] * ((K // 8) * BITS) + grp[None, :, None] * BITS + j[None, None, :]
            bmask = rmask[:, None, None] & (grp * 8 < K)[None, :, None] & (j < BITS)[None, None, :]
            tl.store(data_ptr + boff, byts, mask=bmask)
        else:
            cg = tl.reshape(codes, [TR, TK // G, G])
            if G == 1:
                byts = tl.reshape(cg, [TR, TK]).to(tl.uint8)
            else:
                sh = tl.arange(0, G) * BITS
                byts = tl.sum(cg << sh[None, None, :], axis=2).to(tl.uint8)  # disjoint bits: sum == or
            bcols = (k0 // G) + tl.arange(0, TK // G)
            tl.store(data_ptr + rows64[:, None] * (K // G) + bcols[None, :], byts,
                     mask=rmask[:, None] & (bcols * G < K)[None, :])

        # ---- scales (and zero points), straight into the requested layout
        srow = pid_r * RB + tl.arange(0, RB)
        scol = (k0 // B) + tl.arange(0, NB)
        smask = (srow * BR < R)[:, None] & (scol * B < K)[None, :]
        soff = _scale_offset(srow[:, None].to(tl.int64), scol[None, :], SC, LAYOUT)
        if SCALE_KIND == 2:
            tl.store(scale_ptr + soff, raw, mask=smask)
        elif PK & ASM:  # a byte per block from the thread that owns it (tl.store: a shared-memory relayout)
            _st_u8(scale_ptr + soff, raw, smask, EVEN)
        else:
            tl.store(scale_ptr + soff, raw.to(tl.uint8), mask=smask)
        if RULE == 5:
            tl.store(zp_ptr + srow[:, None].to(tl.int64) * SC + scol[None, :], zf.to(tl.uint8), mask=smask)


# ----------------------------------------------------------------------------------
# dequantize
# ----------------------------------------------------------------------------------


@triton.jit
def _prmt(a, b, sel):
    """Interpreter model of PTX ``prmt.b32 d, a, b, sel`` (default mode): byte i of d is
    byte ``sel[4i+2 : 4i]`` of {b, a} (a = bytes 0-3), or that byte's sign replicated
    when ``sel[4i+3]`` is set. Only the low 16 bits of ``sel`` are read."""
    d = tl.zeros_like(a)
    for i in tl.static_range(4):
        nib = (sel >> (4 * i)) & 0xF
        idx = nib & 7
        src = tl.where(idx < 4, a, b)
        byt = (src >> ((idx & 3) * 8)) & 0xFF
        byt = tl.where(nib >= 8, tl.where(byt >= 128, 0xFF, 0), byt)
        d = d | (byt << (8 * i))
    return d


@triton.jit
def _lut_value(s, zp, g, c: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr,
               STEP: tl.constexpr, MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr,
               INF_CODE: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GLOBAL: tl.constexpr):
    """float32 output of code ``c`` in each block, in the reference's order of operations."""
    v = _decode(tl.full(s.shape, c, tl.int32), BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE)
    if HAS_ZP:
        v = v - zp
    v = v * s
    if HAS_GLOBAL:
        v = v * g
    return v


@triton.jit
def _lut_tables(s, zp, g, NE: tl.constexpr, BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr,
                STEP: tl.constexpr, MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr,
                INF_CODE: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GLOBAL: tl.constexpr, out_ty: tl.constexpr,
                MANUAL_BF16: tl.constexpr, ASM: tl.constexpr):
    """Per block: the 16-bit outputs of codes 0..NE-1, computed exactly as the reference
    (``((decode(c) - zp) * s) * g`` in float32, then one RNE cast), split into byte planes
    for ``prmt``: ``Lk`` holds the low bytes of codes 4k..4k+3, ``Hk`` their high bytes.
    (NE = 8: sign-magnitude codes, the sign is applied afterwards; NE = 16: every code.)"""
    L0 = tl.zeros_like(s.to(tl.int32))
    L1 = L0
    L2 = L0
    L3 = L0
    H0 = L0
    H1 = L0
    H2 = L0
    H3 = L0
    if ASM:  # two outputs per cvt.rn.{bf16,f16}x2.f32, byte planes by prmt: 1.5 instructions per entry
        CVT: tl.constexpr = "cvt.rn.bf16x2.f32" if out_ty == tl.bfloat16 else "cvt.rn.f16x2.f32"
        for q in tl.static_range(NE // 4):
            v0 = _lut_value(s, zp, g, 4 * q, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE, HAS_ZP,
                            HAS_GLOBAL)
            v1 = _lut_value(s, zp, g, 4 * q + 1, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE, HAS_ZP,
                            HAS_GLOBAL)
            v2 = _lut_value(s, zp, g, 4 * q + 2, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE, HAS_ZP,
                            HAS_GLOBAL)
            v3 = _lut_value(s, zp, g, 4 * q + 3, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE, HAS_ZP,
                            HAS_GLOBAL)
            lo, hi = tl.inline_asm_elementwise(
                "{\n.reg .b32 a, b;\n" + CVT + " a, $3, $2;\n" + CVT + " b, $5, $4;\n"
                "prmt.b32 $0, a, b, 0x6420;\nprmt.b32 $1, a, b, 0x7531;\n}",
                "=r,=r,f,f,f,f", [v0, v1, v2, v3], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
            if q == 0:
                L0 = lo
                H0 = hi
            elif q == 1:
                L1 = lo
                H1 = hi
            elif q == 2:
                L2 = lo
                H2 = hi
            else:
                L3 = lo
                H3 = hi
    else:
        for c in tl.static_range(NE):
            v = _lut_value(s, zp, g, c, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE, HAS_ZP, HAS_GLOBAL)
            e = _cast(v, out_ty, MANUAL_BF16).to(tl.int16, bitcast=True).to(tl.int32)
            lo = (e & 0xFF) << (8 * (c % 4))
            hi = ((e >> 8) & 0xFF) << (8 * (c % 4))
            if c // 4 == 0:
                L0 = L0 | lo
                H0 = H0 | hi
            elif c // 4 == 1:
                L1 = L1 | lo
                H1 = H1 | hi
            elif c // 4 == 2:
                L2 = L2 | lo
                H2 = H2 | hi
            else:
                L3 = L3 | lo
                H3 = H3 | hi
    return L0, L1, L2, L3, H0, H1, H2, H3


# One word of eight 4-bit codes -> four words of two 16-bit outputs (elements 2j, 2j+1 in
# word j), by byte permutes from the block's table (``_lut_tables``). $4 = codes word,
# $5..$8 = L0 L1 H0 H1. Sign-magnitude codes (NE = 8): the magnitude (3 bits) selects
# the table byte; the sign flips bit 15 of the output (prmt's sign-replicate mode on
# 0x80 bytes turns each code's sign bit into bit 0 of its byte, moved to bit 7).
_LUT8_ASM = tl.constexpr("""{
.reg .b32 m, mh, wh, la, lb, ha, hb, sa, sb;
and.b32 m, $4, 0x77777777;
shr.u32 mh, m, 16;
shr.u32 wh, $4, 16;
prmt.b32 la, $5, $6, m;
prmt.b32 ha, $7, $8, m;
prmt.b32 lb, $5, $6, mh;
prmt.b32 hb, $7, $8, mh;
prmt.b32 sa, $9, $9, $4;
prmt.b32 sb, $9, $9, wh;
shl.b32 sa, sa, 7;
shl.b32 sb, sb, 7;
and.b32 sa, sa, 0x80808080;
and.b32 sb, sb, 0x80808080;
xor.b32 ha, ha, sa;
xor.b32 hb, hb, sb;
prmt.b32 $0, la, ha, 0x5140;
prmt.b32 $1, la, ha, 0x7362;
prmt.b32 $2, lb, hb, 0x5140;
prmt.b32 $3, lb, hb, 0x7362;
}""")

# NE = 16 (integer codes): $5..$12 = L0 L1 L2 L3 H0 H1 H2 H3; code bit 3 picks the table
# half through a byte mask (prmt of {0, 0xFFFFFFFF} by 4 * bit 3).
_LUT16_ASM = tl.constexpr("""{
.reg .b32 m, mh, t, th, ma, mb, x, y, la, lb, ha, hb;
and.b32 m, $4, 0x77777777;
shr.u32 mh, m, 16;
shr.u32 t, $4, 1;
and.b32 t, t, 0x44444444;
shr.u32 th, t, 16;
prmt.b32 ma, 0, $13, t;
prmt.b32 mb, 0, $13, th;
prmt.b32 x, $5, $6, m;
prmt.b32 y, $7, $8, m;
xor.b32 y, y, x;
and.b32 y, y, ma;
xor.b32 la, x, y;
prmt.b32 x, $9, $10, m;
prmt.b32 y, $11, $12, m;
xor.b32 y, y, x;
and.b32 y, y, ma;
xor.b32 ha, x, y;
prmt.b32 x, $5, $6, mh;
prmt.b32 y, $7, $8, mh;
xor.b32 y, y, x;
and.b32 y, y, mb;
xor.b32 lb, x, y;
prmt.b32 x, $9, $10, mh;
prmt.b32 y, $11, $12, mh;
xor.b32 y, y, x;
and.b32 y, y, mb;
xor.b32 hb, x, y;
prmt.b32 $0, la, ha, 0x5140;
prmt.b32 $1, la, ha, 0x7362;
prmt.b32 $2, lb, hb, 0x5140;
prmt.b32 $3, lb, hb, 0x7362;
}""")


@triton.jit
def _lut_decode(w, L0, L1, L2, L3, H0, H1, H2, H3, NE: tl.constexpr, ASM: tl.constexpr):
    """Four words of 16-bit output pairs from a word of eight 4-bit codes (see the asm).
    Without ASM (the interpreter): the same permutes by ``_prmt``."""
    if ASM:
        if NE == 8:
            p0, p1, p2, p3 = tl.inline_asm_elementwise(
                _LUT8_ASM, "=r,=r,=r,=r,r,r,r,r,r,r", [w, L0, L1, H0, H1, tl.full(w.shape, -2139062144, tl.int32)],
                dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
        else:
            p0, p1, p2, p3 = tl.inline_asm_elementwise(
                _LUT16_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r", [w, L0, L1, L2, L3, H0, H1, H2, H3,
                                                                   tl.full(w.shape, -1, tl.int32)],
                dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        m = w & 0x77777777
        mh = (m >> 16) & 0xFFFF
        if NE == 8:
            la = _prmt(L0, L1, m)
            ha = _prmt(H0, H1, m)
            lb = _prmt(L0, L1, mh)
            hb = _prmt(H0, H1, mh)
            k = tl.full(w.shape, -2139062144, tl.int32)  # 0x80808080
            ha = ha ^ ((_prmt(k, k, w) << 7) & -2139062144)
            hb = hb ^ ((_prmt(k, k, (w >> 16) & 0xFFFF) << 7) & -2139062144)
        else:
            t = (w >> 1) & 0x44444444
            z = tl.zeros_like(w)
            ma = _prmt(z, z - 1, t)
            mb = _prmt(z, z - 1, (t >> 16) & 0xFFFF)
            la = _prmt(L0, L1, m) ^ ((_prmt(L2, L3, m) ^ _prmt(L0, L1, m)) & ma)
            ha = _prmt(H0, H1, m) ^ ((_prmt(H2, H3, m) ^ _prmt(H0, H1, m)) & ma)
            lb = _prmt(L0, L1, mh) ^ ((_prmt(L2, L3, mh) ^ _prmt(L0, L1, mh)) & mb)
            hb = _prmt(H0, H1, mh) ^ ((_prmt(H2, H3, mh) ^ _prmt(H0, H1, mh)) & mb)
        sel_lo = tl.full(w.shape, 0x5140, tl.int32)
        sel_hi = tl.full(w.shape, 0x7362, tl.int32)
        p0 = _prmt(la, ha, sel_lo)
        p1 = _prmt(la, ha, sel_hi)
        p2 = _prmt(lb, hb, sel_lo)
        p3 = _prmt(lb, hb, sel_hi)
    return p0, p1, p2, p3


@triton.jit
def _ld_nc(ptr, mask, EVEN: tl.constexpr):
    """GPU: ``tl.load(ptr, mask, other=0)`` for 1-, 2- or 4-byte elements by ld.global.nc in
    the layout of ``ptr`` (Triton's load picks its own layout; for the per-block scales of
    a tile that meant a trip through shared memory to the layout of their use)."""
    ty: tl.constexpr = ptr.dtype.element_ty
    NBITS: tl.constexpr = ty.primitive_bitwidth
    LD: tl.constexpr = "ld.global.nc.u8" if NBITS == 8 else "ld.global.nc.u16" if NBITS == 16 else "ld.global.nc.b32"
    addr = ptr.to(tl.int64, bitcast=True)
    if EVEN:
        r = tl.inline_asm_elementwise(LD + " $0, [$1];", "=r,l", [addr], dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = tl.inline_asm_elementwise("{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\nmov.b32 $0, 0;\n@p " + LD +
                                      " $0, [$1];\n}", "=r,l,r", [addr, mask.to(tl.int32)],
                                      dtype=tl.int32, is_pure=True, pack=1)
    if NBITS == 8:
        out = r.to(tl.uint8).to(ty, bitcast=True)
    elif NBITS == 16:
        out = r.to(tl.int16).to(ty, bitcast=True)
    else:
        out = r.to(ty, bitcast=True)
    return out


@triton.jit
def _ld_blk(ptr, mask, EVEN: tl.constexpr, ASM: tl.constexpr):
    """Per-block values (scales, zero points): ``_ld_nc`` on the GPU, ``tl.load`` otherwise."""
    if ASM:
        v = _ld_nc(ptr, mask, EVEN)
    elif EVEN:
        v = tl.load(ptr)
    else:
        v = tl.load(ptr, mask=mask, other=0)
    return v


@triton.jit
def _st16x8(addr, f0, f1, f2, f3, f4, f5, f6, f7, ok, BF16: tl.constexpr, EVEN: tl.constexpr):
    """GPU: eight float32 values rounded (RNE) to bf16 / f16 and stored as one 16-byte vector at ``addr``."""
    CVT: tl.constexpr = "cvt.rn.bf16x2.f32" if BF16 else "cvt.rn.f16x2.f32"
    body: tl.constexpr = ".reg .b32 a, b, c, d;\n" + CVT + " a, $3, $2;\n" + CVT + " b, $5, $4;\n" + CVT + \
        " c, $7, $6;\n" + CVT + " d, $9, $8;\n"
    if EVEN:
        tl.inline_asm_elementwise("{\n" + body + "st.global.v4.b32 [$1], {a, b, c, d};\nmov.b32 $0, 0;\n}",
                                  "=r,l,f,f,f,f,f,f,f,f", [addr, f0, f1, f2, f3, f4, f5, f6, f7], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("{\n.reg .pred p;\n" + body + "setp.ne.b32 p, $10, 0;\n"
                                  "@p st.global.v4.b32 [$1], {a, b, c, d};\nmov.b32 $0, 0;\n}",
                                  "=r,l,f,f,f,f,f,f,f,f,r", [addr, f0, f1, f2, f3, f4, f5, f6, f7, ok],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _dequantize_kernel(
    data_ptr, scale_ptr, zp_ptr, gscale_ptr, out_ptr, R, K, SC,
    TR: tl.constexpr, TK: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, STEP: tl.constexpr,
    MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr, INF_CODE: tl.constexpr,
    SCALE_KIND: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GLOBAL: tl.constexpr, MANUAL_BF16: tl.constexpr,
    PACK32: tl.constexpr, LUT: tl.constexpr = 0, HW8: tl.constexpr = 0, EVEN: tl.constexpr = False,
    ASM: tl.constexpr = False, KWD: tl.constexpr = 1, SMEM_STORE: tl.constexpr = False,
    HINTS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Three ways, chosen by the host per format (all bit-identical to the reference):

    * ``LUT`` (8 or 16; 4-bit codes, 16-bit output, 1-row blocks, int32 words): each block's
      outputs for its NE codes are computed once (``_lut_tables``: exact float32
      arithmetic, one cast), and every word of eight codes becomes four words of output
      pairs by byte permutes (``_lut_decode``; 16-byte stores, no per-element float work).
    * ``HW8`` (8-bit codes; 1: E4M3 and 2: E5M2 by the GPU's exact ``cvt`` f8x2 -> f16x2,
      3: the bit-placement decode): one float32 multiply per element, the tile viewed as
      ``[TR, NB, B]`` bytes so a thread's 16 bytes share one scale.
    * otherwise the general path: decode by bit placement, scale, zero point, global.

    ``EVEN``: the grid tiles R and K exactly, so no masks. ``PDL``: see :func:`_pdl_start`."""
    _pdl_start(PDL, True)
    RB: tl.constexpr = TR // BR
    NB: tl.constexpr = TK // B
    PACK_WORD: tl.constexpr = (8 % BITS) != 0
    G: tl.constexpr = 8 if PACK_WORD else 8 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1

    pid_r = tl.program_id(0)
    k0 = tl.program_id(1) * TK
    rows = pid_r * TR + tl.arange(0, TR)
    rmask = rows < R
    rows64 = rows.to(tl.int64)
    cols = k0 + tl.arange(0, TK)

    if LUT > 0:
        QW: tl.constexpr = B // 8  # code words per block
        TW: tl.constexpr = TK // 8  # code words per tile row
        kw = tl.multiple_of(K // 8, KWD)  # KWD: the host's largest power of two (<= 4) dividing K / 8 (0: K % 8 != 0)
        wcol = (k0 // 8) + tl.arange(0, TW)
        woff = rows64[:, None] * kw + wcol[None, :]
        blk = (k0 // B) + tl.arange(0, NB)
        soff = rows64[:, None] * SC + blk[None, :]
        bm = rmask[:, None] & (blk < SC)[None, :]
        if EVEN & HINTS:  # (HINTS: streaming loads / stores: evict-first codes, .cs outputs)
            words = tl.load(data_ptr + woff, eviction_policy="evict_first")
        elif EVEN:
            words = tl.load(data_ptr + woff)
        else:
            words = tl.load(data_ptr + woff, mask=rmask[:, None] & (wcol < kw)[None, :], other=0)
        s = _scale_decode(_ld_blk(scale_ptr + soff, bm, EVEN, ASM), SCALE_KIND)
        zp = s
        if HAS_ZP:
            zp = _ld_blk(zp_ptr + soff, bm, EVEN, ASM).to(tl.float32)
        g = 1.0
        if HAS_GLOBAL:
            g = tl.load(gscale_ptr)
        L0, L1, L2, L3, H0, H1, H2, H3 = _lut_tables(s, zp, g, LUT, BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN,
                                                     INF_CODE, HAS_ZP, HAS_GLOBAL, out_ptr.dtype.element_ty,
                                                     MANUAL_BF16, ASM)
        w3 = tl.reshape(words, [TR, NB, QW])
        p0, p1, p2, p3 = _lut_decode(w3, L0[:, :, None], L1[:, :, None], L2[:, :, None], L3[:, :, None],
                                     H0[:, :, None], H1[:, :, None], H2[:, :, None], H3[:, :, None], LUT, ASM)
        out32 = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
        k2 = tl.multiple_of(K // 2, 4 * KWD)
        if ASM & (not SMEM_STORE):
            # each word's 16 output bytes by one st.global.v4 from the registers that decoded
            # them (a thread writes its blocks' 64 contiguous bytes; Triton's own store would
            # first move them through shared memory into a one-16-byte-per-lane layout)
            wo = tl.reshape(rows64[:, None] * k2 + (wcol * 4)[None, :], [TR, NB, QW])
            addr = (out32 + wo).to(tl.int64, bitcast=True)
            if EVEN:
                tl.inline_asm_elementwise("st.global.v4.b32 [$1], {$2, $3, $4, $5};\nmov.b32 $0, 0;",
                                          "=r,l,r,r,r,r", [addr, p0, p1, p2, p3], dtype=tl.int32, is_pure=False,
                                          pack=1)
            else:
                ok = tl.reshape(rmask[:, None] & (wcol < kw)[None, :], [TR, NB, QW]).to(tl.int32)
                tl.inline_asm_elementwise("{\n.reg .pred p;\nsetp.ne.b32 p, $6, 0;\n"
                                          "@p st.global.v4.b32 [$1], {$2, $3, $4, $5};\nmov.b32 $0, 0;\n}",
                                          "=r,l,r,r,r,r,r", [addr, p0, p1, p2, p3, ok], dtype=tl.int32,
                                          is_pure=False, pack=1)
        else:
            pairs = tl.reshape(tl.join(tl.join(p0, p2), tl.join(p1, p3)), [TR, TK // 2])
            pcol = (k0 // 2) + tl.arange(0, TK // 2)
            ooff = rows64[:, None] * k2 + pcol[None, :]
            if EVEN & HINTS:
                tl.store(out32 + ooff, pairs, cache_modifier=".cs")
            elif EVEN:
                tl.store(out32 + ooff, pairs)
            else:
                tl.store(out32 + ooff, pairs, mask=rmask[:, None] & (pcol < k2)[None, :])
    elif HW8 > 0:
        bo = (k0 // B) + tl.arange(0, NB)
        off = rows64[:, None] * K + cols[None, :]
        data8 = data_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        soff = (rows // BR).to(tl.int64)[:, None] * SC + bo[None, :]
        cm = rmask[:, None] & (cols < K)[None, :]
        bm = rmask[:, None] & (bo < SC)[None, :]
        if EVEN & HINTS:
            byts = tl.load(data8 + off, eviction_policy="evict_first")
        elif EVEN:
            byts = tl.load(data8 + off)
        else:
            byts = tl.load(data8 + off, mask=cm, other=0)
        sraw = _ld_blk(scale_ptr + soff, bm, EVEN, ASM)  # in the layout of its use
        if HW8 == 1:
            v = byts.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        elif HW8 == 2:
            v = byts.to(tl.float8e5, bitcast=True).to(tl.float32)
        else:
            v = _decode(byts.to(tl.int32), BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE)
        v = tl.reshape(v, [TR, NB, B])
        if HAS_ZP:
            v = v - _ld_blk(zp_ptr + soff, bm, EVEN, ASM).to(tl.float32)[:, :, None]
        out = v * _scale_decode(sraw, SCALE_KIND)[:, :, None]
        if HAS_GLOBAL:
            out = out * tl.load(gscale_ptr)
        out = tl.reshape(out, [TR, TK])
        if ASM & (not SMEM_STORE) & (out_ptr.dtype.element_ty.primitive_bitwidth == 16) & (KWD > 0):
            # eight outputs per st.global.v4 from the registers that hold them (Triton's store
            # would convert to 8 elements per lane through shared memory)
            o = tl.reshape(out, [TR, TK // 8, 2, 2, 2])
            e0, e1 = tl.split(o)  # element 4a + 2b + c: split c, then b, then a
            e00, e01 = tl.split(e0)
            e10, e11 = tl.split(e1)
            f0, f4 = tl.split(e00)
            f2, f6 = tl.split(e01)
            f1, f5 = tl.split(e10)
            f3, f7 = tl.split(e11)
            g8 = (k0 // 8) + tl.arange(0, TK // 8)
            addr = (out_ptr + (rows64[:, None] * K + (g8 * 8)[None, :])).to(tl.int64, bitcast=True)
            ok = (rmask[:, None] & (g8 * 8 < K)[None, :]).to(tl.int32)
            _st16x8(addr, f0, f1, f2, f3, f4, f5, f6, f7, ok, out_ptr.dtype.element_ty == tl.bfloat16, EVEN)
        else:
            res = _cast(out, out_ptr.dtype.element_ty, MANUAL_BF16)
            if EVEN & HINTS:
                tl.store(out_ptr + off, res, cache_modifier=".cs")
            elif EVEN:
                tl.store(out_ptr + off, res)
            else:
                tl.store(out_ptr + off, res, mask=cm)
    else:
        if PACK32:
            W: tl.constexpr = 32 // BITS
            wcols = (k0 // W) + tl.arange(0, TK // W)
            words = tl.load(data_ptr + rows64[:, None] * (K // W) + wcols[None, :],
                            mask=rmask[:, None] & (wcols * W < K)[None, :], other=0)
            codes = (words[:, :, None] >> (tl.arange(0, W) * BITS)[None, None, :]) & MASK
        elif PACK_WORD:
            grp = (k0 // 8) + tl.arange(0, TK // 8)
            j = tl.arange(0, 8)
            boff = rows64[:, None, None] * ((K // 8) * BITS) + grp[None, :, None] * BITS + j[None, None, :]
            bmask = rmask[:, None, None] & (grp * 8 < K)[None, :, None] & (j < BITS)[None, None, :]
            byts = tl.load(data_ptr + boff, mask=bmask, other=0).to(tl.int64)
            word = tl.sum(byts << (j * 8).to(tl.int64)[None, None, :], axis=2)
            codes = ((word[:, :, None] >> (j * BITS).to(tl.int64)[None, None, :]) & MASK).to(tl.int32)
        else:
            bcols = (k0 // G) + tl.arange(0, TK // G)
            byts = tl.load(data_ptr + rows64[:, None] * (K // G) + bcols[None, :],
                           mask=rmask[:, None] & (bcols * G < K)[None, :], other=0).to(tl.int32)
            if G == 1:
                codes = byts
            else:
                codes = (byts[:, :, None] >> (tl.arange(0, G) * BITS)[None, None, :]) & MASK
        v = _decode(tl.reshape(codes, [TR, TK]), BITS, IS_INT, SIGNED, STEP, MBITS, POW, NAN_MIN, INF_CODE)
        vb = tl.reshape(v, [RB, BR, NB, B])

        srow = pid_r * RB + tl.arange(0, RB)
        scol = (k0 // B) + tl.arange(0, NB)
        smask = (srow * BR < R)[:, None] & (scol * B < K)[None, :]
        soff = srow[:, None].to(tl.int64) * SC + scol[None, :]
        s = _scale_decode(tl.load(scale_ptr + soff, mask=smask, other=0), SCALE_KIND)
        if HAS_ZP:
            zp = tl.load(zp_ptr + soff, mask=smask, other=0).to(tl.float32)
            vb = vb - zp[:, None, :, None]
        out = vb * s[:, None, :, None]
        if HAS_GLOBAL:
            out = out * tl.load(gscale_ptr)
        out = tl.reshape(out, [TR, TK])
        tl.store(out_ptr + rows64[:, None] * K + cols[None, :], _cast(out, out_ptr.dtype.element_ty, MANUAL_BF16),
                 mask=rmask[:, None] & (cols < K)[None, :])
