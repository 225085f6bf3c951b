"""Triton kernel of the grouped decode over experts on tensor cores (private).

The linear op's ``gemv_mma`` (:mod:`microscale.linear._kernels._gemv_mma`: its PTX loaders and
step, one element per thread, every lane's addresses derived from ``%tid.x``) with an expert
axis: program axes (N tile, K split, row tile); a row tile is up to ``8 * TG`` grouped rows of one
expert (the tile map of :func:`microscale.moe.grouped.route`), found through ``tile_expert`` /
``tile_block``; slots past the last tile, and so every untouched expert, return before reading any
weight. Each warp streams ``16 * RG`` rows of that expert's canonical E2M1 codes (the QTensor's own
bytes: no repack) and its block scales; the tokens are the MMA's N side. Products are exact
(bf16 pairs times their block scale), sums fp32.

K need not be a multiple of the K step: a lane whose words lie past the row reads the row's last
words again (in bounds) and its activations are zeroed in registers, so they add nothing.

Activations: row ``q`` of a tile is grouped row ``r``; with ``GATHER`` the lane reads
``x[rows[r] // gather_div]`` (the routing gather, fused). Epilogues as the grouped kernel's
(:mod:`._grouped`): ``ACT`` 1 / 2 (SwiGLU / gpt-oss's clamped SwiGLU; each warp's row slots ``g``
and ``g + 8`` are the gate and up rows of one output column, so both halves of a pair meet in one
lane), ``SCATTER`` (``out[perm[r]] = topw[perm[r]] * row``, fp32), else ``out[r]``.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...linear._kernels._gemv_mma import TID_ASM, _addr, _k_steps, _sum_splits


@triton.jit
def _weight_row(base, half, N, ACT: tl.constexpr, CONCAT: tl.constexpr):
    """The weight row a lane's slot reads: ``base`` (+ 8 for the second ``half``) or, with an activation
    epilogue, the gate (``half`` 0) or up (1) row of output column ``base``."""
    if ACT > 0:
        h = tl.minimum(base, N // 2 - 1)
        if CONCAT:
            return h + half * (N // 2)
        return 2 * h + half
    return tl.minimum(base + 8 * half, N - 1)


@triton.jit
def _decode_mma_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, rows_ptr, offs_ptr, te_ptr, tb_ptr, topw_ptr,
    ke, E, N, KW, stride_x, stride_we, stride_w, stride_se, stride_s, stride_be, stride_o, gather_div, post,
    alpha, limit,
    KW_PER_SPLIT: tl.constexpr, RG: tl.constexpr, WPL: tl.constexpr, TG: tl.constexpr, WPG: tl.constexpr,
    SK: tl.constexpr, SPLIT_K: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr, GATHER: tl.constexpr,
    ACT: tl.constexpr, CONCAT: tl.constexpr, SCATTER: tl.constexpr, EVEN_K: tl.constexpr,
    LASM: tl.constexpr, LCONS: tl.constexpr, NOUT: tl.constexpr, XASM: tl.constexpr, XCONS: tl.constexpr,
    NXOUT: tl.constexpr, SASM: tl.constexpr, SCONS: tl.constexpr, NW: tl.constexpr, WAIT: tl.constexpr = 0,
    TRIGGER: tl.constexpr = False,
):
    """One expert row tile's outputs for ``16 * RG * NW`` weight rows (``8 * RG * NW`` output columns
    with ``ACT``) over one K range. Launched as a programmatic dependent, ``WAIT`` 1: wait for the grid
    before (the routing, whose tile map it reads) at once; 2: the grid before is the gate/up GEMM, launched
    after the routing had finished, so the tile map is read and the first weight step issued before the
    wait (ptxas may still sink those loads below it), the activations after it. ``TRIGGER``: let the next
    launch start (after the wait with 1, at entry with 2: the slot sum it lets in waits for this grid)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_t = tl.program_id(2)
    if WAIT == 1:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    ex = tl.load(te_ptr + pid_t)
    if ex >= E:  # past the last row tile: nothing to read or write
        return
    row0 = tl.load(offs_ptr + ex) + tl.load(tb_ptr + pid_t) * (8 * TG)
    row_end = tl.load(offs_ptr + ex + 1)
    e = tl.arange(0, 32 * NW)
    tid = tl.inline_asm_elementwise(TID_ASM, "=r,r", [e], dtype=tl.int32, is_pure=True, pack=1)
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    if ACT > 0:  # output column of the lane's slot g in row group i: base + 8 i
        base = pid_n * (8 * RG * NW) + (tid // 32) * (8 * RG) + g
    else:  # weight row of slot g in row group i: base + 16 i (slot g + 8: + 8)
        base = pid_n * (16 * RG * NW) + (tid // 32) * (16 * RG) + g
    k0 = pid_k * KW_PER_SPLIT + t * WPL  # this lane's first word
    ex64 = ex.to(tl.int64)
    wbase = w_ptr + ex64 * stride_we
    sbase = s_ptr + ex64 * stride_se
    ws = ()
    ss = ()
    for r in tl.static_range(2 * RG):
        if ACT > 0:
            row = _weight_row(base + 8 * (r // 2), r % 2, N, ACT, CONCAT)
        else:
            row = _weight_row(base + 16 * (r // 2), r % 2, N, ACT, CONCAT)
        ws = ws + (_addr(wbase + row.to(tl.int64) * stride_w + k0),)
        ss = ss + (_addr(sbase + row.to(tl.int64) * stride_s + k0 // WPG),)
    xs = ()
    for q in tl.static_range(TG):
        xr = tl.minimum(row0 + g + 8 * q, row_end - 1)  # the tile's rows past the expert's repeat its last
        if GATHER:
            src = tl.load(rows_ptr + xr) // gather_div
        else:
            src = xr
        xs = xs + (_addr(x_ptr + src.to(tl.int64) * stride_x + k0 * 8),)
    accs = _k_steps(ws, ss, xs, k0, ke, KW, KW_PER_SPLIT, RG, WPL, TG, WPG, SK, EVEN_K, LASM, LCONS, NOUT, XASM,
                    XCONS, NXOUT, SASM, SCONS, NW, WAIT == 2)
    scale = post
    if HAS_GS:
        scale = scale * tl.load(gs_ptr)
    NA: tl.constexpr = 4 * RG * TG
    last = True
    if SPLIT_K > 1:
        accs, last = _sum_splits(accs, ws_ptr, cnt_ptr, pid_t * tl.num_programs(0) + pid_n,
                                 tl.num_programs(0) * tl.num_programs(2), pid_k, e, NA, NW, SPLIT_K)
    if last:
        bp = b_ptr + ex64 * stride_be
        for ri in tl.static_range(RG):
            for qi in tl.static_range(TG):
                for ci in tl.static_range(4):
                    gr = row0 + 8 * qi + 2 * t + (ci % 2)  # the grouped row of this accumulator
                    r_ok = gr < row_end
                    if ACT > 0:
                        if ci < 2:  # (c0, c1): gate rows; (c2, c3): the up rows of the same column
                            col = base + 8 * ri
                            ok = r_ok & (col < N // 2)
                            gate = accs[(ri * TG + qi) * 4 + ci] * scale
                            up = accs[(ri * TG + qi) * 4 + ci + 2] * scale
                            if HAS_BIAS:
                                gate += tl.load(bp + _weight_row(col, 0, N, ACT, CONCAT), mask=ok,
                                                other=0.0).to(tl.float32)
                                up += tl.load(bp + _weight_row(col, 1, N, ACT, CONCAT), mask=ok,
                                              other=0.0).to(tl.float32)
                            if ACT == 2:  # gpt-oss: gate clamped above, up to [-limit, limit]
                                gate = tl.minimum(gate, limit)
                                up = tl.minimum(tl.maximum(up, -limit), limit)
                                h = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
                            else:
                                h = gate * tl.sigmoid(gate) * up
                            tl.store(out_ptr + gr.to(tl.int64) * stride_o + col, h.to(out_ptr.dtype.element_ty),
                                     mask=ok)
                    else:
                        row = base + 16 * ri + 8 * (ci // 2)
                        ok = r_ok & (row < N)
                        v = accs[(ri * TG + qi) * 4 + ci] * scale
                        if HAS_BIAS:
                            v += tl.load(bp + row, mask=ok, other=0.0).to(tl.float32)
                        if SCATTER:  # the routing weight and the un-sort: grouped row r is pair perm[r]
                            p = tl.load(rows_ptr + gr, mask=ok, other=0).to(tl.int64)
                            v = v * tl.load(topw_ptr + p, mask=ok, other=0.0).to(tl.float32)
                            dst = p
                        else:
                            dst = gr.to(tl.int64)
                        tl.store(out_ptr + dst * stride_o + row, v.to(out_ptr.dtype.element_ty), mask=ok)
