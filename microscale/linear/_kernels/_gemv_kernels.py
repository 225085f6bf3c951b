"""Decode-path GEMV for few tokens on the canonical weight layout (private).

One parametric kernel (:func:`_gemv_kernel`) for weights of 4-bit minifloats (E2M1),
8-bit minifloats (E4M3, E5M2) and 4/8-bit two's-complement integers, with any 1-D block
scale (E8M0, UE4M3, fp16/bf16/fp32) and an optional global scale. It reads the QTensor's
packed codes directly (no repack) as int32 words: 8 nibbles (element ``i`` in bits
``[4i, 4i+4)``) or 4 bytes.

Per word, the codes become f16x2 pairs in PTX (``KIND``):

* ``F4``: one shift + masks per pair, by bit placement (sign -> bit 15, exponent|mantissa
  -> bits ``10-MBITS ..``): the f16 reads as the element times ``2^(BIAS-15)``,
  subnormals included. Pair ``j`` holds elements ``j`` and ``j+4``.
* ``E4M3`` / ``E5M2``: the hardware ``cvt.rn.f16x2.e4m3x2`` / ``e5m2x2`` (exact), two
  bytes per conversion. Pairs hold elements ``(0,1)`` and ``(2,3)``.
* ``I8``: ``prmt`` puts each (sign-flipped) byte under the f16 exponent of 1024, one
  exact ``sub.f16x2`` of 1152 leaves the integer.
* ``U8Z`` (affine: unsigned bytes with a zero point per block): the same placement under
  1024, then an exact ``sub.f16x2`` of ``1024 + z`` leaves ``code - z``.
* ``U4Z`` / ``I4`` (nibbles; I4 first offset by 8, ``z = 8``): one ``lop3`` per pair puts
  the nibble under the exponent of 1024, the low nibble of each byte as ``1024 + c``
  (minus ``1024 + z``), the high one left in place as ``1024 + 16c`` (times 1/16 plus
  ``-(64 + z)`` in one ``fma``): no shift for it, one shift per word in all.

Each pair meets an f16x2 of activations in ``fma.rn.f16x2``; the products of ``CHAIN``
consecutive words accumulate in f16 (one chain never straddles a scale block), then one
f16 -> f32 conversion pair and an add give the chain's float32 partial. Block scales,
the global scale, the element constant and the activations' power of two are applied
in float32. ``T`` tokens share one decode (one more ``fma.rn.f16x2`` per pair and token).

f16 cannot overflow: :func:`_prep_x_kernel` scales each chunk of ``BLOCK_KW`` words of
a token's row by a power of two so that its amax lies in ``[2^(XE-1), 2^XE)``, with
``XE`` chosen per format so that a chain's worst-case sum (``XMAX * max|pair value| *
products per lane``) stays below 65504, and stores the row as ``XREGS`` planes of f16
pairs in the order the pairs use; the GEMV undoes each chunk's power of two in float32.

Without a GPU (``TRITON_INTERPRET=1``) the same arithmetic runs in plain Triton ops
(``USE_ASM=False``): each code decoded to float32, products accumulated in float32.
"""
from __future__ import annotations

import functools
import math

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._linear_kernels import _decode_scale

# element kinds (the KIND constexpr)
F4, E4M3, E5M2, I8, I4, U8Z, U4Z = 0, 1, 2, 3, 4, 5, 6
#: activation f16 pairs per int32 word of codes
XREGS = {F4: 4, E4M3: 2, E5M2: 2, I8: 2, I4: 4, U8Z: 2, U4Z: 4}
#: largest |pair value| in f16 after decode (F4: 6 * 2^(BIAS-15) with BIAS 1; U*Z: code - zero point)
_WMAX = {F4: 6.0 * 2.0**-14, E4M3: 448.0, E5M2: 57344.0, I8: 128.0, I4: 8.0, U8Z: 255.0, U4Z: 15.0}
#: kinds whose decode subtracts a per-block zero point (an extra per-word operand)
HAS_ZP_KIND = (U8Z, U4Z)


@functools.lru_cache(maxsize=None)  # asked on every call
def x_exponent(kind: int, chain: int, scale_max: float = 1.0) -> int:
    """``XE``: activations are scaled into ``[2^(XE-1), 2^XE)`` so that a chain of
    ``chain`` words (``8 * chain / XREGS`` products per f16 lane), times a block scale of
    at most ``scale_max`` when the scale is applied in f16, cannot reach 65504."""
    per_lane = chain * (8 if XREGS[kind] == 4 else 4) // 2
    return min(15, math.floor(math.log2(65504.0 / (_WMAX[kind] * per_lane * scale_max))))


