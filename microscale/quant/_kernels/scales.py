"""Scale codecs: E8M0 from a block amax under each power-of-two rule, float scales (UE4M3,
fp16/bf16/fp32) with the host's NaN bits, their decoders, the kernel-written scale layouts,
and ModelOpt's two-level NVFP4 block scale."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import SK_E8M0, SK_UE4M3, _bits, _cast, _clamp_nan, _flt, _isfinite, _markstein_div
from .elements import _decode, _e4m3_decode, _e4m3_encode


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

    SCALE_KIND (``ScaleKind``) E8M0: nearest power of two by the bits, ties up; UE4M3: E4M3 RNE
    saturating; FP16 / BF16 / FP32: the float dtype ``st_ty`` (clamp to +-max, RNE cast; a NaN is stored
    as ``SNAN``, the host's cast of the default quiet NaN, since GPU casts canonicalise
    NaN payloads differently). ``NONAN`` (UE4M3 with ``HW``): no NaN handling, for callers
    that never use a NaN input's result."""
    if SCALE_KIND == SK_E8M0:
        vb = _bits(v)
        e = (vb >> 23) & 0xFF
        m = vb & 0x7FFFFF
        bb = tl.where(e == 0, (m >= 0x600000).to(tl.int32), e + (m >= 0x400000).to(tl.int32))
        bb = tl.minimum(tl.maximum(bb, 0), 254)
        bb = tl.where(_isfinite(v) & (v > 0), bb, 255)
        raw = bb
        val = _e8m0_value(bb)
    elif SCALE_KIND == SK_UE4M3:
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
    if SCALE_KIND == SK_E8M0:
        val = _e8m0_value(raw.to(tl.int32))
    elif SCALE_KIND == SK_UE4M3:
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
