"""Triton kernels of ``conv2d`` on a block-scaled weight in the canonical conv layout
(:mod:`microscale.conv.layout`): the weight ``[C_out, K]`` with K the flattened
``(c_in, kh, kw)`` axis (order ``hwc`` or ``chw``), codes a little-endian bitstream per row,
scales ``[C_out / block_rows, K / block]``.

* :func:`_conv2d_igemm_kernel`: an implicit GEMM. A program computes a tile of output pixels x
  output channels of one group; per K step it gathers the input patch ``[BLOCK_M, BLOCK_K]``
  straight from x (im2col in the loads: padding, stride and dilation are load masks and
  addresses) and decodes the weight ``[BLOCK_N, BLOCK_K]`` once for all BLOCK_M pixels, then one
  ``tl.dot`` with float32 accumulation.
* :func:`_conv2d_depthwise_kernel`: ``C_in/groups == 1`` (depthwise, any channel multiplier): no
  reduction over channels, so no MMA: a program holds pixels x channels and, per kernel tap,
  decodes that tap's weight of each channel once and multiply-adds it into all pixels.

Element and scale decoding are the linear family's (``_decode_elem``, ``_decode_scale``), with
the format's constexprs from :func:`microscale.linear.packed.format_constexprs`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...linear._kernels._linear_kernels import _decode_elem, _decode_scale, _mma


@triton.jit
def _pixels(pid_m, M, OH, OW, BLOCK_M: tl.constexpr):
    """The output pixels of row tile ``pid_m`` (image-major, then row, then column): in-range mask, image, row, column."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = offs_m // OW
    return offs_m < M, t // OH, t % OH, offs_m % OW


@triton.jit
def _load_codes(data_ptr, row_off, k, mask, BITS: tl.constexpr):
    """Codes at K positions ``k`` of the rows starting at byte offsets ``row_off`` (broadcast
    together): each row is a little-endian bitstream, code ``k`` at bits ``[k*BITS, k*BITS + BITS)``
    (4-bit: element 2i in the low nibble; 3/5/6-bit: 8 codes in BITS bytes). int32, low BITS set."""
    bit = k * BITS
    p = data_ptr + row_off + bit // 8
    b = tl.load(p, mask=mask, other=0).to(tl.int32)
    if (8 % BITS) != 0:  # a code may straddle two bytes
        b1 = tl.load(p + 1, mask=mask & ((bit % 8) + BITS > 8), other=0).to(tl.int32)
        b = b | (b1 << 8)
    return (b >> (bit % 8)) & ((1 << BITS) - 1)


@triton.jit
def _scale_bits(raw, SB: tl.constexpr):
    """Raw scale storage (uint8 / int16 / int32 views) -> its bits in the low SB bytes of an int32."""
    if SB == 1:
        return raw.to(tl.int32) & 0xFF
    elif SB == 2:
        return raw.to(tl.int32) & 0xFFFF
    else:
        return raw.to(tl.int32)


