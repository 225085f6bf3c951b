"""Decode-path GEMV on tensor cores for E2M1 weights and bf16 activations (private).

Why: the f16x2 GEMV (:mod:`._gemv_kernels`) spends one ``fma.rn.f16x2`` per pair and
token, needs an activation-prep kernel (f16 range), and re-runs its FMAs per token group.
Here each warp feeds decoded weight pairs to ``mma.sync.m16n8k16`` (bf16 in, fp32
accumulate): up to 8 tokens per MMA (16 with two), products exact, sums in fp32, no prep.

Layout independence. Triton gives no control over which thread holds which tensor
element, while an MMA's operands are per lane. So every per-lane quantity is derived in
PTX from ``%tid.x``: the kernel works on tensors of one element per thread, computes each
lane's row / token / addresses from its own ``tid`` (elementwise, so the element stays in
its thread), and loads its operands inside PTX. The epilogue stores each accumulator at
the (row, token) its own thread computed, so the result is correct whatever layout
Triton picks.

Per warp: ``16 * RG`` weight rows (slot ``g`` = lane // 4 of the MMA's A rows holds row
``16 i + g``, slot ``g + 8`` row ``16 i + 8 + g``), ``4 * WPL`` int32 words of codes per
row per step, lane quad member ``t = lane % 4`` owning words ``[t * WPL, (t + 1) * WPL)``.
Word ``w`` (8 nibbles, element ``i`` in bits ``[4i, 4i+4)``) gives bf16x2 pairs ``(j, j+4)``
by bit placement (sign -> bit 15, magnitude -> bits 6..8: the element times 2^-126,
subnormal bf16 for 0.5), each multiplied in bf16 (exact: <= 6 significant bits) by its
block scale times ``2^k``:

* UE4M3 (NVFP4): ``S = s * 2^119`` (``cvt.rn.f16x2.e4m3x2`` is exact, then via f32),
  products ``v * s * 2^-7``; the epilogue multiplies by ``2^7``.
* E8M0 (MXFP4): ``S = 2^(e - 1 - D)`` as bf16 bits ``(e + 126 - D) << 7``; products
  ``v * 2^(e-127-D)`` stay normal for ``e`` in ``[D + 2, D + 128]`` (the caller picks D
  from the weight's scale range or uses the f16x2 GEMV); the epilogue multiplies by 2^D.

The B operand (column ``n`` = token ``n``; lane ``(g, t)`` supplies token ``g``) is the
activation pair ``(x[8w+j], x[8w+j+4])`` of the same words, one ``prmt`` per pair from a
16-byte load. Accumulator ``c0, c1`` of lane ``(g, t)`` are rows ``g`` and tokens
``2t, 2t+1``; ``c2, c3`` row ``g + 8``.
"""
from __future__ import annotations

import functools

import triton
import triton.language as tl

#: scale kinds served (the ``SK`` constexpr): E8M0 and UE4M3 block scales; ``SK_UE4M3N``: UE4M3 scales of a
#: weight scanned to hold no subnormal scale over a nonzero code and no sign bit
#: (:func:`microscale.linear.weight_state.ue4m3_normal`), made by one multiply-add (``b * 16 + 0x7780`` per half,
#: :data:`UE4M3_ADD`)
SK_E8M0, SK_UE4M3, SK_UE4M3N = 1, 2, 5
#: added to ``b << 4`` in each bf16 half (239 on the exponent field): the bf16 of ``s * 2^119`` for a normal
#: UE4M3 byte ``b``, in both halves
UE4M3_ADD = 0x77807780
#: f32 bits of 2^119 (UE4M3 scales are multiplied by it before the bf16 conversion)
_F32_2P119 = "0f7B000000"


