"""Triton kernel for the fused weight-only linear ``out = x @ dequant(W)^T`` (private).

One kernel, :func:`_linear_splitk_kernel`, parametric over the format through
``tl.constexpr`` parameters (never one copy per format), serves both paths with
different configs (``microscale.linear.backends.splitk.choose_config``):

* decode (few tokens): the weight tile is the MMA's M side and the tokens, zero-padded
  to 16, its N side, so the multiply-adds run on tensor cores while the CUDA cores only
  decode; K is split across programs so all SMs stream the weight. Each split stores
  its fp32 partial tile in its own workspace slot; the last program of each output tile
  (a counter per tile) sums them in split order (deterministic), applies global scale
  and bias, writes the output and zeroes the counter again for the next call.
* prefill: the same structure with 128 or 256 tokens per tile and no split, so each
  weight tile is decoded once per K-strip for all of them; loads software-pipelined
  (``num_stages``).

Weight layout (built by :func:`microscale.linear.packed.prepare`): codes in *containers* of
``CB`` = 4 or 8 bits (4 for codes of <= 4 bits, else 8), ``S = 32/CB`` per int32 word,
rows ``[N, KP*CB/32]`` with K zero-padded to ``KP`` (a multiple of 256). Layout tiles of
8 words (``TK = 8*S`` elements): element ``j*16 + 2*w + h`` of a tile sits in word
``w``, slot ``j + h*S/2`` (bits ``[slot*CB, slot*CB + BITS)``). So one shift of a word
puts the K-adjacent pair ``(2w, 2w+1)`` of chunk ``j`` in the two halves of a bf16x2,
and chunk ``j`` of every tile is 16 contiguous activations. Scales and zero points are
rows of raw bytes padded to whole int32 words and read as words.

Element decode by bit placement (DESIGN.md): a minifloat code ``s|e|m`` becomes the
float32 ``(s << 31) | (e|m) << (23 - MBITS)`` times ``2^(127 - bias)`` (subnormals
come out right); integers go through the magic number ``0x4B000000 | u`` minus
``2^23 + offset``. E8M0 scales are the byte shifted into the exponent field; UE4M3
scales are placed like any minifloat. NaN/Inf codes are honoured only when the
weight holds some (``SPECIALS``, decided at repack time), which keeps the common
path free of selects. ``PAIR=True`` (4-bit containers, bf16 activations) decodes two
elements per 32-bit operation straight into bf16x2 and scales them with bf16x2
multiplies.

Measured on the H200 (docs/decisions/linear-gemv.md): correct, but far from the
bandwidth ceiling; the SASS (cuobjdump of a Triton 3.6 sm_90 build) shows about 8
instructions per weight element in the decode loop (pair decode + two HMUL2 + mask and
layout work) where the budget at full HBM bandwidth is about 2.5, and the activations
reach shared memory through 2-byte stores.
"""
from __future__ import annotations

import triton
import triton.language as tl


