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
``GATHER``: row ``r`` of the grouped input is ``x[rows[r] // gather_div]`` (the routing gather,
fused: ``rows`` is the sorted (token, slot) pair index, ``gather_div`` = top_k).

Weight decode: the linear op's :func:`_decode_slot_pair`, two elements per 32-bit operation into
bf16x2 (``PAIR``: E2M1 codes with E8M0 / UE4M3 scales and bf16 activations, where every decoded
product is exact in bf16) or per element (the other formats).

Epilogues: ``ACT`` 1 / 2 (the gate/up GEMM): SwiGLU / gpt-oss's clamped SwiGLU of each (gate, up)
row pair in fp32, ``out`` [R, N/2]; the tile's rows alternate gate and up (``CONCAT``: physical
rows ``i`` and ``N/2 + i``, else ``2i`` and ``2i+1``), so both halves of a pair meet in one program.
``SCATTER`` (the down GEMM): ``out[perm[r]] = topw[perm[r]] * (acc + bias)`` in fp32, the routing
weight and the un-sort fused; the caller sums each token's ``top_k`` slots in order.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...linear._kernels._linear_kernels import (_bcast_words, _decode_scale, _decode_slot_pair, _load_entries, _mma,
                                                _split_sum)


@triton.jit
def _grouped_kernel(
    x_ptr, w_ptr, s_ptr, zp_ptr, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, rows_ptr, offs_ptr, te_ptr, tb_ptr,
    topw_ptr, E, N, K, KW, stride_xm, stride_om, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zn,
    stride_be, gather_div, alpha, limit,
    BITS: tl.constexpr, CB: tl.constexpr, IS_FLOAT: tl.constexpr, MBITS: tl.constexpr, SIGNED: tl.constexpr,
    ELEM_C: tl.constexpr, SPECIALS: tl.constexpr, INF_MAG: tl.constexpr, NAN_MAG: tl.constexpr,
    SCALE_KIND: tl.constexpr, GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HAS_ZP: tl.constexpr,
    HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr, GATHER: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
    INTERP: tl.constexpr, ITERS: tl.constexpr, SB: tl.constexpr, EVEN_K: tl.constexpr, PAIR: tl.constexpr = False,
    ACT: tl.constexpr = 0, CONCAT: tl.constexpr = False, SCATTER: tl.constexpr = False,
    RAGGED: tl.constexpr = False,
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

    offs_l = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # the tile's rows
    if ACT > 0 and CONCAT:  # gate row i, up row N/2 + i, alternating: each pair in one tile
        offs_n = offs_l // 2 + (offs_l % 2) * (N // 2)
    else:
        offs_n = offs_l
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BLOCK_KW)
    n_ok = offs_l < N
    m_ok = offs_m < row_end
    if GATHER:
        src = (tl.load(rows_ptr + offs_m, mask=m_ok, other=0) // gather_div).to(tl.int64)
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
        kw = kw0 + offs_w
        if RAGGED:  # layout tiles of this step inside the K range (the last step of a range may be partial)
            tile_ok = kw0 + offs_t * 8 < kw_end
            wmask = n_ok[:, None] & (kw < kw_end)[None, :]
            tmask = n_ok[:, None] & tile_ok[None, :]
            x_ok = m_ok[:, None, None] & tile_ok[None, :, None]
        else:  # whole steps: one flag a step (keeps the loads vectorized)
            step_ok = kw0 < kw_end
            wmask = n_ok[:, None] & step_ok
            tmask = n_ok[:, None] & step_ok
            x_ok = m_ok[:, None, None] & step_ok
        words = tl.load(wp + offs_n[:, None] * stride_wn + kw[None, :], mask=wmask, other=0)
        k_base = kw0 * S
        for j in tl.static_range(HS):
            gt = ((kw0 // 8 + offs_t) * TK + j * 16) // GROUP
            scale = _bcast_words(_decode_scale(_load_entries(sp, srow, stride_sn, gt, tmask, SB), SCALE_KIND),
                                 BLOCK_N, NT)
            if HAS_ZP:
                zp = _bcast_words(_load_entries(zpp, offs_n, stride_zn, gt, tmask, 1).to(tl.float32), BLOCK_N, NT)
            else:
                zp = scale
            lo, hi = _decode_slot_pair(words, j, scale, zp, BITS, CB, IS_FLOAT, MBITS, SIGNED, ELEM_C, SPECIALS,
                                       INF_MAG, NAN_MAG, HAS_ZP, PAIR, INTERP)
            a = tl.reshape(tl.join(lo.to(x_ptr.dtype.element_ty), hi.to(x_ptr.dtype.element_ty)),
                           [BLOCK_N, 2 * BLOCK_KW])
            xk = k_base + j * 16 + xq
            # (masked words decode to finite values: a zero x there keeps them out of the sums)
            if EVEN_K:
                xmask = x_ok
            else:
                xmask = x_ok & (xk < K)[None, :, :]
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
        m_ok = m_ok & last
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + e64 * stride_be + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    rows = offs_m.to(tl.int64)
    if ACT > 0:  # [BLOCK_N, BLOCK_M] -> (gate, up) [BLOCK_N/2, BLOCK_M]: the tile's rows alternate them
        gate, up = tl.split(tl.permute(tl.reshape(acc, [BLOCK_N // 2, 2, BLOCK_M]), (0, 2, 1)))
        if ACT == 2:  # gpt-oss: gate clamped above, up to [-limit, limit]
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            h = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
        else:
            h = gate * tl.sigmoid(gate) * up
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + rows[None, :] * stride_om + cols[:, None], h.to(out_ptr.dtype.element_ty),
                 mask=(cols < N // 2)[:, None] & m_ok[None, :])
    else:
        if SCATTER:  # the routing weight and the un-sort: grouped row r is pair perm[r]
            rows = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
            acc = acc * tl.load(topw_ptr + rows, mask=m_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=out_mask)


@triton.jit
def _route_kernel(ids_ptr, perm_ptr, offs_ptr, te_ptr, tb_ptr, P, E, MT, BLOCK_M: tl.constexpr, EB: tl.constexpr,
                  CH: tl.constexpr, NCP: tl.constexpr, NCT: tl.constexpr, TRIGGER: tl.constexpr = False):
    """The routing in one program: a stable counting sort of the ``P`` expert ids (``perm[r]``: the
    pair index of grouped row ``r``; ``offsets`` [E+1]) and the map of ``MT`` row-tile slots
    (``te``: expert of each slot, ``E`` past the last tile; ``tb``: tile index within it).
    ``EB``: a power of two > E; ``CH`` ids per chunk (one-hot tiles [CH, EB]); ``NCP`` / ``NCT``:
    chunks covering P ids / MT slots (constexpr bounds, rounded up by the host to few values).
    ``TRIGGER``: the next launch (a programmatic dependent that waits for this grid) may start now."""
    if TRIGGER:
        gdc_launch_dependents()
    offs_e = tl.arange(0, EB)
    e_ok = offs_e < E
    counts = tl.zeros([EB], dtype=tl.int32)
    for c in range(NCP):
        i = c * CH + tl.arange(0, CH)
        ids = tl.load(ids_ptr + i, mask=i < P, other=EB).to(tl.int32)
        counts += tl.sum((ids[:, None] == offs_e[None, :]).to(tl.int32), 0)
    ends = tl.cumsum(counts, 0)
    tl.store(offs_ptr + 1 + offs_e, ends, mask=e_ok)
    tl.store(offs_ptr + offs_e, 0, mask=offs_e == 0)
    run = ends - counts  # next free grouped row of each expert
    for c in range(NCP):
        i = c * CH + tl.arange(0, CH)
        ids = tl.load(ids_ptr + i, mask=i < P, other=EB).to(tl.int32)
        hot = (ids[:, None] == offs_e[None, :]).to(tl.int32)
        before = tl.cumsum(hot, 0) - hot  # earlier ids of the same expert in this chunk (stable)
        dest = tl.sum(hot * (run[None, :] + before), 1)
        tl.store(perm_ptr + dest, i, mask=i < P)
        run += tl.sum(hot, 0)
    tiles = tl.where(e_ok, (counts + BLOCK_M - 1) // BLOCK_M, 0)
    tends = tl.cumsum(tiles, 0)
    for c in range(NCT):
        s = c * CH + tl.arange(0, CH)
        te = tl.sum(((tends[None, :] <= s[:, None]) & e_ok[None, :]).to(tl.int32), 1)
        first = tl.sum(tl.where(offs_e[None, :] == te[:, None], (tends - tiles)[None, :], 0), 1)
        tl.store(te_ptr + s, te, mask=s < MT)
        tl.store(tb_ptr + s, s - first, mask=s < MT)


@triton.jit
def _slot_sum_kernel(y_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr, WAIT: tl.constexpr = False):
    """``out[t] = sum_j y[t * TOP_K + j]`` in fp32, slots in order (deterministic), cast to out's dtype:
    the experts forward's last step, one launch (so an eager call plan records every launch of the call).
    ``WAIT``: launched as a programmatic dependent of the grid that writes ``y``."""
    if WAIT:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    src = y_ptr + t * TOP_K * H + cols
    acc = tl.load(src, mask=m, other=0.0)
    for j in tl.static_range(1, TOP_K):
        acc += tl.load(src + j * H, mask=m, other=0.0)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=m)
