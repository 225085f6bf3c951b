"""Element codecs vs ml_dtypes: exhaustive decode, encode on every tie/boundary/subnormal/
overflow value plus 10^6 random float32s, under the matching policy."""
import ml_dtypes
import numpy as np
import pytest
import torch

import microscale as ms
from microscale.formats import ELEMENTS, Rounding

ML = {
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}
FLOATS = sorted(ML)
INTS = [n for n, c in ELEMENTS.items() if c.kind == "int"]


def ml_encode(x: np.ndarray, name: str) -> np.ndarray:
    bits = ELEMENTS[name].bits
    with np.errstate(invalid="ignore"):
        return x.astype(ML[name]).view(np.uint8) & ((1 << bits) - 1)


def ml_decode(codes: np.ndarray, name: str) -> np.ndarray:
    return codes.astype(np.uint8).view(ML[name]).astype(np.float32)


def adversarial(name: str) -> np.ndarray:
    """Every representable value, every midpoint (ties), one float32 ulp either side of
    each, overflow boundaries, float32 subnormals and specials — both signs."""
    c = ELEMENTS[name]
    vals = ELEMENTS[name].lut().numpy()
    fin = np.unique(np.abs(vals[np.isfinite(vals)]))
    mids = (fin[:-1] + fin[1:]) / 2
    top = [c.max, c.max * 1.0625, c.max * 1.125, c.max * 1.5, c.max * 2, c.max * 4, 3.0e38, np.inf, np.nan]
    tiny = [1e-45, 1e-40, 1.1754942e-38, c.min_subnormal / 2, c.min_subnormal / 4, c.min_subnormal * 0.75]
    base = np.concatenate([fin, mids, np.array(top + tiny, dtype=np.float64)]).astype(np.float32)
    near = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(0))])
    return np.concatenate([near, -near]).astype(np.float32)


@pytest.mark.parametrize("name", FLOATS)
def test_decode_exhaustive(name):
    c = ELEMENTS[name]
    codes = np.arange(1 << c.bits, dtype=np.uint8)
    ours = ms.decode(torch.from_numpy(codes), name).numpy()
    ref = ml_decode(codes, name)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", FLOATS)
def test_encode_adversarial_matches_ml_dtypes(name):
    x = adversarial(name)
    # ml_dtypes: RNE, E4M3fn overflow -> NaN, E5M2 -> Inf, FP4/FP6 saturate: our "native" policy.
    ours = ms.encode(torch.from_numpy(x), name, overflow="native").numpy()
    np.testing.assert_array_equal(ours, ml_encode(x, name), err_msg=name)


@pytest.mark.parametrize("name", FLOATS)
def test_encode_random_matches_ml_dtypes(name, gen):
    c = ELEMENTS[name]
    n = 1_000_000
    # Mixed scales: uniform around the representable range plus random bit patterns.
    x = torch.randn(n // 2, generator=gen) * (c.max / 3)
    bits = torch.randint(0, 2**32, (n // 2,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = torch.cat([x, bits.view(torch.float32)]).numpy()
    ours = ms.encode(torch.from_numpy(x), name, overflow="native").numpy()
    np.testing.assert_array_equal(ours, ml_encode(x, name))


@pytest.mark.parametrize("name", FLOATS)
def test_encode_saturate_and_roundtrip(name):
    c = ELEMENTS[name]
    codes = torch.arange(1 << c.bits, dtype=torch.uint8)
    vals = c.decode(codes)
    fin = torch.isfinite(vals)
    # every finite value encodes back to its own code (both zeros keep their sign)
    assert torch.equal(c.encode(vals[fin]), codes[fin])
    big = torch.tensor([c.max * 4, -c.max * 4, float("inf"), -float("inf")])
    out = c.decode(c.encode(big, overflow="saturate"))
    assert out.tolist() == [c.max, -c.max, c.max, -c.max]


def test_nearest_away_ties():
    c = ELEMENTS["e2m1"]
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0])
    away = c.decode(c.encode(x, rounding="nearest_away")).tolist()
    even = c.decode(c.encode(x, rounding="nearest_even")).tolist()
    assert away == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0]
    assert even == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0]


