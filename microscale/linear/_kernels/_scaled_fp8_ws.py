"""Warp-specialized fp8 ``out = a @ b^T`` with a float32 promotion every 128 K, in Gluon (private; see
:mod:`microscale.linear.backends.scaled_fp8`).

Why: the Triton kernel (:mod:`._scaled_fp8`) runs both warpgroups of a 128-row tile in lockstep
(CTA barriers in its K loop), and each chunk's wgmma is waited on right after it is issued, before
that chunk's float32 scale-and-add; moving the promotion one chunk later does not help, the compiler
still waits at once (sm_90 PTX). So the tensor cores idle while both warpgroups promote: 813 TFLOP/s,
1.10x cuBLAS bf16 at 4096 tokens (docs/decisions/scaled-mm-operands.md). Here, as DeepGEMM does:

* a 1-warp producer streams both operands' ``[rows, 128]`` fp8 tiles with TMA into a ring of
  ``STAGES`` slots (``ready`` / ``empty`` mbarriers, no CTA barrier);
* two consumer warpgroups, each its own partition, take 64 activation rows apiece of a 128-row
  tile; per chunk: the MMA into a fresh float32 tile (``use_acc=False``), its wait, the slot
  released, then ``acc += part * (s_a * s_b)``. The warpgroups drift apart, so one promotes while the
  other's MMAs run;
* one persistent program per SM walks the output tiles in groups of ``GROUP_M`` row tiles (the
  weight's column tile stays in L2), the producer running ahead into the next tile.

Block scales come by pointer loads issued before each MMA (float32, float16, bfloat16 or E8M0; one
per row and chunk for the activations, per ``GROUP_ROWS`` rows for the weight). The epilogue is the
Triton kernel's: ``acc * fp32(g_a * g_b)``, ``+ bias``, one rounding. Gluon kernels do not run under
the Triton interpreter: CI compiles this one for sm_90 (``tools/compile_check.py``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ._prefill_gluon import ring_acquire, ring_barriers
from ._scaled_kernels import _global_scaled

#: activation rows per consumer warpgroup (the wgmma M) and per tile (two consumers)
WG_M = gl.constexpr(64)
#: K elements per ring slot and promotion
BK = gl.constexpr(128)


@gluon.jit
def _tile_mn(tile, n_m, n_n, GROUP_M: gl.constexpr):
    """``(pid_m, pid_n)`` of output tile ``tile``: groups of ``GROUP_M`` row tiles sweep all column tiles."""
    per = GROUP_M * n_n
    first = (tile // per) * GROUP_M
    rows = gl.minimum(n_m - first, GROUP_M)
    return first + (tile % per) % rows, (tile % per) // rows


@gluon.jit
def _block_scale(s_ptr, row0, rows, n_rows, blk, stride_s, KIND: gl.constexpr, GROUP_ROWS: gl.constexpr):
    """float32 block scales of ``rows`` (from ``row0``; those at or past ``n_rows`` read 0) at K block ``blk``:
    ``s_ptr`` typed float32 / float16 / bfloat16 (``KIND`` 5 / 3 / 4, converted exactly) or uint8 E8M0 bytes
    (``KIND`` 1). One scalar when a block of ``GROUP_ROWS`` rows covers them all (128 x 128 weight blocks)."""
    if GROUP_ROWS % rows.shape[0] == 0:  # (the tile starts at a multiple of its size)
        raw = gl.load(s_ptr + (row0 // GROUP_ROWS) * stride_s + blk, mask=row0 < n_rows, other=0)
    else:
        raw = gl.load(s_ptr + (rows // GROUP_ROWS) * stride_s + blk, mask=rows < n_rows, other=0)
    if KIND == 1:
        b = raw.to(gl.int32)
        s = gl.where(b == 0, 0x400000, gl.where(b == 255, 0x7FC00000, b << 23)).to(gl.float32, bitcast=True)
    else:
        s = raw.to(gl.float32)
    return s


@gluon.jit
def _promote(acc, part, sa, sb):
    """``acc + part * (sa[:, None] * sb[None, :])`` where either scale may be a scalar (:func:`_block_scale`).
    Both vectors: ``(part * sa) * sb``, so no ``[rows, BN]`` scale tile is live beside ``acc`` and ``part``
    (with it, 128-column tiles spilled on sm_90)."""
    if len(sa.shape) == 0:
        if len(sb.shape) == 0:
            v = acc + part * (sa * sb)
        else:
            v = acc + part * gl.expand_dims(sb * sa, 0)
    elif len(sb.shape) == 0:
        v = acc + part * gl.expand_dims(sa * sb, 1)
    else:
        v = acc + (part * gl.expand_dims(sa, 1)) * gl.expand_dims(sb, 0)
    return v


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, n_m, n_n, n_k, GROUP_M: gl.constexpr):
    """TMA of both operands' tiles of every chunk of this program's output tiles into the ring."""
    BN: gl.constexpr = b_desc.block_type.shape[0]
    it = 0
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile_mn(tile, n_m, n_n, GROUP_M)
        for c in range(n_k):
            s = ring_acquire(ready, empty, it, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pm * (2 * WG_M), c * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [pn * BN, c * BK], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, ag_ptr, bg_ptr, bias_ptr, out_ptr, M, N, n_m, n_n, n_k,
              stride_as, stride_bs, stride_om, WG: gl.constexpr, A_KIND: gl.constexpr, A_GROUP: gl.constexpr,
              A_GROUP_ROWS: gl.constexpr, B_KIND: gl.constexpr, B_GROUP: gl.constexpr, B_GROUP_ROWS: gl.constexpr,
              HAS_GA: gl.constexpr, HAS_GB: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP_M: gl.constexpr):
    """Rows ``WG x 64 ..`` of each of this program's ``128 x BN`` output tiles: per chunk the MMA into a
    fresh float32 tile, then its promotion into ``acc``; the epilogue stores the tile."""
    STAGES: gl.constexpr = a_bufs.shape[0]
    BN: gl.constexpr = b_bufs.shape[1]
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    cols_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    part = gl.zeros([WG_M, BN], gl.float32, acc_l)
    it = 0
    for tile in range(gl.program_id(0), n_m * n_n, gl.num_programs(0)):
        pm, pn = _tile_mn(tile, n_m, n_n, GROUP_M)
        m0 = pm * (2 * WG_M) + WG * WG_M
        n0 = pn * BN
        offs_m = m0 + gl.arange(0, WG_M, layout=rows_l)
        offs_n = n0 + gl.arange(0, BN, layout=cols_l)
        m_ok = offs_m < M
        n_ok = offs_n < N
        acc = gl.zeros([WG_M, BN], gl.float32, acc_l)
        for c in range(n_k):
            s = it % STAGES
            sa = _block_scale(as_ptr, m0, offs_m, M, (c * BK) // A_GROUP, stride_as, A_KIND, A_GROUP_ROWS)
            sb = _block_scale(bs_ptr, n0, offs_n, N, (c * BK) // B_GROUP, stride_bs, B_KIND, B_GROUP_ROWS)
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            part = warpgroup_mma(a_bufs.index(s).slice(WG * WG_M, WG_M), b_bufs.index(s).permute((1, 0)), part,
                                 use_acc=False, is_async=True)
            part = warpgroup_mma_wait(num_outstanding=0, deps=[part])
            mbarrier.arrive(empty.index(s), count=1)  # slot free (one arrive per warpgroup)
            acc = _promote(acc, part, sa, sb)  # promotion: float32 from here on
            it += 1
        acc = _global_scaled(acc, ag_ptr, bg_ptr, HAS_GA, HAS_GB)  # (the Triton kernels' epilogue from here on)
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(gl.float32), 0)
        mask = gl.expand_dims(m_ok, 1) & gl.expand_dims(n_ok, 0)
        ptrs = out_ptr + gl.expand_dims(offs_m.to(gl.int64) * stride_om, 1) + gl.expand_dims(offs_n, 0)
        gl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _scaled_fp8_ws_kernel(a_desc, b_desc, as_ptr, bs_ptr, ag_ptr, bg_ptr, bias_ptr, out_ptr, M, N, K,
                          stride_as, stride_bs, stride_om,
                          A_KIND: gl.constexpr, A_GROUP: gl.constexpr, A_GROUP_ROWS: gl.constexpr,
                          B_KIND: gl.constexpr, B_GROUP: gl.constexpr, B_GROUP_ROWS: gl.constexpr,
                          HAS_GA: gl.constexpr, HAS_GB: gl.constexpr, HAS_BIAS: gl.constexpr,
                          STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """``out[M, N] = a @ b^T`` in ``128 x BN`` tiles. ``a_desc`` / ``b_desc``: TMA descriptors of the fp8
    codes ``[M, K]`` / ``[N, K]`` (blocks ``[128, 128]`` / ``[BN, 128]``; K past the end reads zeros);
    ``as_ptr`` / ``bs_ptr``: block scales ``[rows / GROUP_ROWS, K / GROUP]`` (``GROUP`` a multiple of 128,
    ``KIND`` as :func:`_block_scale`); ``ag_ptr`` / ``bg_ptr``: float32 global scales (``HAS_G*``);
    ``bias_ptr``: ``[N]`` (``HAS_BIAS``); ``out_ptr``: ``[M, N]`` rows ``stride_om`` apart."""
    n_m = gl.cdiv(M, 2 * WG_M)
    n_n = gl.cdiv(N, b_desc.block_type.shape[0])
    n_k = gl.cdiv(K, BK)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = ring_barriers(STAGES, 2)  # both consumer warpgroups free a slot
    gl.warp_specialize([
        (_consumer, (a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, ag_ptr, bg_ptr, bias_ptr, out_ptr, M, N, n_m, n_n,
                     n_k, stride_as, stride_bs, stride_om, 0, A_KIND, A_GROUP, A_GROUP_ROWS, B_KIND, B_GROUP,
                     B_GROUP_ROWS, HAS_GA, HAS_GB, HAS_BIAS, GROUP_M)),
        (_consumer, (a_bufs, b_bufs, ready, empty, as_ptr, bs_ptr, ag_ptr, bg_ptr, bias_ptr, out_ptr, M, N, n_m, n_n,
                     n_k, stride_as, stride_bs, stride_om, 1, A_KIND, A_GROUP, A_GROUP_ROWS, B_KIND, B_GROUP,
                     B_GROUP_ROWS, HAS_GA, HAS_GB, HAS_BIAS, GROUP_M)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, n_m, n_n, n_k, GROUP_M)),
    ], [4, 1], [232, 40])
