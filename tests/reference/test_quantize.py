"""Reference quantizer vs independent oracles: numpy + ml_dtypes casts and the scale
formulas of FORMATS.md, written separately from the library code."""
import ml_dtypes
import numpy as np
import pytest
import torch

import microscale as ms
from microscale.formats import registry, unpack_codes
from microscale.formats.elements import div_exact

ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def u32(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.int64)


def oracle_e8m0(amax: np.ndarray, rule: str, elem) -> np.ndarray:
    bits = u32(amax)
    e, m = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if rule == "floor":
        b = e - elem.emax
    elif rule == "ceil":
        b = e + (m != 0) - elem.emax
    elif rule == "even":
        me = elem.mbits if elem.kind == "float" else elem.frac_bits
        b = (((bits + 2 ** (22 - me)) & 0xFF800000) >> 23) - elem.emax
    else:
        d = (amax.astype(np.float32) / np.float32(elem.max)).astype(np.float32)
        db = u32(d)
        de, dm = (db >> 23) & 0xFF, db & 0x7FFFFF
        b = np.where(de == 0, (dm > 0x400000).astype(np.int64), de + (dm != 0))
    b = np.clip(b, 0, 254)
    return np.where(np.isfinite(amax), b, 255).astype(np.uint8)


def oracle_cast(v: np.ndarray, elem) -> np.ndarray:
    """Saturating RNE element cast through ml_dtypes (or rint for integers)."""
    v = np.clip(v, -elem.max, elem.max).astype(np.float32)
    if elem.kind == "float":
        return v.astype(ML[elem.name]).view(np.uint8) & ((1 << elem.bits) - 1)
    k = np.rint(v * np.float32(2.0**elem.frac_bits)).astype(np.int64)
    return (k & ((1 << elem.bits) - 1)).astype(np.uint8)


def our_codes(q):
    return unpack_codes(q.data, q.fmt.element.bits, q.padded_shape[-1]).numpy()


def rand_input(gen, shape, dtype=torch.bfloat16):
    # heavy-tailed, with exact zero blocks and exact ties on the element grid
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-8, 8, shape[:-1] + (1,), generator=gen).float())
    x[..., :32] = 0.0
    x[..., 32:40] = torch.tensor([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, -0.75, 6.5])
    return x.to(dtype)


MX = [n for n, f in registry.items() if f.scale.name == "e8m0"]


@pytest.mark.parametrize("name", MX)
@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_mx_formats_match_oracle(name, rule, gen):
    f = registry[name]
    x = rand_input(gen, (6, 256))
    q = ms.quantize(x, name, scale_rule=rule)
    xb = x.float().numpy().reshape(6, -1, f.block_size)
    amax = np.abs(xb).max(-1)
    b = oracle_e8m0(amax, rule, f.element)
    np.testing.assert_array_equal(q.scales.numpy(), b)
    scaled = xb / np.ldexp(np.float32(1), b.astype(np.int32) - 127)[..., None].astype(np.float32)
    np.testing.assert_array_equal(our_codes(q).reshape(scaled.shape), oracle_cast(scaled, f.element))


FLOATSCALE = [n for n, f in registry.items() if f.scale.name in ("fp32", "fp16") and not f.zero_point]


@pytest.mark.parametrize("name", FLOATSCALE)
def test_float_scaled_formats_match_oracle(name, gen):
    f = registry[name]
    shape = (256, 256) if f.block_rows > 1 else (4, 512)
    x = rand_input(gen, shape, torch.float32)
    q = ms.quantize(x, name)
    xn = x.numpy()
    if f.block_rows > 1:
        xb = xn.reshape(2, 128, 2, 128).transpose(0, 2, 1, 3).reshape(2, 2, -1)
    else:
        xb = xn.reshape(4, -1, f.block_size)
    s = (np.abs(xb).max(-1) / np.float32(f.element.max)).astype(np.float32)
    s = s.astype(np.float16).astype(np.float32) if f.scale.name == "fp16" else s
    np.testing.assert_array_equal(q.scales.float().numpy().reshape(s.shape), s)
    sd = np.where(s == 0, np.float32(1), s)
    codes = oracle_cast(xb / sd[..., None], f.element)
    ours = our_codes(q)
    if f.block_rows > 1:
        ours = ours.reshape(2, 128, 2, 128).transpose(0, 2, 1, 3).reshape(2, 2, -1)
    np.testing.assert_array_equal(ours.reshape(codes.shape), codes)


