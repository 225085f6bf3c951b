"""Triton kernels for the fused weight-only linear ``out = x @ dequant(W)^T`` (private).

Two kernels, each parametric over the format through ``tl.constexpr`` parameters
(never one copy per format):

* :func:`_linear_splitk_kernel` — the decode path (few tokens). Split-K over all SMs;
  the weight tile is the MMA's M side and the (zero-padded) tokens its N side, so the
  multiply-adds run on tensor cores while the CUDA cores only decode. Partial sums go
  to an fp32 workspace with atomics; the last program of each output tile (a counter
  per tile) applies global scale and bias, writes the output and zeroes the
  workspace and counter again for the next call.
* :func:`_linear_tc_kernel` — the prefill path: a tiled GEMM that dequantizes each
  weight tile once per K-strip into x's dtype and feeds ``tl.dot``; software
  pipelined, configs chosen per M bucket.

Weight layout read by both (built by :func:`microscale.linear.prepare`): codes in
*containers* of ``CB`` = 4 or 8 bits (4 for codes of <= 4 bits, else 8), packed
little-endian into int32 words ``[N, K*CB/32]``: container ``i`` of word ``w`` is
element ``w*(32/CB) + i``, bits ``[i*CB, i*CB + BITS)``. For 4- and 8-bit formats this
is the canonical QTensor byte layout viewed as int32 (no copy).

Element decode by bit placement (DESIGN.md): a minifloat code ``s|e|m`` becomes the
float32 ``(s << 31) | (e|m) << (23 - MBITS)`` times ``2^(127 - bias)`` (subnormals
come out right); integers go through the magic number ``0x4B000000 | u`` minus
``2^23 + offset``. E8M0 scales are the byte shifted into the exponent field; UE4M3
scales are placed like any minifloat. NaN/Inf codes are honoured only when the
weight holds some (``SPECIALS``, decided at repack time), which keeps the common
path free of selects.

The decode path's fast route for 4-bit containers (``PAIR=True``, bf16 activations,
scales exact in bf16) decodes two elements per 32-bit operation: shifting the word
by one amount places container ``j`` in the low half and container ``j + 4`` in the
high half of a bf16x2 pattern at once.
"""
from __future__ import annotations

import triton
import triton.language as tl


# ----------------------------------------------------------------------------------
# decode helpers (shared by both kernels)
# ----------------------------------------------------------------------------------
@triton.jit
def _decode_scale(raw, SCALE_KIND: tl.constexpr):
    """Raw scale (loaded tensor) -> float32. 0: a float dtype; 1: E8M0 byte; 2: E4M3 byte."""
    if SCALE_KIND == 1:
        b = raw.to(tl.int32)
        bits = tl.where(b == 0, 0x400000, tl.where(b == 255, 0x7FC00000, b << 23))
        s = bits.to(tl.float32, bitcast=True)
    elif SCALE_KIND == 2:
        b = raw.to(tl.int32)
        mag = b & 0x7F
        bits = ((b & 0x80) << 24) | (mag << 20)
        s = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
        s = tl.where(mag == 0x7F, float("nan"), s)
    else:
        s = raw.to(tl.float32)
    return s