# ----------------------------------------------------------------------------------
# decode helpers (shared by both kernels)
# ----------------------------------------------------------------------------------
@triton.jit
def _load_entries(ptr, rows, stride_rw, gidx, mask, SB: tl.constexpr):
    """Entries ``gidx`` [NT] of each row of a byte array (rows padded to whole int32 words,
    viewed as int32): the raw bits, SB bytes each, in the low bits of an int32 [rows, NT].
    Whole-word loads keep them eligible for async copies and vector loads."""
    byte = gidx * SB
    w = tl.load(ptr + rows[:, None] * stride_rw + (byte // 4)[None, :], mask=mask, other=0)
    if SB < 4:
        w = (w >> ((byte % 4) * 8)[None, :]) & ((1 << (SB * 8)) - 1)
    return w


@triton.jit
def _decode_scale(raw, SCALE_KIND: tl.constexpr):
    """Raw scale bits (int32) -> float32. 1: E8M0; 2: E4M3 (UE4M3); 3: fp16; 4: bf16; 5: fp32."""
    if SCALE_KIND == 1:
        b = raw
        bits = tl.where(b == 0, 0x400000, tl.where(b == 255, 0x7FC00000, b << 23))
        s = bits.to(tl.float32, bitcast=True)
    elif SCALE_KIND == 2:
        b = raw
        mag = b & 0x7F
        bits = ((b & 0x80) << 24) | (mag << 20)
        s = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
        s = tl.where(mag == 0x7F, float("nan"), s)
    elif SCALE_KIND == 3:
        s = raw.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    elif SCALE_KIND == 4:
        s = (raw << 16).to(tl.float32, bitcast=True)
    else:
        s = raw.to(tl.float32, bitcast=True)
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
               SIGNED: tl.constexpr, CB: tl.constexpr = 4):
    """bf16x2 bit patterns of containers J (low half) and J + 16/CB (high half) of words of
    CB-bit containers (4: nibbles, 8: bytes): one shift places both. Floats: value *
    2^(bias-127); ints (4-bit containers): 128 + (u ^ signflip)."""
    if IS_FLOAT:
        SH_MAG: tl.constexpr = (7 - MBITS) - CB * J
        SH_SGN: tl.constexpr = (16 - BITS) - CB * J
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
def _decode_slot_pair(words, J: tl.constexpr, scale, zp, BITS: tl.constexpr, CB: tl.constexpr,
                      IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr, ELEM_C: tl.constexpr,
                      SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr, HAS_ZP: tl.constexpr,
                      PAIR: tl.constexpr, INTERP: tl.constexpr):
    """Slots ``J`` and ``J + S/2`` of the packed words (the K-adjacent pairs of chunk ``J`` of
    each layout tile) -> (lo, hi) scaled values, ``scale`` / ``zp`` broadcast per word.
    ``PAIR``: two elements per 32-bit operation into bf16x2 (4-bit containers, bf16
    activations; bf16 results); else the per-element decode (float32 results)."""
    HS: tl.constexpr = 16 // CB  # slot pairs per word
    SOFF: tl.constexpr = (1 << (BITS - 1)) if SIGNED else 0  # signed ints: offset of the biased code
    if PAIR:
        p = _pair_bits(words, J, IS_FLOAT, BITS, MBITS, SIGNED)
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
        c_lo = (words >> (J * CB)) & ((1 << BITS) - 1)
        c_hi = (words >> ((J + HS) * CB)) & ((1 << BITS) - 1)
        lo = _decode_elem(c_lo, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG,
                          NAN_MAG, HAS_ZP)
        hi = _decode_elem(c_hi, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG,
                          NAN_MAG, HAS_ZP)
    return lo, hi


@triton.jit
def _mma(a, b, acc, INTERP: tl.constexpr):
    """acc += a @ b. The Triton interpreter mishandles dots of converted bf16 operands, so
    under it both go through float32 (a test-only route; values are the same)."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of program ``pid`` in groups of GROUP_M row tiles, so that neighbouring programs
    share each column tile (the weight's) while it is in L2."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows_here, (pid % per_group) // rows_here


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
    PAIR: tl.constexpr, INTERP: tl.constexpr, ITERS: tl.constexpr, SB: tl.constexpr, EVEN_K: tl.constexpr,
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
        step_ok = kw0 < kw_end  # steps are whole: KW and chunk are multiples of BLOCK_KW
        kw = kw0 + offs_w
        wmask = n_ok[:, None] & step_ok
        words = tl.load(w_ptr + offs_n[:, None] * stride_wn + kw[None, :], mask=wmask, other=0)
        k_base = kw0 * S
        for j in tl.static_range(HS):
            # one scale per (row, layout tile) for this pair: [BLOCK_N, NT], broadcast over 8 words
            gt = ((kw0 // 8 + offs_t) * TK + j * 16) // GROUP
            tmask = n_ok[:, None] & step_ok
            s_raw = _load_entries(s_ptr, srow, stride_sn, gt, tmask, SB)
            scale = _bcast_words(_decode_scale(s_raw, SCALE_KIND), BLOCK_N, NT)
            if HAS_ZP:
                zp = _load_entries(zp_ptr, offs_n, stride_zn, gt, tmask, 1)
                zp = _bcast_words(zp.to(tl.float32), BLOCK_N, NT)
            else:
                zp = scale
            lo, hi = _decode_slot_pair(words, j, scale, zp, BITS, CB, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS,
                                       INF_MAG, NAN_MAG, HAS_ZP, PAIR, INTERP)
            a = tl.reshape(tl.join(lo.to(x_ptr.dtype.element_ty), hi.to(x_ptr.dtype.element_ty)),
                           [BLOCK_N, 2 * BLOCK_KW])
            xk = k_base + j * 16 + xq  # [NT, 16]
            if EVEN_K:
                xmask = m_ok[:, None, None] & step_ok
            else:
                xmask = m_ok[:, None, None] & step_ok & (xk < K)[None, :, :]
            xt = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + xk[None, :, :], mask=xmask, other=0.0)
            xt = tl.trans(tl.reshape(xt, [BLOCK_M, 2 * BLOCK_KW]))
            acc = _mma(a, xt, acc, INTERP)

    out_mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K > 1:  # each split's partial in its own workspace slot, one [BLOCK_N, BLOCK_M] tile each
        tiles = tl.num_programs(0) * tl.num_programs(2)
        tile = pid_m * tl.num_programs(0) + pid_n
        loc = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        acc, last = _split_sum(acc, ws_ptr + tile * (BLOCK_N * BLOCK_M) + loc, (BLOCK_N * BLOCK_M) * tiles,
                               pid_k, out_mask, cnt_ptr + tile, SPLIT_K)
        out_mask = out_mask & last
    _epilogue(acc, offs_n, offs_m, n_ok, out_mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS, HAS_BIAS)


@triton.jit
def _split_sum(acc, wsp, slot, pid_k, mask, cnt_ptr, SPLIT_K: tl.constexpr):
    """Split-K without floating-point atomics: store this split's partial ``acc`` at
    ``wsp + pid_k * slot``; the last split of the tile to arrive (counter ``cnt_ptr``,
    zero on entry and reset to zero) sums all partials in split order. Returns (the sum,
    whether this program is that last one); the others get zeros and must not write."""
    tl.store(wsp + pid_k * slot, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is stored before the release below
    last = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    tot = tl.zeros_like(acc)
    for s in tl.static_range(SPLIT_K):
        tot += tl.load(wsp + s * slot, mask=mask & last, other=0.0, cache_modifier=".cg")
    tl.store(cnt_ptr, 0, mask=last)  # ready for the next call
    return tot, last


@triton.jit
def _epilogue(acc, offs_n, offs_m, n_ok, mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS: tl.constexpr,
              HAS_BIAS: tl.constexpr, N_ROWS: tl.constexpr = True):
    """out[m, n] = acc * gs + bias in out's dtype; ``acc`` [BLOCK_N, BLOCK_M] (out
    transposed) when ``N_ROWS``, else [BLOCK_M, BLOCK_N]; ``mask`` shaped like acc."""
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if N_ROWS:
        if HAS_BIAS:
            acc = acc + tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    else:
        if HAS_BIAS:
            acc = acc + tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)




# ----------------------------------------------------------------------------------
# prefill path on the canonical layout: tokens on the MMA's M side
# ----------------------------------------------------------------------------------
@triton.jit
def _linear_prefill_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr,
    M, N, stride_xm, stride_wn, stride_sn, stride_zn, stride_om, K: tl.constexpr,
    BITS: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GS: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, INTERP: tl.constexpr, SWAP: tl.constexpr = False, PAIR: tl.constexpr = False,
    SB: tl.constexpr = 1, WIDE_S: tl.constexpr = False, WIDE_Z: tl.constexpr = False,
    SPLIT_K: tl.constexpr = 1, ws_ptr=None, cnt_ptr=None,
):
    """out[BLOCK_M, BLOCK_N] tile = x @ dequant(W)^T for many tokens, reading the QTensor's
    own layout (codes of 4 bits: two per byte, element ``2i`` in the low nibble; 8 bits:
    one per byte; scales / zero points ``[N, K / GROUP]``). Per K step the x tile is a
    plain (pipelined) load and the weight tile ``[BLOCK_N, BLOCK_K]`` is decoded once in
    registers, scaled, cast to x's dtype and fed to ``tl.dot`` for all BLOCK_M tokens.
    K must be a multiple of BLOCK_K (host check); M and N are masked. Programs are
    ordered in groups of GROUP_M row tiles so neighbours share weight tiles in L2.

    ``WIDE_S`` / ``WIDE_Z``: the scales (``SB`` bytes each) / zero points of one K step
    fill whole int32 words of a row, and ``s_ptr`` / ``zp_ptr`` are int32 views (strides
    in words): they are loaded as words, wide enough for the asynchronous copies of the
    software pipeline (a 1-2 byte load per thread is not, and then stalls every K step).
    ``SPLIT_K`` > 1: program axis 1 takes one of SPLIT_K equal K ranges and stores its
    fp32 partial tile to ``ws_ptr`` [SPLIT_K, M, N]; the last of them to finish (a counter
    per output tile in ``cnt_ptr``, zero on entry and reset to zero) sums the partials in
    split order (deterministic) and writes the output."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    NG: tl.constexpr = BLOCK_K // GROUP if BLOCK_K >= GROUP else 1
    # the UE4M3 scale times 2^119 stays a bf16 (448 * 2^119 < 2^128), and an element times it is
    # at least 2^-19 for E2M1 / E4M3 / E5M2 codes: normal, so the single bf16 product is exact
    UE4M3_FOLD: tl.constexpr = 6.64613997892457936e35  # 2^119
    if SWAP:  # out^T tile: the decoded weights are the MMA's A operand (registers)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    KS: tl.constexpr = K // SPLIT_K
    for kk in range(0, KS, BLOCK_K):
        k0 = pid_k * KS + kk
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        if PAIR and BITS == 8:  # minifloat bytes -> bf16x2 pairs (j, j+2) by bit placement -> K order
            w32 = w_ptr.to(tl.pointer_type(tl.int32))
            words = tl.load(w32 + offs_n[:, None] * (stride_wn // 4) + (k0 // 4 + tl.arange(0, BLOCK_K // 4))[None, :],
                            mask=n_ok[:, None], other=0)
            p0 = _pair_bits(words, 0, True, BITS, MBITS, SIGNED, 8)
            p1 = _pair_bits(words, 1, True, BITS, MBITS, SIGNED, 8)
            q01 = (p0 & 0xFFFF) | (p1 << 16)
            q23 = ((p0 >> 16) & 0xFFFF) | (p1 & -65536)
            qq = tl.reshape(tl.join(q01, q23), [BLOCK_N, BLOCK_K // 2])
            c = tl.reshape(tl.join(qq & 0xFFFF, (qq >> 16) & 0xFFFF), [BLOCK_N, BLOCK_K])  # bf16 bits, K order
        elif PAIR:  # E2M1 words -> bf16x2 pairs (j, j+4) by bit placement -> pairs in K order
            w32 = w_ptr.to(tl.pointer_type(tl.int32))
            words = tl.load(w32 + offs_n[:, None] * (stride_wn // 4) + (k0 // 8 + tl.arange(0, BLOCK_K // 8))[None, :],
                            mask=n_ok[:, None], other=0)
            p0 = _pair_bits(words, 0, True, BITS, MBITS, SIGNED)
            p1 = _pair_bits(words, 1, True, BITS, MBITS, SIGNED)
            p2 = _pair_bits(words, 2, True, BITS, MBITS, SIGNED)
            p3 = _pair_bits(words, 3, True, BITS, MBITS, SIGNED)
            q01 = (p0 & 0xFFFF) | (p1 << 16)
            q23 = (p2 & 0xFFFF) | (p3 << 16)
            q45 = ((p0 >> 16) & 0xFFFF) | (p1 & -65536)
            q67 = ((p2 >> 16) & 0xFFFF) | (p3 & -65536)
            qq = tl.reshape(tl.join(tl.join(q01, q45), tl.join(q23, q67)), [BLOCK_N, BLOCK_K // 2])
            c = tl.reshape(tl.join(qq & 0xFFFF, (qq >> 16) & 0xFFFF), [BLOCK_N, BLOCK_K])  # bf16 bits, K order
        elif BITS == 4:
            b = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 2 + tl.arange(0, BLOCK_K // 2))[None, :],
                        mask=n_ok[:, None], other=0).to(tl.int32)
            c = tl.reshape(tl.join(b & 0xF, (b >> 4) & 0xF), [BLOCK_N, BLOCK_K])  # natural K order
        else:
            c = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 + offs_k)[None, :],
                        mask=n_ok[:, None], other=0).to(tl.int32) & 0xFF
        gk = k0 // GROUP + tl.arange(0, NG)
        if WIDE_S:  # raw bits in the low SB bytes of an int32
            s_raw = _row_entries(s_ptr, offs_n, stride_sn, k0 // GROUP, n_ok, NG, SB)
        else:
            s_raw = tl.load(s_ptr + offs_n[:, None] * stride_sn + gk[None, :], mask=n_ok[:, None], other=0)
            if SCALE_KIND == 3 or SCALE_KIND == 4:
                s_raw = s_raw.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            elif SCALE_KIND == 5:
                s_raw = s_raw.to(tl.int32, bitcast=True)
            else:
                s_raw = s_raw.to(tl.int32) & 0xFF
        scale = _decode_scale(s_raw, SCALE_KIND)
        if not IS_FLOAT:  # integers: the element constant (<= 1) folded in per block
            scale = scale * ELEM_C
        if PAIR and SCALE_KIND == 2:
            scale = scale * UE4M3_FOLD
        if PAIR and not INTERP:  # bf16 once per scale, before the broadcast (exact: E8M0 / UE4M3)
            scale = scale.to(tl.bfloat16)
        if BLOCK_K > GROUP:  # one scale per GROUP elements along K
            scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BLOCK_N, NG, GROUP]), [BLOCK_N, BLOCK_K])
        else:
            scale = tl.broadcast_to(scale, [BLOCK_N, BLOCK_K])
        if HAS_ZP:
            if WIDE_Z:
                zp = _row_entries(zp_ptr, offs_n, stride_zn, k0 // GROUP, n_ok, NG, 1)
            else:
                zp = tl.load(zp_ptr + offs_n[:, None] * stride_zn + gk[None, :], mask=n_ok[:, None], other=0)
            zp = zp.to(tl.float32)
            if BLOCK_K > GROUP:
                zp = tl.reshape(tl.broadcast_to(zp[:, :, None], [BLOCK_N, NG, GROUP]), [BLOCK_N, BLOCK_K])
            else:
                zp = tl.broadcast_to(zp, [BLOCK_N, BLOCK_K])
        else:
            zp = scale
        if PAIR and SCALE_KIND == 2:  # UE4M3 scales (<= 448): 2^119 of the element constant folded into
            # them (exact in bf16), the rest (ELEM_C / 2^119) applied to the accumulator: one multiply
            if INTERP:  # the interpreter has no bf16 arithmetic: the same values through float32
                w = (c << 16).to(tl.float32, bitcast=True) * scale
            else:
                w = c.to(tl.int16).to(tl.bfloat16, bitcast=True) * scale
        elif PAIR:  # value * 2^(bias-127) in bf16: two exact bf16 multiplies (element constant, scale)
            if INTERP:
                w = (c << 16).to(tl.float32, bitcast=True) * ELEM_C * scale
            else:
                v = c.to(tl.int16).to(tl.bfloat16, bitcast=True)
                w = (v * tl.full([1, 1], ELEM_C, tl.float32).to(tl.bfloat16)) * scale
        else:
            w = _decode_elem(c, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C if IS_FLOAT else 1.0, SPECIALS,
                             INF_MAG, NAN_MAG, HAS_ZP)
        if SWAP:
            acc = _mma(w.to(x_ptr.dtype.element_ty), tl.trans(x), acc, INTERP)
        else:
            acc = _mma(x, tl.trans(w.to(x_ptr.dtype.element_ty)), acc, INTERP)
    if SWAP:
        acc = tl.trans(acc)
    if PAIR and SCALE_KIND == 2:
        acc = acc * (ELEM_C / UE4M3_FOLD)  # a power of two
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:  # partials as [SPLIT_K, M, N]
        part = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        acc, last = _split_sum(acc, ws_ptr + part, M.to(tl.int64) * N, pid_k, mask, cnt_ptr + pid, SPLIT_K)
        mask = mask & last
    _epilogue(acc, offs_n, offs_m, n_ok, mask, gs_ptr, b_ptr, out_ptr, stride_om, HAS_GS, HAS_BIAS, False)


@triton.jit
def _row_entries(ptr, rows, stride_rw, first, row_ok, NG: tl.constexpr, SB: tl.constexpr):
    """Entries ``first .. first + NG`` of each row of an array of SB-byte entries (int32
    view, ``stride_rw`` words per row): raw bits in the low bytes of an int32 [rows, NG],
    read as NG * SB / 4 whole words per row (or, when they fill less than a word, the
    word holding each entry)."""
    if (NG * SB) % 4 != 0:
        w = _load_entries(ptr, rows, stride_rw, first + tl.arange(0, NG), row_ok[:, None], SB)
    else:
        NW: tl.constexpr = NG * SB // 4
        w = tl.load(ptr + rows[:, None] * stride_rw + (first * SB // 4 + tl.arange(0, NW))[None, :],
                    mask=row_ok[:, None], other=0)
        if SB <= 2:  # halves, little-endian: entry order
            w = tl.reshape(tl.join(w & 0xFFFF, (w >> 16) & 0xFFFF), [w.shape[0], 2 * NW])
        if SB == 1:
            w = tl.reshape(tl.join(w & 0xFF, (w >> 8) & 0xFF), [w.shape[0], 4 * NW])
    return w
