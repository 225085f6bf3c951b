"""The MoE prefill path in Gluon (private; see :mod:`microscale.moe.prefill`): the linear op's warp-specialized
prefill (:mod:`microscale.linear._kernels._prefill_gluon`) with an expert axis.

Per output tile (``2 x 64`` weight rows of one expert x ``BT`` grouped rows of that expert): a 1-warp
producer streams the K-permuted activations of the tile's grouped rows with TMA into a ring; two consumer
warpgroups decode their E2M1 code words straight into the wgmma A operand and multiply (the linear kernel's
own K loop, :func:`~microscale.linear._kernels._prefill_gluon._k_loop`). The tiles come from the routing's
device tile map (:func:`microscale.moe.grouped.route`: per slot, the expert and the tile index within it),
so nothing is synced to the host; slots past the last tile are skipped by every partition alike. Rows of a
tile past its expert's range (the next expert's) are computed and not stored.

Epilogues, as the grouped and decode kernels': ``ACT`` (the gate/up GEMM): each warp's 16 rows are 8 gate
rows and the 8 up rows of the same output columns (rows ``16 s + g`` and ``16 s + 8 + g`` of a warpgroup
are column ``8 s + g``), so every thread holds both halves of its pairs and applies SwiGLU / gpt-oss's
clamped SwiGLU in fp32; ``SCATTER`` (the down GEMM): ``out[perm[r]] = topw[perm[r]] * row`` in fp32; else
``out[r]``. Gluon kernels do not run under the Triton interpreter: CI compiles this one for sm_90.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from ...linear._kernels._prefill_gluon import (BK, WG_ROWS, _k_loop, _row_codes, _tile_origin, code_word_layout,
                                               ring_acquire, ring_barriers)


@gluon.jit
def _moe_tile(tile, n_slots, n_n, te_ptr, tb_ptr, off_ptr, E, BT: gl.constexpr, GROUP_T: gl.constexpr):
    """``(expert, first grouped row, end of the expert's rows, row tile origin, valid)`` of tile ``tile``
    (slots of the tile map in groups of ``GROUP_T`` sweep the row tiles; a slot past the last tile is not
    valid, its expert clamped for addressing)."""
    off_s, off_n = _tile_origin(tile, n_slots, n_n, BT, GROUP_T)
    slot = off_s // BT
    e = gl.load(te_ptr + slot)
    ec = gl.minimum(e, E - 1)
    t0 = gl.load(off_ptr + ec) + gl.load(tb_ptr + slot) * BT
    return ec, t0, gl.load(off_ptr + ec + 1), off_n, e < E


@gluon.jit
def _moe_rows(r, off_n, WG: gl.constexpr, N, ACT: gl.constexpr, CONCAT: gl.constexpr):
    """The expert's weight rows of this warpgroup's 64 tile rows ``r`` (clamped in bounds): rows
    ``off_n + 64 WG + r``, or with ``ACT`` the gate (``r % 16 < 8``) and up rows of output column
    ``off_n / 2 + 32 WG + 8 (r // 16) + r % 8`` (concatenated halves or interleaved pairs)."""
    if ACT > 0:
        half = N // 2
        c = gl.minimum(off_n // 2 + WG * 32 + 8 * (r // 16) + r % 8, half - 1)
        up = (r // 8) % 2
        if CONCAT:
            rows = c + up * half
        else:
            rows = 2 * c + up
    else:
        rows = gl.minimum(off_n + WG * WG_ROWS + r, N - 1)
    return rows


@gluon.jit
def _moe_producer(xp_desc, x_bufs, ready, empty, te_ptr, tb_ptr, off_ptr, E, n_slots, n_n, n_steps,
                  BT: gl.constexpr, GROUP_T: gl.constexpr):
    """TMA of the activation tile of every K step of this program's valid tiles into the ring."""
    it = 0
    for tile in range(gl.program_id(0), n_slots * n_n, gl.num_programs(0)):
        e, t0, t_end, off_n, valid = _moe_tile(tile, n_slots, n_n, te_ptr, tb_ptr, off_ptr, E, BT, GROUP_T)
        for i in range(gl.where(valid, n_steps, 0)):
            s = ring_acquire(ready, empty, it, xp_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(xp_desc, [t0, i * BK], ready.index(s), x_bufs.index(s))
            it += 1


@gluon.jit
def _moe_epilogue(acc, e, t0, t_end, off_n, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, N, stride_be, stride_om, post,
                  alpha, limit, WG: gl.constexpr, HAS_GS: gl.constexpr, HAS_BIAS: gl.constexpr, ACT: gl.constexpr,
                  CONCAT: gl.constexpr, SCATTER: gl.constexpr, acc_l: gl.constexpr):
    """The tile's grouped rows ``t0 ..`` below ``t_end``: scale (``post``, the global scale), the expert's bias,
    then the activation (``ACT``), the routing weight and un-sort (``SCATTER``, fp32) or a plain store."""
    BT: gl.constexpr = acc.shape[1]
    scale = post
    if HAS_GS:
        scale = scale * gl.load(gs_ptr)
    v = acc * scale
    bp = b_ptr + e.to(gl.int64) * stride_be
    if ACT > 0:
        # rows 16 s + 8 h + g: column 8 s + g, gate (h = 0) / up (h = 1), in the same thread
        gate, up = gl.split(gl.permute(gl.reshape(v, [4, 2, 8, BT]), (0, 2, 3, 1)))
        l3: gl.constexpr = gate.type.layout
        s_i = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, l3)))
        g_i = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))
        t_i = t0 + gl.arange(0, BT, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))
        half = N // 2
        col = off_n // 2 + WG * 32 + 8 * gl.expand_dims(s_i, 1) + gl.expand_dims(g_i, 0)  # [4, 8]
        if HAS_BIAS:
            cc = gl.minimum(col, half - 1)
            if CONCAT:
                g_row = cc
                u_row = cc + half
            else:
                g_row = 2 * cc
                u_row = 2 * cc + 1
            gate += gl.expand_dims(gl.load(bp + g_row).to(gl.float32), 2)
            up += gl.expand_dims(gl.load(bp + u_row).to(gl.float32), 2)
        if ACT == 2:  # gpt-oss: gate clamped above, up to [-limit, limit]
            gate = gl.minimum(gate, limit)
            up = gl.minimum(gl.maximum(up, -limit), limit)
            h = (up + 1.0) * (gate * (1.0 / (1.0 + gl.exp(-(gate * alpha)))))
        else:
            h = gate * (1.0 / (1.0 + gl.exp(-gate))) * up
        t3 = gl.expand_dims(gl.expand_dims(t_i, 0), 1)  # [1, 1, BT]
        ok = gl.expand_dims(col < half, 2) & (t3 < t_end)
        gl.store(out_ptr + t3.to(gl.int64) * stride_om + gl.expand_dims(col, 2), h.to(out_ptr.dtype.element_ty),
                 mask=ok)
    else:
        n_o = off_n + WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, acc_l))
        t_o = t0 + gl.arange(0, BT, layout=gl.SliceLayout(0, acc_l))
        n_ok = n_o < N
        t_ok = t_o < t_end
        if HAS_BIAS:
            v += gl.expand_dims(gl.load(bp + n_o, mask=n_ok, other=0.0).to(gl.float32), 1)
        if SCATTER:  # the routing weight and the un-sort: grouped row r is pair perm[r]
            p = gl.load(rows_ptr + t_o, mask=t_ok, other=0).to(gl.int64)
            v = v * gl.expand_dims(gl.load(topw_ptr + p, mask=t_ok, other=0.0).to(gl.float32), 0)
            dst = p
        else:
            dst = t_o.to(gl.int64)
        ok = gl.expand_dims(n_ok, 1) & gl.expand_dims(t_ok, 0)
        gl.store(out_ptr + gl.expand_dims(dst * stride_om, 0) + gl.expand_dims(n_o, 1),
                 v.to(out_ptr.dtype.element_ty), mask=ok)


