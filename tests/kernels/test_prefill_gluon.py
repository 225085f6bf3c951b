"""The warp-specialized Gluon prefill (``linear.prefill_ws``) without a GPU.

Gluon kernels do not run under the Triton interpreter. What runs here: the K-permutation
prep kernel (interpreted) against its formula; the kernel's arithmetic (its decode and
scale PTX, run by the PTX emulator of ``test_gemv_mma.py``) driven by a mirror of the
per-thread assignment its layouts state (thread quad member ``t`` of a row owns code words
``2t, 2t+1`` of each 64-element K chunk; word ``a``'s pair ``(j, j+4)`` fills the wgmma K
slots ``16 j + 8 a + 2 t + {0, 1}``), against float64; and the compile for sm_90a (the
decode lands in the MMA's register layout without a data movement -- the kernel asserts
that at compile time --, no spills, no serialized wgmma). The GPU test checks the kernel
itself.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import microscale as ms
from microscale.linear import eligibility as elig
from microscale.linear.backends import prefill_ws as pws
from microscale.linear import routing
from microscale.runtime import target
from microscale.linear import tuning
from microscale.linear import weight_state as wst

pg = pytest.importorskip("microscale.linear._kernels._prefill_gluon")
from test_gemv_mma import Warp  # noqa: E402  (the PTX emulator)


def _xperm(x: torch.Tensor, cb: int = 4) -> torch.Tensor:
    m, k = x.shape
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # conftest interprets only without one
    xd = x.to(dev)
    xp = torch.full((m, k), float("nan"), dtype=x.dtype, device=dev)
    pg._xperm_kernel[(-(-m // 32), k // 64)](xd, xp, m, xd.stride(0), K=k, BLOCK_R=32, CB=cb)
    return xp.cpu()


def test_xperm_layout(gen):
    """Slot ``16 j + 8 a + 2 t + e`` of each 64-element chunk holds element ``16 t + 8 a + j + 4 e``;
    for 8-bit codes slot ``16 a + 8 h + 2 t + e`` element ``16 t + 4 a + 2 h + e``."""
    x = torch.randn(37, 192, generator=gen).to(torch.bfloat16)
    got = _xperm(x).view(37, 3, 4, 2, 4, 2)  # rows, chunk, j, a, t, e
    want = x.view(37, 3, 4, 2, 2, 4).permute(0, 1, 5, 3, 2, 4)  # (t, a, e, j) -> (j, a, t, e)
    assert torch.equal(got, want)
    got = _xperm(x, 8).view(37, 3, 4, 2, 4, 2)  # rows, chunk, a, h, t, e
    want = x.view(37, 3, 4, 4, 2, 2).permute(0, 1, 3, 4, 2, 5)  # (t, a, h, e) -> (a, h, t, e)
    assert torch.equal(got, want)


def _emulated_e8m0(q) -> tuple[int, float]:
    """The emulator's own ``(ke, post)`` for an E8M0-scaled weight (the scale is ``2^(e + ke - 127)``,
    the sums are multiplied by ``post``), from the decodes' placements: E2M1 as ``v 2^-126``
    (``ke = 126 - D``), E4M3 as ``v 2^-120`` one binade lower (``121 - D``), E5M2 as ``v 2^-112``
    (``120 - D``), integers exact (``-D``, their ``2^-frac`` in ``post``)."""
    el = q.fmt.element
    d = wst.e8m0_window(q)
    if el.kind == "int":
        return -d, 2.0 ** (d - el.frac_bits)
    if el.bits == 4:
        return 126 - d, 2.0 ** d
    if el.mbits == 2:
        return 120 - d, 2.0 ** (d - 8)
    return 121 - d, 2.0 ** (d - 1)


def _scale_word(warp, q, sb: np.ndarray, ke: int = 0) -> np.ndarray:
    """The bf16x2 scale words the kernels' bf16 decode makes of scale bytes ``sb`` (``_byte_scale`` for
    ``q``'s scale kind): one integer multiply-add (``SK_UE4M3N`` / ``SK_E8M0N``) or the conversion PTX."""
    sk = pws.gluon_scale_args(q)[0]
    if sk == pg.SK_UE4M3N:
        return ((sb.astype(np.int64) * pg.UE4M3_MUL + pg.UE4M3_ADD) & 0xFFFFFFFF).astype(np.uint32)
    if sk == pg.SK_E8M0N:
        return (((sb.astype(np.int64) + ke) * pg.E8M0_MUL) & 0xFFFFFFFF).astype(np.uint32)
    if sk == pg.SK_UE4M3:
        return warp.run(pg.UE4M3_ASM.value, "=r,r", [sb])[0]
    return warp.run(pg.E8M0_ASM.value, "=r,r,r", [sb, np.full(32, ke).astype(np.int64) & 0xFFFFFFFF])[0]