@functools.lru_cache(maxsize=None)
def load_asm(rg: int, wpl: int, tg: int, sbytes: int, xstride: int = 16) -> tuple[str, str, int]:
    """PTX loading a lane's operands of one step: ``2 * rg * wpl`` code words (rows in
    slot order) and ``2 * rg`` scale words (the lane's ``sbytes`` scale bytes of each row,
    zero extended), then ``tg * wpl * 4`` activation words (``wpl`` 16-byte loads per
    token group, ``xstride`` bytes apart: 16 on x itself, 512 on fragment-ordered
    activations). Inputs: ``2 * rg`` code addresses, ``2 * rg`` scale addresses, ``tg``
    activation addresses (int64); ``rg`` or ``tg`` may be 0 (codes only / activations
    only). Returns (asm, constraints, outputs)."""
    nw, ns, nx = 2 * rg * wpl, 2 * rg, tg * wpl * 4
    nout = nw + ns + nx
    a_w, a_s, a_x = nout, nout + 2 * rg, nout + 4 * rg
    lines = []
    for r in range(2 * rg):
        for v in range(wpl // 4):
            o = r * wpl + 4 * v
            lines.append(f"ld.global.nc.v4.b32 {{${o}, ${o + 1}, ${o + 2}, ${o + 3}}}, [${a_w + r}+{16 * v}];")
    if rg:
        ty = {1: "u8", 2: "u16", 4: "u32"}[sbytes]
        for r in range(2 * rg):
            lines.append(f"ld.global.nc.{ty} ${nw + r}, [${a_s + r}];")
    for q in range(tg):
        for u in range(wpl):
            o = nw + ns + (q * wpl + u) * 4
            lines.append(f"ld.global.nc.v4.b32 {{${o}, ${o + 1}, ${o + 2}, ${o + 3}}}, [${a_x + q}+{xstride * u}];")
    cons = ",".join(["=r"] * nout + ["l"] * (4 * rg + tg))
    return "{\n" + "\n".join(lines) + "\n}", cons, nout


def _pair_lines(w: str, dst: str, j: int, scale: str) -> list[str]:
    """bf16x2 pair (elements j, j+4) of code word ``w`` times bf16x2 ``scale``."""
    sm = 6 - 4 * j  # magnitude bits 4j..4j+2 -> 6..8
    ss = 12 - 4 * j  # sign bit 4j+3 -> 15
    mag = f"shl.b32 m, {w}, {sm};" if sm > 0 else f"shr.u32 m, {w}, {-sm};"
    sgn = f"shl.b32 s, {w}, {ss};" if ss else f"mov.b32 s, {w};"
    return [mag, "and.b32 m, m, 0x01C001C0;", sgn, "and.b32 s, s, 0x80008000;", f"or.b32 {dst}, m, s;",
            f"mul.rn.bf16x2 {dst}, {dst}, {scale};"]


#: bf16x2 pair bits: magnitudes at 6..8 / 22..24, signs at 15 / 31
_PAIR_MASK = "0x81C081C0"


def _word_lines_select(w: str, dst: str, scale: str) -> list[str]:
    """The four bf16x2 pairs ``dst0..dst3`` of code word ``w`` (as :func:`_pair_lines`),
    11 integer ops instead of 15: each sign sits 3 bits above its magnitude in the
    nibble and 9 above it in the pair, so ``r = rotl(w, 6)`` carries every sign 6 bits up.
    One ``lop3`` select (LUT 0xE4: first input where the mask is set, second elsewhere) of
    the magnitudes of elements 0, 1, 4, 5 from ``w`` and the rest from ``r`` gives a word
    from which pairs (0, 4) and (1, 5) are one shift and the pair mask each; a second select
    (magnitudes of elements 2, 3, 6, 7 from ``w``: the signs they need from ``r``, at bits 17,
    21, 1 and 5, are none of those magnitudes) gives pairs (2, 6) and (3, 7) by right rotations
    by 2 and 6 (the signs of elements 6 and 7, wrapped to bits 1 and 5, land on 31)."""
    out = ["shf.l.wrap.b32 r, {0}, {0}, 6;".format(w),
           f"lop3.b32 z, {w}, r, 0x00770077, 0xE4;",
           f"shl.b32 {dst}0, z, 6;", f"and.b32 {dst}0, {dst}0, {_PAIR_MASK};",
           f"shl.b32 {dst}1, z, 2;", f"and.b32 {dst}1, {dst}1, {_PAIR_MASK};",
           f"lop3.b32 z, {w}, r, 0x77007700, 0xE4;",
           f"shf.r.wrap.b32 {dst}2, z, z, 2;", f"and.b32 {dst}2, {dst}2, {_PAIR_MASK};",
           f"shf.r.wrap.b32 {dst}3, z, z, 6;", f"and.b32 {dst}3, {dst}3, {_PAIR_MASK};"]
    return out + [f"mul.rn.bf16x2 {dst}{j}, {dst}{j}, {scale};" for j in range(4)]


@functools.lru_cache(maxsize=None)
def step_asm(rg: int, wpl: int, tg: int, wpg: int, sk: int) -> tuple[str, str]:
    """PTX of one step: decode, scale and ``mma.sync`` the operands :func:`load_asm`
    loaded, adding to ``4 * rg * tg`` fp32 accumulators (inputs after the operands, in
    (row group, token group, c0..c3) order; the outputs in the same order). E8M0 takes
    one more input: ``(126 - D) * 0x10001``."""
    nw, ns, nx = 2 * rg * wpl, 2 * rg, tg * wpl * 4
    na = 4 * rg * tg
    i_w, i_s, i_x, i_a = na, na + nw, na + nw + ns, na + nw + ns + nx
    i_ke = i_a + na
    nb = wpl // wpg  # blocks per lane per row and step (wpl is a multiple of wpg)
    regs = ["m", "s", "t", "sc", "r", "z"] + [f"S{r}_{b}" for r in range(2 * rg) for b in range(nb)]
    regs += [f"p{r}_{j}" for r in range(2) for j in range(4)]
    regs += [f"x{q}_{j}" for q in range(tg) for j in range(4)]
    accs = [f"e{z}_{i}_{q}_{c}" for z in range(2) for i in range(rg) for q in range(tg) for c in range(4)]
    body = [f".reg .b32 {', '.join(regs)};", ".reg .b16 lo, hi;", f".reg .f32 fa, fb, zf, {', '.join(accs)};",
            "mov.f32 zf, 0f00000000;"]
    # block scales -> bf16x2 (both halves equal) per row slot and block
    for i in range(rg):
        sa, sb = f"${i_s + 2 * i}", f"${i_s + 2 * i + 1}"
        for b in range(nb):
            if sk == SK_UE4M3N:
                body += [f"prmt.b32 t, {sa}, {sb}, {hex(b | ((4 + b) << 8))};", "and.b32 t, t, 0x00FF00FF;",
                         f"mad.lo.u32 sc, t, 16, {hex(UE4M3_ADD)};"]
            elif sk == SK_UE4M3:
                body += [f"prmt.b32 t, {sa}, {sb}, {hex(b | ((4 + b) << 4))};", "mov.b32 {lo, hi}, t;",
                         "cvt.rn.f16x2.e4m3x2 sc, lo;", "mov.b32 {lo, hi}, sc;", "cvt.f32.f16 fa, lo;",
                         "cvt.f32.f16 fb, hi;", f"mul.f32 fa, fa, {_F32_2P119};", f"mul.f32 fb, fb, {_F32_2P119};",
                         "cvt.rn.bf16x2.f32 sc, fb, fa;"]
            else:
                body += [f"prmt.b32 t, {sa}, {sb}, {hex(b | ((4 + b) << 8))};", "and.b32 t, t, 0x00FF00FF;",
                         f"add.u32 t, t, ${i_ke};", "shl.b32 sc, t, 7;"]
            body += [f"prmt.b32 S{2 * i}_{b}, sc, 0, 0x1010;", f"prmt.b32 S{2 * i + 1}_{b}, sc, 0, 0x3232;"]
    used = set()

    def acc(z: int, i: int, q: int) -> tuple[str, str]:
        d = ", ".join(f"e{z}_{i}_{q}_{c}" for c in range(4))
        if (z, i, q) in used:
            return d, d
        used.add((z, i, q))
        if z == 0:
            return d, ", ".join(f"${i_a + (i * tg + q) * 4 + c}" for c in range(4))
        return d, "zf, zf, zf, zf"

    def xr(q: int, u: int, j: int) -> str:  # activation pair (j, j+4) of word u, token group q
        return f"x{q}_{j}"

    for u in range(wpl):
        for q in range(tg):  # pair the 16 loaded bytes (elements 0..7) of each token group
            xb = i_x + (q * wpl + u) * 4
            for j in range(4):
                lo_src, hi_src = (xb, xb + 2) if j < 2 else (xb + 1, xb + 3)
                body.append(f"prmt.b32 x{q}_{j}, ${lo_src}, ${hi_src}, {'0x5410' if j % 2 == 0 else '0x7632'};")
        for i in range(rg):
            for ab in range(2):
                w = f"${i_w + (2 * i + ab) * wpl + u}"
                for j in range(4):
                    body += _pair_lines(w, f"p{ab}_{j}", j, f"S{2 * i + ab}_{u // wpg}")
            for q in range(tg):
                for h in range(2):
                    d, c = acc(u % 2, i, q)
                    body.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d}}}, "
                                f"{{p0_{2 * h}, p1_{2 * h}, p0_{2 * h + 1}, p1_{2 * h + 1}}}, "
                                f"{{{xr(q, u, 2 * h)}, {xr(q, u, 2 * h + 1)}}}, {{{c}}};")
    for i in range(rg):
        for q in range(tg):
            for c in range(4):
                o = (i * tg + q) * 4 + c
                body.append(f"add.f32 ${o}, e0_{i}_{q}_{c}, e1_{i}_{q}_{c};")
    cons = ",".join(["=f"] * na + ["r"] * (nw + ns + nx) + ["f"] * na + (["r"] if sk == SK_E8M0 else []))
    return "{\n" + "\n".join(body) + "\n}", cons