def _decode_word_ptx(kind: int, mbits: int, w: str, out: list[str], select: bool = False) -> list[str]:
    """PTX lines decoding int32 register ``w`` into f16x2 registers ``out``. ``select``
    (4-bit floats): the select decode (13 PTX integer ops per word against 16; same pairs)."""
    if kind == F4 and select:
        # The f16 wants each sign 5 + MBITS bits above its magnitude's first bit, the nibble
        # has it 3 above: so w << D (D = 2 + MBITS) carries every sign to where its pair
        # needs it, and one select per element parity merges magnitudes (from w) and signs
        # (from w << D): z_even holds elements 0, 2, 4, 6 and z_odd 1, 3, 5 in f16 shape, each
        # pair then one shift + mask. Element 7's sign would leave the word, but pair (3, 7)
        # already has its signs at bits 15 / 31: magnitudes shifted down, signs masked in.
        pos = 10 - mbits  # bit where the 3 magnitude bits start in an f16
        d = 2 + mbits
        mag = (0b111 << pos) | (0b111 << (pos + 16))
        full = hex(mag | 0x80008000)
        # (lop3 0xE4: a where c is set, b elsewhere, one instruction; written as and/or,
        # ptxas spends two)
        lines = [f"shl.b32 u, {w}, {d};",
                 f"lop3.b32 m, {w}, u, 0x07070707, 0xE4;",  # z_even
                 f"lop3.b32 k, {w}, u, 0x70707070, 0xE4;"]  # z_odd
        for j, (z, base) in enumerate((("m", 0), ("k", 4), ("m", 8))):  # pairs (0,4), (1,5), (2,6)
            sh = pos - base
            lines.append((f"shl.b32 {out[j]}, {z}, {sh}; " if sh else f"mov.b32 {out[j]}, {z}; ")
                         + f"and.b32 {out[j]}, {out[j]}, {full};")
        lines.append(f"shr.u32 s, {w}, {12 - pos}; and.b32 s, s, {hex(mag)}; "  # pair (3, 7)
                     f"and.b32 {out[3]}, {w}, 0x80008000; or.b32 {out[3]}, {out[3]}, s;")
        return lines
    if kind == F4:
        pos = 10 - mbits  # bit where the 3 magnitude bits start in an f16
        mask = hex((0b111 << pos) | (0b111 << (pos + 16)))
        lines = []
        for j, p in enumerate(out):
            sh = pos - 4 * j
            op = "shl.b32" if sh >= 0 else "shr.u32"
            lines.append(f"{op} m, {w}, {abs(sh)}; and.b32 m, m, {mask};")
            ss = 12 - 4 * j
            lines.append(f"shl.b32 s, {w}, {ss}; and.b32 s, s, 0x80008000;" if ss else "and.b32 s, " + w + ", 0x80008000;")
            lines.append(f"or.b32 {p}, m, s;")
        return lines
    if kind in (E4M3, E5M2):
        t = "e4m3x2" if kind == E4M3 else "e5m2x2"
        return [f"mov.b32 {{lo, hi}}, {w};", f"cvt.rn.f16x2.{t} {out[0]}, lo;", f"cvt.rn.f16x2.{t} {out[1]}, hi;"]
    if kind == I8:
        return [f"xor.b32 u, {w}, 0x80808080;",
                f"prmt.b32 {out[0]}, u, 0x64646464, 0x4140; sub.rn.f16x2 {out[0]}, {out[0]}, k;",
                f"prmt.b32 {out[1]}, u, 0x64646464, 0x4342; sub.rn.f16x2 {out[1]}, {out[1]}, k;"]
    if kind == U8Z:  # k holds (1024 + zero point) in both halves
        return [f"prmt.b32 {out[0]}, {w}, 0x64646464, 0x4140; sub.rn.f16x2 {out[0]}, {out[0]}, k;",
                f"prmt.b32 {out[1]}, {w}, 0x64646464, 0x4342; sub.rn.f16x2 {out[1]}, {out[1]}, k;"]
    if kind in (U4Z, I4):
        # pairs (0, 4) and (2, 6): nibble under the exponent of 1024, minus k = 1024 + z; pairs
        # (1, 5) and (3, 7) stay 4 bits up: (1024 + 16 c) / 16 + k2 with k2 = -(64 + z), one
        # fma. Every step exact in f16 (integers below 2048), and no shift for the odd pairs.
        src = w
        lines = []
        if kind == I4:  # two's complement -> offset 8
            lines.append(f"xor.b32 u, {w}, 0x88888888;")
            src = "u"
        lines.append("mov.b32 c, 0x2C002C00;")  # 1/16 in both halves
        for j, p in enumerate(out):
            if j == 2:
                lines.append(f"shr.u32 m, {src}, 8;")
                src = "m"
            mask = "0x00F000F0" if j % 2 else "0x000F000F"
            # (a & b) | c: lop3 with LUT 0xEA
            lines.append(f"lop3.b32 {p}, {src}, {mask}, 0x64006400, 0xEA; "
                         + (f"fma.rn.f16x2 {p}, {p}, c, k2;" if j % 2 else f"sub.rn.f16x2 {p}, {p}, k;"))
        return lines
    raise ValueError(f"unknown element kind {kind}")


