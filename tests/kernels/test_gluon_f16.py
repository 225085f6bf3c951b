"""fp16 activations on the Gluon kernels (``prefill_ws``, ``decode_tma``) without a GPU.

The kernels decode the codes into f16 for fp16 MMAs (:func:`_prefill_gluon.f16_decode_asm`). Here
the decode and scale PTX run in the PTX emulator of ``test_gemv_mma.py``, driven by the same
per-thread assignment as ``test_prefill_gluon.emulate`` (4-bit codes: thread quad member ``t`` owns
words ``2t, 2t+1`` of a 64-element chunk, output ``2j + e`` of word ``a`` fills K slot
``16 j + 8 a + 2 t + e``; 8-bit codes: words ``4t + a``, output ``2h + e`` slot ``16 a + 8 h + 2 t + e``),
against float64: E2M1, E4M3, E5M2 and E8M0-scaled integers exact at both ends of each f16 window,
integers with fp16 scales each the f16 of ``(code - z) * s``. Also: the windows are tight (one
binade more fails), the refusals, the compile for sm_90a. The GPU tests run the kernels.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import microscale as ms
from microscale.linear import routing
from microscale.linear.backends import decode_tma as dt
from microscale.linear import eligibility as elig
from microscale.linear.backends import prefill_ws as pws

pg = pytest.importorskip("microscale.linear._kernels._prefill_gluon")
from test_gemv_mma import Warp  # noqa: E402  (the PTX emulator)
from test_prefill_gluon import _xperm  # noqa: E402

#: per element kind: (the largest f16 exponent field of a scale, B of the decode's v * 2^-B), from the
#: formats' ranges: E2M1 placed as v * 2^-14 (largest product 12, least 2^-24 at field 6); E4M3
#: 448 * 2^(22 - 15) <= 65504; E5M2 57344 * 2^0; MXINT4 8 * 2^12; MXINT8 128 * 2^8
_TOP = {"e2m1": (30, 14), "e4m3": (22, 0), "e5m2": (15, 0), "s4": (27, 0), "s8": (23, 0)}
#: and the least exponent field that keeps every product exact: E2M1 0.5 * 2^-14 * 2^(6 - 15) = 2^-24,
#: E5M2 2^-16 * 2^(7 - 15); the others reach 2^-24 at field 1 or below (a normal f16 scale needs 1)
_LEAST = {"e2m1": 6, "e4m3": 1, "e5m2": 7, "s4": 1, "s8": 1}


def _kind(q) -> str:
    f = q.fmt
    el = f.element
    if el.kind == "int":
        return ("u" if f.zero_point else "s") + str(el.bits)
    return "e2m1" if el.bits == 4 else "e5m2" if el.mbits == 2 else "e4m3"


def _emulated_ke_post(q) -> tuple[int, float]:
    """The emulator's ``(ke, post)`` for an E8M0-scaled weight: the largest scale at the top of its
    kind's window, the sums times ``2^(e - 127 + B - frac) / 2^(e + ke - 15)``."""
    top, b = _TOP[_kind(q)]
    ke = top - int(q.scales.view(torch.uint8).max())
    return ke, 2.0 ** (b - 112 - ke - q.fmt.element.frac_bits)


def _scale_operands(q, warp: Warp, sb: np.ndarray, ke: int) -> np.ndarray:
    """The f16x2 scale of each lane's block: UE4M3 and E8M0 by their PTX, fp16 bits in both halves."""
    if q.fmt.scale.name == "ue4m3":
        return warp.run(pg.UE4M3_F16_ASM.value, "=r,r", [sb])[0]
    if q.fmt.scale.name == "e8m0":
        return warp.run(pg.E8M0_F16_ASM.value, "=r,r,r", [sb, np.full(32, ke).astype(np.int64) & 0xFFFFFFFF])[0]
    return ((sb & np.uint32(0xFFFF)) * np.uint32(0x10001)).astype(np.uint32)