TID_ASM = tl.constexpr("mov.u32 $0, %tid.x;")


@triton.jit
def _addr(p):
    return p.to(tl.int64)


@triton.jit
def _load(ws, ss, xs, LASM: tl.constexpr, LCONS: tl.constexpr, NOUT: tl.constexpr):
    return tl.inline_asm_elementwise(LASM, LCONS, ws + ss + xs, dtype=(tl.int32,) * NOUT, is_pure=True, pack=1)


@triton.jit
def _sum_splits(accs, ws_ptr, cnt_ptr, tile, tiles, pid_k, e, NA: tl.constexpr, NW: tl.constexpr,
                SPLIT_K: tl.constexpr):
    """Split-K partials of one tile (``NA`` per-thread accumulators): each split stores its own in the
    workspace; the last split of ``tile`` to arrive (counter ``cnt_ptr[tile]``, zero on entry, reset to
    zero) gets their sum in split order (deterministic). Returns ``(sums or own partials, is last)``."""
    for ci in tl.static_range(NA):
        tl.store(ws_ptr + ((pid_k * tiles + tile).to(tl.int64) * NA + ci) * (32 * NW) + e, accs[ci])
    tl.debug_barrier()  # every partial of this program is stored before the release below
    last = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    if last:
        tot = ()
        for ci in tl.static_range(NA):
            v = tl.zeros([32 * NW], dtype=tl.float32)
            for sp in tl.static_range(SPLIT_K):  # split order: deterministic
                v += tl.load(ws_ptr + ((sp * tiles + tile).to(tl.int64) * NA + ci) * (32 * NW) + e,
                             cache_modifier=".cg")
            tot = tot + (v,)
        accs = tot
        tl.store(cnt_ptr + tile, 0)  # ready for the next call
    return accs, last


