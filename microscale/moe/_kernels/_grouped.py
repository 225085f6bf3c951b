"""Triton kernel of the grouped weight-only matmul over experts (private).

One kernel, parametric over the format (the linear op's constexprs and decoders,
:mod:`microscale.linear._kernels._linear_kernels`), on the linear op's packed layout stacked
per expert (:mod:`microscale.moe.packed`). Rows of ``x`` are grouped by expert
(``offsets[e] .. offsets[e+1]``). Program axes: (N tile, K split, row tile); a row tile is one
``BLOCK_M`` slice of one expert's rows, found through the tile map ``tile_expert`` /
``tile_block`` the host builds on the GPU (no sync): programs past the last tile, and so every
untouched expert, return before reading any weight. Tokens are the MMA's N side (out^T tiles
``[BLOCK_N, BLOCK_M]``): at decode ``BLOCK_M`` = 16 and K is split so all SMs stream the touched
experts (deterministic split sum through the linear op's ``_split_sum``); at prefill ``BLOCK_M``
= 64..128 and each weight tile is decoded once per K step for the whole token tile.
``GATHER``: row ``r`` of the grouped input is ``x[rows[r]]`` (the routing gather, fused).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...linear._kernels._linear_kernels import (_bcast_words, _decode_elem, _decode_scale, _epilogue, _load_entries,
                                                _mma, _split_sum)


@triton.jit
def _grouped_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, rows_ptr, offs_ptr, te_ptr, tb_ptr,
    E, N, K, KW, stride_xm, stride_om, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn, stride_be,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
    INTERP: tl.constexpr, ITERS: tl.constexpr, SB: tl.constexpr, EVEN_K: tl.constexpr,
):
    """out^T tile [BLOCK_N, BLOCK_M] of one expert's row tile over a K range."""
    S: tl.constexpr = 32 // CB  # containers per word
    HS: tl.constexpr = S // 2  # slot pairs per word
    TK: tl.constexpr = 8 * S  # elements per layout tile (8 words)
    NT: tl.constexpr = BLOCK_KW // 8  # layout tiles per step
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_t = tl.program_id(2)
    e = tl.load(te_ptr + pid_t)
    if e >= E:  # past the last row tile: nothing to read or write
        return
    row0 = tl.load(offs_ptr + e) + tl.load(tb_ptr + pid_t) * BLOCK_M
    row_end = tl.load(offs_ptr + e + 1)
    chunk = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * chunk
    kw_end = tl.minimum(kw_start + chunk, KW)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BLOCK_KW)
    n_ok = offs_n < N
    m_ok = offs_m < row_end
    if GATHER:
        src = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    else:
        src = offs_m.to(tl.int64)
    e64 = e.to(tl.int64)
    wp = w_ptr + e64 * stride_we
    sp = s_ptr + e64 * stride_se
    zpp = zp_ptr + e64 * stride_ze
    srow = offs_n // GROUP_ROWS
    xq = (tl.arange(0, NT) * TK)[:, None] + tl.arange(0, 16)[None, :]
    offs_t = tl.arange(0, NT)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for it in range(ITERS):
        kw0 = kw_start + it * BLOCK_KW
        step_ok = kw0 < kw_end
        kw = kw0 + offs_w
        words = tl.load(wp + offs_n[:, None] * stride_wn + kw[None, :], mask=n_ok[:, None] & step_ok, other=0)
        k_base = kw0 * S
        for j in tl.static_range(HS):
            gt = ((kw0 // 8 + offs_t) * TK + j * 16) // GROUP
            tmask = n_ok[:, None] & step_ok
            scale = _bcast_words(_decode_scale(_load_entries(sp, srow, stride_sn, gt, tmask, SB), SCALE_KIND),
                                 BLOCK_N, NT)
            if HAS_ZP:
                zp = _bcast_words(_load_entries(zpp, offs_n, stride_zn, gt, tmask, 1).to(tl.float32), BLOCK_N, NT)
            else:
                zp = scale
            c_lo = (words >> (j * CB)) & ((1 << BITS) - 1)
            c_hi = (words >> ((j + HS) * CB)) & ((1 << BITS) - 1)
            lo = _decode_elem(c_lo, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG,
                              HAS_ZP)
            hi = _decode_elem(c_hi, scale, zp, BITS, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS, INF_MAG, NAN_MAG,
                              HAS_ZP)
            a = tl.reshape(tl.join(lo.to(x_ptr.dtype.element_ty), hi.to(x_ptr.dtype.element_ty)),
                           [BLOCK_N, 2 * BLOCK_KW])
            xk = k_base + j * 16 + xq
            if EVEN_K:
                xmask = m_ok[:, None, None] & step_ok
            else:
                xmask = m_ok[:, None, None] & step_ok & (xk < K)[None, :, :]
            xt = tl.load(x_ptr + src[:, None, None] * stride_xm + xk[None, :, :], mask=xmask, other=0.0)
            xt = tl.trans(tl.reshape(xt, [BLOCK_M, 2 * BLOCK_KW]))
            acc = _mma(a, xt, acc, INTERP)

    out_mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K > 1:
        tile = pid_t * tl.num_programs(0) + pid_n
        tiles = tl.num_programs(0) * tl.num_programs(2)
        loc = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        acc, last = _split_sum(acc, ws_ptr + tile.to(tl.int64) * (BLOCK_N * BLOCK_M) + loc,
                               (BLOCK_N * BLOCK_M) * tiles.to(tl.int64), pid_k, out_mask, cnt_ptr + tile, SPLIT_K)
        out_mask = out_mask & last
    _epilogue(acc, offs_n, offs_m.to(tl.int64), n_ok, out_mask, gs_ptr, b_ptr + e64 * stride_be, out_ptr, stride_om,
              HAS_GS, HAS_BIAS)