def nvfp4_oracle(x: np.ndarray, conv: str):
    """FORMATS.md's three NVFP4 conventions in numpy float32."""
    f32 = np.float32
    amax_t = f32(np.abs(x).max())
    xb = x.reshape(x.shape[0], -1, 16)
    amax_b = np.abs(xb).max(-1).astype(f32)
    if conv == "compressed-tensors":
        gs = f32(2688) / max(amax_t, np.finfo(f32).tiny)
        sb = np.minimum(gs * (amax_b / f32(6)), f32(448)).astype(ml_dtypes.float8_e4m3fn).astype(f32)
        sb = np.where(sb == 0, f32(0.125), sb)
        v = xb / (sb / gs)[..., None]
        g = f32(1) / gs
    else:
        s2 = amax_t / f32(2688)
        if conv == "modelopt":
            sb = amax_b / (f32(6) * s2)
            sb = np.where(sb == 0, f32(1), sb).astype(ml_dtypes.float8_e4m3fn).astype(f32)
            v = xb / (sb * s2)[..., None]
        else:
            sb = np.clip((amax_b / f32(6)) / s2, f32(2.0**-6), f32(448))
            sb = sb.astype(ml_dtypes.float8_e4m3fn).astype(f32)
            v = xb * ((f32(1) / s2) / sb)[..., None]
        g = s2
    codes = np.clip(v.astype(f32), -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return codes.reshape(x.shape), sb, g


@pytest.mark.parametrize("conv", ["modelopt", "torchao", "compressed-tensors"])
def test_nvfp4_conventions_match_oracle(conv, gen):
    x = rand_input(gen, (8, 256), torch.float32)
    q = ms.quantize(x, "nvfp4", convention=conv)
    codes, sb, g = nvfp4_oracle(x.numpy(), conv)
    assert q.global_scale.dtype == torch.float32 and q.global_scale.dim() == 0
    assert float(q.global_scale) == float(g)
    np.testing.assert_array_equal(q.scales.float().numpy(), sb)
    np.testing.assert_array_equal(our_codes(q), codes)


def test_nvfp4_static_global_scale(gen):
    x = torch.randn(4, 64, generator=gen)
    q = ms.quantize(x, "nvfp4", global_scale=0.01)
    assert float(q.global_scale) == np.float32(0.01)
    d = q.dequantize()
    assert (d - x).abs().max() < 0.5 * 6 * 448 * 0.01


@pytest.mark.parametrize("name", [n for n, f in registry.items() if f.zero_point])
def test_affine_matches_oracle(name, gen):
    f = registry[name]
    x = rand_input(gen, (4, 256), torch.float32)
    q = ms.quantize(x, name)
    xb = x.numpy().reshape(4, -1, f.block_size)
    qmax = np.float32(f.element.max_code)
    lo, hi = np.minimum(xb.min(-1), 0), np.maximum(xb.max(-1), 0)
    s = ((hi - lo) / qmax).astype(np.float32).astype(np.float16).astype(np.float32)
    s = np.where(s > 0, s, np.float32(1))
    zp = np.clip(np.rint(-lo / s), 0, qmax)
    codes = np.clip(np.rint(xb / s[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    np.testing.assert_array_equal(q.scales.float().numpy(), s)
    np.testing.assert_array_equal(q.zero_points.numpy(), zp.astype(np.uint8))
    np.testing.assert_array_equal(our_codes(q).reshape(codes.shape), codes)


@pytest.mark.parametrize("name", list(registry))
def test_dequantize_matches_float64_formula(name, gen):
    f = registry[name]
    x = rand_input(gen, (256, 256) if f.block_rows > 1 else (3, 2, 256))
    q = ms.quantize(x, name)
    codes = torch.from_numpy(our_codes(q).astype(np.int64))
    vals = f.element.lut().double()[codes]
    s = f.scale.decode(q.scales).double()
    if f.block_rows > 1:
        s = s.repeat_interleave(128, -2)
    s = s.repeat_interleave(f.block_size, -1)
    if f.zero_point:
        vals = vals - q.zero_points.double().repeat_interleave(f.block_size, -1)
    ref = vals * s * (q.global_scale.double() if f.global_scale else 1.0)
    out = q.dequantize(torch.float64)
    assert out.shape == x.shape and out.dtype == torch.float64
    assert torch.equal(out, ref.to(torch.float32).double())  # one float32 rounding, exact
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16


def test_leading_dims_padding_and_swizzle_free_canonical_layout(gen):
    x = torch.randn(2, 3, 100, generator=gen, dtype=torch.bfloat16)
    q = ms.quantize(x, "mxfp4", pad=True)
    assert q.data.shape == (2, 3, 64) and q.scales.shape == (2, 3, 4) and q.scales.dtype == torch.uint8
    d = q.dequantize(torch.float32)
    assert d.shape == (2, 3, 100)
    assert torch.equal(d, ms.quantize(torch.nn.functional.pad(x, (0, 28)), "mxfp4").dequantize()[..., :100])


def test_nonfinite_blocks(gen):
    x = torch.randn(2, 64, generator=gen)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    q = ms.quantize(x, "mxfp8_e4m3")
    assert q.scales[0, 0] == 255 and q.scales[1, 1] == 255  # NaN scale for non-finite blocks
    d = q.dequantize()
    assert torch.isnan(d[0, :32]).all() and torch.isfinite(d[0, 32:]).all()
    qz = ms.quantize(x, "mxfp8_e4m3", nonfinite="zero")
    assert torch.isfinite(qz.dequantize()).all() and qz.dequantize()[0, 3] == 0
    with pytest.raises(ValueError, match="NaN or Inf"):
        ms.quantize(x, "mxfp8_e4m3", nonfinite="error")
    # nvfp4: the global scale ignores non-finite values; the NaN block decodes to NaN
    qn = ms.quantize(x, "nvfp4")
    assert torch.isfinite(qn.global_scale)
    assert torch.isnan(qn.dequantize()[0, :16]).all() and torch.isfinite(qn.dequantize()[0, 16:]).all()


def test_zero_tensor_all_formats():
    for name, f in registry.items():
        x = torch.zeros((128, 128) if f.block_rows > 1 else (2, 128))
        d = ms.quantize(x, name).dequantize()
        assert torch.equal(d, x), name


def test_nvfp4_global_scale_is_the_ieee_quotient():
    from microscale import reference
    """s_dec = amax/2688 correctly rounded (FORMATS.md), not amax * fl(1/2688), which is
    what torch computes for ``cuda_tensor / 2688.0`` and differs for ~1 in 6 values."""
    amax = np.arange(1, 20001, dtype=np.float32) * np.float32(0.25)
    want = amax / np.float32(2688.0)
    x = torch.zeros(len(amax), 16)
    x[:, 3] = torch.from_numpy(amax)
    got = np.array([float(reference.nvfp4_global_scale(x[i:i + 1])) for i in range(0, len(amax), 97)],
                   dtype=np.float32)
    np.testing.assert_array_equal(got, want[::97])
    recip = amax * (np.float32(1.0) / np.float32(2688.0))
    assert (recip != want).mean() > 0.05  # the two roundings do differ on these inputs
    t = torch.from_numpy(amax)
    assert torch.equal(div_exact(t, 2688.0), torch.from_numpy(want))
    for c in (3.0, 6.0, 7.0, 15.0, 127.0, 448.0):  # the other python divisors of the reference
        assert torch.equal(div_exact(t, c), torch.from_numpy(amax / np.float32(c))), c


# formats whose scales come from a float32 quotient by a python number (amax / element max, the
# affine range / max code, RCEIL's amax / element max), one per rule and scale dtype
_PY_DIVISOR_FORMATS = ["int4_fp32", "int8_fp32", "fp8_e4m3_fp32", "fp4_fp32", "nvfp8", "fp8_e4m3_block128",
                       "fp8_e4m3_block128x128", "int4_affine_g128", "int8_affine_g32", "fp4_fp16"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the CPU divides exactly either way")
@pytest.mark.parametrize("name,rule", [(n, None) for n in _PY_DIVISOR_FORMATS] + [("mxfp8_e4m3", "rceil"),
                                                                                   ("mxfp4", "rceil")])
def test_reference_on_cuda_equals_the_cpu(name, rule, gen):
    """The reference on CUDA tensors is the CPU's bit for bit (torch's CUDA ``tensor / python float``
    multiplies by the reciprocal: each such division goes through ``div_exact``)."""
    from microscale import reference
    x = torch.randn(128, 4096, generator=gen) * torch.exp2(torch.randint(-4, 5, (128, 1), generator=gen).float())
    x = x.to(torch.bfloat16)
    kw = {} if rule is None else {"scale_rule": rule}
    a, b = reference.quantize(x, name, **kw), reference.quantize(x.cuda(), name, **kw)
    assert torch.equal(a.data, b.data.cpu()) and torch.equal(a.scales.view(torch.uint8),
                                                             b.scales.cpu().view(torch.uint8)), name
    if a.zero_points is not None:
        assert torch.equal(a.zero_points, b.zero_points.cpu()), name
