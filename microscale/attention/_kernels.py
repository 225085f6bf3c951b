"""Triton kernels for attention over block-scaled KV pages (private; imports Triton).

:func:`_paged_attn_kernel` serves decode and causal prefill/extend: a program owns one KV
head of one sequence, a tile of ``BLOCK_M`` query tokens times the ``G`` query heads of that
KV head (GQA: the pages are read once per KV head), and one split of the key range (flash
decoding: splits keep every SM busy at batch 1). It loads codes and block scales of
``BLOCK_N`` tokens from the pages, decodes them in registers with the linear op's decoders,
and runs an online softmax in fp32 (base 2). Each split writes its partial output and
log-sum-exp; :func:`_combine_kernel` merges the splits and the attention sink.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..linear._kernels._linear_kernels import _decode_elem, _decode_scale

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(codes_ptr, scales_ptr, zp_ptr, gs, rowid, ok, d,
                  D: tl.constexpr, DB: tl.constexpr, NB: tl.constexpr, SB: tl.constexpr,
                  BITS: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
                  ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
                  SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GS: tl.constexpr):
    """Decoded values [BLOCK_N, D] (fp32) of page rows ``rowid`` (slot * heads + head)."""
    bit = d * BITS
    byte = tl.load(codes_ptr + rowid[:, None].to(tl.int64) * DB + (bit // 8)[None, :], mask=ok[:, None], other=0)
    c = (byte.to(tl.int32) >> (bit % 8)[None, :]) & ((1 << BITS) - 1)
    sidx = rowid[:, None].to(tl.int64) * NB + (d // GROUP)[None, :]
    raw = tl.load(scales_ptr + sidx, mask=ok[:, None], other=0).to(tl.int32)
    if SB < 4:
        raw = raw & ((1 << (SB * 8)) - 1)
    scale = _decode_scale(raw, SCALE_KIND)
    if HAS_ZP:
        zp = tl.load(zp_ptr + sidx, mask=ok[:, None], other=0).to(tl.float32)
    else:
        zp = 0.0
    v = _decode_elem(c, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG, HAS_ZP)
    if HAS_GS:
        v = v * gs
    return tl.where(ok[:, None], v, 0.0)


@triton.jit
def _dot_bf16(a, b, DOT_BF16: tl.constexpr):
    """fp32 ``a @ b`` of the operands rounded to bf16 (tensor cores). DOT_BF16=False (the
    interpreter, whose bf16 dot is wrong) rounds them to bf16 values by bits and multiplies in fp32."""
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        ab = a.to(tl.int32, bitcast=True)
        bb = b.to(tl.int32, bitcast=True)
        ab = (ab + 0x7FFF + ((ab >> 16) & 1)) & -65536  # round to nearest even at bit 16
        bb = (bb + 0x7FFF + ((bb >> 16) & 1)) & -65536
        return tl.dot(ab.to(tl.float32, bitcast=True), bb.to(tl.float32, bitcast=True), input_precision="ieee")


@triton.jit
def _paged_attn_kernel(
    q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, kz_ptr, vz_ptr, gs_ptr, pt_ptr, lens_ptr, seq_ptr, qstart_ptr, qlen_ptr,
    o_ptr, lse_ptr,
    stride_qt, stride_qh, stride_pt, HKV, HQ, n_splits, split_len, softmax_scale, softcap, window,
    D: tl.constexpr, DB: tl.constexpr, NB: tl.constexpr, SB: tl.constexpr, PAGE: tl.constexpr,
    G: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, N_ITER: tl.constexpr, DOT_BF16: tl.constexpr,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr,
):
    R: tl.constexpr = BLOCK_M * GP
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
    d = tl.arange(0, D)
    qrow = (q0 + t).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + qrow[:, None] + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)

    # the keys this tile of queries may see, intersected with this program's split
    last_t = tl.minimum(pid_m * BLOCK_M + BLOCK_M, nq) - 1
    hi = tl.minimum(length - nq + last_t + 1, (pid_s + 1) * split_len)
    lo = pid_s * split_len
    if HAS_WINDOW:
        lo = tl.maximum(lo, length - nq + pid_m * BLOCK_M - window + 1)
    lo = tl.maximum(lo, 0)

    gs = 1.0
    if HAS_GS:
        gs = tl.load(gs_ptr)
    m_i = tl.full((R,), -1.0e30, tl.float32)  # finite: a fully masked tile leaves exp2(-inf - m) = 0
    l_i = tl.zeros((R,), tl.float32)
    acc = tl.zeros((R, D), tl.float32)
    # a constexpr trip count, a power of two (few specializations); masked steps load nothing
    for it in range(0, N_ITER):
        kpos = pid_s * split_len + it * BLOCK_N + tl.arange(0, BLOCK_N)
        kok = (kpos < hi) & (kpos >= lo)
        page = tl.load(pt_ptr + seq.to(tl.int64) * stride_pt + kpos // PAGE, mask=kok, other=0)
        rowid = (page * PAGE + kpos % PAGE) * HKV + hk
        k = _load_kv_tile(kc_ptr, ks_ptr, kz_ptr, gs, rowid, kok, d, D, DB, NB, SB, BITS, IS_FLOAT, MBITS, SIGNED,
                          ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, GROUP, HAS_ZP, HAS_GS)
        s = _dot_bf16(q, tl.trans(k), DOT_BF16) * softmax_scale
        if HAS_SOFTCAP:
            s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))  # tanh without overflow
        vis = kok[None, :] & (kpos[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            vis = vis & (qpos[:, None] - kpos[None, :] < window)
        s = tl.where(vis, s * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv_tile(vc_ptr, vs_ptr, vz_ptr, gs, rowid, kok, d, D, DB, NB, SB, BITS, IS_FLOAT, MBITS, SIGNED,
                          ELEM_C, SPECIALS, INF_MAG, NAN_MAG, SCALE_KIND, GROUP, HAS_ZP, HAS_GS)
        acc = acc * alpha[:, None] + _dot_bf16(p, v, DOT_BF16)
        m_i = m_new

    lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
    o = acc / tl.maximum(l_i, 1e-30)[:, None]
    orow = ((q0 + t).to(tl.int64) * HQ + head) * n_splits + pid_s
    tl.store(o_ptr + orow[:, None] * D + d[None, :], o, mask=row_ok[:, None])
    tl.store(lse_ptr + orow, lse, mask=row_ok)


@triton.jit
def _combine_kernel(o_ptr, lse_ptr, sink_ptr, out_ptr, HQ, n_splits, stride_ot, stride_oh,
                    D: tl.constexpr, SP: tl.constexpr, HAS_SINKS: tl.constexpr):
    """out[t, h] = sum_s w_s o_s / (sum_s w_s + exp(sink_h)), w_s = exp(lse_s) (base 2, max-shifted)."""
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