def _decode_constants_ptx(kind: int, zk: str, zk2: str) -> list[str]:
    """PTX setting the decode's constants ``k`` / ``k2`` (zero-point kinds: from operands
    ``zk`` / ``zk2``, see :func:`zero_point_operands`)."""
    if kind == I8:
        return ["mov.b32 k, 0x64806480;"]  # 1152 = 1024 + 128 in each f16 half
    if kind == I4:
        return ["mov.b32 k, 0x64086408; mov.b32 k2, 0xD480D480;"]  # 1032 = 1024 + 8; -72 = -(64 + 8)
    if kind in HAS_ZP_KIND:
        return [f"mov.b32 k, {zk}; mov.b32 k2, {zk2};"]
    return []


@functools.lru_cache(maxsize=None)  # per call otherwise: ~12 us of host time (stubbed-kernel profile)
def word_asm(kind: int, mbits: int, tokens: int, select: bool = False) -> str:
    """PTX for one int32 word of codes and ``tokens`` tokens: the f16x2 sum of the word's
    products with each token's activation pairs, packed in an int32 per token.

    Operands: ``$0..$(T-1)`` the packed outputs, ``$T`` the word, (zero-point kinds) ``$(T+1)``
    the f16x2 ``1024 + zero point`` of the word's block and ``$(T+2)`` the f16x2
    ``-(64 + zero point)`` (:func:`zero_point_operands`), then token ``t``'s pair ``j`` at
    ``$(X0 + t * XREGS + j)`` with ``X0 = T + 1 (+ 2)``."""
    xr = XREGS[kind]
    x0 = tokens + 1 + (2 if kind in HAS_ZP_KIND else 0)
    regs = ", ".join(["m", "s", "u", "c", "k", "k2"] + [f"p{i}" for i in range(xr)] + [f"a{t}" for t in range(tokens)])
    body = [f".reg .b32 {regs};", ".reg .b16 lo, hi;"] + _decode_constants_ptx(kind, f"${tokens + 1}",
                                                                                 f"${tokens + 2}")
    body += _decode_word_ptx(kind, mbits, f"${tokens}", [f"p{i}" for i in range(xr)], select)
    for t in range(tokens):
        for j in range(xr):
            xo = f"${x0 + t * xr + j}"
            body.append(f"mul.rn.f16x2 a{t}, p{j}, {xo};" if j == 0 else f"fma.rn.f16x2 a{t}, p{j}, {xo}, a{t};")
    body += [f"mov.b32 ${t}, a{t};" for t in range(tokens)]  # outputs written after every input is read
    return "{\n" + "\n".join(body) + "\n}"


@functools.lru_cache(maxsize=None)
def word_constraints(kind: int, tokens: int) -> str:
    """The inline-asm constraint string matching :func:`word_asm`."""
    return ",".join(["=r"] * tokens + ["r"] * (1 + 2 * (kind in HAS_ZP_KIND) + tokens * XREGS[kind]))


@triton.jit
def zero_point_operands(z):
    """Zero points (int32 tensor) -> the word PTX's two operands: f16x2 ``1024 + z`` and
    f16x2 ``-(64 + z)`` (both exact for ``z < 1024``)."""
    k2 = (-(z.to(tl.float32) + 64.0)).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return (z + 0x6400) * 0x10001, k2 * 0x10001


#: f16x2 sum of a chain's packed words -> float32 (both halves added)
FINISH_ASM = tl.constexpr("{ .reg .b16 lo, hi; .reg .f32 a, b; mov.b32 {lo, hi}, $1; "
                          "cvt.f32.f16 a, lo; cvt.f32.f16 b, hi; add.f32 $0, a, b; }")