@triton.jit
def _conv2d_igemm_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr,
    M, NPG, H, W, OH, OW,
    sxn, sxc, sxh, sxw, son, soc, soh, sow, stride_wn, stride_sn,
    SH, SW, PH, PW, DH, DW,
    CG: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HWC: tl.constexpr,
    BITS: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, SB: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    HAS_ZP: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERP: tl.constexpr, IEEE: tl.constexpr,
):
    """out[img, g*NPG + n, oh, ow] = sum_k x[img, g*CG + c(k), ih(oh, k), iw(ow, k)] * w[g*NPG + n, k]
    for a [BLOCK_M pixels, BLOCK_N channels] tile of group ``g`` (program axis 2).

    ``M`` = images x OH x OW, ``NPG`` output channels per group, ``K`` = CG*KH*KW (the real,
    unpadded reduction length: positions past it read nothing; constexpr, as the kernel
    geometry: the index math divides by constants). ``HWC``: K order (r, s, c) with c
    innermost, else (c, r, s). ``IEEE``: float32 activations, full-precision dot (no TF32)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.program_id(2)
    m_ok, img, oh, ow = _pixels(pid_m, M, OH, OW, BLOCK_M)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    xbase = img.to(tl.int64) * sxn + (g * CG).to(tl.int64) * sxc
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < NPG
    rows = g * NPG + offs_n
    wrow = rows.to(tl.int64) * stride_wn
    srow = (rows // BR).to(tl.int64) * stride_sn
    NG: tl.constexpr = BLOCK_K // B if BLOCK_K >= B else 1
    K: tl.constexpr = CG * KH * KW
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        if HWC:
            c = kk % CG
            rs = kk // CG
            s = rs % KW
            r = rs // KW
        else:
            s = kk % KW
            rs = kk // KW
            r = rs % KH
            c = rs // KH
        # the input patch: im2col in the load (zero padding = masked lanes)
        ih = ih0[:, None] + (r * DH)[None, :]
        iw = iw0[:, None] + (s * DW)[None, :]
        xmask = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_ptr + xbase[:, None] + c.to(tl.int64)[None, :] * sxc + ih * sxh + iw * sxw, mask=xmask,
                    other=0.0)
        # the weight K-chunk, decoded once for every pixel of the tile
        wmask = n_ok[:, None] & k_ok[None, :]
        codes = _load_codes(w_ptr, wrow[:, None], kk[None, :], wmask, BITS)
        gcol = k0 // B + tl.arange(0, NG)
        smask = n_ok[:, None] & (gcol * B < K)[None, :]
        scale = _decode_scale(_scale_bits(tl.load(s_ptr + srow[:, None] + gcol[None, :], mask=smask, other=0), SB),
                              SCALE_KIND)
        if HAS_ZP:
            zp = tl.load(zp_ptr + srow[:, None] + gcol[None, :], mask=smask, other=0).to(tl.float32)
        else:
            zp = scale
        if BLOCK_K > B:  # one scale per B elements along K
            scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BLOCK_N, NG, B]), [BLOCK_N, BLOCK_K])
            zp = tl.reshape(tl.broadcast_to(zp[:, :, None], [BLOCK_N, NG, B]), [BLOCK_N, BLOCK_K])
        else:
            scale = tl.broadcast_to(scale, [BLOCK_N, BLOCK_K])
            zp = tl.broadcast_to(zp, [BLOCK_N, BLOCK_K])
        wv = _decode_elem(codes, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG,
                          HAS_ZP)
        wv = tl.where(wmask, wv, 0.0)  # block padding and masked scales contribute nothing
        if IEEE:
            acc = tl.dot(a, tl.trans(wv), acc, input_precision="ieee")
        else:
            acc = _mma(a, tl.trans(wv.to(x_ptr.dtype.element_ty)), acc, INTERP)
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    optr = (out_ptr + (img.to(tl.int64) * son + oh * soh + ow * sow)[:, None]
            + rows.to(tl.int64)[None, :] * soc)
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _conv2d_depthwise_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr,
    M, CO, MULT, H, W, OH, OW,
    sxn, sxc, sxh, sxw, son, soc, soh, sow, stride_wn, stride_sn,
    SH, SW, PH, PW, DH, DW,
    KH: tl.constexpr, KW: tl.constexpr,
    BITS: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, SB: tl.constexpr, B: tl.constexpr, BR: tl.constexpr,
    HAS_ZP: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """out[img, co, oh, ow] = sum_(r, s) x[img, co // MULT, ih, iw] * w[co, r*KW + s] for a
    [BLOCK_M pixels, BLOCK_C channels] tile (one input channel per group; MULT outputs each)."""
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
    m_ok, img, oh, ow = _pixels(pid_m, M, OH, OW, BLOCK_M)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    xbase = img.to(tl.int64) * sxn
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < CO
    cbase = (offs_c // MULT).to(tl.int64) * sxc
    wrow = offs_c.to(tl.int64) * stride_wn
    srow = (offs_c // BR).to(tl.int64) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    for tap in range(KH * KW):
        r = tap // KW
        s = tap % KW
        ih = ih0 + r * DH
        iw = iw0 + s * DW
        pm = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        xv = tl.load(x_ptr + (xbase + ih * sxh + iw * sxw)[:, None] + cbase[None, :],
                     mask=pm[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        # this tap's weight of every channel of the tile, decoded once for all pixels
        codes = _load_codes(w_ptr, wrow, tap, c_ok, BITS)
        scale = _decode_scale(_scale_bits(tl.load(s_ptr + srow + tap // B, mask=c_ok, other=0), SB), SCALE_KIND)
        if HAS_ZP:
            zp = tl.load(zp_ptr + srow + tap // B, mask=c_ok, other=0).to(tl.float32)
        else:
            zp = scale
        wv = _decode_elem(codes, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG,
                          HAS_ZP)
        acc += xv * tl.where(c_ok, wv, 0.0)[None, :]
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    optr = (out_ptr + (img.to(tl.int64) * son + oh * soh + ow * sow)[:, None]
            + offs_c.to(tl.int64)[None, :] * soc)
    tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & c_ok[None, :])