def test_stochastic_rounding_is_seeded_and_unbiased():
    c = ELEMENTS["e2m1"]
    x = torch.full((200_000,), 2.5)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = c.encode(x, rounding=Rounding.STOCHASTIC, generator=g1)
    b = c.encode(x, rounding=Rounding.STOCHASTIC, generator=g2)
    assert torch.equal(a, b)
    vals = c.decode(a)
    assert set(vals.unique().tolist()) == {2.0, 3.0}
    assert abs(vals.mean().item() - 2.5) < 0.01  # 2.5 is halfway: E = 2.5, sd of mean ~0.001


@pytest.mark.parametrize("name", INTS)
def test_int_codec_exhaustive(name):
    c = ELEMENTS[name]
    codes = torch.arange(1 << c.bits, dtype=torch.uint8)
    vals = c.decode(codes)
    k = vals * 2.0**c.frac_bits
    if c.signed:
        expect = torch.where(codes >= (1 << (c.bits - 1)), codes.int() - (1 << c.bits), codes.int())
    else:
        expect = codes.int()
    assert torch.equal(k.int(), expect)
    # encode: every value round-trips except the unused most negative code
    valid = vals >= -c.max
    assert torch.equal(c.encode(vals[valid]), codes[valid])
    assert c.decode(c.encode(torch.tensor([1e9, -1e9]))).tolist() == [c.max, c.min]
    # ties to even (k + 0.5 -> even k), within range
    step = 2.0**-c.frac_bits
    half = torch.tensor([0.5, 1.5, 2.5])[: c.max_code - (0 if c.signed else 0)] * step
    expect = torch.tensor([0.0, 2.0, 2.0])[: len(half)].clamp(max=c.max_code)
    assert torch.equal(c.decode(c.encode(half)) / step, expect)


def test_int_facts():
    assert ELEMENTS["int4"].max == 7 and ELEMENTS["int4"].min == -7
    assert ELEMENTS["uint4"].max == 15 and ELEMENTS["uint4"].min == 0
    assert ELEMENTS["mxint8"].max == 127 / 64 and ELEMENTS["mxint8"].emax == 0


@pytest.mark.parametrize("name,emax,mx,sub", [("e2m1", 2, 6, 0.5), ("e2m3", 2, 7.5, 0.125), ("e3m2", 4, 28, 0.0625),
                                             ("e4m3", 8, 448, 2**-9), ("e5m2", 15, 57344, 2**-16)])
def test_float_facts(name, emax, mx, sub):
    c = ELEMENTS[name]
    assert (c.emax, c.max, c.min_subnormal) == (emax, mx, sub)


def test_nonfinite_policies():
    c = ELEMENTS["e4m3"]
    x = torch.tensor([float("nan"), float("inf"), 1.0])
    assert c.encode(x, nonfinite="zero").tolist() == [0, 0, 0x38]
    with pytest.raises(ValueError, match="NaN or Inf"):
        c.encode(x, nonfinite="error")
    assert c.encode(x, nonfinite="propagate", overflow="saturate").tolist() == [0x7F, 0x7E, 0x38]


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounding='up' is not valid"):
        ms.encode(torch.ones(2), "e2m1", rounding="up")
    with pytest.raises(TypeError, match="floating"):
        ms.encode(torch.ones(2, dtype=torch.int32), "e2m1")
    with pytest.raises(KeyError, match="unknown element"):
        ms.encode(torch.ones(2), "e9m9")
    with pytest.raises(TypeError, match="integer"):
        ms.decode(torch.ones(2), "e2m1")


@pytest.mark.parametrize("name", list(ELEMENTS))
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty_tensors_encode_and_decode(name, shape):
    import microscale as ms

    for nonfinite in ("propagate", "zero", "error"):
        c = ms.encode(torch.empty(shape), name, nonfinite=nonfinite)
        assert c.dtype == torch.uint8 and c.shape == shape
    d = ms.decode(torch.empty(shape, dtype=torch.uint8), name)
    assert d.dtype == torch.float32 and d.shape == shape