#: the same, multiplied first by an E4M3 block scale byte ($2) in f16 (exact decode by
#: ``cvt.rn.f16x2.e4m3x2``, duplicated into both halves)
FINISH_E4M3_ASM = tl.constexpr("{ .reg .b16 lo, hi; .reg .b32 sc, v; .reg .f32 a, b; mov.b32 {lo, hi}, $2; "
                               "cvt.rn.f16x2.e4m3x2 sc, lo; prmt.b32 sc, sc, 0, 0x1010; mul.rn.f16x2 v, $1, sc; "
                               "mov.b32 {lo, hi}, v; cvt.f32.f16 a, lo; cvt.f32.f16 b, hi; add.f32 $0, a, b; }")

#: two chains' f16x2 sums ($1, $2) times their E4M3 block scales (bytes 0 and 1 of $3, one
#: ``cvt.rn.f16x2.e4m3x2`` for both), added in f16, then -> float32
FINISH2_E4M3_ASM = tl.constexpr("{ .reg .b16 lo, hi; .reg .b32 sc, sa, sb, v; .reg .f32 a, b; mov.b32 {lo, hi}, $3; "
                                "cvt.rn.f16x2.e4m3x2 sc, lo; prmt.b32 sa, sc, 0, 0x1010; prmt.b32 sb, sc, 0, 0x3232; "
                                "mul.rn.f16x2 v, $1, sa; fma.rn.f16x2 v, $2, sb, v; "
                                "mov.b32 {lo, hi}, v; cvt.f32.f16 a, lo; cvt.f32.f16 b, hi; add.f32 $0, a, b; }")