@triton.jit
def _decode_elem(c, scale, zp, BITS: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr,
                 SIGNED: tl.constexpr, ELEM_C: tl.constexpr, SPECIALS: tl.constexpr,
                 INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr, HAS_ZP: tl.constexpr):
    """Container code ``c`` (int32, only the low BITS bits set) -> float32 value * scale."""
    if IS_FLOAT:
        mag = c & ((1 << (BITS - 1)) - 1)
        bits = ((c >> (BITS - 1)) << 31) | (mag << (23 - MBITS))
        v = bits.to(tl.float32, bitcast=True) * ELEM_C
        if SPECIALS:
            if INF_MAG >= 0:
                v = tl.where(mag == INF_MAG, float("inf") * tl.where(c >> (BITS - 1) != 0, -1.0, 1.0), v)
            if NAN_MAG >= 0:
                v = tl.where(mag >= NAN_MAG, float("nan"), v)
        v = v * scale
    else:
        if SIGNED:
            u = c ^ (1 << (BITS - 1))
            v = (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + (1 << (BITS - 1)))
        else:
            v = (c | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            if HAS_ZP:
                v = v - zp
        v = v * (scale * ELEM_C)
    return v


@triton.jit
def _pair_bits(words, J: tl.constexpr, IS_FLOAT: tl.constexpr, BITS: tl.constexpr, MBITS: tl.constexpr,
               SIGNED: tl.constexpr):
    """bf16x2 bit patterns of containers J (low half) and J+4 (high half) of 4-bit-container
    words: one shift places both. Floats: value * 2^(bias-127); ints: 128 + (u ^ signflip)."""
    if IS_FLOAT:
        SH_MAG: tl.constexpr = (7 - MBITS) - 4 * J
        SH_SGN: tl.constexpr = (16 - BITS) - 4 * J
        MAGM: tl.constexpr = ((1 << (BITS - 1)) - 1) << (7 - MBITS)
        if SH_MAG >= 0:
            a = words << SH_MAG
        else:
            a = (words >> (-SH_MAG))
        if SH_SGN >= 0:
            b = words << SH_SGN
        else:
            b = (words >> (-SH_SGN))
        p = (a & (MAGM | (MAGM << 16))) | (b & -2147450880)  # 0x80008000
    else:
        SFLIP: tl.constexpr = (1 << (BITS - 1)) if SIGNED else 0
        a = words >> (4 * J)
        p = ((a & 0x000F000F) ^ (SFLIP | (SFLIP << 16))) | 0x43004300
    return p


@triton.jit
def _mma(a, b, acc, INTERP: tl.constexpr):
    """acc += a @ b. The Triton interpreter mishandles dots of converted bf16 operands, so
    under it both go through float32 (a test-only route; values are the same)."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _bcast_words(v, BLOCK_N: tl.constexpr, NT: tl.constexpr):
    """[BLOCK_N, NT] per-layout-tile values -> [BLOCK_N, NT*8] per word."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], [BLOCK_N, NT, 8]), [BLOCK_N, NT * 8])


@triton.jit
def _split_pair(p):
    lo = p.to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi = (p >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


# ----------------------------------------------------------------------------------
# decode path: split-K, tokens on the MMA's N side
# ----------------------------------------------------------------------------------
@triton.jit
def _linear_splitk_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, K, KW, stride_xm, stride_om, stride_wn, stride_sn, stride_zn,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
    PAIR: tl.constexpr, INTERP: tl.constexpr, ITERS: tl.constexpr,
):
    """out^T tile [BLOCK_N, BLOCK_M] over a K range; see the module docstring for the layout.

    Per step: BLOCK_KW words per row = BLOCK_KW/8 layout tiles. For each slot pair j, the
    decoded (slot j, slot j + S/2) values of every word, interleaved, are the K-contiguous
    16-element chunks j of each layout tile: one tl.dot of [BLOCK_N, 2*BLOCK_KW] x
    [2*BLOCK_KW, BLOCK_M] per pair.
    """
    S: tl.constexpr = 32 // CB  # containers per word
    HS: tl.constexpr = S // 2  # slot pairs per word
    TK: tl.constexpr = 8 * S  # elements per layout tile (8 words)
    NT: tl.constexpr = BLOCK_KW // 8  # layout tiles per step
    SOFF: tl.constexpr = (1 << (BITS - 1)) if SIGNED else 0  # signed ints: offset of the biased code
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    # KW: int32 words per weight row (K padded to whole layout tiles)
    chunk = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * chunk
    kw_end = tl.minimum(kw_start + chunk, KW)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BLOCK_KW)
    n_ok = offs_n < N
    m_ok = offs_m < M
    srow = offs_n // GROUP_ROWS
    # x chunk offsets inside a step: [NT, 16] -> K offsets t*TK + q (+ j*16 per pair)
    xq = (tl.arange(0, NT) * TK)[:, None] + tl.arange(0, 16)[None, :]
    offs_t = tl.arange(0, NT)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for it in range(ITERS):  # constant trip count (host: cdiv(chunk, BLOCK_KW))
        kw0 = kw_start + it * BLOCK_KW
        kw = kw0 + offs_w
        kw_ok = kw < kw_end
        wmask = n_ok[:, None] & kw_ok[None, :]
        words = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :], mask=wmask, other=0)
        k_base = kw0 * S
        for j in tl.static_range(HS):
            # element index of slot j of word w: tile(w)*TK + j*16 + 2*(w%8); slot j+HS is +1
            # one scale per (row, layout tile) for this pair: load [BLOCK_N, NT], broadcast over 8 words
            gt = ((kw0 // 8 + offs_t) * TK + j * 16) // GROUP
            tmask = n_ok[:, None] & (kw0 + offs_t * 8 < kw_end)[None, :]
            s_raw = tl.load(s_ptr + srow[:, None] * stride_sn + gt[None, :], mask=tmask, other=0)
            scale = _bcast_words(_decode_scale(s_raw, SCALE_KIND), BLOCK_N, NT)
            if HAS_ZP:
                zp = tl.load(zp_ptr + offs_n[:, None] * stride_zn + gt[None, :], mask=tmask, other=0)
                zp = _bcast_words(zp.to(tl.float32), BLOCK_N, NT)
            else:
                zp = scale
            if PAIR:
                p = _pair_bits(words, j, IS_FLOAT, BITS, MBITS, SIGNED)
                if INTERP:  # the interpreter has no bf16 arithmetic: same values through fp32
                    lo = (p << 16).to(tl.float32, bitcast=True)
                    hi = (p & -65536).to(tl.float32, bitcast=True)
                    if IS_FLOAT:
                        lo = lo * ELEM_C * scale
                        hi = hi * ELEM_C * scale
                    else:
                        if HAS_ZP:
                            off = zp + 128.0
                        else:
                            off = zp * 0 + (128.0 + SOFF)
                        lo = (lo - off) * (scale * ELEM_C)
                        hi = (hi - off) * (scale * ELEM_C)
                elif IS_FLOAT:
                    lo, hi = _split_pair(p)
                    cb = tl.full([1, 1], ELEM_C, tl.float32).to(tl.bfloat16)
                    sb = scale.to(tl.bfloat16)
                    lo = (lo * cb) * sb
                    hi = (hi * cb) * sb
                else:
                    lo, hi = _split_pair(p)
                    if HAS_ZP:
                        off = (zp + 128.0).to(tl.bfloat16)
                    else:
                        off = tl.full([1, 1], 128.0 + SOFF, tl.float32).to(tl.bfloat16)
                    esb = (scale * ELEM_C).to(tl.bfloat16)
                    lo = (lo - off) * esb
                    hi = (hi - off) * esb
            else:
                c_lo = (words >> (j * CB)) & ((1 << BITS) - 1)
                c_hi = (words >> ((j + HS) * CB)) & ((1 << BITS) - 1)
                lo = _decode_elem(c_lo, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG,
                                  NAN_MAG, HAS_ZP)
                hi = _decode_elem(c_hi, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG,
                                  NAN_MAG, HAS_ZP)
            a = tl.reshape(tl.join(lo.to(x_ptr.dtype.element_ty), hi.to(x_ptr.dtype.element_ty)),
                           [BLOCK_N, 2 * BLOCK_KW])
            xk = k_base + j * 16 + xq  # [NT, 16]
            xk_ok = (xk < K) & (xk < kw_end * S)
            xt = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + xk[None, :, :],
                         mask=m_ok[:, None, None] & xk_ok[None, :, :], other=0.0)
            xt = tl.trans(tl.reshape(xt, [BLOCK_M, 2 * BLOCK_KW]))
            acc = _mma(a, xt, acc, INTERP)

    out_mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K == 1:
        _epilogue(acc, offs_n, offs_m, n_ok, out_mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS, HAS_BIAS)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        loc = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        wsp = ws_ptr + tile * (BLOCK_N * BLOCK_M) + loc
        tl.atomic_add(wsp, acc, mask=out_mask, sem="relaxed")
        tl.debug_barrier()
        count = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if count == SPLIT_K - 1:
            tot = tl.load(wsp, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(wsp, tl.zeros_like(acc), mask=out_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)
            _epilogue(tot, offs_n, offs_m, n_ok, out_mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS, HAS_BIAS)


@triton.jit
def _epilogue(acc, offs_n, offs_m, n_ok, mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS: tl.constexpr,
              HAS_BIAS: tl.constexpr):
    """acc [BLOCK_N, BLOCK_M] (out transposed) -> out[m, n] = acc * gs + bias."""
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------
# prefill path: tiled GEMM, weight tile dequantized once per K-strip
# ----------------------------------------------------------------------------------
@triton.jit
def _linear_tc_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_wn, stride_sn, stride_zn,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERP: tl.constexpr, ITERS: tl.constexpr,
):
    S: tl.constexpr = 32 // CB
    TK: tl.constexpr = 8 * S
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsize
    pid_n = (pid % width) // gsize

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    srow = offs_n // GROUP_ROWS
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(ITERS):  # constant trip count: cdiv(K, BLOCK_K)
        k0 = it * BLOCK_K
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                    other=0.0)
        # natural k -> (layout tile t, pair j, word w, half h) -> word t*8+w, slot j + h*S/2
        r = kk % TK
        word = (kk // TK) * 8 + (r % 16) // 2
        shift = ((r // 16) + (r % 2) * (S // 2)) * CB
        wmask = n_ok[:, None] & (kk < K)[None, :]
        words = tl.load(w_ptr + offs_n[:, None] * stride_wn + word[None, :], mask=wmask, other=0)
        c = (words >> shift[None, :]) & ((1 << BITS) - 1)
        g = kk // GROUP
        s_raw = tl.load(s_ptr + srow[:, None] * stride_sn + g[None, :], mask=wmask, other=0)
        scale = _decode_scale(s_raw, SCALE_KIND)
        if HAS_ZP:
            zp = tl.load(zp_ptr + offs_n[:, None] * stride_zn + g[None, :], mask=wmask, other=0).to(tl.float32)
        else:
            zp = scale
        w = _decode_elem(c, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, HAS_ZP)
        acc = _mma(x, tl.trans(w.to(x_ptr.dtype.element_ty)), acc, INTERP)

    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])
