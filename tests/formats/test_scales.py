"""Scale rules vs the bit formulas of FORMATS.md, on adversarial amax values; scale
codecs vs ml_dtypes / torch."""
import ml_dtypes
import numpy as np
import pytest
import torch

from microscale.formats import ELEMENTS, SCALES, ScaleRule, e8m0_from_amax


def f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def adversarial_amax() -> torch.Tensor:
    vals = [0.0, f32(1), f32(0x400000), f32(0x400001), f32(0x5FFFFF), f32(0x600000), f32(0x7FFFFF), 1.1754944e-38,
            3.4028235e38, float("inf"), float("nan")]
    for k in range(-130, 128, 1):
        p = 2.0**k
        if p < 3.4e38:
            vals += [p, float(np.nextafter(np.float32(p), np.float32(0))), float(np.nextafter(np.float32(p), np.float32(np.inf)))]
    for m in (1.5, 1.75, 1.875, 1.9375, 1.25, 1.125, 3.0, 6.0, 7.5, 28.0, 448.0, 57344.0):
        for k in (-20, -1, 0, 1, 5, 30):
            vals.append(m * 2.0**k)
    return torch.tensor(vals, dtype=torch.float32)


def spec_byte(a: np.float32, rule: str, elem) -> int:
    """FORMATS.md formulas, written independently per scalar with Python ints."""
    if not np.isfinite(a):
        return 255
    bits = int(np.array([a], dtype=np.float32).view(np.uint32)[0])
    e, m = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    emax = elem.emax
    if rule == "floor":
        b = e - emax
    elif rule == "ceil":
        b = e + (m != 0) - emax
    elif rule == "even":
        me = elem.mbits if elem.kind == "float" else elem.frac_bits
        b2 = (bits + 2 ** (22 - me)) & 0xFF800000
        b = ((b2 >> 23) & 0xFF) - emax
    else:  # rceil
        d = np.float32(a) / np.float32(elem.max)
        db = int(np.array([d], dtype=np.float32).view(np.uint32)[0])
        de, dm = (db >> 23) & 0xFF, db & 0x7FFFFF
        b = int(dm > 0x400000) if de == 0 else de + (dm != 0)
    return min(max(b, 0), 254)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("elem", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "mxint8"])
def test_pow2_rules_match_formulas(rule, elem):
    c = ELEMENTS[elem]
    a = adversarial_amax()
    ours = e8m0_from_amax(a, ScaleRule(rule), c).tolist()
    ref = [spec_byte(np.float32(v), rule, c) for v in a.tolist()]
    assert ours == ref


def test_floor_is_ocp_and_rceil_bounds():
    c = ELEMENTS["e2m1"]
    a = torch.tensor([6.0, 7.9999995, 8.0, 1.0, 0.0])
    # OCP: floor(log2(a)) - emax; float32 log2 would give 3 for 7.9999995
    assert e8m0_from_amax(a, ScaleRule.FLOOR, c).tolist() == [127, 127, 128, 125, 0]
    # RCEIL: scaled amax never exceeds the element max
    r = e8m0_from_amax(a[:4], ScaleRule.RCEIL, c).to(torch.int32)
    s = torch.ldexp(torch.ones(4), r - 127)
    assert bool((a[:4] / s <= 6.0).all()) and bool((a[:4] / s > 3.0).all())


def test_e8m0_codec_matches_ml_dtypes():
    c = SCALES["e8m0"]
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    ours = c.decode(torch.from_numpy(codes)).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
    # encode: nearest power of two, ties up, over positive finite values in range
    a = adversarial_amax().numpy()
    a = a[np.isfinite(a) & (a > 0) & (a < 1.5 * 2.0**127)]
    a = np.concatenate([a, np.array([0.0, -1.0, np.inf, np.nan], dtype=np.float32)])
    with np.errstate(invalid="ignore"):
        ref = a.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    np.testing.assert_array_equal(c.encode(torch.from_numpy(a)).numpy(), ref)


@pytest.mark.parametrize("name,dtype", [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_float_scale_codecs(name, dtype, gen):
    c = SCALES[name]
    s = torch.rand(10_000, generator=gen) * torch.exp2(torch.randint(-30, 15, (10_000,), generator=gen).float())
    assert torch.equal(c.encode(s), s.to(dtype))  # RNE; fp16 keeps subnormals
    assert c.decode(c.encode(s)).dtype == torch.float32
    big = torch.tensor([1e39 if name != "fp32" else 3e38])
    assert torch.isfinite(c.decode(c.encode(big))).all()  # saturates, never Inf


def test_ue4m3_codec_matches_torch(gen):
    c = SCALES["ue4m3"]
    s = torch.rand(100_000, generator=gen) * 460
    assert torch.equal(c.encode(s).view(torch.uint8), s.to(torch.float8_e4m3fn).view(torch.uint8))