def _int_operands(q, sb: np.ndarray) -> list[np.ndarray]:
    """The integer decodes' f16x2 constants: ``1024 + z`` and ``-(64 + z)``, ``1/16`` (4-bit), or
    ``1024 + z`` and the ``0x64`` bytes (8-bit); z from the packed scale (8 / 128 for signed codes)."""
    u = np.uint32
    signed = not q.fmt.zero_point
    z = (sb >> u(16)) if q.fmt.scale.name == "fp16" and not (signed and q.fmt.element.bits == 8) else None
    if q.fmt.element.bits == 8:
        k = np.full(32, 0x6480 * 0x10001, u) if signed else ((z + u(0x6400)) * u(0x10001)).astype(u)
        return [k, np.full(32, pg.F16_C64.value, u)]
    z = np.full(32, 8, u) if z is None else z
    return [((z + u(0x6400)) * u(0x10001)).astype(u), ((z * u(16) + u(0xD400)) * u(0x10001)).astype(u),
            np.full(32, pg.F16_C16.value, u)]


def _asm(q, scaled: bool = True) -> str:
    kind = _kind(q)
    if kind in ("e2m1", "e4m3", "e5m2"):
        return getattr(pg, f"F16_{kind.upper()}_ASM").value
    return getattr(pg, f"F16_{kind.upper()}_{'ASM' if scaled else 'CODE_ASM'}").value