@triton.jit
def _load_at(ws, ss, off, RG: tl.constexpr, WPG: tl.constexpr, LASM: tl.constexpr, LCONS: tl.constexpr,
             NOUT: tl.constexpr):
    """Codes and scales of the ``2 * RG`` row slots ``off`` words past ``ws`` / ``ss``."""
    ws1 = ()
    ss1 = ()
    for r in tl.static_range(2 * RG):
        ws1 = ws1 + (ws[r] + off * 4,)
        ss1 = ss1 + (ss[r] + off // WPG,)
    return _load(ws1, ss1, (), LASM, LCONS, NOUT)


@triton.jit
def _after_wait(xs, first, TG: tl.constexpr):
    """``griddepcontrol.wait`` after ``first`` (a register of the first loads) is loaded, and ``xs`` made to
    depend on it: the activation loads are pure asm, which the compiler could otherwise hoist above a wait it
    sees no data flow through (the asm's output is zero, the compiler cannot know it)."""
    z = tl.inline_asm_elementwise("griddepcontrol.wait;\n\tmov.u32 $0, 0;", "=r,r", [first], dtype=tl.int32,
                                  is_pure=False, pack=1)
    out = ()
    for q in tl.static_range(TG):
        out = out + (xs[q] + z.to(tl.int64),)
    return out


@triton.jit
def _k_steps(ws, ss, xs, k0, ke, KW, KW_PER_SPLIT: tl.constexpr, RG: tl.constexpr, WPL: tl.constexpr,
             TG: tl.constexpr, WPG: tl.constexpr, SK: tl.constexpr, EVEN_K: tl.constexpr, LASM: tl.constexpr,
             LCONS: tl.constexpr, NOUT: tl.constexpr, XASM: tl.constexpr, XCONS: tl.constexpr, NXOUT: tl.constexpr,
             SASM: tl.constexpr, SCONS: tl.constexpr, NW: tl.constexpr, WAIT: tl.constexpr = False):
    """The K loop of one K range: ``ws`` / ``ss`` the lane's code and scale addresses of its ``2 * RG``
    row slots at word ``k0``, ``xs`` its activation addresses; returns the ``4 * RG * TG`` fp32
    accumulators. Codes and scales of step i+1 are loaded before step i's arithmetic (ptxas moves these
    loads to the loop's end; loading them ahead into L2 instead measured slower); the activations, L1/L2
    hits, in their own step (a register prefetch of them measured slower: registers). Without
    ``EVEN_K`` (K not a multiple of the range's steps) a lane whose words lie past the row (``KW`` words)
    reads the row's last ``WPL`` words again, in bounds, and zeroes its activations, so they add nothing.
    ``WAIT``: launched as a programmatic dependent whose activations the grid before writes: the first step's
    codes and scales are issued, then ``griddepcontrol.wait``, then the first activations (ptxas, which sees
    the wait's zero, may sink the weight loads below the wait; the activation loads stay after it)."""
    STEP: tl.constexpr = 4 * WPL  # words per row per step
    accs = ()
    for c in tl.static_range(4 * RG * TG):
        accs = accs + (tl.zeros([32 * NW], dtype=tl.float32),)
    last_w = KW - WPL - k0  # (words from k0 to the row's last WPL words)
    if EVEN_K:
        d = _load(ws, ss, (), LASM, LCONS, NOUT)
    else:
        d = _load_at(ws, ss, tl.minimum(0, last_w), RG, WPG, LASM, LCONS, NOUT)
    if WAIT:
        xs = _after_wait(xs, d[0], TG)
    for i in range(0, KW_PER_SPLIT, STEP):
        nxt = tl.minimum(i + STEP, KW_PER_SPLIT - STEP)  # the last step reloads itself
        if not EVEN_K:
            nxt = tl.minimum(nxt, last_w)  # words past the row: its last words again (zeroed activations)
        d2 = _load_at(ws, ss, nxt, RG, WPG, LASM, LCONS, NOUT)
        xi = i if EVEN_K else tl.minimum(i, last_w)
        xs1 = ()
        for q in tl.static_range(TG):
            xs1 = xs1 + (xs[q] + xi * 16,)  # bytes per word of the step
        dx = _load((), (), xs1, XASM, XCONS, NXOUT)
        if not EVEN_K:
            live = k0 + i < KW
            z = ()
            for v in tl.static_range(NXOUT):
                z = z + (tl.where(live, dx[v], 0),)
            dx = z
        if SK == 1:
            args = d + dx + accs + (tl.full([32 * NW], 0, tl.int32) + ke,)
        else:
            args = d + dx + accs
        accs = tl.inline_asm_elementwise(SASM, SCONS, args, dtype=(tl.float32,) * (4 * RG * TG), is_pure=True,
                                         pack=1)
        d = d2
    return accs


@triton.jit
def _gemv_mma_kernel(
    x_ptr, w_ptr, s_ptr, gs_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, ke,
    N, M, KW, stride_x, stride_w, stride_s, stride_o, post,
    KW_PER_SPLIT: tl.constexpr, RG: tl.constexpr, WPL: tl.constexpr, TG: tl.constexpr, WPG: tl.constexpr,
    SK: tl.constexpr, SPLIT_K: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    LASM: tl.constexpr, LCONS: tl.constexpr, NOUT: tl.constexpr, XASM: tl.constexpr, XCONS: tl.constexpr,
    NXOUT: tl.constexpr, SASM: tl.constexpr, SCONS: tl.constexpr, NW: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] W[n, k] (+ bias) for this program's rows, one element per
    thread (see the module notes). ``w_ptr``: int32 words of codes; ``s_ptr``: uint8
    scales; ``x_ptr``: bf16. Split-K: each program stores its fp32 partials in the
    workspace ``ws_ptr``; the last of a row tile's splits to arrive (counter ``cnt_ptr[pid_n]``,
    zero on entry, reset to zero) sums them in split order and writes ``out``. The K loop:
    :func:`_k_steps` (``KW`` words a row; ``EVEN_K``: the splits cover whole steps)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    e = tl.arange(0, 32 * NW)
    tid = tl.inline_asm_elementwise(TID_ASM, "=r,r", [e], dtype=tl.int32, is_pure=True, pack=1)
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    base = pid_n * (16 * RG * NW) + (tid // 32) * (16 * RG) + g
    k0 = pid_k * KW_PER_SPLIT + t * WPL  # this lane's first word
    ws = ()
    ss = ()
    for r in tl.static_range(2 * RG):
        row = tl.minimum(base + 8 * r, N - 1)  # slot order: (16i + g, 16i + 8 + g)
        ws = ws + (_addr(w_ptr + row.to(tl.int64) * stride_w + k0),)
        ss = ss + (_addr(s_ptr + row.to(tl.int64) * stride_s + k0 // WPG),)
    xs = ()
    for q in tl.static_range(TG):
        tok = tl.minimum(g + 8 * q, M - 1)
        xs = xs + (_addr(x_ptr + tok.to(tl.int64) * stride_x + k0 * 8),)
    accs = _k_steps(ws, ss, xs, k0, ke, KW, KW_PER_SPLIT, RG, WPL, TG, WPG, SK, EVEN_K, LASM, LCONS, NOUT, XASM,
                    XCONS, NXOUT, SASM, SCONS, NW)
    scale = post
    if HAS_GS:
        scale = scale * tl.load(gs_ptr)
    NA: tl.constexpr = 4 * RG * TG
    last = True
    if SPLIT_K > 1:
        accs, last = _sum_splits(accs, ws_ptr, cnt_ptr, pid_n, tl.num_programs(0), pid_k, e, NA, NW, SPLIT_K)
    if last:
        for ri in tl.static_range(RG):
            for qi in tl.static_range(TG):
                for ci in tl.static_range(4):
                    row = base + 16 * ri + 8 * (ci // 2)
                    tok = 8 * qi + 2 * t + (ci % 2)
                    ok = (row < N) & (tok < M)
                    v = accs[(ri * TG + qi) * 4 + ci] * scale
                    if HAS_BIAS:
                        v += tl.load(b_ptr + row, mask=ok, other=0.0).to(tl.float32)
                    tl.store(out_ptr + tok.to(tl.int64) * stride_o + row, v.to(out_ptr.dtype.element_ty), mask=ok)