@gluon.jit
def _moe_consumer(w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, te_ptr, tb_ptr, off_ptr, x_bufs, ready,
                  empty, E, N, n_slots, n_n, n_steps, stride_wn, stride_sn, stride_be, stride_om, ke, post, alpha, limit,
                  WG: gl.constexpr, BT: gl.constexpr, GROUP_T: gl.constexpr, SK: gl.constexpr, TPS: gl.constexpr,
                  HAS_GS: gl.constexpr, HAS_BIAS: gl.constexpr, ACT: gl.constexpr, CONCAT: gl.constexpr,
                  SCATTER: gl.constexpr):
    """One warpgroup: 64 weight rows x ``BT`` grouped rows of ``out^T`` per valid tile of this program."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    CB: gl.constexpr = 4
    WPT: gl.constexpr = CB // 2
    w_l: gl.constexpr = code_word_layout(WG_ROWS, [[16, 0, 0], [32, 0, 0]], CB)
    s_l: gl.constexpr = gl.SliceLayout(2, w_l)
    r = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_l))
    tq = gl.arange(0, 4, layout=gl.SliceLayout(0, s_l))
    av = gl.arange(0, WPT, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_l)))
    w_col = WPT * tq[None, :, None] + av[None, None, :]
    s_col = tq[None, :] // TPS
    tq2 = tq[None, :]
    it = 0
    for tile in range(gl.program_id(0), n_slots * n_n, gl.num_programs(0)):
        e, t0, t_end, off_n, valid = _moe_tile(tile, n_slots, n_n, te_ptr, tb_ptr, off_ptr, E, BT, GROUP_T)
        nk = gl.where(valid, n_steps, 0)
        rows = _moe_rows(r, off_n, WG, N, ACT, CONCAT).to(gl.int64) + e.to(gl.int64) * N
        w_off, s_off, words, sraw, words_n, sraw_n = _row_codes(w_ptr, s_ptr, s_ptr, rows, 0, gl.maximum(nk, 1),
                                                                w_col, s_col, tq2, stride_wn, stride_sn, TPS, SK, CB)
        acc = gl.zeros([WG_ROWS, BT], gl.float32, acc_l)
        acc, it = _k_loop(acc, it, nk, words, sraw, words_n, sraw_n, w_ptr, s_ptr, s_ptr, w_off, s_off, 0, tq2, ke,
                          x_bufs, ready, empty, TPS, SK, s_l, a_l, CB, 0, False)
        if valid:
            _moe_epilogue(acc, e, t0, t_end, off_n, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, N, stride_be, stride_om,
                          post, alpha, limit, WG, HAS_GS, HAS_BIAS, ACT, CONCAT, SCATTER, acc_l)


@gluon.jit
def _moe_prefill_ws_kernel(xp_desc, w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, te_ptr, tb_ptr, off_ptr,
                           E, N, K, n_slots, stride_wn, stride_sn, stride_be, stride_om, ke, post, alpha, limit,
                           BT: gl.constexpr, STAGES: gl.constexpr, GROUP_T: gl.constexpr, SK: gl.constexpr,
                           TPS: gl.constexpr, HAS_GS: gl.constexpr, HAS_BIAS: gl.constexpr, ACT: gl.constexpr,
                           CONCAT: gl.constexpr, SCATTER: gl.constexpr):
    """Grouped ``out = x_sorted @ dequant(W[e])^T`` for E2M1 experts (UE4M3 / E8M0 scales, ``SK`` / ``ke`` /
    ``post`` as the linear kernel's): ``xp_desc`` the TMA descriptor of the grouped rows' K-permuted
    activations ``[R, K]`` (block ``[BT, BK]``); ``w_ptr`` int32 code words ``[E * N, K / 8]``, ``s_ptr`` scale
    bytes ``[E * N, K / G]``; ``te_ptr`` / ``tb_ptr`` the tile map of ``n_slots`` slots for ``BT``-row tiles,
    ``off_ptr`` the experts' offsets ``[E + 1]``; ``rows_ptr`` / ``topw_ptr`` the sorted pair index and the flat
    routing weights (``SCATTER``); ``b_ptr`` bias ``[E, N]`` rows ``stride_be`` apart. One persistent program per
    SM takes tiles ``p, p + P, ...`` of ``n_slots x`` row tiles (128 rows, or 64 output columns with ``ACT``)."""
    if ACT > 0:
        n_n = gl.cdiv(N // 2, WG_ROWS)
    else:
        n_n = gl.cdiv(N, 2 * WG_ROWS)
    n_steps = K // BK
    x_bufs = gl.allocate_shared_memory(xp_desc.dtype, [STAGES] + xp_desc.block_type.shape, xp_desc.layout)
    ready, empty = ring_barriers(STAGES, 2)  # both consumer warpgroups free a slot
    gl.warp_specialize([
        (_moe_consumer, (w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, te_ptr, tb_ptr, off_ptr, x_bufs, ready,
                         empty, E, N, n_slots, n_n, n_steps, stride_wn, stride_sn, stride_be, stride_om, ke, post, alpha,
                         limit, 0, BT, GROUP_T, SK, TPS, HAS_GS, HAS_BIAS, ACT, CONCAT, SCATTER)),
        (_moe_consumer, (w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, rows_ptr, topw_ptr, te_ptr, tb_ptr, off_ptr, x_bufs, ready,
                         empty, E, N, n_slots, n_n, n_steps, stride_wn, stride_sn, stride_be, stride_om, ke, post, alpha,
                         limit, 1, BT, GROUP_T, SK, TPS, HAS_GS, HAS_BIAS, ACT, CONCAT, SCATTER)),
        (_moe_producer, (xp_desc, x_bufs, ready, empty, te_ptr, tb_ptr, off_ptr, E, n_slots, n_n, n_steps, BT, GROUP_T)),
    ], [4, 1], [232, 40])
