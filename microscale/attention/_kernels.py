"""Triton kernels for attention over block-scaled KV pages (private; imports Triton).

:func:`_paged_attn_kernel` serves decode and causal prefill/extend: a program owns one KV
head of one sequence, a tile of ``BLOCK_M`` query tokens times the ``G`` query heads of that
KV head (GQA: the pages are read once per KV head), and one split of the keys that tile can
see (flash decoding: splits keep every SM busy at batch 1). The splits partition the visible
range only: with a sliding window they start at the window's first key, and a program whose
split holds no visible key runs no loop step.

Per step of ``BLOCK_N`` keys: one page-table read per key row, the codes of each row as
contiguous int32 words (16-byte loads), the block scales once per block. Codes become bf16
operands word by word (:func:`_kv_tile`, ``MODE``):

* ``MODE`` 1 (one scale per token and head, minifloat codes): each word's codes are placed as
  bf16 pairs (the linear op's ``_pair_bits``) and multiplied by ``2^(127 - bias)`` with one
  exact ``mul.rn.bf16x2``: the operand is the element's value. The token's scale multiplies
  its logit column (K) and its probability column (V) in float32.
* ``MODE`` 2 (UE4M3 block scales): pairs times the block scale times ``2^119`` in one exact
  ``mul.rn.bf16x2`` (as the linear prefill does); the rest of the element constant goes to
  the float32 logit / output factors.
* ``MODE`` 3 (E8M0 or bf16 block scales): pairs times ``2^(127 - bias)``, then times the block
  scale: two exact bf16x2 multiplies.
* ``MODE`` 0 (integers, zero points, fp16 / fp32 block scales): each code decoded in float32
  with the linear op's ``_decode_elem`` and rounded to bf16 once.

The pairs of a word hold elements ``(j, j + S/2)``, so the tile's columns are head_dim in a
fixed permutation; q is loaded and the output stored through the same permutation
(:func:`_assemble` of the indices). QK^T and PV run on tensor cores (bf16 operands, fp32
sums), the global scale and the residual powers of two are applied to the logits and the
output in float32, and the online softmax stays in fp32 (base 2). Each split writes its
partial output and log-sum-exp; :func:`_combine_kernel` merges the splits and the sink.

Non-finite codes: the pair modes do not test codes for NaN/Inf. A block that holds a NaN
code holds a NaN scale (the cache's quantize takes the scale from the block's amax), which
the scale decode honours: the block decodes to NaN as in the reference.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..linear._kernels._linear_kernels import _decode_elem, _decode_scale, _pair_bits, _split_pair

LOG2E = 1.4426950408889634


@triton.jit
def _pdl_start(PDL: tl.constexpr, EARLY: tl.constexpr):
    """Launched as a programmatic dependent (Hopper+): wait for the previous kernel's results before any
    read (every read and write stays after the wait, so stream order holds), and let the next kernel
    launch: ``EARLY`` before the wait (the attention kernel: its combine launches at once and waits for
    the splits), else after it (the combine: the next op's programs do not sit beside a running
    attention kernel). Back-to-back launches stop paying their launch and ramp."""
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()


@triton.jit
def _bmul2(p, m, INTERP: tl.constexpr):
    """bf16x2 products of packed pairs ``p`` and ``m`` (int32 bit patterns), rounded to
    nearest even. The interpreter has no bf16 arithmetic: the same values through float32."""
    if INTERP:
        lo = (p << 16).to(tl.float32, bitcast=True) * (m << 16).to(tl.float32, bitcast=True)
        hi = (p & -65536).to(tl.float32, bitcast=True) * (m & -65536).to(tl.float32, bitcast=True)
        lb = lo.to(tl.int32, bitcast=True)
        hb = hi.to(tl.int32, bitcast=True)
        lb = (lb + 0x7FFF + ((lb >> 16) & 1)) >> 16
        hb = (hb + 0x7FFF + ((hb >> 16) & 1)) >> 16
        return (lb & 0xFFFF) | (hb << 16)
    else:
        return tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [p, m], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def _halves(p, INTERP: tl.constexpr):
    """The two bf16 of packed pairs: bf16 tensors (the interpreter: their values in float32)."""
    if INTERP:
        return (p << 16).to(tl.float32, bitcast=True), (p & -65536).to(tl.float32, bitcast=True)
    else:
        return _split_pair(p)


@triton.jit
def _round_bf16(x, INTERP: tl.constexpr):
    """float32 -> bf16, nearest even (the interpreter, whose bf16 is broken: bf16 values in float32)."""
    if INTERP:
        b = x.to(tl.int32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _dot(a, b, INTERP: tl.constexpr):
    """fp32 ``a @ b`` of bf16 operands on tensor cores (the interpreter: bf16 values in fp32)."""
    if INTERP:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _assemble(x, HS: tl.constexpr):
    """``2 * HS`` tensors ``[N, W]`` (the halves of pairs ``0 .. HS-1``, low then high) -> one
    ``[N, W * 2 * HS]``. The halves of a pair end up adjacent (the last join), so a pair's
    register is an MMA operand register as it is. Applied to indices it gives the permutation."""
    if HS == 4:
        lo = tl.join(tl.join(x[0], x[4]), tl.join(x[2], x[6]))
        hi = tl.join(tl.join(x[1], x[5]), tl.join(x[3], x[7]))
    else:
        lo = tl.join(x[0], x[2])
        hi = tl.join(x[1], x[3])
    t = tl.join(lo, hi)
    return tl.reshape(t, [x[0].shape[0], x[0].shape[1] * 2 * HS])


@triton.jit
def _per_word(x, WPB: tl.constexpr):
    """[N, NB] per scale block -> [N, NB * WPB] per code word."""
    return tl.reshape(tl.broadcast_to(x[:, :, None], [x.shape[0], x.shape[1], WPB]), [x.shape[0], x.shape[1] * WPB])


@triton.jit
def _kv_tile(c_ptr, s_ptr, z_ptr, rowid, ok, BLOCK_N: tl.constexpr, DW: tl.constexpr, NB: tl.constexpr,
             SB: tl.constexpr, MODE: tl.constexpr, INTERP: tl.constexpr, BITS: tl.constexpr, CB: tl.constexpr,
             IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr, ELEM_C: tl.constexpr,
             SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr, SCALE_KIND: tl.constexpr,
             HAS_ZP: tl.constexpr, CPAIR: tl.constexpr):
    """The bf16 operand ``[BLOCK_N, DW * 32 / BITS]`` (head_dim permuted, see :func:`_assemble`)
    of page rows ``rowid`` (int64: slot * heads + head), and (MODE 1) their float32 token scales."""
    S: tl.constexpr = 32 // CB  # codes per word
    HS: tl.constexpr = S // 2
    WPB: tl.constexpr = DW // NB  # words per scale block
    words = tl.load(c_ptr + rowid[:, None] * DW + tl.arange(0, DW)[None, :], mask=ok[:, None], other=0)
    if MODE == 1:
        raw = tl.load(s_ptr + rowid, mask=ok, other=0).to(tl.int32)
    else:
        raw = tl.load(s_ptr + rowid[:, None] * NB + tl.arange(0, NB)[None, :], mask=ok[:, None], other=0)
        raw = raw.to(tl.int32)
    if SB < 4:
        raw = raw & ((1 << (SB * 8)) - 1)
    scale = _decode_scale(raw, SCALE_KIND)  # once per block (MODE 1: per row)
    parts = ()
    if MODE == 0:
        sw = _per_word(scale, WPB)
        if HAS_ZP:
            zp = tl.load(z_ptr + rowid[:, None] * NB + tl.arange(0, NB)[None, :], mask=ok[:, None], other=0)
            zw = _per_word(zp.to(tl.float32), WPB)
        else:
            zw = sw
        for j in tl.static_range(HS):
            for h in tl.static_range(2):
                c = (words >> (CB * (j + h * HS))) & ((1 << BITS) - 1)
                v = _decode_elem(c, sw, zw, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG,
                                 HAS_ZP)
                parts = parts + (_round_bf16(v, INTERP),)
    else:
        cpair = tl.full([BLOCK_N, DW], CPAIR, tl.int32)
        if MODE == 2:
            # UE4M3 * 2^119 stays a bf16 (448 * 2^119 < 2^128), and an E2M1 / E4M3 / E5M2 code placed in a
            # bf16 times it is at least 2^-19: normal, so the one bf16 product is exact
            sb = ((scale * 6.64613997892457936e35).to(tl.int32, bitcast=True) >> 16) & 0xFFFF
            mult = _per_word(sb | (sb << 16), WPB)
        elif MODE == 3:
            sb = (scale.to(tl.int32, bitcast=True) >> 16) & 0xFFFF  # E8M0: a power of two (or NaN), exact
            mult = _per_word(sb | (sb << 16), WPB)
        for j in tl.static_range(HS):
            p = _pair_bits(words, j, True, BITS, MBITS, SIGNED, CB)
            if MODE == 1:
                p = _bmul2(p, cpair, INTERP)
            elif MODE == 2:
                p = _bmul2(p, mult, INTERP)
            else:
                p = _bmul2(_bmul2(p, cpair, INTERP), mult, INTERP)
            lo, hi = _halves(p, INTERP)
            parts = parts + (lo, hi)
    return _assemble(parts, HS), scale


@triton.jit
def _step(k0, end, q, qpos, kf, softcap, window, m_i, l_i, acc, pt_row, hk, HKV, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr,
          vz_ptr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DW: tl.constexpr, NB: tl.constexpr, SB: tl.constexpr,
          MODE: tl.constexpr, INTERP: tl.constexpr, BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr,
          MBITS: tl.constexpr, SIGNED: tl.constexpr, ELEM_C: tl.constexpr, SPECIALS: tl.constexpr,
          INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr, SCALE_KIND: tl.constexpr, HAS_ZP: tl.constexpr,
          CPAIR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """One loop step: keys ``k0 .. k0 + BLOCK_N`` (those below ``end``) into the online softmax."""
    kpos = k0 + tl.arange(0, BLOCK_N)
    kok = kpos < end
    page = tl.load(pt_row + kpos // PAGE, mask=kok, other=0)
    rowid = ((page * PAGE + kpos % PAGE) * HKV + hk).to(tl.int64)
    k, ksc = _kv_tile(kc_ptr, ks_ptr, kz_ptr, rowid, kok, BLOCK_N, DW, NB, SB, MODE, INTERP, BITS, CB, IS_FLOAT,
                      MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, HAS_ZP, CPAIR)
    s = tl.trans(_dot(k, tl.trans(q), INTERP))
    if MODE == 1:
        s = s * (ksc * kf)[None, :]
    else:
        s = s * kf
    if HAS_SOFTCAP:
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))  # tanh without overflow
        s = s * 1.4426950408889634
    vis = kok[None, :] & (kpos[None, :] <= qpos[:, None])
    if HAS_WINDOW:
        vis = vis & (qpos[:, None] - kpos[None, :] < window)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v, vsc = _kv_tile(vc_ptr, vs_ptr, vz_ptr, rowid, kok, BLOCK_N, DW, NB, SB, MODE, INTERP, BITS, CB, IS_FLOAT,
                      MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, HAS_ZP, CPAIR)
    if MODE == 1:
        p = p * vsc[None, :]
    acc = acc * alpha[None, :] + _dot(tl.trans(v), tl.trans(_round_bf16(p, INTERP)), INTERP)  # out^T: [D, R]
    m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attn_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, gs_ptr, pt_ptr, lens_ptr, seq_ptr, qstart_ptr, qlen_ptr,
    o_ptr, lse_ptr,
    stride_qt, stride_qh, stride_pt, HKV, HQ, n_splits, softmax_scale, softcap, window,
    D: tl.constexpr, DW: tl.constexpr, NB: tl.constexpr, SB: tl.constexpr, PAGE: tl.constexpr,
    G: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, INTERP: tl.constexpr, MODE: tl.constexpr,
    CPAIR: tl.constexpr, RES: tl.constexpr,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr, PDL: tl.constexpr,
):
    R: tl.constexpr = BLOCK_M * GP
    S: tl.constexpr = 32 // CB
    HS: tl.constexpr = S // 2
    _pdl_start(PDL, True)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    seq = tl.load(seq_ptr + b)
    length = tl.load(lens_ptr + seq)
    q0 = tl.load(qstart_ptr + b)
    nq = tl.load(qlen_ptr + b)

    r = tl.arange(0, R)
    t = pid_m * BLOCK_M + r // GP
    g = r % GP
    row_ok = (t < nq) & (g < G)
    head = hk * G + g
    qpos = length - nq + t
    # head_dim in the operands' order: element w * S + j (low) and + j + HS (high) of pair j of word w
    wi = tl.arange(0, DW)[None, :] * S
    idx = ()
    for j in tl.static_range(HS):
        idx = idx + (wi + j, wi + j + HS)
    perm = _assemble(idx, HS)  # [1, D]
    qrow = (q0 + t).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + qrow[:, None] + perm, mask=row_ok[:, None], other=0.0).to(tl.float32)
    q = _round_bf16(q, INTERP)

    # logit and output factors: softmax scale, global scale, the element constant's residual power of two
    kf = softmax_scale * RES
    vf = RES
    if HAS_GS:
        gsv = tl.load(gs_ptr)
        kf = kf * gsv
        vf = vf * gsv
    if not HAS_SOFTCAP:
        kf = kf * 1.4426950408889634

    # the keys this tile of queries may see: [lo, hi); the splits partition them from lo
    last_t = tl.minimum(pid_m * BLOCK_M + BLOCK_M, nq) - 1
    hi = length - nq + last_t + 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(length - nq + pid_m * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N
    # each split's length from this sequence's length on the device, whole key blocks: a call captured in a CUDA
    # graph and replayed after the cache grew still covers every key (n_splits was fixed at capture)
    split_len = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), n_splits), BLOCK_N) * BLOCK_N
    start = lo + pid_s * split_len
    end = tl.minimum(start + split_len, hi)

    m_i = tl.full((R,), -1.0e30, tl.float32)  # finite: a fully masked tile leaves exp2(-inf - m) = 0
    l_i = tl.zeros((R,), tl.float32)
    acc = tl.zeros((D, R), tl.float32)  # the output transposed (the decoded V is the MMA's M side)
    pt_row = pt_ptr + seq.to(tl.int64) * stride_pt
    # (the interpreter cannot take tensor bounds in range(): the same steps as a while loop)
    if INTERP:
        k0 = start
        while k0 < end:
            m_i, l_i, acc = _step(k0, end, q, qpos, kf, softcap, window, m_i, l_i, acc, pt_row, hk, HKV, kc_ptr, vc_ptr,
                                  ks_ptr, vs_ptr, kz_ptr, vz_ptr, PAGE, BLOCK_N, DW, NB, SB, MODE, INTERP, BITS, CB,
                                  IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, HAS_ZP, CPAIR,
                                  HAS_WINDOW, HAS_SOFTCAP)
            k0 += BLOCK_N
    else:
        for k0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _step(k0, end, q, qpos, kf, softcap, window, m_i, l_i, acc, pt_row, hk, HKV, kc_ptr, vc_ptr,
                                  ks_ptr, vs_ptr, kz_ptr, vz_ptr, PAGE, BLOCK_N, DW, NB, SB, MODE, INTERP, BITS, CB,
                                  IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, HAS_ZP, CPAIR,
                                  HAS_WINDOW, HAS_SOFTCAP)

    lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
    o = acc * (vf / tl.maximum(l_i, 1e-30))[None, :]
    orow = ((q0 + t).to(tl.int64) * HQ + head) * n_splits + pid_s
    tl.store(o_ptr + orow[None, :] * D + tl.reshape(perm, [D, 1]), o, mask=row_ok[None, :])
    tl.store(lse_ptr + orow, lse, mask=row_ok)


@triton.jit
def _combine_kernel(o_ptr, lse_ptr, sink_ptr, out_ptr, HQ, n_splits, stride_ot, stride_oh,
                    D: tl.constexpr, SP: tl.constexpr, HAS_SINKS: tl.constexpr, PDL: tl.constexpr):
    """out[t, h] = sum_s w_s o_s / (sum_s w_s + exp(sink_h)), w_s = exp(lse_s) (base 2, max-shifted)."""
    _pdl_start(PDL, False)
    pid = tl.program_id(0)
    t = pid // HQ
    h = pid % HQ
    sp = tl.arange(0, SP)
    d = tl.arange(0, D)
    sok = sp < n_splits
    lse = tl.load(lse_ptr + pid.to(tl.int64) * n_splits + sp, mask=sok, other=float("-inf"))
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    w = tl.where(sok, tl.exp2(lse - m), 0.0)
    den = tl.sum(w, 0)
    if HAS_SINKS:
        den = den + tl.exp2(sink - m)
    o = tl.load(o_ptr + (pid.to(tl.int64) * n_splits + sp)[:, None] * D + d[None, :], mask=sok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / den
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))
