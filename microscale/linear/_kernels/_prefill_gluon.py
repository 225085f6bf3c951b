"""Warp-specialized prefill for 4-bit, E4M3 and 8-bit integer weights on Hopper, in Gluon (private).

Why: the Triton prefill kernel (:mod:`._linear_kernels`, ``swap`` + ``pair``) reaches
0.78x cuBLAS bf16 at 4096 tokens (this kernel: 0.79-0.93x in short timings;
docs/decisions/linear-prefill-ws.md). Its sm_90 SASS shows where the time goes besides the MMAs: the decoded
weight tile makes a round trip through shared memory per 16-element K slice
(``STS.128`` + ``LDSM``) to reach the wgmma register-operand layout, the block
scales are re-laid-out through shared memory behind two CTA barriers per K step, and one
more CTA barrier per step orders the software pipeline. Gluon states layouts explicitly,
so here:

* a 1-warp producer streams the activation tiles with TMA into a ring of ``STAGES``
  shared-memory slots (``ready`` / ``empty`` mbarriers, no CTA barrier);
* two consumer warpgroups (64 weight rows each) load their own code words straight from
  global memory into registers, in a layout chosen so that the select decode
  (:func:`._gemv_mma._word_lines_select`: bf16x2 pairs times the block scale) lands every
  value in the thread and register the wgmma A operand wants: the final
  ``convert_layout`` is asserted trivial at compile time;
* ``warpgroup_mma`` takes the weights from registers and the activations from the ring
  (tokens on the MMA's N side: the tile is ``out^T``), one group in flight;
* one persistent program per SM; the last partial wave of tiles is split in K into parts
  that run side by side (:func:`_plan`), added up by each tile's last part.

The price of loading codes in A-operand order is a K permutation of the activations: in
each 64-element K chunk the MMA's K slot ``16 j + 8 a + 2 t + e`` holds physical element
``16 t + 8 a + j + 4 e`` (thread quad member ``t`` owns code words ``2t, 2t+1`` of its
rows; word ``a`` gives pairs ``(j, j+4)``). :func:`_xperm_kernel` writes the activations in
that order (one extra pass over x: ~1% of a 4096-token call), the weight keeps its
canonical layout.

4-bit integer weights with fp16 block scales (affine ``int4_affine_g*``: ``(code - z) * s``;
symmetric ``int4_fp16``) take the same layout and K order: :func:`int4_decode_asm` places each
nibble pair under the bf16 exponent of 128 (pairs ``(j, j+4)`` as for E2M1), one exact
``sub.bf16x2`` of ``128 + z`` leaves ``code - z``, and the fp16 scale, split into a bf16 ``hi``
(its top 8 significant bits) and an exact bf16 ``lo`` (the other 3), gives
``fma(d, hi, d * lo)``: ``d * lo`` is exact (<= 4 + 3 bits), so the one rounding of the fma
makes the bf16 of ``d * s``, the reference dequantization rounded once. Block sizes of any
multiple of 16 (a thread's 16 elements of a row never straddle a block).

8-bit E4M3 codes with E8M0 scales (MXFP8, ``CB`` = 8): a thread owns 4 code words (16 bytes) of
each row and step; word ``a``'s pair ``h`` (bytes ``2 h``, ``2 h + 1``) fills K slots
``16 a + 8 h + 2 t + {0, 1}`` (:func:`e4m3_decode_asm`; :func:`_xperm_kernel` with ``CB=8``).
8-bit integers take the same layout (:func:`int8_decode_asm`: each byte under the bf16 exponent of
128, its top bit apart, two exact subtractions): with E8M0 scales (MXINT8, ``EI``) the products are
exact; with fp16 scales (``int8_fp16``, ``int8_affine_g*``) the ``hi`` / ``lo`` split leaves a weight
the bf16 of ``(code - z) * s`` except within 2^-15 (relative) of a rounding tie.

fp16 activations (``F16``) take the same kernel with f16 decodes (:func:`f16_decode_asm`: E2M1 as
``v * 2^-14`` by the one-token GEMV's select decode, E4M3 / E5M2 by ``cvt``, integers under the f16
exponent of 1024, then one ``mul.f16x2`` by the block scale) and fp16 MMAs: the weights exact (E8M0
scales within an f16 window per element kind, ``microscale.linear.eligibility.E8M0_F16_WINDOW``; UE4M3 scales
always), or for fp16 scales the f16 of ``(code - z) * s``; the K order is the same.

``ms.linear`` routes NVFP4 / MXFP4, those integer weights, MXFP8 and MXINT8 here from ``tuning.prefill_ws_min_m``
(65) tokens (8-bit codes from ``tuning.prefill_ws_min_m_8bit``, 33, but integers with fp16 scales in blocks of 32)
(H200 timings: docs/decisions/linear-prefill-ws.md). Gluon kernels do not run under
the Triton interpreter; CI compiles this one for sm_90 and checks its structure and its
decode (``tests/kernels/test_prefill_gluon.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ._gemv_mma import SK_E8M0, SK_UE4M3, UE4M3_ADD, _word_lines_select

#: scale kinds of the integer weights with fp16 scales (``SK``): fp16 scale and uint8 zero point per
#: block (unsigned codes), fp16 scale alone (two's-complement codes)
SK_F16Z, SK_F16 = 3, 4
_SKZ = gl.constexpr(SK_F16Z)  # (as the kernels see them)
_SKS = gl.constexpr(SK_F16)

#: weight rows per consumer warpgroup (the wgmma M) and per program (two consumers)
WG_ROWS = gl.constexpr(64)
#: K elements per step (one ring slot): 4 wgmma K slices of 16; 2 (4-bit) or 4 (8-bit) code words per thread and row
BK = gl.constexpr(64)
#: tail split: at most this many K parts per tile
MAX_SPLIT = gl.constexpr(8)


@triton.jit
def _xperm_kernel(x_ptr, xp_ptr, M, stride_x, K: tl.constexpr, BLOCK_R: tl.constexpr, CB: tl.constexpr = 4,
                  rows_ptr=None, gather_div=1, GATHER: tl.constexpr = False):
    """x [M, K] -> xp [M, K] in the consumers' K order: in each 64-element chunk, element
    ``16 t + 8 a + j + 4 e`` goes to slot ``16 j + 8 a + 2 t + e`` (4-bit codes, ``CB`` 4), or
    element ``16 t + 4 a + 2 h + e`` to slot ``16 a + 8 h + 2 t + e`` (8-bit codes). One program
    per ``BLOCK_R`` rows and 64-element chunk. ``GATHER``: row ``r`` of xp is row ``rows[r] // gather_div``
    of x (the MoE routing gather; ``M`` rows of xp)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1)
    ok = (r < M)[:, None]
    if GATHER:
        src = tl.load(rows_ptr + r, mask=r < M, other=0).to(tl.int64) // gather_div
    else:
        src = r.to(tl.int64)
    v = tl.load(x_ptr + src[:, None] * stride_x + c * 64 + tl.arange(0, 64)[None, :], mask=ok)
    if CB == 8:
        v = tl.permute(tl.reshape(v, [BLOCK_R, 4, 4, 2, 2]), (0, 2, 3, 1, 4))  # (t, a, h, e) -> (a, h, t, e)
    else:
        v = tl.permute(tl.reshape(v, [BLOCK_R, 4, 2, 2, 4]), (0, 4, 2, 1, 3))  # (t, a, e, j) -> (j, a, t, e)
    tl.store(xp_ptr + r[:, None].to(tl.int64) * K + c * 64 + tl.arange(0, 64)[None, :],
             tl.reshape(v, [BLOCK_R, 64]), mask=ok)