@triton.jit
def _prep_x_kernel(x_ptr, xp_ptr, xs_ptr, stride_x, K: tl.constexpr, XE: tl.constexpr, KIND: tl.constexpr,
                   CW: tl.constexpr, USE_PDL: tl.constexpr = False, WAIT_PDL: tl.constexpr = False):
    """Chunk ``c`` (``CW`` words' elements) of row ``m`` of x -> f16 scaled by
    ``2^(XE - 1 - E)`` (``E``: exponent of the chunk's amax), stored as planes of f16
    pairs: for 4-bit codes plane ``j`` holds ``(x[8w+j], x[8w+j+4])`` of word ``w``, for
    8-bit codes plane ``j`` holds ``(x[4w+2j], x[4w+2j+1])``. Writes the chunk's float32
    undo factor ``2^(E + 1 - XE)`` to ``xs[m, c]``. One contiguous load; the permutation
    is a register reshape. ``WAIT_PDL``: launched as a programmatic dependent of the
    previous kernel (which may still run): x is read only after it completes."""
    m = tl.program_id(0)
    c = tl.program_id(1)
    if USE_PDL:  # let the GEMV's programs launch now; they wait for this grid before reading x
        gdc_launch_dependents()
    if WAIT_PDL:
        gdc_wait()
    if KIND == 0 or KIND == 4 or KIND == 6:
        EPW: tl.constexpr = 8
        XR: tl.constexpr = 4
    else:
        EPW: tl.constexpr = 4
        XR: tl.constexpr = 2
    KW: tl.constexpr = K // EPW
    BLOCK: tl.constexpr = CW * EPW
    offs = c * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + m * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
    a = tl.max(tl.abs(v), 0)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, -100), 100)
    up = ((127 + XE - 1 - e) << 23).to(tl.float32, bitcast=True)
    tl.store(xs_ptr + m * ((KW + CW - 1) // CW) + c, ((127 + e + 1 - XE) << 23).to(tl.float32, bitcast=True))
    v = (v * up).to(tl.float16)
    if EPW == 8:  # element 8w + j + 4h: (w, h, j) -> (j, w, h)
        t = tl.permute(tl.reshape(v, [CW, 2, 4]), (2, 0, 1))
    else:  # element 4w + 2j + h: (w, j, h) -> (j, w, h)
        t = tl.permute(tl.reshape(v, [CW, 2, 2]), (1, 0, 2))
    w = c * CW + tl.arange(0, CW)
    dst = (xp_ptr + m * K + tl.arange(0, XR)[:, None, None] * (2 * KW) + w[None, :, None] * 2
           + tl.arange(0, 2)[None, None, :])
    tl.store(dst, t, mask=(w < KW)[None, :, None])


@triton.jit
def _code_value(w, i, KIND: tl.constexpr, MBITS: tl.constexpr):
    """Element ``i`` of int32 words ``w`` as float32, valued like the PTX decode (F4: times
    ``2^(BIAS-15)``; the rest: the element's code value)."""
    if KIND == 0:
        nib = (w >> (4 * i)) & 0xF
        bits = ((nib >> 3) << 31) | ((nib & 7) << (23 - MBITS))
        v = bits.to(tl.float32, bitcast=True) * 5.192296858534828e33  # f32 placement 2^-127 -> f16's 2^-15
    elif KIND == 1 or KIND == 2:
        b = (w >> (8 * i)) & 0xFF
        if KIND == 1:
            bits = ((b >> 7) << 31) | ((b & 0x7F) << 20)
            v = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^(127-7)
            v = tl.where((b & 0x7F) == 0x7F, float("nan"), v)
        else:
            bits = ((b >> 7) << 31) | ((b & 0x7F) << 21)
            v = bits.to(tl.float32, bitcast=True) * 5.192296858534828e33  # 2^(127-15)
            v = tl.where((b & 0x7F) > 0x7C, float("nan"), tl.where((b & 0x7F) == 0x7C, float("inf") * v, v))
    elif KIND == 3:
        v = ((w << (24 - 8 * i)) >> 24).to(tl.float32)
    elif KIND == 4:
        v = ((w << (28 - 4 * i)) >> 28).to(tl.float32)
    elif KIND == 5:
        v = ((w >> (8 * i)) & 0xFF).to(tl.float32)
    else:
        v = ((w >> (4 * i)) & 0xF).to(tl.float32)
    return v


@triton.jit
def _word_dot_ref(w, kz, xs, KIND: tl.constexpr, MBITS: tl.constexpr, XR: tl.constexpr):
    """Plain-Triton twin of one word of the PTX: the float32 sum of its products with the
    activation pairs ``xs`` (a tuple of XR int32 tensors); ``kz``: the zero-point operand."""
    acc = tl.zeros(w.shape, dtype=tl.float32)
    if KIND == 5 or KIND == 6:
        z = ((kz & 0xFFFF) - 0x6400).to(tl.float32)
    else:
        z = 0.0
    for j in tl.static_range(XR):
        for h in tl.static_range(2):
            if XR == 4:
                i = j + 4 * h
            else:
                i = 2 * j + h
            xh = ((xs[j] >> (16 * h)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            acc += (_code_value(w, i, KIND, MBITS) - z) * xh
    return acc


@triton.jit
def _hadd2(a, b):
    """f16x2 add of packed int32 (a reduction combiner)."""
    return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@functools.lru_cache(maxsize=None)  # asked on every call
def scale_load_asm(nbytes: int) -> str:
    """PTX loading one block scale (or, paired, two byte scales) of ``nbytes`` bytes into a
    32-bit register, zero-extended (the scale decodes read only the low ``8 * nbytes``
    bits), for ``_load_weight_step``'s ``SDIRECT``."""
    return f"ld.global.nc.u{8 * nbytes} $0, [$1];"


@triton.jit
def _load_weight_step(w_ptr, s_ptr, z_ptr, offs_n, n_ok, stride_w, stride_s, stride_z, k0, KW: tl.constexpr,
                      WPG: tl.constexpr, CHAIN: tl.constexpr, BLOCK_KW: tl.constexpr, EVEN_N: tl.constexpr,
                      EVEN_K: tl.constexpr, HAS_ZP: tl.constexpr, SPAIR: tl.constexpr = False,
                      SDIRECT: tl.constexpr = ""):
    """One K step's weight operands from word ``k0``: codes ``[BLOCK_N, BLOCK_KW]``, raw
    block scales ``[BLOCK_N, BLOCK_KW // CHAIN]`` (one per chain; ``SPAIR``: 16-bit pairs,
    ``[BLOCK_N, BLOCK_KW // CHAIN // 2]``) and the zero-point operands per word (a pair,
    :func:`zero_point_operands`; zeros without zero points). With ``SDIRECT`` the zero
    points are loaded once per chain. ``SDIRECT`` (PTX, unmasked tiles): the PTX load
    of one scale (:func:`scale_load_asm`; "" for ``tl.load``). Triton does not re-lay-out
    it like its own loads, so the scales arrive in the layout of their use and the loop
    carries them without a shared-memory layout conversion."""
    NC: tl.constexpr = BLOCK_KW // CHAIN
    kw = k0 + tl.arange(0, BLOCK_KW)
    kw_ok = kw < KW
    if SPAIR:  # one 16-bit load per pair of chains (byte scales, a chain per block): ra | rb << 8
        kc = k0 + 2 * CHAIN * tl.arange(0, NC // 2)
        s_ptrs = s_ptr.to(tl.pointer_type(tl.int16)) + offs_n[:, None] * (stride_s // 2) + (kc // WPG // 2)[None, :]
    else:
        kc = k0 + CHAIN * tl.arange(0, NC)  # first word of each chain
        s_ptrs = s_ptr + offs_n[:, None] * stride_s + (kc // WPG)[None, :]
    w_ptrs = w_ptr + offs_n[:, None] * stride_w + kw[None, :]
    if SDIRECT != "":  # (a PTX load is no layout anchor: the addresses take the layout of the use)
        w = tl.load(w_ptrs)
        raw = tl.inline_asm_elementwise(SDIRECT, "=r,l", [s_ptrs.to(tl.int64, bitcast=True)], dtype=tl.int32,
                                        is_pure=True, pack=1)
    elif EVEN_N and EVEN_K:  # no masks: unpredicated 16-byte loads
        w = tl.load(w_ptrs)
        raw = tl.load(s_ptrs).to(tl.int32)
    else:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & kw_ok[None, :], other=0)
        raw = tl.load(s_ptrs, mask=n_ok[:, None] & (kc < KW)[None, :], other=0).to(tl.int32)
    if SPAIR and SDIRECT == "":
        raw = raw & 0xFFFF
    if HAS_ZP and SDIRECT != "":
        # one PTX byte load per chain, like the scales, then repeated over the chain's words
        # in registers (a chain's words are one thread's: no layout conversion)
        kcz = k0 + CHAIN * tl.arange(0, NC)
        z_ptrs = z_ptr + offs_n[:, None] * stride_z + (kcz // WPG)[None, :]
        z = tl.inline_asm_elementwise("ld.global.nc.u8 $0, [$1];", "=r,l", [z_ptrs.to(tl.int64, bitcast=True)],
                                      dtype=tl.int32, is_pure=True, pack=1)
        ka, kb = zero_point_operands(z)
        R: tl.constexpr = ka.shape[0]
        kz = (tl.reshape(tl.broadcast_to(ka[:, :, None], [R, NC, CHAIN]), [R, BLOCK_KW]),
              tl.reshape(tl.broadcast_to(kb[:, :, None], [R, NC, CHAIN]), [R, BLOCK_KW]))
    elif HAS_ZP:  # per word (an L1 hit after the first of its block): f16x2 of 1024 + z
        z_ptrs = z_ptr + offs_n[:, None] * stride_z + (kw // WPG)[None, :]
        if EVEN_N and EVEN_K:
            z = tl.load(z_ptrs).to(tl.int32)
        else:
            z = tl.load(z_ptrs, mask=n_ok[:, None] & kw_ok[None, :], other=0).to(tl.int32)
        kz = zero_point_operands(z)
    else:
        kz = (0, 0)
    return w, raw, kz


@triton.jit
def _load_x_step(x_ptr, k0, KW: tl.constexpr, XR: tl.constexpr, T: tl.constexpr, BLOCK_KW: tl.constexpr,
                 EVEN_K: tl.constexpr):
    """One K step's activation planes from word ``k0``: a tuple of ``T * XR`` tensors
    ``[1, BLOCK_KW]`` (token ``t``'s plane ``j`` at ``t * XR + j``)."""
    kw = k0 + tl.arange(0, BLOCK_KW)
    kw_ok = kw < KW
    xs = ()
    for t in tl.static_range(T):
        for j in tl.static_range(XR):
            if EVEN_K:
                xv = tl.load(x_ptr + (t * XR + j) * KW + kw[None, :])
            else:
                xv = tl.load(x_ptr + (t * XR + j) * KW + kw[None, :], mask=kw_ok[None, :], other=0)
            xs = xs + (xv,)
    return xs


@triton.jit
def _load_step(w_ptr, s_ptr, z_ptr, x_ptr, offs_n, n_ok, stride_w, stride_s, stride_z, k0, KW: tl.constexpr,
               XR: tl.constexpr, T: tl.constexpr, WPG: tl.constexpr, CHAIN: tl.constexpr, BLOCK_KW: tl.constexpr,
               EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, HAS_ZP: tl.constexpr, SPAIR: tl.constexpr = False,
               SDIRECT: tl.constexpr = ""):
    """One K step's operands: :func:`_load_weight_step`'s, then :func:`_load_x_step`'s."""
    w, raw, kz = _load_weight_step(w_ptr, s_ptr, z_ptr, offs_n, n_ok, stride_w, stride_s, stride_z, k0, KW, WPG,
                                   CHAIN, BLOCK_KW, EVEN_N, EVEN_K, HAS_ZP, SPAIR, SDIRECT)
    return w, raw, kz, _load_x_step(x_ptr, k0, KW, XR, T, BLOCK_KW, EVEN_K)


@triton.jit
def _word_parts(w, kz, xs, XR: tl.constexpr, T: tl.constexpr, KIND: tl.constexpr, MBITS: tl.constexpr,
                USE_ASM: tl.constexpr, ASM: tl.constexpr, CONS: tl.constexpr, HAS_ZP: tl.constexpr):
    """Per word of ``w`` and per token (a tuple): the sum of the word's products with the
    activation planes ``xs``, as packed f16x2 int32 (PTX) or float32 (the plain-Triton twin)."""
    if USE_ASM:
        if HAS_ZP:
            args = (w, kz[0], kz[1]) + xs
        else:
            args = (w,) + xs
        if T == 1:
            parts = (tl.inline_asm_elementwise(ASM, CONS, args, dtype=tl.int32, is_pure=True, pack=1),)
        else:
            parts = tl.inline_asm_elementwise(ASM, CONS, args, dtype=(tl.int32,) * T, is_pure=True, pack=1)
    else:
        parts = ()
        for t in tl.static_range(T):
            x4 = ()
            for j in tl.static_range(XR):
                x4 = x4 + (xs[t * XR + j],)
            parts = parts + (_word_dot_ref(w, kz[0], x4, KIND, MBITS, XR),)
    return parts


@triton.jit
def _chain_finish(p, raw, CHAIN: tl.constexpr, USE_ASM: tl.constexpr, SCALE_IN_ASM: tl.constexpr,
                  SPAIR: tl.constexpr = False):
    """``[R, C]`` word parts -> ``[R, C // CHAIN]`` float32 chain sums (f16 adds in the PTX
    path); with ``SCALE_IN_ASM``, times the E4M3 block scales ``raw`` and two neighbouring
    chains added in f16: ``[R, C // CHAIN // 2]``."""
    R: tl.constexpr = p.shape[0]
    NC: tl.constexpr = p.shape[1] // CHAIN
    if USE_ASM:
        if CHAIN > 1:
            h = tl.reduce(tl.reshape(p, [R, NC, CHAIN]), 2, _hadd2)
        else:
            h = p
        if SCALE_IN_ASM:
            ha, hb = tl.split(tl.reshape(h, [R, NC // 2, 2]))
            if SPAIR:  # (``raw``: the pairs' scales as loaded, ``[R, NC // 2]``)
                rab = raw
            else:
                ra, rb = tl.split(tl.reshape(raw, [R, NC // 2, 2]))
                rab = ra | (rb << 8)
            out = tl.inline_asm_elementwise(FINISH2_E4M3_ASM, "=f,r,r,r", [ha, hb, rab],
                                            dtype=tl.float32, is_pure=True, pack=1)
        else:
            out = tl.inline_asm_elementwise(FINISH_ASM, "=f,r", [h], dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = tl.sum(tl.reshape(p, [R, NC, CHAIN]), 2)
        if SCALE_IN_ASM and SPAIR:
            oa, ob = tl.split(tl.reshape(out, [R, NC // 2, 2]))
            out = oa * _decode_scale(raw & 0xFF, 2) + ob * _decode_scale(raw >> 8, 2)
        elif SCALE_IN_ASM:
            out = tl.sum(tl.reshape(out * _decode_scale(raw, 2), [R, NC // 2, 2]), 2)
    return out


@triton.jit
def _gemv_kernel(
    xp_ptr, xs_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, b_ptr, out_ptr,
    N, stride_w, stride_s, stride_z, stride_o, M: tl.constexpr, KW: tl.constexpr,
    KIND: tl.constexpr, MBITS: tl.constexpr, ELEM_C: tl.constexpr, SCALE_KIND: tl.constexpr,
    WPG: tl.constexpr, HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, KW_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr,
    CHAIN: tl.constexpr, T: tl.constexpr, USE_ASM: tl.constexpr, ASM: tl.constexpr, CONS: tl.constexpr,
    EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, SCALE_IN_ASM: tl.constexpr, USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr, HAS_ZP: tl.constexpr, SPAIR: tl.constexpr = False, EARLY_W: tl.constexpr = True,
    PDL_CHAIN: tl.constexpr = False, SDIRECT: tl.constexpr = "",
):
    """out[m, n] (+)= sum_k x[m, k] * W[n, k] over this program's K slice (split-K: fp32
    atomics into a zeroed fp32 ``out``; else the final dtype is written directly).
    ``KW``: int32 words of codes per weight row; ``WPG``: words per scale block; ``CHAIN``:
    words summed in f16 (divides WPG); ``EVEN_N`` / ``EVEN_K``: the tiles cover N / every
    split's K range exactly (no masks); ``SCALE_IN_ASM``: E4M3 block scales (one per chain)
    applied in f16 inside the PTX; ``USE_PDL``: launched as a programmatic dependent of
    the activation prep (waits for it before reading x); ``PREFETCH``: load step i+1
    while step i computes (register double buffer). Activations arrive in chunks of
    ``BLOCK_KW`` words, each with its own power of two (``xs[m, chunk]``). ``EARLY_W``
    (with ``USE_PDL`` and ``PREFETCH``): the first step's weight loads are issued before the
    wait; ``PDL_CHAIN``: the next kernel (the next call's prep) may launch once every program
    of this grid runs. ``SDIRECT``: see :func:`_load_weight_step`."""
    XR: tl.constexpr = 4 if (KIND == 0 or KIND == 4 or KIND == 6) else 2
    if USE_PDL and PDL_CHAIN:
        gdc_launch_dependents()
    if USE_PDL and not (EARLY_W and PREFETCH):
        gdc_wait()
    NC: tl.constexpr = BLOCK_KW // CHAIN
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    k_lo = pid_k * KW_PER_SPLIT
    NCH: tl.constexpr = KW // BLOCK_KW  # activation chunks (one undo factor each) per token
    for m0 in tl.static_range(0, M, T):
        x_ptr = xp_ptr + m0 * XR * KW
        accs = ()
        for t in tl.static_range(T):
            accs = accs + (tl.zeros([BLOCK_N, NC // 2 if SCALE_IN_ASM else NC], dtype=tl.float32),)
        if PREFETCH:
            # the weights do not come from the activation prep: their first loads are in
            # flight while a programmatic dependent launch waits for it
            w, raw, kz = _load_weight_step(w_ptr, s_ptr, z_ptr, offs_n, n_ok, stride_w, stride_s, stride_z, k_lo,
                                           KW, WPG, CHAIN, BLOCK_KW, EVEN_N, EVEN_K, HAS_ZP, SPAIR, SDIRECT)
            if USE_PDL and EARLY_W and m0 == 0:  # x is ready only after this
                gdc_wait()
            xs = _load_x_step(x_ptr, k_lo, KW, XR, T, BLOCK_KW, EVEN_K)
        for i in range(0, KW_PER_SPLIT, BLOCK_KW):
            if PREFETCH:  # issue the next step's loads before this step's arithmetic
                nxt = tl.minimum(i + BLOCK_KW, KW_PER_SPLIT - BLOCK_KW)
                w2, raw2, kz2, xs2 = _load_step(w_ptr, s_ptr, z_ptr, x_ptr, offs_n, n_ok, stride_w, stride_s,
                                                stride_z, k_lo + nxt, KW, XR, T, WPG, CHAIN, BLOCK_KW, EVEN_N, EVEN_K,
                                                HAS_ZP, SPAIR, SDIRECT)
            else:
                w, raw, kz, xs = _load_step(w_ptr, s_ptr, z_ptr, x_ptr, offs_n, n_ok, stride_w, stride_s, stride_z,
                                            k_lo + i, KW, XR, T, WPG, CHAIN, BLOCK_KW, EVEN_N, EVEN_K, HAS_ZP, SPAIR,
                                            SDIRECT)
            parts = _word_parts(w, kz, xs, XR, T, KIND, MBITS, USE_ASM, ASM, CONS, HAS_ZP)
            if SCALE_IN_ASM:
                scale = 1.0
            else:
                scale = _decode_scale(raw, SCALE_KIND)
            chunk = (k_lo + i) // BLOCK_KW
            new = ()
            for t in tl.static_range(T):
                if EVEN_K:  # the activation chunk's power of two
                    xf = tl.load(xs_ptr + (m0 + t) * NCH + chunk)
                else:
                    xf = tl.load(xs_ptr + (m0 + t) * NCH + chunk, mask=chunk < NCH, other=0.0)
                new = new + (accs[t] + _chain_finish(parts[t], raw, CHAIN, USE_ASM, SCALE_IN_ASM, SPAIR) * (scale * xf),)
            accs = new
            if PREFETCH:
                w = w2
                raw = raw2
                kz = kz2
                xs = xs2
        for t in tl.static_range(T):
            acc = tl.sum(accs[t], 1)  # across K once, after the loop
            if m0 + t < M:
                acc = acc * ELEM_C
                if HAS_GS:
                    acc = acc * tl.load(gs_ptr)
                if SPLIT_K == 1:
                    if HAS_BIAS:
                        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
                    tl.store(out_ptr + (m0 + t) * stride_o + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
                else:
                    if HAS_BIAS:
                        if pid_k == 0:
                            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
                    tl.atomic_add(out_ptr + (m0 + t) * stride_o + offs_n, acc, mask=n_ok, sem="relaxed")
