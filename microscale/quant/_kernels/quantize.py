"""The quantize kernel (with the fused RMSNorm / SiLU-mul prologues), for every format.

One quantize kernel and one dequantize kernel serve every :class:`~microscale.formats.Format`:
the format's fields arrive as ``tl.constexpr`` parameters (built once per format by
:mod:`microscale.quant.params`), so each format compiles to its own specialised code
without a copy of the source per format and without branches on names.

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

from .amax import _global_from_partials
from .common import (
    SK_E8M0, SK_FP16, SK_UE4M3, _bits, _clamp_nan, _flt, _isfinite, _markstein_div, _nan_rule, _pdl_start,
    _rcp_rn_normal, _rint_s32, _round_int, _to_f32,
)
from .elements import (
    _encode, _encode_mag_rne, _encode_mag_rne_p2, _mag_max, _pack8_nibbles, _pk_codes, _pk_load, _pk_words,
    _split4, _st_u8,
)
from .scales import _e8m0_from_amax, _e8m0_recip, _e8m0_value, _modelopt_scale, _scale_encode, _scale_offset


@triton.jit
def _quantize_kernel(
    x_ptr, y_ptr, w_ptr,  # input; second input (silu: up) ; rmsnorm weight
    data_ptr, scale_ptr, zp_ptr, gscale_ptr, part_ptr, gs_out_ptr, flag_ptr, dst_ptr,
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
    PDL: tl.constexpr = False, DST: tl.constexpr = False,
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
    if DST:  # input row r is stored at row dst[r] of the outputs (a paged KV cache's slots; 1-D blocks, row-major)
        orows64 = tl.load(dst_ptr + rows, mask=rmask, other=0).to(tl.int64)
    else:
        orows64 = rows64

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
    FBS: tl.constexpr = (SCALE_KIND == SK_UE4M3) & PK & MARKSTEIN & ASM & (TWO_LEVEL == 1)
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
            # the range from the finite values; NaN -> the zero point, +-Inf -> saturated (as the reference). A tile
            # without Inf / NaN (its blocks' magnitude bits below Inf's) takes min / max of x as it is
            abm = tl.max(tl.max(ab, axis=3), axis=1)  # [RB, NB]
            tile_abm = tl.max(tl.reshape(abm, [RB * NB], can_reorder=True), axis=0)
            if tile_abm < 0x7F800000:
                xr = xb
            else:
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
            # x / s by Markstein's sequence where it is RN(x / s) for the whole tile: every x finite with |x| < 2^60,
            # s in [2^-40, 2^60] (a smaller nonzero |x| gives |x / s| < 2^-20, which rounds to the same integer, 0,
            # whatever its last bit), and s not saturated (s >= range / (2 MAX): |x / s| <= 2 MAX, so no NaN and no
            # clamp before the rounding); elsewhere IEEE division, NaN -> 0, clamped
            tile_ok = False
            if MARKSTEIN:  # (the interpreter's fma rounds twice: IEEE division there)
                sbits = _bits(s)
                sbad = (abm >= 0x5D800000) | (sbits < 0x2B800000) | (sbits > 0x5D800000) | \
                    (s * (2.0 * MAX_CODE) < hi - lo)
                tile_ok = tl.max(tl.reshape(sbad.to(tl.int32), [RB * NB], can_reorder=True), axis=0) == 0
            if tile_ok:
                if ASM:
                    r = _rcp_rn_normal(s)
                else:
                    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
                xs = _markstein_div(xb, r[:, None, :, None], (0.0 - s)[:, None, :, None])
                if ASM & (ROUNDING == 0):  # (one cvt.rni rounds and converts; zero point and clamp in integers)
                    qi = _rint_s32(xs) + zf.to(tl.int32)[:, None, :, None]
                    codes = tl.minimum(tl.maximum(qi, 0), MAX_CODE)
                else:
                    q = _round_int(xs, ROUNDING) + zf[:, None, :, None]
                    codes = tl.minimum(tl.maximum(q, 0.0), MAX_CODE * 1.0).to(tl.int32)
            else:
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
                if SCALE_KIND == SK_E8M0:
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
                    pdw = data_ptr + orows64[:, None, None] * tl.multiple_of(K // 8, QW) + \
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
                        tl.store(data_ptr.to(tl.pointer_type(tl.uint8)) + orows64[:, None] * K + cols8[None, :],
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
            tl.store(data_ptr + orows64[:, None, None] * kw + wc, words,
                     mask=rmask[:, None, None] & (blk < K)[None, :, None])
        elif PACK32:  # codes of 1/2/4/8 bits: one int32 word per 32 bits (coalesced 4-byte stores)
            W: tl.constexpr = 32 // BITS
            cw = tl.reshape(codes, [TR, TK // W, W])
            words = tl.sum(cw << (tl.arange(0, W) * BITS)[None, None, :], axis=2)  # disjoint bits: sum == or
            # a run-time 0 hides the columns' alignment: the words stay in the registers that
            # packed them (one 4-byte store per row and thread, coalesced per warp) instead of
            # a shared-memory layout conversion to wider vector stores
            wcols = (k0 // W) + tl.arange(0, TK // W) + ((K // K - 1) if BITS == 4 else 0)
            tl.store(data_ptr + orows64[:, None] * (K // W) + wcols[None, :], words,
                     mask=rmask[:, None] & (wcols * W < K)[None, :])
        elif PACK_WORD:
            cg = tl.reshape(codes, [TR, TK // G, G])
            sh = (tl.arange(0, 8) * BITS).to(tl.int64)
            word = tl.sum(cg.to(tl.int64) << sh[None, None, :], axis=2)  # [TR, TK/8]
            j = tl.arange(0, 8)
            byts = ((word[:, :, None] >> (j * 8).to(tl.int64)[None, None, :]) & 0xFF).to(tl.uint8)
            grp = (k0 // 8) + tl.arange(0, TK // 8)
            boff = orows64[:, None, None] * ((K // 8) * BITS) + grp[None, :, None] * BITS + j[None, None, :]
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
            tl.store(data_ptr + orows64[:, None] * (K // G) + bcols[None, :], byts,
                     mask=rmask[:, None] & (bcols * G < K)[None, :])

        # ---- scales (and zero points), straight into the requested layout
        srow = pid_r * RB + tl.arange(0, RB)
        scol = (k0 // B) + tl.arange(0, NB)
        smask = (srow * BR < R)[:, None] & (scol * B < K)[None, :]
        if DST:  # (BR == 1: a scale row per input row)
            srow64 = orows64
        else:
            srow64 = srow.to(tl.int64)
        soff = _scale_offset(srow64[:, None], scol[None, :], SC, LAYOUT)
        if SCALE_KIND >= SK_FP16:
            tl.store(scale_ptr + soff, raw, mask=smask)
        elif PK & ASM:  # a byte per block from the thread that owns it (tl.store: a shared-memory relayout)
            _st_u8(scale_ptr + soff, raw, smask, EVEN)
        else:
            tl.store(scale_ptr + soff, raw.to(tl.uint8), mask=smask)
        if RULE == 5:
            tl.store(zp_ptr + srow64[:, None] * SC + scol[None, :], zf.to(tl.uint8), mask=smask)