def decode_asm() -> str:
    """PTX: code word ``$8`` and bf16x2 scale ``$9`` -> 8 bf16 outputs, ``$2j`` / ``$2j+1``
    the elements ``j`` / ``j+4`` of the word times the scale (see :func:`_word_lines_select`)."""
    lines = _word_lines_select("$8", "p", "$9")
    lines += [f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, p{j};" for j in range(4)]
    return "{\n.reg .b32 r, z, m, s, p0, p1, p2, p3;\n" + "\n".join(lines) + "\n}"


DECODE_ASM = gl.constexpr(decode_asm())


#: UE4M3 scale byte ``$1`` -> bf16x2 ``s * 2^119`` in both halves (``cvt.rn.f16x2.e4m3x2`` is exact;
#: the f32 product is exact and fits bf16: at most 4 significant bits, at most 448 * 2^119)
UE4M3_ASM = gl.constexpr("{\n.reg .b16 lo, hi;\n.reg .b32 sc;\n.reg .f32 fa;\ncvt.u16.u32 lo, $1;\n"
             "cvt.rn.f16x2.e4m3x2 sc, lo;\nmov.b32 {lo, hi}, sc;\ncvt.f32.f16 fa, lo;\n"
             "mul.f32 fa, fa, 0f7B000000;\ncvt.rn.bf16x2.f32 $0, fa, fa;\n}")
#: E8M0 scale byte ``$1`` and ``$2`` = ``ke`` -> bf16x2 ``2^(e + ke - 127)`` in both halves (bf16 bits
#: ``(e + ke) << 7``; ``ke``: ``126 - D`` for E2M1, ``120 - D'`` for E4M3, ``120 - D`` for E5M2, ``-D`` for
#: integers: :func:`microscale.linear.backends.prefill_ws.gluon_scale_args`)
E8M0_ASM = gl.constexpr("{\n.reg .b32 t;\nadd.u32 t, $1, $2;\nshl.b32 t, t, 7;\nprmt.b32 $0, t, 0, 0x1010;\n}")


def e4m3_decode_asm(mbits: int = 3) -> str:
    """PTX: E4M3 code word ``$4`` (element ``i`` in byte ``i``) and bf16x2 scale ``$5`` -> 4 bf16
    outputs ``$0..$3``, element ``i`` times the scale times ``2^-120``: each byte's sign to bit
    15 and its 7 exponent|mantissa bits to bits 4..10 of a bf16 (subnormals included; NaN codes
    are not decoded: :func:`microscale.linear.prefill_ws` refuses weights holding them).
    ``mbits=2``: E5M2 codes, their 7 bits to bits 5..11, times ``2^-112`` (no Inf / NaN either)."""
    sh = mbits + 1  # E4M3: bits 14..8 of the half down 4 to 10..4; E5M2: down 3 to 11..5
    mask = (0x7F << (8 - sh)) * 0x10001
    lines = []
    for h, sel in ((0, "0x1404"), (1, "0x3424")):  # bytes (0, 1) / (2, 3) to the high bytes of the halves
        lines += [f"prmt.b32 x, $4, 0, {sel};", f"shr.u32 m, x, {sh};", f"and.b32 m, m, 0x{mask:08X};",
                  "lop3.b32 x, x, 0x80008000, m, 0xEA;", f"mul.rn.bf16x2 p{h}, x, $5;",
                  f"mov.b32 {{${2 * h}, ${2 * h + 1}}}, p{h};"]
    return "{\n.reg .b32 x, m, p0, p1;\n" + "\n".join(lines) + "\n}"


E4M3_DECODE_ASM = gl.constexpr(e4m3_decode_asm())
E5M2_DECODE_ASM = gl.constexpr(e4m3_decode_asm(2))


def int4_decode_asm(signed: bool, scale: str = "f16") -> str:
    """PTX: 4-bit integer code word ``$8`` -> 8 bf16 outputs, ``$2j`` / ``$2j+1`` the
    elements ``j`` / ``j+4`` of the word. ``signed``: two's-complement codes (the word XORed with
    0x88888888 first: ``code + 8``, with ``z = 8``). Operands after the word, by ``scale`` (as
    :func:`int8_decode_asm`):

    * ``"f16"``: ``$9`` / ``$10`` bf16x2 ``hi`` / ``lo`` of the block scale, ``$11`` bf16x2
      ``128 + z`` (see :data:`F16Z_SCALE_ASM`): ``(code - z) * s`` rounded once;
    * ``"none"``: ``$9`` bf16x2 ``128 + z``: the exact ``code - z`` (for a kernel that applies the
      block scale to the MMA's fp32 result: ``decode_tma`` with one block per K step);
    * ``"bf16"`` (signed codes, MXINT4): the exact code times ``$9``, a bf16x2 power of two."""
    assert scale in ("f16", "none", "bf16") and (signed or scale != "bf16")
    kz = {"f16": "$11", "none": "$9", "bf16": "k"}[scale]
    lines = ["mov.b32 k, 0x43084308;"] if scale == "bf16" else []  # bf16x2 128 + 8 (bf16x2 ops take no immediates)
    w = "$8"
    if signed:
        lines.append("xor.b32 w, $8, 0x88888888;")
        w = "w"
    for j in range(4):
        src = w
        if j:
            lines.append(f"shr.u32 m, {w}, {4 * j};")
            src = "m"
        # (src & 0x000F000F) | 0x43004300: the nibbles j, j+4 as bf16 128 + code (exact)
        lines.append(f"lop3.b32 m, {src}, 0x000F000F, 0x43004300, 0xEA;")
        if scale == "none":
            lines.append(f"sub.rn.bf16x2 p{j}, m, {kz};")
        else:
            lines.append(f"sub.rn.bf16x2 m, m, {kz};")
            lines += ([f"mul.rn.bf16x2 p{j}, m, $9;"] if scale == "bf16" else
                      [f"mul.rn.bf16x2 p{j}, m, $10;", f"fma.rn.bf16x2 p{j}, m, $9, p{j};"])
    lines += [f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, p{j};" for j in range(4)]
    return "{\n.reg .b32 w, m, k, p0, p1, p2, p3;\n" + "\n".join(lines) + "\n}"


INT4Z_DECODE_ASM = gl.constexpr(int4_decode_asm(False))
INT4S_DECODE_ASM = gl.constexpr(int4_decode_asm(True))
INT4Z_CODE_ASM = gl.constexpr(int4_decode_asm(False, "none"))
INT4S_CODE_ASM = gl.constexpr(int4_decode_asm(True, "none"))
INT4S_E8M0_ASM = gl.constexpr(int4_decode_asm(True, "bf16"))


def int8_decode_asm(signed: bool, scale: str) -> str:
    """PTX: 8-bit integer code word ``$4`` (element ``i`` in byte ``i``) -> 4 bf16 outputs, ``$2h``
    / ``$2h+1`` the elements ``2h`` / ``2h+1`` (the K order of :func:`e4m3_decode_asm`). Each byte
    goes under the bf16 exponent of 128 (``prmt``): its low 7 bits as ``128 + (b & 127)``, its top
    bit as 128 or 256 (``256 - 128 b7`` for unsigned codes); one exact ``sub`` leaves the
    two's-complement value (signed) or ``u - 128`` (unsigned), one more the zero point. Operands
    after the word, by ``scale``:

    * ``"none"``: ``$5`` bf16x2 ``z - 128`` (unsigned; unused when signed): the exact ``code - z``
      (for :mod:`._decode_tma`'s scale after the MMA);
    * ``"bf16"``: ``$5`` the bf16x2 scale (an E8M0 power of two: the products are exact);
    * ``"f16"``: ``$5`` / ``$6`` bf16x2 ``hi`` / ``lo`` of an fp16 scale (:data:`F16Z_SCALE_ASM`),
      ``$7`` bf16x2 ``z - 128``: ``fma(d, hi, d * lo)``. With up to 8 significant bits in ``d`` the
      product ``d * lo`` is rounded (``|lo| < 2^-7 |s|``: an error below 2^-15 of ``d * s``), so a
      weight is the bf16 of ``(code - z) * s`` except where that lies within 2^-15 of a rounding
      tie, where it may be the neighbouring bf16 value (4-bit codes are exact:
      :func:`int4_decode_asm`)."""
    kz = {"none": "$5", "bf16": None, "f16": "$7"}[scale]
    lines = []
    for h, sel in ((0, "0x4140"), (1, "0x4342")):  # bytes (0, 1) / (2, 3) to the low bytes of the halves
        # (the bytes under 0x43 by lop3, not by the prmt: a constant prmt operand costs a move each)
        lines += [f"prmt.b32 x, $4, 0, {sel};", "lop3.b32 a, x, 0x007F007F, 0x43004300, 0xEA;"]  # 128 + (b & 127)
        if signed:
            lines.append("lop3.b32 b, x, 0x00800080, 0x43004300, 0xEA;")  # 128, or 256 for a set sign bit
        else:
            lines.append("lop3.b32 b, x, 0x00800080, 0x43004300, 0xAE;")  # 256, or 128 for a set top bit
        d = f"p{h}"
        lines.append(f"sub.rn.bf16x2 {d}, a, b;")
        if not signed:
            lines.append(f"sub.rn.bf16x2 {d}, {d}, {kz};")
        if scale == "bf16":
            lines.append(f"mul.rn.bf16x2 {d}, {d}, $5;")
        elif scale == "f16":
            lines += [f"mul.rn.bf16x2 x, {d}, $6;", f"fma.rn.bf16x2 {d}, {d}, $5, x;"]
        lines.append(f"mov.b32 {{${2 * h}, ${2 * h + 1}}}, {d};")
    return "{\n.reg .b32 x, a, b, p0, p1;\n" + "\n".join(lines) + "\n}"


INT8S_E8M0_ASM = gl.constexpr(int8_decode_asm(True, "bf16"))
INT8Z_DECODE_ASM = gl.constexpr(int8_decode_asm(False, "f16"))
INT8S_DECODE_ASM = gl.constexpr(int8_decode_asm(True, "f16"))
INT8Z_CODE_ASM = gl.constexpr(int8_decode_asm(False, "none"))
INT8S_CODE_ASM = gl.constexpr(int8_decode_asm(True, "none"))
#: zero point ``z`` -> bf16x2 ``{}`` = ``z - 128`` (exact for z <= 255), PTX lines with registers ``z``, ``f``
_Z8_LINES = "sub.s32 z, z, 128;\ncvt.rn.f32.s32 f, z;\ncvt.rn.bf16x2.f32 {}, f, f;"
#: packed ``$1`` = fp16 scale bits | zero point << 16 -> bf16x2 ``z - 128``
Z8_ASM = gl.constexpr("{\n.reg .b32 z;\n.reg .f32 f;\nshr.u32 z, $1, 16;\n" + _Z8_LINES.format("$0") + "\n}")
#: packed ``$3`` = fp16 scale bits | zero point << 16 -> ``$0`` bf16x2 ``hi`` (the f32 of the
#: scale truncated to bf16), ``$1`` bf16x2 ``lo`` (the exact rest, <= 3 significant bits),
#: ``$2`` bf16x2 ``128 + z`` (bits ``0x4300 + z``; exact for z <= 127)
F16Z_SCALE_ASM = gl.constexpr("{\n.reg .b16 h;\n.reg .b32 t, z;\n.reg .f32 f, fh;\ncvt.u16.u32 h, $3;\n"
                  "cvt.f32.f16 f, h;\nmov.b32 t, f;\nand.b32 t, t, 0xFFFF0000;\nmov.b32 fh, t;\n"
                  "sub.f32 f, f, fh;\ncvt.rn.bf16x2.f32 $1, f, f;\nprmt.b32 $0, t, 0, 0x3232;\n"
                  "shr.u32 z, $3, 16;\nadd.u32 z, z, 0x4300;\nprmt.b32 $2, z, 0, 0x1010;\n}")


#: :data:`F16Z_SCALE_ASM` for 8-bit integer codes: ``$2`` is the bf16x2 ``z - 128`` (exact for z <= 255)
F16Z8_SCALE_ASM = gl.constexpr(F16Z_SCALE_ASM.value.replace("add.u32 z, z, 0x4300;\nprmt.b32 $2, z, 0, 0x1010;",
                                                             _Z8_LINES.format("$2")))


#: f16x2 constants of :func:`f16_decode_asm`'s integer decodes: ``1/16`` (the 4-bit odd pairs' fma), the
#: byte ``0x64`` (f16 exponent of 1024, under which ``prmt`` puts 8-bit codes), ``1024 + 128`` (signed
#: 8-bit codes after the sign flip), ``1024 + 8`` (signed 4-bit codes after theirs)
F16_C16, F16_C64, F16_K_S8, F16_K_S4 = (gl.constexpr(v) for v in (0x2C002C00, 0x64646464, 0x64806480, 0x64086408))


def f16_decode_asm(kind: str, scaled: bool = True) -> str:
    """PTX for fp16 activations (fp16 MMAs): code word ``$n`` -> ``n`` f16 outputs (8 for 4-bit codes,
    4 for 8-bit ones) in the K order of the bf16 decodes (4-bit codes: ``$2j`` / ``$2j+1`` the elements
    ``j`` / ``j+4``; 8-bit codes: ``$2h`` / ``$2h+1`` the elements ``2h`` / ``2h+1``). ``kind``:

    * ``"e2m1"``: the sign and 3 magnitude bits placed as f16 ``v * 2^-14`` by the one-token GEMV's
      select decode (:func:`._gemv_kernels._decode_word_ptx`);
    * ``"e4m3"`` / ``"e5m2"``: ``cvt.rn.f16x2``, the exact value;
    * ``"u4"`` / ``"s4"``: each nibble under the f16 exponent of 1024 (odd pairs 4 bits up, brought
      down by an exact ``fma`` with 1/16), minus ``1024 + z`` (``s4``: two's-complement codes, their
      sign bits flipped first: ``z = 8``): the exact ``code - z``;
    * ``"u8"`` / ``"s8"``: each byte under 1024 by one ``prmt``, minus ``1024 + z`` (``s8``: sign bits
      flipped first, ``z = 128``): the exact ``code - z``.

    Operands after the word: with ``scaled`` the f16x2 scale (both halves equal) every value is
    multiplied by, rounded once (exact for the float codes and E8M0-scaled integers within the windows
    of :func:`microscale.linear.backends.prefill_ws.gluon_scale_args`; ``(code - z) * s`` rounded to f16 for fp16
    scales); then for ``u4`` / ``s4`` the f16x2 ``1024 + z``, ``-(64 + z)`` and ``1/16``
    (:data:`F16_C16`), for ``u8`` / ``s8`` the f16x2 ``1024 + z`` and ``0x64646464``
    (:data:`F16_C64`)."""
    from ._gemv_kernels import F4, _decode_word_ptx

    n = 4 if kind[1:] in ("8", "4m3", "5m2") else 8
    w = f"${n}"
    ops = [f"${n + 1 + i}" for i in range(4)]
    sc = ops.pop(0) if scaled else None
    pairs = [f"p{j}" for j in range(n // 2)]
    if kind == "e2m1":
        lines = _decode_word_ptx(F4, 1, w, pairs, select=True)
    elif kind in ("e4m3", "e5m2"):
        lines = [f"mov.b32 {{lo, hi}}, {w};", f"cvt.rn.f16x2.{kind}x2 p0, lo;", f"cvt.rn.f16x2.{kind}x2 p1, hi;"]
    elif kind in ("u8", "s8"):
        lines = [f"xor.b32 x, {w}, 0x80808080;"] if kind == "s8" else []
        src = "x" if kind == "s8" else w
        for h, sel in ((0, "0x5140"), (1, "0x5342")):  # bytes (0, 1) / (2, 3) under the 0x64 bytes of ops[1]
            lines += [f"prmt.b32 p{h}, {src}, {ops[1]}, {sel};", f"sub.rn.f16x2 p{h}, p{h}, {ops[0]};"]
    elif kind in ("u4", "s4"):
        lines = [f"xor.b32 x, {w}, 0x88888888;"] if kind == "s4" else []
        src = "x" if kind == "s4" else w
        for j in range(4):
            if j == 2:
                lines.append(f"shr.u32 m, {src}, 8;")
                src = "m"
            if j % 2:  # 1024 + 16 c -> (64 + c) - (64 + z)
                lines += [f"lop3.b32 p{j}, {src}, 0x00F000F0, 0x64006400, 0xEA;",
                          f"fma.rn.f16x2 p{j}, p{j}, {ops[2]}, {ops[1]};"]
            else:
                lines += [f"lop3.b32 p{j}, {src}, 0x000F000F, 0x64006400, 0xEA;", f"sub.rn.f16x2 p{j}, p{j}, {ops[0]};"]
    else:
        raise ValueError(f"unknown f16 decode kind {kind!r}")
    if scaled:
        lines += [f"mul.rn.f16x2 {p}, {p}, {sc};" for p in pairs]
    lines += [f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, p{j};" for j in range(n // 2)]
    return "{\n.reg .b32 u, m, k, s, x, p0, p1, p2, p3;\n.reg .b16 lo, hi;\n" + "\n".join(lines) + "\n}"


F16_E2M1_ASM = gl.constexpr(f16_decode_asm("e2m1"))
F16_E4M3_ASM = gl.constexpr(f16_decode_asm("e4m3"))
F16_E5M2_ASM = gl.constexpr(f16_decode_asm("e5m2"))
F16_U4_ASM = gl.constexpr(f16_decode_asm("u4"))
F16_S4_ASM = gl.constexpr(f16_decode_asm("s4"))
F16_U8_ASM = gl.constexpr(f16_decode_asm("u8"))
F16_S8_ASM = gl.constexpr(f16_decode_asm("s8"))
F16_U4_CODE_ASM = gl.constexpr(f16_decode_asm("u4", False))
F16_S4_CODE_ASM = gl.constexpr(f16_decode_asm("s4", False))
F16_U8_CODE_ASM = gl.constexpr(f16_decode_asm("u8", False))
F16_S8_CODE_ASM = gl.constexpr(f16_decode_asm("s8", False))
#: UE4M3 scale byte ``$1`` -> f16x2 ``s`` in both halves (exact; the E2M1 decode's ``2^-14`` and this
#: leave products of at least 2^-24 with at most 5 significant bits: exact f16, the ``2^14`` in ``post``)
UE4M3_F16_ASM = gl.constexpr("{\n.reg .b16 lo;\n.reg .b32 sc;\ncvt.u16.u32 lo, $1;\ncvt.rn.f16x2.e4m3x2 sc, lo;\n"
                             "prmt.b32 $0, sc, 0, 0x1010;\n}")
#: E8M0 scale byte ``$1`` and ``$2`` = ``ke`` -> f16x2 ``2^(e + ke - 15)`` in both halves (f16 bits
#: ``(e + ke) << 10``; ``e + ke`` within the window of :func:`microscale.linear.backends.prefill_ws.gluon_scale_args`, or
#: below it for blocks of zero codes only: clamped to 0, the f16 zero)
E8M0_F16_ASM = gl.constexpr("{\n.reg .b32 t;\nadd.u32 t, $1, $2;\nmax.s32 t, t, 0;\nshl.b32 t, t, 10;\n"
                            "prmt.b32 $0, t, 0, 0x1010;\n}")


#: the bf16x2 scale of a UE4M3 byte ``b`` by one integer multiply-add, ``b * UE4M3_MUL + UE4M3_ADD``: ``b << 4``
#: puts its 4 exponent and 3 mantissa bits under bf16's (a bf16 of ``s * 2^-120``) in both halves, and
#: ``UE4M3_ADD`` adds 239 to both exponent fields: ``s * 2^119``, as :data:`UE4M3_ASM`, for normal scales
#: (bytes 8..126); subnormal ones come out wrong (and 0x80..0x87 as Inf), so ``SK_UE4M3N`` is for weights whose
#: bytes below 8 only scale blocks of zero codes and with no byte above 126 (scanned,
#: :func:`microscale.linear.weight_state.ue4m3_normal`)
UE4M3_MUL = 0x00100010  # (UE4M3_ADD: from ._gemv_mma, which makes the same scales)
_UE4M3_MUL, _UE4M3_ADD = gl.constexpr(UE4M3_MUL), gl.constexpr(UE4M3_ADD)
#: the bf16x2 scale of an E8M0 byte ``e`` by one integer multiply-add, ``(e + ke) * E8M0_MUL``: the bits
#: ``(e + ke) << 7`` in both halves (:data:`E8M0_ASM`; ``e + ke`` < 255, so no carry crosses the halves)
E8M0_MUL = 0x00800080
_E8M0_MUL = gl.constexpr(E8M0_MUL)
#: scale kinds ``SK`` of the bf16 decodes with the scale by one multiply-add (UE4M3, E8M0); the f16
#: decodes take them as ``SK_UE4M3`` / ``SK_E8M0``
SK_UE4M3N, SK_E8M0N = 5, 6


@gluon.jit
def _byte_scale(sraw, ke, SK: gl.constexpr, s_l: gl.constexpr, F16: gl.constexpr):
    """UE4M3 (``SK`` 2 or 5) or E8M0 (1 or 6) scale bytes -> the bf16x2 (``F16``: f16x2) scale the decode
    multiplies by (:data:`UE4M3_ASM`, :data:`E8M0_ASM` and their f16 twins; bf16 with ``SK`` 5 / 6: one
    integer multiply-add, :data:`UE4M3_MUL`, :data:`E8M0_MUL`)."""
    if SK == 5 and not F16:
        sc = sraw * _UE4M3_MUL + _UE4M3_ADD
    elif SK == 6 and not F16:
        sc = sraw * _E8M0_MUL + ke * _E8M0_MUL
    elif SK == 2 or SK == 5:
        sc = gl.inline_asm_elementwise(UE4M3_F16_ASM if F16 else UE4M3_ASM, "=r,r", [sraw], dtype=gl.int32,
                                       is_pure=True, pack=1)
    else:
        sc = gl.inline_asm_elementwise(E8M0_F16_ASM if F16 else E8M0_ASM, "=r,r,r",
                                       [sraw, gl.full(sraw.shape, 0, gl.int32, s_l) + ke], dtype=gl.int32,
                                       is_pure=True, pack=1)
    return sc


@gluon.jit
def _decode_f16(words, sraw, ke, SK: gl.constexpr, s_l: gl.constexpr, CB: gl.constexpr, UNSCALED: gl.constexpr,
                EI: gl.constexpr):
    """:func:`_decode`'s f16 outputs (before the K-slot reshuffle), for fp16 activations: the
    block scale made an f16x2 and the word decoded by :func:`f16_decode_asm`."""
    w_l: gl.constexpr = words.type.layout
    if SK == _SKZ or SK == _SKS:
        z = sraw >> 16
        if CB == 8 and SK == _SKS:
            k = gl.full(sraw.shape, F16_K_S8, gl.int32, s_l)
        else:
            k = (z + 0x6400) * 0x10001  # f16x2 1024 + z (z 8 for signed 4-bit codes)
        sc = (sraw & 0xFFFF) * 0x10001  # the fp16 scale in both halves
    else:
        sc = _byte_scale(sraw, ke, SK, s_l, True)
        k = gl.full(sraw.shape, F16_K_S8 if CB == 8 else F16_K_S4, gl.int32, s_l)  # MXINT8 / MXINT4
        z = gl.full(sraw.shape, 8, gl.int32, s_l)
    sc3 = gl.broadcast(gl.expand_dims(sc, 2), words)[0]
    k3 = gl.broadcast(gl.expand_dims(k, 2), words)[0]
    ints: gl.constexpr = (SK == _SKZ) or (SK == _SKS) or (EI == 1)
    signed: gl.constexpr = SK != _SKZ
    if CB == 8 and ints:
        c64 = gl.full(words.shape, F16_C64, gl.int32, w_l)
        if UNSCALED:
            e = gl.inline_asm_elementwise(F16_S8_CODE_ASM if signed else F16_U8_CODE_ASM, "=h,=h,=h,=h,r,r,r",
                                          [words, k3, c64], dtype=(gl.float16,) * 4, is_pure=True, pack=1)
        else:
            e = gl.inline_asm_elementwise(F16_S8_ASM if signed else F16_U8_ASM, "=h,=h,=h,=h,r,r,r,r",
                                          [words, sc3, k3, c64], dtype=(gl.float16,) * 4, is_pure=True, pack=1)
    elif ints:
        k23 = gl.broadcast(gl.expand_dims((z * 16 + 0xD400) * 0x10001, 2), words)[0]  # f16x2 -(64 + z)
        c16 = gl.full(words.shape, F16_C16, gl.int32, w_l)
        if UNSCALED:
            e = gl.inline_asm_elementwise(F16_S4_CODE_ASM if signed else F16_U4_CODE_ASM,
                                          "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [words, k3, k23, c16],
                                          dtype=(gl.float16,) * 8, is_pure=True, pack=1)
        else:
            e = gl.inline_asm_elementwise(F16_S4_ASM if signed else F16_U4_ASM,
                                          "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r", [words, sc3, k3, k23, c16],
                                          dtype=(gl.float16,) * 8, is_pure=True, pack=1)
    elif CB == 8:
        e = gl.inline_asm_elementwise(F16_E5M2_ASM if EI == 2 else F16_E4M3_ASM, "=h,=h,=h,=h,r,r", [words, sc3],
                                      dtype=(gl.float16,) * 4, is_pure=True, pack=1)
    else:
        e = gl.inline_asm_elementwise(F16_E2M1_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, sc3],
                                      dtype=(gl.float16,) * 8, is_pure=True, pack=1)
    return e


@gluon.constexpr_function
def code_word_layout(rows, warp_bases, CB, shape3=True, rep_rows=()):
    """The register layout of a step's code words as :func:`_decode` takes them: ``[rows, t, a]``
    (``shape3``) or ``[rows, 4 W]`` words of ``rows`` weight rows, ``W = CB / 2`` words per thread
    and row (``CB``-bit codes): registers ``a`` then row + 8 (then the row offsets ``rep_rows``: a warp's
    further 16-row slices), lanes ``t`` then rows 0-7, warps ``warp_bases`` (rows + 16, + 32, ...). They
    are the A operand's own rows and quads, so the decoded pairs need no data movement."""
    w = CB // 2
    if shape3:
        regs = [[0, 0, 1 << i] for i in range(w.bit_length() - 1)] + [[8, 0, 0]] + [[r, 0, 0] for r in rep_rows]
        lanes = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
        return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=warp_bases, block_bases=[],
                                          shape=[rows, 4, w])
    regs = [[0, 1 << i] for i in range(w.bit_length() - 1)] + [[8, 0]] + [[r, 0] for r in rep_rows]
    lanes = [[0, w], [0, 2 * w], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=lanes, warp_bases=[[b[0], 0] for b in warp_bases],
                                      block_bases=[], shape=[rows, 4 * w])


@gluon.jit
def _tile_origin(tile, n_t, n_n, BT: gl.constexpr, GROUP_T: gl.constexpr):
    """``(off_t, off_n)`` of tile number ``tile``: groups of ``GROUP_T`` token tiles sweep all
    row tiles (consecutive tiles share a weight row tile; a group's activations stay in L2)."""
    per = GROUP_T * n_n
    first_t = (tile // per) * GROUP_T
    size_t = gl.minimum(n_t - first_t, GROUP_T)
    return (first_t + (tile % per) % size_t) * BT, ((tile % per) // size_t) * (2 * WG_ROWS)


@gluon.jit
def _plan(n_tiles, n_steps, SPLIT_TAIL: gl.constexpr):
    """This program's share of the work: ``(dp, s_lo, s_hi, S)``. ``dp`` whole tiles
    ``p, p + P, ...``; with ``SPLIT_TAIL`` the ``R`` tiles past the last full wave
    (``n_tiles % P``; all of them when there are fewer than ``P``) are split in K into ``S``
    parts when ``S = P // R`` is at least 2 (at most ``MAX_SPLIT``): program ``p < R S``
    then also takes steps ``[s_lo, s_hi)`` of tail tile ``p // S``. Parts ``s`` of all
    tail tiles run at the same time and read the same activation K slices (L2 reuse: a
    stream-K cut into uneven ranges spreads those reads out in time and measured slower)."""
    p = gl.program_id(0)
    P = gl.num_programs(0)
    if SPLIT_TAIL:
        dp = n_tiles // P
        R = n_tiles - dp * P
        S = gl.minimum(gl.minimum(P // gl.maximum(R, 1), MAX_SPLIT), n_steps)
        S = gl.where(R > 0, S, 1)
        on = (S > 1) & (p < R * S)
        s_lo = gl.where(on, (p % S) * n_steps // S, 0)
        s_hi = gl.where(on, (p % S + 1) * n_steps // S, 0)
        dp = gl.where((S == 1) & (p < R), dp + 1, dp)  # an unsplit tail: whole tiles as usual
    else:
        dp = (n_tiles - p + P - 1) // P
        s_lo = 0
        s_hi = 0
        S = 1
    return dp, s_lo, s_hi, S


@gluon.jit
def _segment(j, dp, s_lo, s_hi, S, n_steps):
    """``(tile, k_lo, k_hi)`` of segment ``j`` (``0 <= j < dp + (s_hi > s_lo)``): a whole tile
    ``p + j P``, or this program's part of tail tile ``p // S`` (numbered after the
    ``dp x P`` whole ones)."""
    P = gl.num_programs(0)
    p = gl.program_id(0)
    is_dp = j < dp
    tile = gl.where(is_dp, p + j * P, dp * P + p // S)
    k_lo = gl.where(is_dp, 0, s_lo)
    k_hi = gl.where(is_dp, n_steps, s_hi)
    return tile, k_lo, k_hi


@gluon.jit
def ring_acquire(ready, empty, it, nbytes):
    """The producer's side of ring step ``it`` (:func:`ring_barriers`): waits until its slot is free (slots start
    out free), arms the slot's ``ready`` barrier for ``nbytes`` of TMA loads and returns the slot."""
    STAGES: gl.constexpr = ready.shape[0]
    s = it % STAGES
    mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), nbytes)
    return s


@gluon.jit
def _producer(xp_desc, x_bufs, ready, empty, n_t, n_n, n_steps, BT: gl.constexpr, GROUP_T: gl.constexpr,
              SPLIT_TAIL: gl.constexpr):
    """TMA of the activation tile of every K step of this program's segments into the ring
    (slot ``it % STAGES`` of the running step count ``it``): it runs ahead into the next
    segment while the consumers finish the last one."""
    dp, s_lo, s_hi, S = _plan(n_t * n_n, n_steps, SPLIT_TAIL)
    it = 0
    for j in range(dp + (s_hi > s_lo).to(gl.int32)):
        tile, k_lo, k_hi = _segment(j, dp, s_lo, s_hi, S, n_steps)
        off_t, off_n = _tile_origin(tile, n_t, n_n, BT, GROUP_T)
        for i in range(k_lo, k_hi):
            s = ring_acquire(ready, empty, it, xp_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(xp_desc, [off_t, i * BK], ready.index(s), x_bufs.index(s))
            it += 1


@gluon.jit
def _codes(w_ptr, s_ptr, z_ptr, w_off, s_off, step, k_lo, tq, TPS: gl.constexpr, SK: gl.constexpr,
           CB: gl.constexpr):
    """The code words (``CB``-bit codes) and (int32) block scales of K step ``step`` after
    ``k_lo``: UE4M3 / E8M0 bytes (``BK / G`` per step, ``s_off`` from ``k_lo`` on), or for the
    int4 kinds the fp16 scale bits | zero point << 16 of block ``(4 (k_lo + step) + tq) // TPS``
    (any ``TPS``)."""
    words = gl.load(w_ptr + w_off + step * (BK * CB // 32))
    if SK == _SKZ or SK == _SKS:
        idx = s_off + ((k_lo + step) * 4 + tq) // TPS
        sraw = gl.load(s_ptr + idx).to(gl.int32) & 0xFFFF
        if SK == _SKZ:
            sraw = sraw | (gl.load(z_ptr + idx).to(gl.int32) << 16)
        else:
            sraw = sraw | (8 << 16)
    else:
        sraw = gl.load(s_ptr + s_off + step * (4 // TPS)).to(gl.int32)
    return words, sraw


@gluon.jit
def _tile_codes(w_ptr, s_ptr, z_ptr, off_n, k_lo, nk, r_w, w_col, s_col, tq, N, stride_wn, stride_sn,
                TPS: gl.constexpr, SK: gl.constexpr, CB: gl.constexpr):
    """Offsets of this warpgroup's code words and scales in the row tile at ``off_n`` from K
    step ``k_lo`` on (rows clamped: reads of a ragged last tile stay in bounds, its stores are
    masked) and the codes and scales of the first two of its ``nk`` steps."""
    return _row_codes(w_ptr, s_ptr, z_ptr, gl.minimum(off_n + r_w, N - 1).to(gl.int64), k_lo, nk, w_col, s_col, tq,
                      stride_wn, stride_sn, TPS, SK, CB)


@gluon.jit
def _row_codes(w_ptr, s_ptr, z_ptr, rows, k_lo, nk, w_col, s_col, tq, stride_wn, stride_sn, TPS: gl.constexpr,
               SK: gl.constexpr, CB: gl.constexpr):
    """:func:`_tile_codes` for explicit (int64, in-bounds) weight ``rows``, one per row of the warpgroup's tile."""
    w_off = rows[:, None, None] * stride_wn + (w_col + k_lo * (BK * CB // 32))
    if SK == _SKZ or SK == _SKS:
        s_off = rows[:, None] * stride_sn
    else:
        s_off = rows[:, None] * stride_sn + (s_col + k_lo * (4 // TPS))
    words, sraw = _codes(w_ptr, s_ptr, z_ptr, w_off, s_off, 0, k_lo, tq, TPS, SK, CB)
    words_n, sraw_n = _codes(w_ptr, s_ptr, z_ptr, w_off, s_off, gl.minimum(1, nk - 1), k_lo, tq, TPS, SK, CB)
    return w_off, s_off, words, sraw, words_n, sraw_n


@gluon.jit
def _decode(words, sraw, ke, SK: gl.constexpr, s_l: gl.constexpr, a_l: gl.constexpr, CB: gl.constexpr = 4,
            UNSCALED: gl.constexpr = False, EI: gl.constexpr = 0, F16: gl.constexpr = False):
    """Code words and scale bytes of one K step -> the ``[rows, BK]`` bf16 (``F16``: f16) wgmma (or
    mma.sync) A operand (K slots permuted, see the module docstring); the layout change is asserted free.
    ``UNSCALED`` (integers with fp16 scales): ``code - z`` only, the block scale left to the caller.
    ``EI``: the element kind under E8M0 scales where ``CB`` leaves it open: 0 the minifloat (E2M1, E4M3),
    1 two's-complement integers (MXINT4, MXINT8), 2 E5M2 (the fp16 scale kinds imply integers)."""
    if F16:
        e = _decode_f16(words, sraw, ke, SK, s_l, CB, UNSCALED, EI)
    elif (SK == _SKZ or SK == _SKS) and UNSCALED:
        if CB == 8:
            kz = gl.inline_asm_elementwise(Z8_ASM, "=r,r", [sraw], dtype=gl.int32, is_pure=True, pack=1)  # z - 128
        else:
            kz = ((sraw >> 16) + 0x4300) * 0x10001  # bf16x2 128 + z
        kz3 = gl.broadcast(gl.expand_dims(kz, 2), words)[0]
        if CB == 8:
            e = gl.inline_asm_elementwise(INT8Z_CODE_ASM if SK == _SKZ else INT8S_CODE_ASM, "=h,=h,=h,=h,r,r",
                                          [words, kz3], dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
        else:
            e = gl.inline_asm_elementwise(INT4Z_CODE_ASM if SK == _SKZ else INT4S_CODE_ASM,
                                          "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, kz3],
                                          dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    elif SK == _SKZ or SK == _SKS:
        hi, lo, kz = gl.inline_asm_elementwise(F16Z8_SCALE_ASM if CB == 8 else F16Z_SCALE_ASM, "=r,=r,=r,r", [sraw],
                                               dtype=(gl.int32,) * 3, is_pure=True, pack=1)
        hi3 = gl.broadcast(gl.expand_dims(hi, 2), words)[0]
        lo3 = gl.broadcast(gl.expand_dims(lo, 2), words)[0]
        kz3 = gl.broadcast(gl.expand_dims(kz, 2), words)[0]
        if CB == 8:
            e = gl.inline_asm_elementwise(INT8Z_DECODE_ASM if SK == _SKZ else INT8S_DECODE_ASM,
                                          "=h,=h,=h,=h,r,r,r,r", [words, hi3, lo3, kz3],
                                          dtype=(gl.bfloat16,) * 4, is_pure=True, pack=1)
        else:
            e = gl.inline_asm_elementwise(INT4Z_DECODE_ASM if SK == _SKZ else INT4S_DECODE_ASM,
                                          "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [words, hi3, lo3, kz3],
                                          dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        sc = _byte_scale(sraw, ke, SK, s_l, False)
        sc3 = gl.broadcast(gl.expand_dims(sc, 2), words)[0]
        if CB == 8 and EI == 1:  # MXINT8: [rows, t, a] words of 4 elements 16 t + 4 a + 2 h + e
            e = gl.inline_asm_elementwise(INT8S_E8M0_ASM, "=h,=h,=h,=h,r,r", [words, sc3], dtype=(gl.bfloat16,) * 4,
                                          is_pure=True, pack=1)
        elif CB == 8 and EI == 2:  # E5M2
            e = gl.inline_asm_elementwise(E5M2_DECODE_ASM, "=h,=h,=h,=h,r,r", [words, sc3], dtype=(gl.bfloat16,) * 4,
                                          is_pure=True, pack=1)
        elif CB == 8:  # E4M3
            e = gl.inline_asm_elementwise(E4M3_DECODE_ASM, "=h,=h,=h,=h,r,r", [words, sc3], dtype=(gl.bfloat16,) * 4,
                                          is_pure=True, pack=1)
        elif EI == 1:  # MXINT4
            e = gl.inline_asm_elementwise(INT4S_E8M0_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, sc3],
                                          dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            e = gl.inline_asm_elementwise(DECODE_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, sc3],
                                          dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    if CB == 8:
        v = gl.join(gl.join(e[0], e[1]), gl.join(e[2], e[3]))  # [rows, t, a, e, h]
        v = gl.permute(v, (0, 2, 4, 1, 3))  # [rows, a, h, t, e] = K slot 16 a + 8 h + 2 t + e
    else:
        # (j, e) pairs -> [rows, t, a, e, j0, j1] -> [rows, j1, j0, a, t, e] = K slot 16 j + 8 a + 2 t + e
        q0 = gl.join(e[0], e[1])
        q1 = gl.join(e[2], e[3])
        q2 = gl.join(e[4], e[5])
        q3 = gl.join(e[6], e[7])
        v = gl.join(gl.join(q0, q1), gl.join(q2, q3))
        v = gl.permute(v, (0, 5, 4, 2, 1, 3))
    return gl.convert_layout(gl.reshape(v, [words.shape[0], BK]), a_l, assert_trivial=True)


@gluon.jit
def _mma_step(a, x_bufs, ready, empty, acc, it):
    """``acc += a @ x^T`` with the activations of ring step ``it``; retires the MMAs and frees the slot."""
    STAGES: gl.constexpr = x_bufs.shape[0]
    s = it % STAGES
    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
    acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
    # retire this step's MMAs before the next decode: with one group left in flight (also with
    # the loop unrolled by two, the A tiles in distinct registers) ptxas serializes the wgmmas
    # (C7512): the wait keeps the bf16 elements alive, not the packed registers the wgmma
    # reads. The other consumer warpgroup's decode overlaps these MMAs instead
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    mbarrier.arrive(empty.index(s), count=1)  # slot free (one arrive per warpgroup)
    return acc


def arrive_asm(n: int) -> str:
    """PTX: split arrival of ``n`` (row, thread quad member) counters at once (``pack=n``): per
    element ``i``, ``atom.add`` of the steps ``$(2n+i)`` this program summed to the counter at
    ``$(n+i)`` + 4 x (lane % 4); ``$i`` = 1 for the last contributor (the sum reaches ``$(3n+i)``),
    which also resets that counter to zero for the next call. One ``fence.acq_rel.gpu`` before
    the relaxed atomics releases this thread's partial stores (a release pattern), and one after
    them, only where some element is last, acquires the other contributors' stores (an acquire
    pattern). Per-element ``acq_rel`` atomics cost a ``MEMBAR.ALL.GPU`` and an L1 invalidation
    each (SASS), ``2 SLICES`` of them in a row per thread in :mod:`._decode_tma`'s epilogue."""
    lines = [".reg .u32 l, o;", ".reg .u64 a, d;", ".reg .pred p, q;", "mov.u32 l, %laneid;", "and.b32 l, l, 3;",
             "mul.wide.u32 d, l, 4;", "setp.ne.u32 q, l, l;", "fence.acq_rel.gpu;"]
    for i in range(n):
        lines += [f"add.u64 a, d, ${n + i};", f"atom.relaxed.gpu.global.add.u32 o, [a], ${2 * n + i};",
                  f"add.u32 o, o, ${2 * n + i};", f"setp.eq.u32 p, o, ${3 * n + i};", f"selp.u32 ${i}, 1, 0, p;",
                  "@p st.relaxed.gpu.global.u32 [a], 0;", "or.pred q, q, p;"]
    return "{\n" + "\n".join(lines + ["@q fence.acq_rel.gpu;"]) + "\n}"


def arrive_constraints(n: int) -> str:
    """The ``inline_asm_elementwise`` constraints of :func:`arrive_asm` (``n`` flags; addresses, steps, totals)."""
    return ",".join(["=r"] * n + ["l"] * n + ["r"] * (2 * n))


#: :func:`arrive_asm` for the two rows a thread holds of a warpgroup's (or a 16-row MMA slice's) accumulator
ARRIVE2_ASM = gl.constexpr(arrive_asm(2))
ARRIVE2_CONS = gl.constexpr(arrive_constraints(2))
#: ... and for the four of two 16-row slices (:mod:`._decode_tma`'s 256-row tiles with more programs than fit)
ARRIVE4_ASM = gl.constexpr(arrive_asm(4))
ARRIVE4_CONS = gl.constexpr(arrive_constraints(4))


def signal_asm(n: int) -> str:
    """PTX: a later K part's signal to its tile's first program, for ``n`` (row, thread quad member)
    counters at once (``pack=n``): one ``fence.acq_rel.gpu`` (releases this thread's partial stores),
    then per element ``i`` a relaxed ``red.add`` of the steps ``$(2n+i)`` to the counter at ``$(n+i)``
    + 4 x (lane % 4); ``$i`` = 0. No value comes back, so nothing waits on the atomics."""
    lines = [".reg .u32 l;", ".reg .u64 a, d;", "mov.u32 l, %laneid;", "and.b32 l, l, 3;", "mul.wide.u32 d, l, 4;",
             "fence.acq_rel.gpu;"]
    for i in range(n):
        lines += [f"add.u64 a, d, ${n + i};", f"red.relaxed.gpu.global.add.u32 [a], ${2 * n + i};", f"mov.u32 ${i}, 0;"]
    return "{\n" + "\n".join(lines) + "\n}"


def wait_asm(n: int) -> str:
    """PTX: the tile's first program waits, per element ``i``, until the counter at ``$(n+i)`` + 4 x
    (lane % 4) reaches ``$(2n+i)`` (the later parts' steps, :func:`signal_asm`), resets it to zero for
    the next call, and then acquires the parts' stores with one ``fence.acq_rel.gpu``; ``$i`` = 1."""
    lines = [".reg .u32 l, v;", ".reg .u64 a, d;", ".reg .pred p;", "mov.u32 l, %laneid;", "and.b32 l, l, 3;",
             "mul.wide.u32 d, l, 4;"]
    for i in range(n):  # (labels are local to the asm's braces: each inlined copy has its own)
        lines += [f"add.u64 a, d, ${n + i};", f"W{i}: ld.relaxed.gpu.global.u32 v, [a];",
                  f"setp.ne.u32 p, v, ${2 * n + i};", f"@p bra W{i};", "st.relaxed.gpu.global.u32 [a], 0;",
                  f"mov.u32 ${i}, 1;"]
    return "{\n" + "\n".join(lines + ["fence.acq_rel.gpu;"]) + "\n}"


def signal_constraints(n: int) -> str:
    """The ``inline_asm_elementwise`` constraints of :func:`signal_asm` and :func:`wait_asm`
    (``n`` outputs; addresses, steps)."""
    return ",".join(["=r"] * n + ["l"] * n + ["r"] * n)


#: :func:`signal_asm` / :func:`wait_asm` for the four rows a thread holds of two 16-row MMA slices
#: (:mod:`._decode_tma`'s 256-row tiles)
SIGNAL4_ASM, WAIT4_ASM, SIGNAL4_CONS = (gl.constexpr(signal_asm(4)), gl.constexpr(wait_asm(4)),
                                        gl.constexpr(signal_constraints(4)))


@gluon.jit
def _split_sum(acc, ws_ptr, cnt_ptr, nk, n_tiles, n_steps, WG: gl.constexpr, acc_l: gl.constexpr):
    """A tail tile's partial ``acc`` (this program's K part): stored to this program's
    workspace slot; the tile's last part to arrive, per row and thread (elementwise
    counters: no barrier), sums all ``S`` parts in K order (deterministic). Returns (that
    sum, the [rows, 1] flag of rows this thread finishes)."""
    BT: gl.constexpr = acc.shape[1]
    TILE: gl.constexpr = 2 * WG_ROWS * BT
    S = _plan(n_tiles, n_steps, True)[3]  # recomputed here: fewer live registers
    tile_sk = gl.program_id(0) // S
    r = gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, acc_l))
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, acc_l))
    elem = (WG * WG_ROWS + r)[:, None] * BT + c[None, :]
    gl.store(ws_ptr + gl.program_id(0) * TILE + elem, acc)
    z = gl.full([WG_ROWS], 0, gl.int32, gl.SliceLayout(1, acc_l))
    cnt = cnt_ptr + tile_sk * (2 * WG_ROWS * 4) + (WG * WG_ROWS + r) * 4
    last = gl.inline_asm_elementwise(ARRIVE2_ASM, ARRIVE2_CONS, [cnt, z + nk, z + n_steps], dtype=gl.int32,
                                     is_pure=False, pack=2)
    last2 = gl.expand_dims(last, 1) != 0
    lm = gl.broadcast(last2, acc)[0]
    tot = gl.zeros_like(acc)
    for q in range(tile_sk * S, tile_sk * S + S):  # the tile's parts are programs tile_sk S ... + S - 1
        tot += gl.load(ws_ptr + q * TILE + elem, mask=lm, other=0.0, cache_modifier=".cg")
    return tot, last2


@gluon.jit
def _epilogue(acc, ok, e_t, e_n, gs_ptr, b_ptr, out_ptr, out_desc, c_bufs, N, M, stride_om, post,
              WG: gl.constexpr, HAS_GS: gl.constexpr, HAS_BIAS: gl.constexpr, TMA_OUT: gl.constexpr,
              acc_l: gl.constexpr):
    """``out[e_t:, e_n + WG x 64:] = (acc * scale (+ bias))^T`` in out's dtype: by TMA store
    (``TMA_OUT``; ``ok`` unused) or by 2-byte stores of the rows where ``ok`` ([rows, 1])."""
    BT: gl.constexpr = acc.shape[1]
    scale = post
    if HAS_GS:
        scale = scale * gl.load(gs_ptr)
    r_o = e_n + WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, acc_l))
    v = acc * scale
    if HAS_BIAS:
        v += gl.load(b_ptr + r_o, mask=r_o < N, other=0.0).to(gl.float32)[:, None]
    v = v.to(out_ptr.dtype.element_ty)
    if TMA_OUT:  # the tile transposed through shared memory, one TMA store (clipped at M and N)
        c = c_bufs.index(WG)
        tma.store_wait(0)  # the previous tile's store has left the buffer
        c.store(gl.permute(v, (1, 0)))
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [e_t, e_n + WG * WG_ROWS], c)
    else:  # 2-byte stores (a thread holds token pairs of a row; rows are the contiguous axis)
        t_o = e_t + gl.arange(0, BT, layout=gl.SliceLayout(0, acc_l))
        ok = ok & (r_o < N)[:, None] & (t_o < M)[None, :]
        gl.store(out_ptr + t_o[None, :].to(gl.int64) * stride_om + r_o[:, None], v, mask=ok)


@gluon.jit
def _k_loop(acc, it, nk, words, sraw, words_n, sraw_n, w_ptr, s_ptr, z_ptr, w_off, s_off, k_lo, tq2, ke, x_bufs, ready,
            empty, TPS: gl.constexpr, SK: gl.constexpr, s_l: gl.constexpr, a_l: gl.constexpr, CB: gl.constexpr,
            EI: gl.constexpr, F16: gl.constexpr):
    """``nk`` K steps of one tile from ring step ``it`` on: each step's codes decoded into the wgmma operand
    and multiplied into ``acc`` (``words`` / ``sraw`` and ``words_n`` / ``sraw_n``: the first two steps',
    loaded by :func:`_tile_codes`). Returns ``(acc, it)``."""
    # two steps per iteration, so that each step's codes load into the registers its
    # predecessor two steps back has just decoded (no register moves that wait for a load
    # issued one step earlier): loads land two steps ahead (~1 us at 256 tokens)
    for i in range(0, nk, 2):
        a = _decode(words, sraw, ke, SK, s_l, a_l, CB, False, EI, F16)
        words, sraw = _codes(w_ptr, s_ptr, z_ptr, w_off, s_off, gl.minimum(i + 2, nk - 1), k_lo, tq2, TPS, SK, CB)
        acc = _mma_step(a, x_bufs, ready, empty, acc, it)
        it += 1
        if i + 1 < nk:
            a = _decode(words_n, sraw_n, ke, SK, s_l, a_l, CB, False, EI, F16)
            words_n, sraw_n = _codes(w_ptr, s_ptr, z_ptr, w_off, s_off, gl.minimum(i + 3, nk - 1), k_lo, tq2, TPS,
                                     SK, CB)
            acc = _mma_step(a, x_bufs, ready, empty, acc, it)
            it += 1
    return acc, it


@gluon.jit
def _consumer(w_ptr, s_ptr, z_ptr, gs_ptr, b_ptr, out_ptr, out_desc, c_bufs, x_bufs, ready, empty, ws_ptr, cnt_ptr, n_t,
              n_n, n_steps, N, M, stride_wn, stride_sn, stride_om, ke, post, WG: gl.constexpr, BT: gl.constexpr,
              GROUP_T: gl.constexpr, SK: gl.constexpr, TPS: gl.constexpr, HAS_GS: gl.constexpr,
              HAS_BIAS: gl.constexpr, TMA_OUT: gl.constexpr, SPLIT_TAIL: gl.constexpr, CB: gl.constexpr,
              EI: gl.constexpr, F16: gl.constexpr):
    """One warpgroup: ``WG_ROWS`` weight rows x ``BT`` tokens of ``out^T`` per tile, for each
    of this program's segments (:func:`_plan`). Per K step it decodes its code words
    (``[rows, t, a]``: rows ``16 w + g`` and ``+ 8``, words ``W t + a`` with ``W`` = ``CB / 2``
    words of a thread per row and step) and block scales in
    registers into the wgmma A layout, loads those of two steps ahead, waits for the step's
    activation slot, issues the MMAs, retires them and releases the slot to the producer. The
    next segment's first code words are loaded before this one's epilogue; a split tail
    tile's partial goes through :func:`_split_sum`."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    WPT: gl.constexpr = CB // 2
    w_l: gl.constexpr = code_word_layout(WG_ROWS, [[16, 0, 0], [32, 0, 0]], CB)
    s_l: gl.constexpr = gl.SliceLayout(2, w_l)
    r_w = WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, s_l))
    tq = gl.arange(0, 4, layout=gl.SliceLayout(0, s_l))
    av = gl.arange(0, WPT, layout=gl.SliceLayout(0, gl.SliceLayout(1, w_l)))
    w_col = WPT * tq[None, :, None] + av[None, None, :]
    s_col = tq[None, :] // TPS
    dp, s_lo, s_hi, S = _plan(n_t * n_n, n_steps, SPLIT_TAIL)
    n_seg = dp + (s_hi > s_lo).to(gl.int32)
    j = 0
    tile, k_lo, k_hi = _segment(0, dp, s_lo, s_hi, S, n_steps)
    off_t, off_n = _tile_origin(tile, n_t, n_n, BT, GROUP_T)
    tq2 = tq[None, :]
    w_off, s_off, words, sraw, words_n, sraw_n = _tile_codes(w_ptr, s_ptr, z_ptr, off_n, k_lo, k_hi - k_lo, r_w,
                                                             w_col, s_col, tq2, N, stride_wn, stride_sn, TPS, SK, CB)
    it = 0
    while j < n_seg:
        nk = k_hi - k_lo
        acc = gl.zeros([WG_ROWS, BT], gl.float32, acc_l)
        acc, it = _k_loop(acc, it, nk, words, sraw, words_n, sraw_n, w_ptr, s_ptr, z_ptr, w_off, s_off, k_lo, tq2, ke,
                          x_bufs, ready, empty, TPS, SK, s_l, a_l, CB, EI, F16)
        # the next segment's first two steps of codes and scales, in flight during the epilogue
        # (past the last segment: this one's again, never used)
        e_t = off_t
        e_n = off_n
        j += 1
        if j < n_seg:
            tile, k_lo, k_hi = _segment(j, dp, s_lo, s_hi, S, n_steps)
            off_t, off_n = _tile_origin(tile, n_t, n_n, BT, GROUP_T)
        w_off, s_off, words, sraw, words_n, sraw_n = _tile_codes(w_ptr, s_ptr, z_ptr, off_n, k_lo, k_hi - k_lo, r_w,
                                                                 w_col, s_col, tq2, N, stride_wn, stride_sn, TPS, SK,
                                                                 CB)
        partial = nk < n_steps  # always whole tiles without SPLIT_TAIL
        if partial:
            tot, last = _split_sum(acc, ws_ptr, cnt_ptr, nk, n_t * n_n, n_steps, WG, acc_l)
            _epilogue(tot, last, e_t, e_n, gs_ptr, b_ptr, out_ptr, out_desc, c_bufs, N, M, stride_om, post, WG,
                      HAS_GS, HAS_BIAS, False, acc_l)
        else:
            _epilogue(acc, gl.full([WG_ROWS, 1], 1, gl.int1, acc_l), e_t, e_n, gs_ptr, b_ptr, out_ptr, out_desc,
                      c_bufs, N, M, stride_om, post, WG, HAS_GS, HAS_BIAS, TMA_OUT, acc_l)
    if TMA_OUT:
        tma.store_wait(0)


@gluon.jit
def ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """The ``ready`` / ``empty`` mbarriers of a ring of ``STAGES`` slots, initialized: a
    slot is ready after one arrival (its TMA bytes expected), empty after ``CONSUMERS``."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    fence_async_shared()
    return ready, empty


@gluon.jit
def _prefill_ws_kernel(xp_desc, w_ptr, s_ptr, z_ptr, gs_ptr, b_ptr, out_ptr, out_desc, ws_ptr, cnt_ptr, N, M, K,
                       stride_wn, stride_sn, stride_om, ke, post, BT: gl.constexpr, STAGES: gl.constexpr,
                       GROUP_T: gl.constexpr, SK: gl.constexpr, TPS: gl.constexpr, HAS_GS: gl.constexpr,
                       HAS_BIAS: gl.constexpr, TMA_OUT: gl.constexpr, SPLIT_TAIL: gl.constexpr,
                       CB: gl.constexpr = 4, EI: gl.constexpr = 0, F16: gl.constexpr = False):
    """``out[M, N] = x @ dequant(W)^T (+ bias)`` in tiles of ``2 * WG_ROWS`` weight rows x
    ``BT`` tokens. ``xp_desc``: TMA descriptor of the K-permuted activations (block
    ``[BT, BK]``); ``w_ptr``: int32 code words ``[N, K CB / 32]`` (``CB``: 4, or 8 for E4M3 / E5M2
    codes and 8-bit integers); ``s_ptr``: block scales
    ``[N, K / G]`` (``TPS = G / 16`` quad members share one: a thread's 16 elements of a row
    lie in one block); ``SK``: UE4M3 / E8M0 scale bytes (``ke`` for E8M0: see :data:`E8M0_ASM`;
    ``EI`` the element kind under them, see :func:`_decode`), or int16 bits of fp16
    scales with integer codes
    (``SK_F16Z``: unsigned, uint8 zero points at ``z_ptr`` in the scales' shape; ``SK_F16``:
    two's complement; ``z_ptr`` unused otherwise); ``post``: the power of two the scale
    placement leaves out. Tile
    order: :func:`_tile_origin`; program ``p`` of ``P`` takes tiles ``p, p + P, ...``
    (persistent when ``P`` is the SM count: the producer fills the ring for the next tile
    and the consumers load its first codes during the epilogue); ``SPLIT_TAIL``: the tiles
    past the last full wave split in K (:func:`_plan`), their fp32 parts in ``ws_ptr``
    (``P x 2 WG_ROWS x BT``) and int32 counters ``cnt_ptr`` (``2 WG_ROWS x 4`` per tail tile,
    zero on entry, left zero). ``TMA_OUT``: each consumer writes a whole tile's
    ``[BT, WG_ROWS]`` output through shared memory with one TMA store (``out_desc``, block
    ``[BT, WG_ROWS]``; N a multiple of 8), else with masked 2-byte stores. ``F16``: fp16
    activations and output, f16 decodes (:func:`f16_decode_asm`) and fp16 MMAs."""
    n_t = gl.cdiv(M, BT)
    n_n = gl.cdiv(N, 2 * WG_ROWS)
    n_steps = K // BK
    x_bufs = gl.allocate_shared_memory(xp_desc.dtype, [STAGES] + xp_desc.block_type.shape, xp_desc.layout)
    if TMA_OUT:
        c_bufs = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
    else:
        c_bufs = x_bufs  # unused
    ready, empty = ring_barriers(STAGES, 2)  # both consumer warpgroups free a slot
    gl.warp_specialize([
        (_consumer, (w_ptr, s_ptr, z_ptr, gs_ptr, b_ptr, out_ptr, out_desc, c_bufs, x_bufs, ready, empty, ws_ptr, cnt_ptr,
                     n_t, n_n, n_steps, N, M, stride_wn, stride_sn, stride_om, ke, post, 0, BT, GROUP_T, SK, TPS,
                     HAS_GS, HAS_BIAS, TMA_OUT, SPLIT_TAIL, CB, EI, F16)),
        (_consumer, (w_ptr, s_ptr, z_ptr, gs_ptr, b_ptr, out_ptr, out_desc, c_bufs, x_bufs, ready, empty, ws_ptr, cnt_ptr,
                     n_t, n_n, n_steps, N, M, stride_wn, stride_sn, stride_om, ke, post, 1, BT, GROUP_T, SK, TPS,
                     HAS_GS, HAS_BIAS, TMA_OUT, SPLIT_TAIL, CB, EI, F16)),
        (_producer, (xp_desc, x_bufs, ready, empty, n_t, n_n, n_steps, BT, GROUP_T, SPLIT_TAIL)),
    ], [4, 1], [232, 40])


__all__ = ["SK_E8M0", "SK_UE4M3", "SK_UE4M3N", "SK_E8M0N", "SK_F16Z", "SK_F16", "WG_ROWS", "BK", "code_word_layout",
           "decode_asm", "e4m3_decode_asm", "int4_decode_asm"]