def emulate(x: torch.Tensor, q) -> np.ndarray:
    """``x @ dequant(q)^T`` as the kernel computes it: every code word through the decode
    PTX with its block scale through the scale PTX, placed in the K slot its thread and
    register hold, against the permuted activations; fp32-exact products summed in float64."""
    n, k = q.shape
    f = q.fmt
    if f.element.bits == 8:
        return _emulate_8bit(x, q)[0]
    words = q.data.contiguous().view(torch.int32).numpy().view(np.uint32).reshape(n, k // 8)
    warp = Warp(np.zeros(1, np.uint8))
    int4 = f.scale.name == "fp16"
    if int4:  # fp16 scale bits | zero point (8 for two's-complement codes) << 16, as the kernel packs them
        zp = q.zero_points.numpy().astype(np.uint32) if f.zero_point else 8
        scales = (q.scales.contiguous().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF) | (zp << 16)
        dasm = pg.INT4Z_DECODE_ASM.value if f.zero_point else pg.INT4S_DECODE_ASM.value
        post = 1.0
    else:
        scales = q.scales.contiguous().view(torch.uint8).numpy().astype(np.uint32)
    mxint = f.element.kind == "int" and f.scale.name == "e8m0"  # MXINT4: the exact code times the power of two
    ke = 0
    if f.scale.name == "ue4m3":
        post = 2.0 ** 7
    elif f.scale.name == "e8m0":
        ke, post = _emulated_e8m0(q)
    a = np.zeros((n, k))
    r, c, t, av = (v.reshape(-1) for v in np.meshgrid(np.arange(n), np.arange(k // 64), np.arange(4), np.arange(2),
                                                      indexing="ij"))
    for lo in range(0, r.size, 32):  # 32 (row, chunk, t, a) words per emulated warp step
        sl = slice(lo, lo + 32)
        w = words[r[sl], 8 * c[sl] + 2 * t[sl] + av[sl]]
        sb = scales[r[sl], (64 * c[sl] + 16 * t[sl]) // f.block_size]  # the block of the thread's 16
        if int4:
            hi, lo, kz = warp.run(pg.F16Z_SCALE_ASM.value, "=r,=r,=r,r", [sb])
            outs = warp.run(dasm, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [w, hi, lo, kz])
        else:
            sc = _scale_word(warp, q, sb, ke)
            dasm = pg.INT4S_E8M0_ASM.value if mxint else pg.DECODE_ASM.value
            outs = warp.run(dasm, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, sc])
        for jj in range(4):
            for e in range(2):
                h = outs[2 * jj + e].astype(np.uint32) & 0xFFFF
                val = (h << 16).view(np.float32).astype(np.float64)
                a[r[sl], 64 * c[sl] + 16 * jj + 8 * av[sl] + 2 * t[sl] + e] = val
    xp = _xperm(x).double().numpy()
    out = xp @ a.T * post
    if q.global_scale is not None:
        out *= float(q.global_scale.reshape(-1)[0])
    return out


def _emulate_8bit(x: torch.Tensor, q) -> tuple[np.ndarray, np.ndarray]:
    """:func:`emulate` for 8-bit codes: thread ``t`` of a row owns code words ``4 t + a`` of each
    64-element K chunk; output ``2 h + e`` of word ``a`` fills K slot ``16 a + 8 h + 2 t + e``.
    E4M3 / E5M2 / MXINT8 under E8M0 scales (:func:`_emulated_e8m0`), or 8-bit integers with fp16
    scales (``hi`` / ``lo`` and ``z - 128`` by :data:`F16Z8_SCALE_ASM`). Also returns the decoded
    weights in natural K order (times ``post``)."""
    n, k = q.shape
    f = q.fmt
    words = q.data.contiguous().view(torch.int32).numpy().view(np.uint32).reshape(n, k // 4)
    warp = Warp(np.zeros(1, np.uint8))
    e8m0 = f.scale.name == "e8m0"
    if e8m0:
        ke, post = _emulated_e8m0(q)
        scales = q.scales.contiguous().view(torch.uint8).numpy().astype(np.uint32)
        dasm = (pg.INT8S_E8M0_ASM if f.element.kind == "int" else pg.E5M2_DECODE_ASM if f.element.mbits == 2
                else pg.E4M3_DECODE_ASM).value
    else:
        zp = q.zero_points.numpy().astype(np.uint32) if f.zero_point else 8
        scales = (q.scales.contiguous().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF) | (zp << 16)
        dasm = (pg.INT8Z_DECODE_ASM if f.zero_point else pg.INT8S_DECODE_ASM).value
        post = 1.0
    a = np.zeros((n, k))
    nat = np.zeros((n, k))
    r, c, t, av = (v.reshape(-1) for v in np.meshgrid(np.arange(n), np.arange(k // 64), np.arange(4), np.arange(4),
                                                      indexing="ij"))
    for lo in range(0, r.size, 32):
        sl = slice(lo, lo + 32)
        w = words[r[sl], 16 * c[sl] + 4 * t[sl] + av[sl]]
        sb = scales[r[sl], (64 * c[sl] + 16 * t[sl]) // f.block_size]
        if e8m0:
            sc = _scale_word(warp, q, sb, ke)
            outs = warp.run(dasm, "=h,=h,=h,=h,r,r", [w, sc])
        else:
            hi, lo_, kz = warp.run(pg.F16Z8_SCALE_ASM.value, "=r,=r,=r,r", [sb])
            outs = warp.run(dasm, "=h,=h,=h,=h,r,r,r,r", [w, hi, lo_, kz])
        for h in range(2):
            for e in range(2):
                bits = outs[2 * h + e].astype(np.uint32) & 0xFFFF
                val = (bits << 16).view(np.float32).astype(np.float64)
                a[r[sl], 64 * c[sl] + 16 * av[sl] + 8 * h + 2 * t[sl] + e] = val
                nat[r[sl], 64 * c[sl] + 16 * t[sl] + 4 * av[sl] + 2 * h + e] = val * post
    return _xperm(x, 8).double().numpy() @ a.T * post, nat


def _int8_weight(name: str, gen, n: int = 24, k: int = 512):
    """An 8-bit integer weight with every code (-128 too), scales over many binades (fp16:
    subnormal, normal with low mantissa bits set, the largest; E8M0: the ends of the widest
    window) and, for affine codes, every zero point."""
    w = torch.randn(n, k, generator=gen) * torch.logspace(-6, 2, n).reshape(n, 1)
    q = ms.quantize(w, name)
    q.data[1, :] = torch.arange(256, dtype=torch.uint8).repeat(k // 256 + 1)[:k]  # every code
    if q.fmt.scale.name == "e8m0":
        q.data[2:4, :] = q.data[1, :]
        q.scales.view(torch.uint8)[2, :] = 63  # every code at the lowest scale of the widest window (D + 2) ...
        q.scales.view(torch.uint8)[3, :] = 63 + 126  # ... and the highest (D + 128)
        return q
    sc = q.scales.view(torch.int16)
    extremes = torch.tensor([0x0001, 0x03FF, 0x0401, 0x7BFF, 0x3C01, 0x3FFF], dtype=torch.int16)
    sc[0, :] = extremes.repeat(sc.shape[1] // extremes.numel() + 1)[: sc.shape[1]]
    sc[1, :] = extremes.flip(0).repeat(sc.shape[1] // extremes.numel() + 1)[: sc.shape[1]]
    if q.zero_points is not None:
        q.zero_points[1:4, :] = (torch.arange(3 * q.zero_points.shape[1]) * 37 % 256).to(torch.uint8).view(3, -1)
    return q


@pytest.mark.parametrize("name", ["mxint8", "int8_fp16", "int8_affine_g128", "int8_affine_g32"])
def test_int8_arithmetic_matches_float64(name, gen):
    """8-bit integers: each decoded weight, placed in its K slot and multiplied by the permuted
    activations, against float64. MXINT8 (E8M0 powers of two) is exact; with fp16 scales each
    weight is the bf16 of ``(code - z) * s`` or, within 2^-15 of a rounding tie, its neighbour."""
    q = _int8_weight(name, gen)
    _check_int8(q, (torch.randn(5, q.shape[1], generator=gen) * 2).to(torch.bfloat16))


def _check_int8(q, x: torch.Tensor) -> None:
    out, nat = _emulate_8bit(x, q)
    exact = q.dequantize(torch.float64)
    if q.fmt.scale.name == "e8m0":
        assert wst.e8m0_window(q) is not None
        assert np.array_equal(nat, exact.numpy())
    else:
        ex = exact.numpy()
        rounded = exact.to(torch.bfloat16).double().numpy()
        off = nat != rounded
        # a weight off the bf16 rounding lies across a tie the exact value is within 2^-15 (relative)
        # of: so it is the rounding's other neighbour (any other value's midpoint with the rounding
        # is half an ulp or more away)
        tie = (nat[off] + rounded[off]) / 2
        assert (np.abs(ex[off] - tie) <= 2.0 ** -15 * np.abs(ex[off])).all()
        exact = torch.from_numpy(nat)
    ref = (x.double() @ exact.T).numpy()
    cond = (x.double().abs() @ exact.abs().T).numpy()
    assert (np.abs(out - ref) <= 2.0 ** -40 * cond + 1e-300).all()


def test_int8_emulation_catches_a_lost_scale_part(gen, monkeypatch):
    """The check can fail: fp16 scales without their ``lo`` part are caught, and so is MXINT8's
    top bit read as a magnitude bit."""
    q = _int8_weight("int8_affine_g128", gen)
    x = (torch.randn(3, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    with monkeypatch.context() as mp:
        mp.setattr(pg, "F16Z8_SCALE_ASM", pg.gl.constexpr(pg.F16Z8_SCALE_ASM.value.replace(
            "cvt.rn.bf16x2.f32 $1, f, f;", "mov.b32 $1, 0;")))
        with pytest.raises(AssertionError):
            _check_int8(q, x)
    monkeypatch.setattr(pg, "INT8S_E8M0_ASM", pg.gl.constexpr(pg.INT8S_E8M0_ASM.value.replace("0x00800080",
                                                                                              "0x00000000")))
    with pytest.raises(AssertionError):
        _check_int8(_int8_weight("mxint8", gen), x)


def test_scale_args_are_the_emulated_ones(gen):
    """The kernels' ``(SK, ke, post)`` and element kind per format are the ones the emulator
    uses (:func:`_emulated_e8m0`; so a routing slip there is caught without a GPU)."""
    fixed = {"nvfp4": (pg.SK_UE4M3N, 0, 2.0 ** 7), "int4_affine_g128": (pg.SK_F16Z, 0, 1.0),
             "int4_fp16": (pg.SK_F16, 0, 1.0), "int8_fp16": (pg.SK_F16, 0, 1.0), "int8_affine_g32": (pg.SK_F16Z, 0, 1.0)}
    kinds = {"mxfp8_e5m2": 2, "mxint8": 1, "mxint4": 1}  # the rest 0
    for name in (*fixed, "mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "mxint4"):
        q = ms.quantize(torch.randn(8, 256, generator=gen) * 2.0 ** (len(name) - 8), name)  # windows differ
        want = fixed[name] if name in fixed else (pg.SK_E8M0N, *_emulated_e8m0(q))
        assert (pws.gluon_scale_args(q), elig.gluon_elem_kind(q)) == (want, kinds.get(name, 0)), name


def test_scale_multiply_add_is_the_conversion():
    """The bf16 decodes' one-instruction scales equal the conversion PTX they replace, bit for bit: UE4M3
    for every normal byte (8..126; also against ml_dtypes: ``s * 2^119`` as bf16), E8M0 for every byte
    and ``ke`` with ``e + ke`` in 1..254; subnormal UE4M3 bytes come out wrong (hence the scan)."""
    import ml_dtypes

    warp = Warp(np.zeros(1, np.uint8))
    for lo in range(0, 256, 32):
        b = np.arange(lo, lo + 32, dtype=np.uint32)
        fast = ((b.astype(np.int64) * pg.UE4M3_MUL + pg.UE4M3_ADD) & 0xFFFFFFFF).astype(np.uint32)
        asm = warp.run(pg.UE4M3_ASM.value, "=r,r", [b])[0]
        s = b.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64) * 2.0 ** 119
        oracle = s.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32) * 0x10001
        normal = (b >= 8) & (b <= 126)
        assert (fast[normal] == asm[normal]).all() and (fast[normal] == oracle[normal]).all()
        assert (fast[~normal & (b != 0)] != oracle[~normal & (b != 0)]).all()  # why the scan is needed
        exp_ones = (fast & 0x7F80) == 0x7F80  # Inf / NaN halves: bytes 0x80..0x87 (refused outright)
        assert (exp_ones == ((b >= 0x80) & (b <= 0x87))).all()
    for ke in range(-254, 255, 7):
        for lo in range(0, 256, 32):
            e = np.arange(lo, lo + 32, dtype=np.uint32)
            ok = (e.astype(np.int64) + ke >= 1) & (e.astype(np.int64) + ke <= 254)
            fast = (((e.astype(np.int64) + ke) * pg.E8M0_MUL) & 0xFFFFFFFF).astype(np.uint32)
            asm = warp.run(pg.E8M0_ASM.value, "=r,r,r", [e, np.full(32, ke).astype(np.int64) & 0xFFFFFFFF])[0]
            assert (fast[ok] == asm[ok]).all()


def test_ue4m3_scan(gen):
    """``SK_UE4M3N`` (scales by one multiply-add) only for weights whose UE4M3 bytes below 8 (or above
    126) scale blocks of zero codes; a subnormal scale under a nonzero code, or a NaN scale anywhere,
    keeps the conversion PTX; fp16 activations always take it; rescanned after an in-place change."""
    q = ms.quantize(torch.randn(16, 256, generator=gen), "nvfp4")
    assert pws.gluon_scale_args(q)[0] == pg.SK_UE4M3N
    assert pws.gluon_scale_args(q, True)[0] == pg.SK_UE4M3
    data, sc = q.data.clone(), q.scales.clone()
    sc.view(torch.uint8)[3, 5] = 0  # a zero scale over zero codes
    codes = data.view(torch.uint8)
    codes[3, 5 * 8:6 * 8] = 0
    q2 = dataclasses.replace(q, data=data, scales=sc)
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3N
    sc.view(torch.uint8)[3, 5] = 3  # subnormal, still over zero codes
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3N
    codes[3, 5 * 8] = 0x10  # a nonzero code under the subnormal scale
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3
    codes[3, 5 * 8] = 0x80  # -0: zero again
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3N
    sc.view(torch.uint8)[7, 1] = 0x7F  # NaN
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3
    sc.view(torch.uint8)[7, 1] = 0x40
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3N
    sc.view(torch.uint8)[3, 5] = 0x80  # a sign bit, even over zero codes (the multiply-add makes Inf of it)
    assert pws.gluon_scale_args(q2)[0] == pg.SK_UE4M3


def test_emulation_catches_the_subnormal_scale_shortcut(gen, monkeypatch):
    """Negative control: a weight with subnormal UE4M3 scales under nonzero codes, forced onto the
    multiply-add scales, is wrong in the emulation (the scan is what keeps it right)."""
    w = torch.randn(24, 512, generator=gen)
    w[:, :64] *= 2.0 ** -16  # blocks far below the largest: subnormal UE4M3 scales
    q = ms.quantize(w, "nvfp4")
    b = q.scales.view(torch.uint8)
    assert bool(((b >= 1) & (b < 8)).any())
    x = torch.randn(5, 512, generator=gen).to(torch.bfloat16)
    wd = q.dequantize(torch.float64)
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    assert pws.gluon_scale_args(q)[0] == pg.SK_UE4M3
    assert (np.abs(emulate(x, q) - ref) <= 2.0 ** -20 * cond + 1e-300).all()  # the reference rounds s * gs
    monkeypatch.setattr(pws, "ue4m3_normal", lambda q: True)
    assert not (np.abs(emulate(x, q) - ref) <= 2.0 ** -20 * cond + 1e-300).all()


@pytest.mark.parametrize("signed", [False, True])
def test_int8_unscaled_decode_is_exact(signed, gen):
    """``decode_tma``'s unscaled 8-bit decode: output ``2h + e`` of a word holds byte ``2h + e`` as
    exactly ``code - z`` in bf16 (unsigned: every zero point 0-255; signed: the two's-complement
    value), every byte value in every slot."""
    every = np.array([v * 0x01010101 for v in range(256)], dtype=np.uint32)
    rnd = torch.randint(-2**31, 2**31, (256,), generator=gen, dtype=torch.int64).numpy().astype(np.uint32)
    w = np.concatenate([every, every, rnd])  # 768 words, 24 warps
    z = (np.arange(w.size) * 7 % 256).astype(np.uint32)
    asm = (pg.INT8S_CODE_ASM if signed else pg.INT8Z_CODE_ASM).value
    warp = Warp(np.zeros(1, np.uint8))
    cons = "=h,=h,=h,=h,r,r"
    for lo in range(0, w.size, 32):
        ww, zz = w[lo:lo + 32], z[lo:lo + 32]
        kz = warp.run(pg.Z8_ASM.value, "=r,r", [zz << np.uint32(16)])[0]
        outs = warp.run(asm, cons, [ww, kz])
        for i in range(4):
            byte = ((ww >> np.uint32(8 * i)) & np.uint32(0xFF)).astype(np.int64)
            want = np.where(byte >= 128, byte - 256, byte) if signed else byte - zz.astype(np.int64)
            got = ((outs[i].astype(np.uint32) & 0xFFFF) << 16).view(np.float32)
            assert (got.astype(np.float64) == want).all(), i
    # the check can fail: a zero point off by one moves every unsigned value; a lost top bit the signed ones
    wr, zr = w[-32:], z[-32:]  # random words
    kz = warp.run(pg.Z8_ASM.value, "=r,r", [zr << np.uint32(16)])[0]
    good = warp.run(asm, cons, [wr, kz])
    if signed:
        bad = warp.run(asm.replace("0x00800080", "0x00000000"), cons, [wr, kz])
    else:
        bad = warp.run(asm, cons, [wr, warp.run(pg.Z8_ASM.value, "=r,r", [(zr + 1) << np.uint32(16)])[0]])
    assert not np.array_equal(bad[1], good[1])


def _e4m3_weight(gen, n: int = 24, k: int = 512, name: str = "mxfp8_e4m3"):
    """An MXFP8 weight with every finite E4M3 (E5M2) code (subnormals too) and scales 126 binades apart."""
    q = ms.quantize(torch.randn(n, k, generator=gen) * torch.logspace(-10, 10, n).reshape(n, 1), name)
    if name == "mxfp8_e5m2":  # no Inf / NaN (exponent 31: 0x7C-0x7F, 0xFC-0xFF)
        codes = torch.cat([torch.arange(0, 0x7C), torch.arange(128, 0xFC)]).to(torch.uint8)
    else:  # no NaN (0x7F, 0xFF)
        codes = torch.cat([torch.arange(0, 127), torch.arange(128, 255)]).to(torch.uint8)
    q.data[1:3, :] = codes.repeat(k // codes.numel() + 1)[:k]
    q.scales.view(torch.uint8)[2, :] = 63  # every code at the lowest scale of the widest window (D + 2) ...
    q.scales.view(torch.uint8)[3, :] = 63 + 126  # ... and the highest (D + 128)
    return q


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_e4m3_arithmetic_matches_float64(name, gen):
    """E4M3 / E5M2 codes: every decoded weight (code times its E8M0 scale, exact in bf16 down to
    its subnormals) against float64."""
    q = _e4m3_weight(gen, name=name)
    assert wst.e8m0_window(q) is not None
    x = (torch.randn(5, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    out = emulate(x, q)
    wd = q.dequantize(torch.float64)
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    assert (np.abs(out - ref) <= 2.0 ** -40 * cond + 1e-300).all()


def test_emulation_catches_wrong_mxint4_and_e5m2_decodes(gen, monkeypatch):
    """The checks can fail: MXINT4 without the +8 of its two's-complement bias, E5M2 shifted as E4M3."""
    x = (torch.randn(3, 256, generator=gen) * 2).to(torch.bfloat16)
    q = ms.quantize(torch.randn(24, 256, generator=gen), "mxint4")
    wd = q.dequantize(torch.float64)
    monkeypatch.setattr(pg, "INT4S_E8M0_ASM", pg.gl.constexpr(pg.INT4S_E8M0_ASM.value.replace("0x43084308",
                                                                                              "0x43004300")))
    assert not np.allclose(emulate(x, q), (x.double() @ wd.T).numpy(), rtol=1e-3, atol=1e-6)
    q = _e4m3_weight(gen, name="mxfp8_e5m2")
    wd = q.dequantize(torch.float64)
    x = (torch.randn(3, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    monkeypatch.setattr(pg, "E5M2_DECODE_ASM", pg.gl.constexpr(pg.e4m3_decode_asm(3)))
    assert not np.allclose(emulate(x, q), (x.double() @ wd.T).numpy(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_e4m3_emulation_catches_a_wrong_binade(name, gen, monkeypatch):
    """The check can fail: the E8M0 window one binade higher loses the subnormal products."""
    q = _e4m3_weight(gen, name=name)
    x = (torch.randn(3, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    wd = q.dequantize(torch.float64)
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    higher = lambda q, f=wst.e8m0_window: f(q) + 1  # noqa: E731
    monkeypatch.setattr(wst, "e8m0_window", higher)  # (what the emulator reads)
    monkeypatch.setattr(pws, "e8m0_window", higher)  # (what the scale arguments read)
    assert not (np.abs(emulate(x, q) - ref) <= 2.0 ** -40 * cond + 1e-300).all()


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxint4"])
def test_kernel_arithmetic_matches_float64(name, gen):
    q = ms.quantize(torch.randn(24, 256, generator=gen), name)
    if name == "mxint4":  # every code, at both ends of the widest E8M0 window
        q.data[1:4, :] = torch.arange(256, dtype=torch.uint8).repeat(2)[:128]
        q.scales.view(torch.uint8)[2, :] = 63
        q.scales.view(torch.uint8)[3, :] = 63 + 126
    x = (torch.randn(5, 256, generator=gen) * 2).to(torch.bfloat16)
    out = emulate(x, q)
    wd = q.dequantize(torch.float64)
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    assert (np.abs(out - ref) <= 2.0 ** -20 * cond + 1e-300).all()  # the reference rounds s * gs to fp32


def _int4_weight(name: str, gen, n: int = 24, k: int = 512):
    """A 4-bit integer weight with scales over many binades (normal and subnormal fp16, with
    low mantissa bits set: the ``lo`` part of the split) and every code and zero point."""
    w = torch.randn(n, k, generator=gen) * torch.logspace(-6, 2, n).reshape(n, 1)
    q = ms.quantize(w, name)
    sc = q.scales.view(torch.int16)
    extremes = torch.tensor([0x0001, 0x03FF, 0x0401, 0x7BFF], dtype=torch.int16)  # fp16 subnormal / normal
    sc[0, :] = extremes.repeat(sc.shape[1] // 4 + 1)[: sc.shape[1]]
    q.data[1, :] = torch.arange(256, dtype=torch.uint8).repeat(k // 512 + 1)[: k // 2]  # every code pair
    if q.zero_points is not None:
        q.zero_points[2, :] = torch.arange(q.zero_points.shape[1], dtype=torch.uint8) % 16
    return q


@pytest.mark.parametrize("name", ["int4_affine_g128", "int4_affine_g32", "int4_affine_g64", "int4_fp16"])
def test_int4_arithmetic_is_the_reference_dequantization(name, gen):
    """4-bit integers with fp16 scales: every decoded weight is the bf16 of ``(code - z) * s``
    (the reference dequantization rounded once), so the products match float64 on the
    bf16-rounded weights up to fp32 accumulation."""
    q = _int4_weight(name, gen)
    x = (torch.randn(5, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    out = emulate(x, q)
    wd = q.dequantize(torch.float64).to(torch.bfloat16).double()  # rounded once from the exact value
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    assert (np.abs(out - ref) <= 2.0 ** -40 * cond + 1e-300).all()


@pytest.mark.parametrize("signed", [False, True])
def test_int4_unscaled_decode_is_exact(signed, gen):
    """``decode_tma``'s unscaled 4-bit decode (PTX run by the emulator): output ``2j`` / ``2j+1`` of
    a word holds elements ``j`` / ``j + 4`` as exactly ``code - z`` in bf16 (unsigned: every zero
    point 0-15; signed: the two's-complement value), every nibble value in every slot."""
    every = np.array([v * 0x11111111 for v in range(16)], dtype=np.uint32)
    rnd = torch.randint(-2**31, 2**31, (224,), generator=gen, dtype=torch.int64).numpy().astype(np.uint32)
    w = np.concatenate([np.tile(every, 16), rnd])  # 480 words, 15 warps
    z = (np.arange(w.size) % 16).astype(np.uint32) if not signed else np.full(w.size, 8, np.uint32)
    asm = (pg.INT4S_CODE_ASM if signed else pg.INT4Z_CODE_ASM).value
    warp = Warp(np.zeros(1, np.uint8))
    for lo in range(0, w.size, 32):
        ww, zz = w[lo:lo + 32], z[lo:lo + 32]
        outs = warp.run(asm, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [ww, (zz + 0x4300) * 0x10001])
        for j in range(4):
            for e in range(2):
                nib = ((ww >> np.uint32(4 * (j + 4 * e))) & np.uint32(0xF)).astype(np.int64)
                want = np.where(nib >= 8, nib - 16, nib) if signed else nib - zz.astype(np.int64)
                got = ((outs[2 * j + e].astype(np.uint32) & 0xFFFF) << 16).view(np.float32)
                assert (got.astype(np.float64) == want).all(), (j, e)
    # the check can fail: the operand of z + 1 moves every value
    cons = "=h,=h,=h,=h,=h,=h,=h,=h,r,r"
    bad = warp.run(asm, cons, [w[:32], (z[:32] + 0x4301) * 0x10001])
    assert not np.array_equal(bad[0], warp.run(asm, cons, [w[:32], (z[:32] + 0x4300) * 0x10001])[0])


def test_int4_emulation_catches_an_inexact_scale(gen, monkeypatch):
    """The check can fail: fp16 scales rounded to bf16 (one multiply, no ``lo`` part) are caught."""
    q = _int4_weight("int4_affine_g128", gen)
    x = (torch.randn(3, q.shape[1], generator=gen) * 2).to(torch.bfloat16)
    monkeypatch.setattr(pg, "F16Z_SCALE_ASM", pg.gl.constexpr(pg.F16Z_SCALE_ASM.value.replace(
        "cvt.rn.bf16x2.f32 $1, f, f;", "mov.b32 $1, 0;")))
    wd = q.dequantize(torch.float64).to(torch.bfloat16).double()
    ref = (x.double() @ wd.T).numpy()
    cond = (x.double().abs() @ wd.abs().T).numpy()
    assert not (np.abs(emulate(x, q) - ref) <= 2.0 ** -40 * cond + 1e-300).all()


def test_emulation_catches_a_wrong_slot_order(gen, monkeypatch):
    """The check can fail: activations left in natural K order are caught."""
    q = ms.quantize(torch.randn(8, 128, generator=gen), "nvfp4")
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    monkeypatch.setitem(globals(), "_xperm", lambda v: v.clone())
    wd = q.dequantize(torch.float64)
    assert not np.allclose(emulate(x, q), (x.double() @ wd.T).numpy(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("fmt,n", [("nvfp4", 256), ("mxfp4", 260), ("int4_affine_g128", 256), ("mxfp8_e4m3", 264),
                                   ("int8_affine_g128", 256), ("mxfp8_e5m2", 256)])
def test_compiles_for_sm90_without_movement_or_spills(fmt, n, tmp_path, run_tool):
    """Compiled as ``prefill_ws`` launches it: the decoded tile reaches the wgmma register
    operand with no layout conversion (``assert_trivial`` in the kernel: a failure would
    stop the compile), no shared-memory round trip of the weights (``LDSM``), code words
    loaded as 8-byte vectors, no spills, no serialized wgmma; whole tiles' output by TMA
    store when N is a multiple of 8."""
    r = run_tool("gemv_ptx.py", str(tmp_path), "--ws", "--fmt", fmt, "--m", "512", "--n", str(n), "--k", "1024",
                 "--config", "{'block_t': 256}", "--sass")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout and "C7512" not in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / "_prefill_ws_kernel.sass").read_text()
    assert "HGMMA.64x256x16.F32.BF16" in sass and "LDG.E.64" in sass and "LDSM" not in sass
    # direct 2-byte stores serve N % 8 != 0 and the split tail tiles; their arrivals are atomics
    assert ("UTMASTG" in sass) == (n % 8 == 0) and "STG.E.U16" in sass and "ATOMG" in sass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name,lead", [("nvfp4", (2, 160)), ("nvfp4", (1, 65)), ("int4_affine_g128", (3, 32)),
                                       ("mxfp8_e4m3", (3, 11)), ("int8_affine_g128", (3, 11)), ("mxint8", (1, 40))])
def test_gpu_routing_switch(name, lead, monkeypatch):
    """``ms.linear`` routes from ``PREFILL_WS_MIN_M`` tokens (MXFP8: ``PREFILL_WS_MIN_M_8BIT``; leading
    batch dims) to ``prefill_ws``."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90 (wgmma)")
    g = torch.Generator(device=dev).manual_seed(6)
    q = ms.quantize(torch.randn(256, 512, device=dev, generator=g), name)
    x = torch.randn(*lead, 512, device=dev, generator=g).to(torch.bfloat16)
    tuning.set_tuning(prefill_ws=True)
    y = ms.linear(x, q)
    m = x.numel() // 512
    torch.testing.assert_close(y, pws.prefill_ws(x.reshape(m, 512), q).reshape(*lead, 256), rtol=0, atol=0)


def test_ws_token_thresholds():
    """From 65 tokens (the first count ``decode_tma`` does not serve) ``prefill_ws``; 8-bit codes,
    which ``decode_tma`` serves up to 32 tokens, from 33, but 8-bit integers with fp16 scales in
    blocks of 32 (the Triton prefill kernel is ahead up to 64 tokens)."""
    from types import SimpleNamespace as NS

    assert routing.ws_min_m(NS(fmt=ms.get_format("nvfp4"))) == tuning.get().prefill_ws_min_m == tuning.get().decode_tma_max_m + 1
    assert routing.ws_min_m(NS(fmt=ms.get_format("int4_affine_g128"))) == tuning.get().prefill_ws_min_m
    assert routing.ws_min_m(NS(fmt=ms.get_format("mxfp8_e4m3"))) == tuning.get().prefill_ws_min_m_8bit == tuning.get().decode_tma_max_m_8bit + 1
    assert [routing.ws_min_m(NS(fmt=ms.get_format(n))) for n in ("mxint8", "int8_affine_g128", "int8_affine_g32",
                                                            "int8_fp16")] == [33, 33, 65, 65]


def test_small_weight_routing(monkeypatch):
    """33-64 tokens on E2M1 weights of at most ``PREFILL_WS_SMALL_MAX_NK`` elements
    (``PREFILL_WS_SMALL_MAX_NK_BF16`` where decode_tma would take its 256-row tile: bf16 activations while
    ``_DT_ONE_TABLE`` is on, or 103-132 such tiles on 132 SMs) go to
    ``prefill_ws`` only while a CUDA graph is being captured, on CUDA, with ``_PREFILL_WS`` on
    and decode_tma not forced (4-bit integers keep ``decode_tma``)."""
    from types import SimpleNamespace as NS

    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    tuning.set_tuning(dt_one_table=True)
    monkeypatch.setattr(target, "num_sms", lambda device: 132)

    def x(m, cuda=True, dtype=torch.float16):
        return NS(is_cuda=cuda, shape=(m, 8192), numel=lambda: m * 8192, dtype=dtype, device=None)

    f4 = ms.get_format("nvfp4")
    small, big = NS(shape=(8192, 8192), fmt=f4), NS(shape=(8192, 8193), fmt=f4)
    for other in ("int4_affine_g128", "mxfp8_e4m3"):  # E2M1 only
        assert not routing.prefill_ws_small_wanted(x(48), NS(shape=(8192, 8192), fmt=ms.get_format(other)))
    assert [routing.prefill_ws_small_wanted(x(m), small) for m in (32, 33, 48, 64, 65)] == [False, True, True, True, False]
    assert not routing.prefill_ws_small_wanted(x(48), big) and not routing.prefill_ws_small_wanted(x(48, False), small)
    assert small.shape[0] * small.shape[1] == tuning.get().prefill_ws_small_max_nk
    # bf16 activations: decode_tma's 256-row tile from PREFILL_WS_SMALL_MAX_NK_BF16 on (fp16 has no such tile)
    bf16 = torch.bfloat16
    half, half1 = NS(shape=(6144, 8192), fmt=f4), NS(shape=(6144, 8193), fmt=f4)
    assert half.shape[0] * half.shape[1] == tuning.get().prefill_ws_small_max_nk_bf16
    assert routing.prefill_ws_small_wanted(x(48, dtype=bf16), half) and routing.prefill_ws_small_wanted(x(64, dtype=bf16), half)
    assert not routing.prefill_ws_small_wanted(x(48, dtype=bf16), half1)
    assert not routing.prefill_ws_small_wanted(x(48, dtype=bf16), small)
    tuning.set_tuning(dt_one_table=False)  # 128-row tiles: the larger limit
    assert routing.prefill_ws_small_wanted(x(48, dtype=bf16), small)
    tall = NS(shape=(28672, 2048), fmt=f4)  # 112 256-row tiles fill the SMs: that tile even without one table
    assert not routing.prefill_ws_small_wanted(x(48, dtype=bf16), tall) and routing.prefill_ws_small_wanted(x(48), tall)
    tuning.set_tuning(prefill_ws=False)
    assert not routing.prefill_ws_small_wanted(x(48), small)
    tuning.set_tuning(prefill_ws=True)
    tuning.set_tuning(decode_tma="always")  # decode_tma forced
    assert not routing.prefill_ws_small_wanted(x(48), small)
    tuning.set_tuning(decode_tma="auto")
    assert routing.prefill_ws_small_wanted(x(48), small)
    capturing[0] = False
    assert not routing.prefill_ws_small_wanted(x(48), small)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_small_weight_route_in_a_graph(monkeypatch):
    """48 tokens on a small NVFP4 weight, captured in a CUDA graph: ``ms.linear`` takes
    ``prefill_ws`` (the same bits), and a replay on new activations is correct against float64."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90 (wgmma)")
    tuning.set_tuning(prefill_ws=True)
    g = torch.Generator(device=dev).manual_seed(7)
    q = ms.quantize(torch.randn(384, 1024, device=dev, generator=g), "nvfp4")
    x = torch.randn(48, 1024, device=dev, generator=g).to(torch.bfloat16)
    ms.linear(x, q)  # eager: decode_tma, so prefill_ws compiles inside the capture below
    torch.cuda.synchronize()
    real, calls = routing.prefill_ws_run, []
    monkeypatch.setattr(routing, "prefill_ws_run", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ms.linear(x, q)
    assert calls == [48]
    monkeypatch.setattr(routing, "prefill_ws_run", real)
    x.copy_(torch.randn(48, 1024, device=dev, generator=g).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, pws.prefill_ws(x, q), rtol=0, atol=0)
    ref = x.double() @ q.dequantize().double().T
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "int4_affine_g128", "int4_affine_g32", "int4_fp16", "mxfp8_e4m3",
                                  "mxint8", "int8_fp16", "int8_affine_g128", "mxfp8_e5m2", "mxint4"])
@pytest.mark.parametrize("programs", [None, 3])
@pytest.mark.parametrize("split_tail", [True, False])
def test_gpu_prefill_ws(name, programs, split_tail, monkeypatch):
    """The kernel on an H200: ragged tokens and rows, bias, odd and even K step counts, each
    output element within bf16 rounding of float64 plus an fp32 accumulation bound.
    ``programs=3``: the persistent grid of 3 programs, each looping over many tiles (its
    ring phases, next-tile code prefetch and output-buffer reuse). ``split_tail``: the tiles
    past the last full wave split in K (with 132 programs every tile here is split, in 4 to 8
    parts; with 3 programs the single tail tile of the first two cases, in 3), checked to
    have taken the split path (its workspace requested), the same output on a second call
    (the parts are added in a fixed order; the counters were left at zero). The reference
    weights: the exact dequantization for E2M1 (code times block scale is exact in bf16); the
    int4 decode rounds ``(code - z) * s`` once, the int8 one too but near ties (a looser bound);
    NVFP4's global scale is applied in float32 after the sums, so its reference weights stay
    exact)."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90 (wgmma)")
    if programs is not None:
        monkeypatch.setattr(target, "num_sms", lambda device: programs)
    parts = []  # partial floats each launch asked the workspace for (nonzero: a split tail)
    workspace = pws.workspace
    monkeypatch.setattr(pws, "workspace", lambda device, floats, tiles: parts.append(floats) or workspace(
        device, floats, tiles))
    g = torch.Generator(device=dev).manual_seed(4)
    cases = [(300, 196, 1024, 256), (64, 128, 512, 128), (513, 200, 2048, 256),  # N % 8: both stores
             (700, 390, 1088, 128), (520, 264, 1088, 64)]  # 17 K steps
    for (m, n, k, bt) in cases:
        k = k if k % ms.get_format(name).block_size == 0 else k + 64  # (g128: an even K step count)
        q = ms.quantize(torch.randn(n, k, device=dev, generator=g), name)
        wd = q.dequantize(torch.float64)
        if q.fmt.scale.name == "fp16":  # the integer decode's weights: rounded once to bf16
            wd = wd.to(torch.bfloat16).double()
        x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
        bias = torch.randn(n, device=dev, generator=g)
        out = pws.prefill_ws(x, q, bias, block_t=bt, split_tail=split_tail)
        assert torch.equal(out, pws.prefill_ws(x, q, bias, block_t=bt, split_tail=split_tail))
        ref = x.double() @ wd.T + bias.double()
        cond = x.double().abs() @ wd.abs().T + bias.double().abs()
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        assert torch.isfinite(out).all()
        # 8-bit integers with fp16 scales: a weight within 2^-15 of a rounding tie may be the other neighbour
        tol = 2.0 ** -12 if q.fmt.scale.name == "fp16" and q.fmt.element.bits == 8 else 2.0 ** -16
        assert ((out.double() - ref).abs() <= 2.0 ** -8 * ref.abs() + tol * cond).all(), (m, n, k)
    assert any(parts) == split_tail


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
def test_gpu_bad_tile_arguments():
    """Tile sizes the kernel has no layout for, and rings too large for shared memory, are refused."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90 (wgmma)")
    q = ms.quantize(torch.randn(128, 256, device=dev), "nvfp4")
    x = torch.randn(64, 256, device=dev).to(torch.bfloat16)
    with pytest.raises(ValueError, match="block_t in"):
        pws.prefill_ws(x, q, block_t=96)
    with pytest.raises(ValueError, match="stages <="):
        pws.prefill_ws(x, q, block_t=256, stages=6)


def test_reasons():
    q = ms.quantize(torch.randn(64, 256), "mxfp6_e2m3")
    x = torch.randn(4, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="serves E2M1"):
        pws.prefill_ws(x, q)
    q = ms.quantize(torch.randn(64, 256), "nvfp4")
    with pytest.raises(ValueError, match="Hopper"):  # float16 activations are served (the f16 decodes)
        pws.prefill_ws(x.half(), q)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        pws.prefill_ws(x.float(), q)
    with pytest.raises(ValueError, match="Hopper"):
        pws.prefill_ws(x, q)
    q = ms.quantize(torch.randn(64, 256), "int4_affine_g128")
    assert pws.prefill_ws_reason(q, x) == "needs a Hopper GPU (sm_90: wgmma)"  # the weight itself is served
    q.zero_points[3, 1] = 16  # 128 + z and (code - z) * lo no longer exact in bf16
    with pytest.raises(ValueError, match="zero points of at most 15"):
        pws.prefill_ws(x, q)
    for name in ("int4_fp32", "mxint6", "int8_fp32", "fp8_e4m3_fp16"):
        with pytest.raises(ValueError, match="4/8-bit integers with fp16"):
            pws.prefill_ws(x, ms.quantize(torch.randn(64, 256), name))
    for name in ("int8_affine_g128", "int8_fp16", "mxint8"):  # 8-bit integers: any zero point
        q = ms.quantize(torch.randn(64, 256), name)
        if q.zero_points is not None:
            q.zero_points[3, 1] = 255
        assert pws.prefill_ws_reason(q, x) == "needs a Hopper GPU (sm_90: wgmma)", name
    q = ms.quantize(torch.randn(64, 256), "mxfp8_e4m3")
    assert pws.prefill_ws_reason(q, x) == "needs a Hopper GPU (sm_90: wgmma)"
    q.data[5, 7] = 0x7F  # a NaN code: the bit-placement decode has no NaN
    with pytest.raises(ValueError, match="without Inf / NaN"):
        pws.prefill_ws(x, q)
    for name in ("mxfp8_e5m2", "mxint4"):
        q = ms.quantize(torch.randn(64, 256), name)
        assert pws.prefill_ws_reason(q, x) == "needs a Hopper GPU (sm_90: wgmma)", name
    q = ms.quantize(torch.randn(64, 256), "mxfp8_e5m2")
    q.data[5, 7] = 0xFC
    with pytest.raises(ValueError, match="without Inf / NaN"):
        pws.prefill_ws(x, q)


@pytest.mark.parametrize("m, n, split, want", [
    (4096, 28672, True, 256), (512, 8192, True, 256),  # many full waves: the widest tile
    (128, 28672, True, 128),  # 224 row tiles: a 256-token tile would be half empty, as many waves
    (128, 8192, True, 128),  # 64 tiles of 128 tokens, each split in 2 K parts: 128 programs
    (128, 8192, False, 64),  # unsplit, only 64-token tiles fill the 132 SMs
    (256, 8192, True, 256), (256, 8192, False, 128)])
def test_choose_ws_tile(m, n, split, want):
    """The token tile with the least modelled cost (the picks of the H200 sweeps,
    docs/decisions/linear-prefill-ws.md)."""
    bt, stages = pws.choose_prefill_ws_tile(m, n, 132, split)
    assert bt == want
    assert (stages + 2) * bt * 128 <= 200 * 1024  # the ring and two output tiles fit
