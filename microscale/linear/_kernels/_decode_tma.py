"""Tensor-core decode for 2-64 tokens on Hopper (E2M1, 4/8-bit integers with fp16 or E8M0 scales, MXFP8), in
Gluon (private).

Why: the Triton tensor-core decode kernel (:mod:`._gemv_mma`) stalls on its loads: each warp
loads its own code words and activations with ~2 steps in flight (ncu: 0.53 issued warps
per scheduler, half of the stalls on L1TEX). Here a producer warp brings every K step's
operands by TMA into a shared-memory ring several steps ahead, and the consumer warps only
decode and issue ``mma.sync``:

* work: the row tiles of ``ROWS`` (128, or 256 with two row slices per warp) weight rows, each ``NCT`` ring chunks of ``C`` K
  steps, in tile-major order; program ``p`` of ``P`` takes chunks ``[p T / P, (p + 1) T / P)``
  of the ``T`` (stream-K shares: whole tiles or equal parts of them where ``P`` divides, see
  :func:`microscale.linear.backends.decode_tma.choose_decode_tma_programs`);
* per ring chunk of ``C`` K steps of 64 (``BK``) the producer loads the tile's code words
  (``[ROWS, 8 CW]`` int32 boxes of the canonical layout, ``CW`` steps each), its block scales
  from a step-major copy made once per weight (:func:`microscale.linear.backends.decode_tma.step_scales`:
  ``[ROWS, 4]`` bytes a step, one per 16 elements; for integers with fp16 scales ``NPS``
  int32 per row and step, fp16 bits | zero point << 16; ``SW`` steps a box) and per step the
  activations (``[TOK, 64]``, ``TOK`` 8, 16, 32 or 64, rows past ``M`` zero-filled by TMA) into
  a slot of a ring of ``STAGES`` chunks (``ready`` / ``empty`` mbarriers);
* the ``ROWS / (16 SLICES)`` consumer warps take ``SLICES`` slices of 16 rows each (rows ``16 w`` and,
  with two slices, ``16 w + ROWS / 2``: the MMA layout's own repetition, so one read of a step's
  activation fragments serves both); every warp decodes its words with
  :func:`._prefill_gluon._decode` (the wgmma A register layout per warp is the ``mma.sync``
  one) and multiplies them by the ``TOK`` tokens (``m16n8k16``, tokens on the N side; the decode,
  most of the work, is the same for every ``TOK``);
* a tile shared by several programs is added up in K order, so results are deterministic: 256-row tiles
  by the tile's first program (its part ends that program's share; the later parts start theirs, store
  their sums to a workspace and signal through per-element counters with no atomic round trip), 128-row
  tiles by their last part to arrive (per-element counters as in the prefill's split tail);
* ``WARP_ARRIVE``: each consumer warp frees a slot on its own once it has read it (the ``empty``
  barriers count the consumer warps), without the partition-wide barriers Gluon puts before the
  ``mbarrier`` waits and arrives (a PTX rewrite, :mod:`._ptx`).

fp16 activations (``F16``): f16 decodes and fp16 MMAs, as in :mod:`._prefill_gluon`.
The activations are K-permuted as for :mod:`._prefill_gluon` (:func:`._prefill_gluon._xperm_kernel`).
Gluon kernels do not run under the Triton interpreter; CI compiles this one for sm_90 and
checks its structure and the scale repack; the GPU tests compare it with float64.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import _ptx
from ._prefill_gluon import (_SKS, _SKZ, ARRIVE2_ASM, ARRIVE2_CONS, ARRIVE4_ASM, ARRIVE4_CONS, BK, SIGNAL4_ASM,
                             SIGNAL4_CONS, WAIT4_ASM, _decode, code_word_layout, ring_barriers)


@gluon.jit
def _chunks(n_tiles, NCT: gl.constexpr):
    """This program's share ``[c0, c1)`` of the ``n_tiles x NCT`` ring chunks (tile-major):
    contiguous and within one chunk of equal across the programs (stream-K)."""
    P = gl.num_programs(0)
    p = gl.program_id(0)
    T = n_tiles * NCT
    return p * T // P, (p + 1) * T // P


@gluon.jit
def _signal(cnt_ptr, r, c0, c1, NCT: gl.constexpr, C: gl.constexpr):
    """The release of the share ``[c0, c1)``'s first tile, a later K part, to that tile's first program:
    its K steps added to this thread's counters of the tile (its rows ``r``, two 16-row slices) after one
    fence (:func:`._prefill_gluon.signal_asm`)."""
    ROWS: gl.constexpr = r.shape[0]
    t0 = c0 // NCT
    cnt = cnt_ptr + t0 * (ROWS * 4) + r * 4
    steps = gl.zeros_like(r) + (gl.minimum(c1, (t0 + 1) * NCT) - c0) * C
    gl.inline_asm_elementwise(SIGNAL4_ASM, SIGNAL4_CONS, [cnt, steps], dtype=gl.int32, is_pure=False, pack=4)


@gluon.jit
def _producer(w_desc, s_desc, x_desc, w_bufs, s_boxes, x_bufs, ready, empty, n_tiles, NCT: gl.constexpr,
              C: gl.constexpr, NPS: gl.constexpr, CB: gl.constexpr):
    """One warp: TMA of every chunk (``C`` K steps: codes, scales, activations) of the
    program's chunk range into the ring, running ahead across tile boundaries."""
    STAGES: gl.constexpr = ready.shape[0]
    ROWS: gl.constexpr = w_bufs.shape[1]
    CW: gl.constexpr = w_bufs.shape[2] // (2 * CB)  # K steps per code box (2 CB code words a step)
    SR: gl.constexpr = NPS * ROWS // 64  # 256-byte rows of scales per K step
    HALF: gl.constexpr = len(s_boxes.shape) == 5  # the 256-row table read by 128-row tiles (_decode_tma_kernel)
    SW: gl.constexpr = s_boxes.shape[1] if HALF else s_boxes.shape[1] // SR  # K steps per scale box
    c0, c1 = _chunks(n_tiles, NCT)
    it = 0
    for ch in range(c0, c1):
        tile = ch // NCT
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)  # slots start out free
        bar = ready.index(slot)
        mbarrier.expect(bar, (C // CW) * w_desc.block_type.nbytes + (C // SW) * s_desc.block_type.nbytes +
                        C * x_desc.block_type.nbytes)
        step0 = (ch % NCT) * C
        for cb in gl.static_range(C // CW):
            tma.async_copy_global_to_shared(w_desc, [tile * ROWS, (step0 + cb * CW) * (2 * CB)], bar,
                                            w_bufs.index(slot * (C // CW) + cb))
        for cb in gl.static_range(C // SW):
            if HALF:  # step rows of 256-row tile tile // 2, its half tile % 2
                tma.async_copy_global_to_shared(s_desc, [(tile // 2) * (NCT * C) + step0 + cb * SW, tile % 2, 0, 0],
                                                bar, s_boxes.index(slot * (C // SW) + cb))
            else:
                tma.async_copy_global_to_shared(s_desc, [(tile * (NCT * C) + step0 + cb * SW) * SR, 0], bar,
                                                s_boxes.index(slot * (C // SW) + cb))
        for cs in gl.static_range(C):
            step = step0 + cs
            tma.async_copy_global_to_shared(x_desc, [0, step * BK], bar, x_bufs.index(slot * C + cs))
        it += 1


@gluon.jit
def _consumer(w_bufs, s_bufs, x_bufs, ready, empty, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, N, M, n_tiles, maxp,
              ke, post, NCT: gl.constexpr, C: gl.constexpr, SK: gl.constexpr, HAS_GS: gl.constexpr,
              HAS_BIAS: gl.constexpr, NPS: gl.constexpr, CB: gl.constexpr, POST: gl.constexpr,
              EI: gl.constexpr, F16: gl.constexpr, WARP_ARRIVE: gl.constexpr, SLICES: gl.constexpr,
              OWNER: gl.constexpr):
    """``NW = ROWS / (16 SLICES)`` warps, ``SLICES`` slices of 16 rows each (rows ``16 w + 16 NW j``). Per
    chunk: wait for its slot, decode and ``mma.sync`` its ``C`` steps, free the slot (``POST``: see
    :func:`_decode_tma_kernel`). Per tile it touches: the epilogue (a shared tile's part to the workspace;
    the tile's last part adds the parts in K order and stores)."""
    STAGES: gl.constexpr = ready.shape[0]
    ROWS: gl.constexpr = w_bufs.shape[1]
    WPS: gl.constexpr = 2 * CB  # code words per row and K step: 8 (4-bit codes) or 16 (8-bit)
    CW: gl.constexpr = w_bufs.shape[2] // WPS
    NW: gl.constexpr = ROWS // (16 * SLICES)  # consumer warps
    gl.static_assert((SLICES == 1) | (SLICES == 2), "one or two 16-row slices per consumer warp")
    gl.static_assert((SLICES == 2) | (OWNER == False), "first-program sums: 256-row tiles (two slices) only")  # noqa: E712
    gl.static_assert((NW == 4) | (NW == 8), "4 or 8 consumer warps")
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma_l, k_width=2)
    if NW == 4:
        wb3: gl.constexpr = [[16, 0, 0], [32, 0, 0]]
    else:
        wb3: gl.constexpr = [[16, 0, 0], [32, 0, 0], [64, 0, 0]]
    # a warp's further row slices (SLICES 2: rows + 16 NW) sit in registers, as the MMA layout repeats them
    reps: gl.constexpr = [16 * NW] if SLICES == 2 else []
    # code words [rows, WPS] as loaded, and [rows, t, a] as _decode takes them (word (WPS / 4) t + a)
    w2_l: gl.constexpr = code_word_layout(ROWS, wb3, CB, False, reps)
    w_l: gl.constexpr = code_word_layout(ROWS, wb3, CB, True, reps)
    s_l: gl.constexpr = gl.SliceLayout(2, w_l)
    s32_sl: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    s_zero = gl.full([ROWS, 4], 0, gl.int32, s_l)
    tq = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, s_l)), 0)
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_l))
    if WARP_ARRIVE:  # the PTX rewrite (._ptx): no partition barriers, each warp frees a slot
        r = _ptx.marker(r)
    TOK: gl.constexpr = x_bufs.shape[1]  # token columns: 8, 16, 32 or 64
    c = gl.arange(0, TOK, layout=gl.SliceLayout(0, mma_l))
    TILE: gl.constexpr = ROWS * TOK
    elem = r[:, None] * TOK + c[None, :]
    P = gl.num_programs(0)
    T = n_tiles * NCT
    c0, c1 = _chunks(n_tiles, NCT)
    # Shared tiles, OWNER (256-row tiles, all programs resident): only the first tile of a share can start
    # inside a tile (a later K part, stored to the workspace and signalled to the tile's first program), only
    # the last can stop inside one (the tile's first part, which waits for the later ones and adds them). The
    # signal's fence waits for the stores, so it goes out after one chunk of the next tile, and before any
    # wait of this program.
    # Else (128-row tiles, often cut in 3-5 parts, two programs per SM; or more programs than fit at once,
    # where a wait could block the SM that a later part needs) the last part to arrive adds them up.
    pend = c0 - c0  # 1 while that signal is due (_signal recomputes its counters and steps: registers)
    it = 0
    for tile in range(c0 // NCT, (c1 - 1) // NCT + 1):  # the tiles this program's chunks touch
        k0 = gl.maximum(c0, tile * NCT)  # the tile's chunks [k0, k1) are this program's
        k1 = gl.minimum(c1, (tile + 1) * NCT)
        acc = gl.zeros([ROWS, TOK], gl.float32, mma_l)
        zero = gl.zeros([ROWS, TOK], gl.float32, mma_l)
        for ch in range(k0, k1):
            slot = it % STAGES
            mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
            for cs in gl.static_range(C):
                wbuf = w_bufs.index(slot * (C // CW) + cs // CW).slice((cs % CW) * WPS, WPS, dim=1)
                words = gl.convert_layout(gl.reshape(wbuf.load(w2_l), [ROWS, 4, WPS // 4]), w_l, assert_trivial=True)
                sb = s_bufs.index(slot * C + cs)
                if SK == _SKZ or SK == _SKS:  # NPS int32 per row and step: fp16 scale bits | zero point << 16
                    sraw = s_zero
                    for j in gl.static_range(NPS):  # quad member t takes block t // (4 / NPS) of the step
                        sv = sb.slice(j * (ROWS // 64), ROWS // 64, dim=0)._reinterpret(gl.int32, [ROWS], s32_sl)
                        sv = gl.expand_dims(sv.load(gl.SliceLayout(1, s_l)), 1) + s_zero
                        sraw = sv if j == 0 else gl.where(tq // (4 // NPS) == j, sv, sraw)
                else:
                    sraw = sb.reshape([ROWS, 4]).load(s_l).to(gl.int32)
                b = x_bufs.index(slot * C + cs).permute((1, 0)).load(b_l)
                if POST:  # one block per row and step: (code - z) @ x (exact products, fp32 sums), times the scale
                    sv = sb.slice(0, ROWS // 64, dim=0)._reinterpret(gl.int32, [ROWS], s32_sl)
                    srow = (sv.load(gl.SliceLayout(1, mma_l)) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True)
                    part = mma_v2(_decode(words, sraw, ke, SK, s_l, a_l, CB, True, EI, F16), b, zero)
                    acc = gl.fma(part, gl.expand_dims(srow.to(gl.float32), 1), acc)
                else:
                    acc = mma_v2(_decode(words, sraw, ke, SK, s_l, a_l, CB, False, EI, F16), b, acc)
            mbarrier.arrive(empty.index(slot), count=1)
            it += 1
            if OWNER:
                if (ch == k0) & (pend != 0):  # one chunk after the stores
                    _signal(cnt_ptr, r, c0, c1, NCT, C)
                    pend = pend * 0
        ok = gl.full([ROWS, 1], 1, gl.int1, mma_l)
        if not OWNER:
            if (k0 != tile * NCT) | (k1 != (tile + 1) * NCT):
                # a part of the tile: to the workspace, slot (tile, this program - the tile's first);
                # the tile's last part to arrive (per row and thread) adds all parts in K order
                pf = ((tile * NCT + 1) * P - 1) // T
                pl = ((tile + 1) * NCT * P - 1) // T
                gl.store(ws_ptr + (tile * maxp + gl.program_id(0) - pf) * TILE + elem, acc)
                z = gl.full([ROWS], 0, gl.int32, gl.SliceLayout(1, mma_l))
                # one release fence for the thread's 2 SLICES rows (pack: all of them in one asm)
                last = gl.inline_asm_elementwise(ARRIVE4_ASM if SLICES == 2 else ARRIVE2_ASM,
                                                 ARRIVE4_CONS if SLICES == 2 else ARRIVE2_CONS,
                                                 [cnt_ptr + tile * (ROWS * 4) + r * 4, z + (k1 - k0) * C, z + NCT * C],
                                                 dtype=gl.int32, is_pure=False, pack=2 * SLICES)
                ok = gl.expand_dims(last, 1) != 0
                lm = gl.broadcast(ok, acc)[0]
                acc = gl.zeros_like(acc)
                for q in range(pl - pf + 1):
                    acc += gl.load(ws_ptr + (tile * maxp + q) * TILE + elem, mask=lm, other=0.0, cache_modifier=".cg")
        elif k0 != tile * NCT:  # a later K part: to the workspace, slot (tile, this program - the tile's first)
            pf = ((tile * NCT + 1) * P - 1) // T
            gl.store(ws_ptr + (tile * maxp + gl.program_id(0) - pf) * TILE + elem, acc)
            ok = gl.full([ROWS, 1], 0, gl.int1, mma_l)
            pend = pend * 0 + 1
        elif k1 != (tile + 1) * NCT:  # the tile's first part: the later ones added to it in K order
            if pend != 0:
                _signal(cnt_ptr, r, c0, c1, NCT, C)
                pend = pend * 0
            pl = ((tile + 1) * NCT * P - 1) // T
            steps = gl.zeros_like(r) + (NCT - (k1 - k0)) * C  # the later parts'
            done = gl.inline_asm_elementwise(WAIT4_ASM, SIGNAL4_CONS, [cnt_ptr + tile * (ROWS * 4) + r * 4, steps],
                                             dtype=gl.int32, is_pure=False, pack=4)
            lm = gl.broadcast(gl.expand_dims(done, 1) != 0, acc)[0]  # (the loads depend on the wait)
            for q in range(1, pl - gl.program_id(0) + 1):
                acc += gl.load(ws_ptr + (tile * maxp + q) * TILE + elem, mask=lm, other=0.0, cache_modifier=".cg")
        scale = post
        if HAS_GS:
            scale = scale * gl.load(gs_ptr)
        r_o = tile * ROWS + r
        v = acc * scale
        if HAS_BIAS:
            v += gl.load(b_ptr + r_o, mask=r_o < N, other=0.0).to(gl.float32)[:, None]
        okm = ok & (r_o < N)[:, None] & (c < M)[None, :]
        gl.store(out_ptr + c[None, :].to(gl.int64) * N + r_o[:, None], v.to(out_ptr.dtype.element_ty), mask=okm)
    if OWNER:
        if pend != 0:  # a share inside one tile: its signal at the end
            _signal(cnt_ptr, r, c0, c1, NCT, C)


@gluon.jit
def _decode_tma_kernel(w_desc, s_desc, x_desc, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, N, M, n_tiles, maxp, ke,
                       post, NCT: gl.constexpr, C: gl.constexpr, SK: gl.constexpr, STAGES: gl.constexpr,
                       HAS_GS: gl.constexpr, HAS_BIAS: gl.constexpr, NPS: gl.constexpr = 1, CB: gl.constexpr = 4,
                       POST: gl.constexpr = False, EI: gl.constexpr = 0, F16: gl.constexpr = False,
                       WARP_ARRIVE: gl.constexpr = False, SLICES: gl.constexpr = 1, OWNER: gl.constexpr = False):
    """``out[M <= TOK, N] = x @ dequant(W)^T (+ bias)``. ``w_desc``: TMA descriptor of the
    int32 code words ``[N, K CB / 32]`` (``CB``: 4-bit codes, or 8; block ``[ROWS, 2 CB CW]``,
    ``CW`` dividing ``C``);
    ``s_desc``: of the step-major scales (block ``[SW NPS ROWS / 64, 256]`` bytes, ``SW`` steps
    dividing ``C``; ``NPS`` = 1 but for int4 weights with blocks of 32, 2: their ``[NPS, ROWS]``
    int32 a step); ``x_desc``: of the K-permuted activations ``[M, K]`` (block ``[TOK, 64]``,
    ``TOK`` 8, 16, 32 or 64). ``NCT`` chunks of ``C`` steps per row tile, shared out over the
    programs (module docstring). ``SK`` / ``ke`` / ``post``: as :mod:`._prefill_gluon`. Partial
    sums of shared tiles in ``ws_ptr`` (``tiles x maxp x ROWS x TOK`` floats, ``maxp`` the most
    programs sharing a tile), int32 counters ``cnt_ptr`` (``ROWS x 4`` per tile; zero on entry,
    left zero). ``EI``: the element kind under E8M0 scales (:func:`._prefill_gluon._decode`). ``POST`` (integers with fp16
    scales, one block per row and K step, ``NPS`` = 1): each
    step's codes go to the MMA as the exact ``code - z`` and its fp32 result is multiplied by the
    row's fp16 scale (one ``fma`` per accumulator element instead of two bf16 ops per weight pair).
    ``F16``: fp16 activations and output, f16 decodes and fp16 MMAs (:func:`._prefill_gluon._decode`).
    ``SLICES``: 16-row slices per consumer warp (1, or 2: ``ROWS / 32`` warps, each reading a step's
    activation fragments once for both slices); launched with ``ROWS / (16 SLICES)`` warps. ``OWNER``
    (``SLICES`` 2, every program resident at once): a shared tile's first program adds the later parts,
    which signal without an atomic round trip; else its last part to arrive adds them all."""
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    CW: gl.constexpr = w_desc.block_type.shape[1] // (2 * CB)  # K steps per code box (2 CB code words a step)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES * (C // CW), ROWS, 2 * CB * CW], w_desc.layout)
    SR: gl.constexpr = NPS * ROWS // 64  # 256-byte rows of scales per K step
    if len(s_desc.block_type.shape) == 4:
        # the step-major table of 256-row tiles ([tiles256 x steps, 2, 2, 256] bytes: a step's rows 0-127
        # then 128-255) read by 128-row tiles: box [SW, 1, 2, 256] = the bytes of a [2 SW, 256] box of
        # their own table, so one table serves both tile heights (tuning.dt_one_table)
        gl.static_assert((ROWS == 128) & (NPS == 1), "the 256-row table serves 128-row tiles of byte scales")
        SW: gl.constexpr = s_desc.block_type.shape[0]
        s_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES * C, SR, 256],
                                           gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2))
        s_boxes = s_bufs._reinterpret(gl.uint8, [STAGES * C // SW, SW, 1, 2, 256], s_desc.layout)
    else:
        SW: gl.constexpr = s_desc.block_type.shape[0] // SR  # K steps per scale box: 1 or C
        s_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES * C, SR, 256], s_desc.layout)
        s_boxes = s_bufs._reinterpret(gl.uint8, [STAGES * C // SW, SW * SR, 256], s_desc.layout)
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * C, x_desc.block_type.shape[0], BK], x_desc.layout)
    ready, empty = ring_barriers(STAGES, ROWS // (16 * SLICES) if WARP_ARRIVE else 1)
    gl.warp_specialize([
        (_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, N, M, n_tiles,
                     maxp, ke, post, NCT, C, SK, HAS_GS, HAS_BIAS, NPS, CB, POST, EI, F16, WARP_ARRIVE, SLICES,
                     OWNER)),
        (_producer, (w_desc, s_desc, x_desc, w_bufs, s_boxes, x_bufs, ready, empty, n_tiles, NCT, C, NPS, CB)),
    ], [1], [40])


__all__: list = []
