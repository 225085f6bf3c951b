"""The dequantize kernel: every format's codes to float32 / float16 / bfloat16, bit-identical
to :func:`microscale.reference.dequantize`. NaN outputs are NaN but their payload and sign
are the GPU's."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import _cast, _pdl_start
from .elements import _decode
from .scales import _scale_decode


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
def _dequantize_kernel(
    data_ptr, scale_ptr, zp_ptr, gscale_ptr, out_ptr, R, K, SC,
    TR: tl.constexpr, TK: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    BITS: tl.constexpr, IS_INT: tl.constexpr, SIGNED: tl.constexpr, STEP: tl.constexpr,
    MBITS: tl.constexpr, POW: tl.constexpr, NAN_MIN: tl.constexpr, INF_CODE: tl.constexpr,
    SCALE_KIND: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GLOBAL: tl.constexpr, MANUAL_BF16: tl.constexpr,
    PACK32: tl.constexpr, LUT: tl.constexpr = 0, HW8: tl.constexpr = 0, EVEN: tl.constexpr = False,
    ASM: tl.constexpr = False, KWD: tl.constexpr = 1,
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