def emulate_f16(x: torch.Tensor, q) -> tuple[np.ndarray, np.ndarray]:
    """``x @ dequant(q)^T`` as the f16 kernels compute it (products exact, sums in float64) and the
    decoded weights in natural K order, times ``post``."""
    n, k = q.shape
    f = q.fmt
    cb = f.element.bits
    wpc = 16 // (8 // cb)  # code words per row and 64-element chunk: 8 (4-bit) or 16 (8-bit)
    words = q.data.contiguous().view(torch.int32).numpy().view(np.uint32).reshape(n, k * cb // 32)
    warp = Warp(np.zeros(1, np.uint8))
    ke, post = _emulated_ke_post(q) if f.scale.name == "e8m0" else (0, 2.0 ** 14 if f.scale.name == "ue4m3" else 1.0)
    if f.scale.name == "fp16":  # fp16 scale bits | zero point (8 for two's-complement codes) << 16, as packed
        zp = q.zero_points.numpy().astype(np.uint32) if f.zero_point else 8
        scales = (q.scales.contiguous().view(torch.int16).numpy().astype(np.uint32) & 0xFFFF) | (zp << 16)
    else:
        scales = q.scales.contiguous().view(torch.uint8).numpy().astype(np.uint32)
    ints = f.element.kind == "int"
    nw = 2 if cb == 4 else 4
    a = np.zeros((n, k))
    nat = np.zeros((n, k))
    r, c, t, av = (v.reshape(-1) for v in np.meshgrid(np.arange(n), np.arange(k // 64), np.arange(4), np.arange(nw),
                                                      indexing="ij"))
    cons = ",".join(["=h"] * (32 // cb)) + ",r,r" + (",r,r" if cb == 8 and ints else ",r,r,r" if ints else "")
    for lo in range(0, r.size, 32):
        sl = slice(lo, lo + 32)
        w = words[r[sl], wpc * c[sl] + nw * t[sl] + av[sl]]
        sb = scales[r[sl], (64 * c[sl] + 16 * t[sl]) // f.block_size]  # the block of the thread's 16
        ops = [w, _scale_operands(q, warp, sb, ke)] + (_int_operands(q, sb) if ints else [])
        outs = warp.run(_asm(q), cons, ops)
        for i, o in enumerate(outs):
            val = (o.astype(np.uint32) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
            if cb == 4:
                jj, e = divmod(i, 2)
                slot, elem = 16 * jj + 8 * av[sl] + 2 * t[sl] + e, 16 * t[sl] + 8 * av[sl] + jj + 4 * e
            else:
                h, e = divmod(i, 2)
                slot, elem = 16 * av[sl] + 8 * h + 2 * t[sl] + e, 16 * t[sl] + 4 * av[sl] + 2 * h + e
            a[r[sl], 64 * c[sl] + slot] = val
            nat[r[sl], 64 * c[sl] + elem] = val * post
    out = _xperm(x, cb).double().numpy() @ a.T * post
    if q.global_scale is not None:
        out *= float(q.global_scale.reshape(-1)[0])
    return out, nat


def _e8m0_weight(name: str, gen, n: int = 24, k: int = 512, span: int | None = None):
    """An E8M0-scaled weight with every finite code (rows 1-3), scales spanning its kind's f16 window
    exactly (``span`` binades more: wider), the least scale on row 2 and the largest on row 3."""
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    el = q.fmt.element
    if el.bits == 4:
        codes = torch.arange(256, dtype=torch.uint8)
    elif el.kind == "int":
        codes = torch.arange(256).to(torch.uint8)
    elif el.mbits == 2:  # no Inf / NaN (exponent 31)
        codes = torch.cat([torch.arange(0, 0x7C), torch.arange(128, 0xFC)]).to(torch.uint8)
    else:  # no NaN
        codes = torch.cat([torch.arange(0, 127), torch.arange(128, 255)]).to(torch.uint8)
    q.data[1:4, :] = codes.repeat(q.data.shape[1] // codes.numel() + 1)[: q.data.shape[1]]
    kind = _kind(q)
    hi = 127 + 2
    lo = hi - (_TOP[kind][0] - _LEAST[kind]) - (span or 0)
    s = q.scales.view(torch.uint8)
    s.clamp_(lo, hi)
    s[2, :] = lo
    s[3, :] = hi
    return q


def _fp16_scaled_weight(name: str, gen, n: int = 24, k: int = 512):
    """An integer weight with fp16 scales: every code and zero point (rows 0-3), scales subnormal, with
    low mantissa bits set, and the largest the f16 decode takes (row 0)."""
    w = torch.randn(n, k, generator=gen) * torch.logspace(-6, 1, n).reshape(n, 1)
    q = ms.quantize(w, name)
    bits = q.fmt.element.bits
    every = torch.arange(256, dtype=torch.uint8)
    q.data[0:4, :] = every.repeat(q.data.shape[1] // 256 + 1)[: q.data.shape[1]]
    sc = q.scales.view(torch.int16)
    top = torch.tensor(65504 / (1 << bits), dtype=torch.float16).view(torch.int16)  # 0x6BFF (4094) / 0x5BFF (255.875)
    extremes = torch.tensor([0x0001, 0x03FF, 0x0401, int(top), 0x3C01, 0x3FFF], dtype=torch.int16)
    sc[0, :] = extremes.repeat(sc.shape[1] // extremes.numel() + 1)[: sc.shape[1]]
    if q.zero_points is not None:
        zmax = 15 if bits == 4 else 255
        q.zero_points[0:4, :] = (torch.arange(4 * q.zero_points.shape[1]) * 7 % (zmax + 1)).to(torch.uint8).view(4, -1)
    return q


def _weight(name: str, gen):
    if ms.get_format(name).scale.name == "e8m0":
        return _e8m0_weight(name, gen)
    if ms.get_format(name).scale.name == "fp16":
        return _fp16_scaled_weight(name, gen)
    return ms.quantize(torch.randn(24, 512, generator=gen), name)


def _check(q, x: torch.Tensor) -> None:
    """The decoded weights: exact (E2M1, E4M3, E5M2, E8M0 integers), or the f16 of ``(code - z) * s``
    (fp16 scales); the sums against float64 on those weights."""
    out, nat = emulate_f16(x, q)
    if q.global_scale is not None:  # applied to the sums: the weights are code times block scale
        q1 = copy.copy(q)
        q1.global_scale = torch.ones_like(q.global_scale)
        exact = q1.dequantize(torch.float64)
    else:
        exact = q.dequantize(torch.float64)
    want = exact.to(torch.float16).double() if q.fmt.scale.name == "fp16" else exact
    assert np.array_equal(nat, want.numpy())
    ref = (x.double() @ torch.from_numpy(nat).T).numpy()
    cond = (x.double().abs() @ torch.from_numpy(nat).abs().T).numpy()
    if q.global_scale is not None:
        ref, cond = ref * float(q.global_scale.reshape(-1)[0]), cond * float(q.global_scale.reshape(-1)[0])
    assert (np.abs(out - ref) <= 2.0 ** -40 * cond + 1e-300).all()


NAMES = ["nvfp4", "mxfp4", "mxint4", "int4_affine_g128", "int4_affine_g32", "int4_fp16", "mxfp8_e4m3", "mxfp8_e5m2",
         "mxint8", "int8_fp16", "int8_affine_g128", "int8_affine_g32"]


@pytest.mark.parametrize("name", NAMES)
def test_f16_arithmetic_matches_float64(name, gen):
    """Every format's f16 decode: the weights bit-exact (or the f16 of ``(code - z) * s``), at both
    ends of the E8M0 windows and at the largest fp16 scale taken, and the sums against float64."""
    q = _weight(name, gen)
    assert elig.f16_weight_reason(q) is None
    _check(q, (torch.randn(5, q.shape[1], generator=gen) * 2).to(torch.float16))


def test_scale_args_are_the_emulated_ones(gen):
    """``_gluon_scale_args(q, f16=True)`` is what the emulator derives (E8M0: ``ke``, ``post``; NVFP4:
    ``2^14``; fp16 scales: 1)."""
    for name in NAMES:
        q = _weight(name, gen)
        sk, ke, post = pws.gluon_scale_args(q, True)
        want = _emulated_ke_post(q) if q.fmt.scale.name == "e8m0" else (0, 2.0 ** 14 if name == "nvfp4" else 1.0)
        assert (ke, post) == want, name


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the wrong decodes overflow)
@pytest.mark.parametrize("name", ["mxfp4", "mxint4", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"])
def test_windows_are_tight(name, gen, monkeypatch):
    """One binade more than the window is refused, and is wrong: moved up, the largest scale's
    products overflow (or the scale itself does); moved down, the least scale's lose bits."""
    assert "within" in elig.f16_weight_reason(_e8m0_weight(name, gen, span=1))
    q = _e8m0_weight(name, gen)
    x = (torch.randn(3, q.shape[1], generator=gen) * 2).to(torch.float16)
    for shift in (1, -1):
        with monkeypatch.context() as mp:
            mp.setitem(_TOP, _kind(q), (_TOP[_kind(q)][0] + shift, _TOP[_kind(q)][1]))
            with pytest.raises(AssertionError):
                _check(q, x)


@pytest.mark.parametrize("name", ["mxfp4", "mxint8", "mxfp8_e4m3"])
def test_zero_blocks_below_the_window(name, gen):
    """Blocks of zero codes (the quantizer gives them the scale byte 0) do not narrow the window: their
    scales, far below it, are flushed to zero (exact); a nonzero code in such a block is refused."""
    w = torch.randn(24, 512, generator=gen)
    w[4, :64] = 0
    w[7, 448:] = 0
    q = ms.quantize(w, name)
    s = q.scales.view(torch.uint8)
    assert int(s[4, 0]) < int(s.max()) - 40  # far below any f16 window
    assert elig.f16_weight_reason(q) is None
    _check(q, (torch.randn(3, 512, generator=gen) * 2).to(torch.float16))
    q.data[4, 3] = 0x11 if name == "mxfp4" else 0x01  # a nonzero code in a zero block
    assert "within" in elig.f16_weight_reason(q)


def test_fp16_scale_bound(gen):
    """fp16 scales above ``65504 / 2^bits`` are refused (``(code - z) * s`` could overflow f16); at
    the bound the products stay finite (the arithmetic test's row 0)."""
    for name in ("int4_affine_g128", "int8_fp16"):
        q = _fp16_scaled_weight(name, gen)
        assert elig.f16_weight_reason(q) is None
        top = torch.tensor(65504 / (1 << q.fmt.element.bits), dtype=torch.float16).view(torch.int16)
        q.scales.view(torch.int16)[5, 1] = top + 1  # the next fp16 above the bound
        assert "fp16 scales of at most" in elig.f16_weight_reason(q)


@pytest.mark.parametrize("name", ["int4_affine_g128", "int4_fp16", "int8_affine_g128", "int8_fp16"])
def test_unscaled_f16_decode_is_exact(name, gen):
    """``decode_tma``'s unscaled decode (the scale applied to the MMA's fp32 result): every code minus
    every zero point, exactly, in every output slot."""
    q = _fp16_scaled_weight(name, gen)
    bits = q.fmt.element.bits
    n = 256 if bits == 8 else 16
    every = np.array([v * (0x01010101 if bits == 8 else 0x11111111) for v in range(n)], dtype=np.uint32)
    rnd = torch.randint(-2**31, 2**31, (64,), generator=gen, dtype=torch.int64).numpy().astype(np.uint32)
    w = np.concatenate([np.tile(every, 512 // n), rnd])
    zs = np.arange(w.size).astype(np.uint32) * 7 % (256 if bits == 8 else 16) if q.fmt.zero_point else \
        np.full(w.size, 8, np.uint32)
    warp = Warp(np.zeros(1, np.uint8))
    cons = ",".join(["=h"] * (32 // bits)) + ",r" + ",r" * (2 if bits == 8 else 3)
    for lo in range(0, w.size, 32):
        ww = w[lo:lo + 32]
        sb = zs[lo:lo + 32] << np.uint32(16)
        outs = warp.run(_asm(q, scaled=False), cons, [ww] + _int_operands(q, sb))
        z = zs[lo:lo + 32].astype(np.int64) if q.fmt.zero_point else None
        for i, o in enumerate(outs):
            shift = 8 * i if bits == 8 else 4 * (i // 2 + 4 * (i % 2))
            code = ((ww >> np.uint32(shift)) & np.uint32(2 ** bits - 1)).astype(np.int64)
            want = code - z if z is not None else np.where(code >= 2 ** (bits - 1), code - 2 ** bits, code)
            got = (o.astype(np.uint32) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
            assert (got == want).all(), i


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the wrong decodes overflow)
def test_emulation_catches_wrong_decodes(gen, monkeypatch):
    """The checks can fail: an E2M1 magnitude placed one bit low, a 4-bit odd pair not brought down,
    signed 8-bit codes without their sign flip, the UE4M3 scale in one half only."""
    x = (torch.randn(3, 512, generator=gen) * 2).to(torch.float16)
    bad = {"F16_E2M1_ASM": ("nvfp4", "0x8e008e00", "0x87008700"),
           "F16_U4_ASM": ("int4_affine_g128", "fma.rn.f16x2 p1, p1, $12, $11;", "sub.rn.f16x2 p1, p1, $10;"),
           "F16_S8_ASM": ("int8_fp16", "xor.b32 x, $4, 0x80808080;", "mov.b32 x, $4;"),
           "UE4M3_F16_ASM": ("nvfp4", "0x1010", "0x3210")}
    for attr, (name, old, new) in bad.items():
        asm = getattr(pg, attr).value
        assert old in asm, attr
        with monkeypatch.context() as mp:
            mp.setattr(pg, attr, pg.gl.constexpr(asm.replace(old, new)))
            with pytest.raises(AssertionError):
                _check(_weight(name, gen), x)


@pytest.mark.parametrize("op,fmt", [("--ws", "nvfp4"), ("--ws", "mxfp4"), ("--ws", "int4_affine_g128"),
                                    ("--ws", "int8_fp16"), ("--ws", "mxfp8_e4m3"), ("--dtma", "nvfp4"),
                                    ("--dtma", "int4_affine_g32"), ("--dtma", "int8_affine_g128"),
                                    ("--dtma", "mxint8")])
def test_f16_compiles_for_sm90(op, fmt, tmp_path, run_tool):
    """Both kernels compile for fp16 activations: fp16 MMAs (no bf16 ones), the decode in the MMA's
    register layout (asserted by the kernel), no spills."""
    args = ["--m", "512", "--n", "256", "--k", "1024", "--config", "{'block_t': 256}"] if op == "--ws" else \
        ["--m", "16", "--n", "1024", "--k", "2048"]
    r = run_tool("gemv_ptx.py", str(tmp_path), op, "--fp16", "--fmt", fmt, *args, "--sass")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stdout and "C7512" not in r.stdout, r.stdout[-2000:]
    sass = (tmp_path / ("_prefill_ws_kernel.sass" if op == "--ws" else "_decode_tma_kernel.sass")).read_text()
    mma = "HGMMA.64x256x16.F32 " if op == "--ws" else "HMMA.16816.F32 "
    assert mma in sass and "BF16" not in sass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", NAMES)
def test_gpu_f16_kernels(name):
    """Both kernels with fp16 activations on an H200: ragged tokens and rows, bias, ``prefill_ws`` with
    a split tail, ``decode_tma`` with shared tiles; fp16 output within f16 rounding of float64 (on
    the weights the f16 decode makes: exact, or the f16 of ``(code - z) * s``) plus an fp32
    accumulation bound; a second call bit-identical; the same through ``ms.linear``."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90")
    g = torch.Generator(device=dev).manual_seed(16)
    for (m, n, k, op) in [(300, 196, 1024, "ws"), (513, 264, 2048, "ws"), (16, 1000, 2048, "dt"),
                          (9, 4096, 8192, "dt"), (32, 520, 4096, "dt"), (5, 28672, 1024, "dt")]:
        q = ms.quantize(torch.randn(n, k, device=dev, generator=g) * 0.05, name)
        wd = q.dequantize(torch.float64)
        if q.fmt.scale.name == "fp16" and not (op == "dt" and dt.dt_post(q, dt.dt_tokens(m))):
            wd = wd.to(torch.float16).double()
        x = (torch.randn(m, k, device=dev, generator=g) * 2).half()
        bias = torch.randn(n, device=dev, generator=g)
        fn = pws.prefill_ws if op == "ws" else dt.decode_tma
        out = fn(x, q, bias)
        assert torch.equal(out, fn(x, q, bias))
        ref = x.double() @ wd.T + bias.double()
        cond = x.double().abs() @ wd.abs().T + bias.double().abs()
        assert out.dtype == torch.float16 and out.shape == (m, n) and torch.isfinite(out).all()
        assert ((out.double() - ref).abs() <= 2.0 ** -11 * ref.abs() + 2.0 ** -16 * cond).all(), (m, n, k, op)
        got = ms.linear(x, q, bias)  # (whichever route: weights exact or rounded once)
        assert ((got.double() - ref).abs() <= 2.0 ** -11 * ref.abs() + 2.0 ** -10 * cond).all(), (m, n, k, "linear")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Hopper)")
@pytest.mark.parametrize("name", ["mxfp4", "int4_affine_g128", "nvfp4"])
def test_gpu_f16_in_cuda_graphs(name, monkeypatch):
    """fp16 calls captured in CUDA graphs: a weight whose f16 limits were never scanned (first used
    inside the capture: E8M0 range, fp16 scale bound) takes another route there, right all the same;
    once an eager call has scanned it, a capture takes ``decode_tma`` (NVFP4 needs no scan)."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("sm_90")
    g = torch.Generator(device=dev).manual_seed(17)
    q = ms.quantize(torch.randn(1024, 2048, device=dev, generator=g) * 0.05, name)
    x = torch.randn(16, 2048, device=dev, generator=g).half()
    want = x.double() @ q.dequantize(torch.float64).T
    calls = []
    real = routing.decode_tma_run
    monkeypatch.setattr(routing, "decode_tma_run", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for scanned in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = ms.linear(x, q)
        graph.replay()
        torch.cuda.synchronize()
        assert y.dtype == torch.float16 and ((y.double() - want).norm() / want.norm()).item() < 2e-3
        assert bool(calls) == (scanned or name == "nvfp4"), (name, scanned)
        calls.clear()
        ms.linear(x, q)  # eager: scans the weight's f16 limits
        calls.clear()
