"""Finite values beyond float32's range and NaN/Inf in affine blocks: no block is poisoned
by one element, and every error message says what it found."""
import pytest
import torch

import microscale as ms
from microscale.formats import registry

F32_MAX = torch.finfo(torch.float32).max
NAMES = [n for n, f in registry.items() if f.block_rows == 1]


def _outcome(fn):
    try:
        return fn()
    except ValueError as e:
        return str(e)


def _huge_row(fmt, value=1e39):
    """Two rows of two blocks; element 3 of block 0 of row 0 is ``value`` (float64)."""
    b = fmt.block_size
    x = torch.linspace(-2.0, 3.0, 4 * b, dtype=torch.float64).reshape(2, 2 * b)
    x[0, 3] = value
    return x


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("nonfinite", ["propagate", "zero", "error"])
def test_float64_beyond_float32_saturates(name, nonfinite):
    """Under overflow='saturate' a finite float64 beyond float32's range is the float32
    maximum (same sign): the result equals quantizing the clamped tensor, has no NaN or Inf
    where the clamped input has none, and the other blocks keep their values."""
    f = registry[name]
    for v in (1e39, -1e300):
        x = _huge_row(f, v)
        got = _outcome(lambda: ms.quantize(x, name, nonfinite=nonfinite).dequantize())
        want = _outcome(lambda: ms.quantize(x.clamp(-F32_MAX, F32_MAX), name, nonfinite=nonfinite).dequantize())
        if isinstance(want, str):  # (NVFP4 ModelOpt: a block scale that rounds to 0 makes x/0 = Inf)
            assert got == want and f.global_scale and nonfinite == "error"
            continue
        assert torch.equal(got, want)
        # finite everywhere else; the huge element itself is its block's largest value, whose
        # float32 decode may round past float32 max (e.g. 127 * fl(max/127)) but is never NaN
        others = torch.ones_like(got, dtype=torch.bool)
        others[0, 3] = False
        assert torch.isfinite(got[others]).all()
        assert not torch.isnan(got[0, 3]) and (got[0, 3] > 0) == (v > 0)
        assert abs(got[0, 3]) == got[0, : f.block_size].abs().max()  # (fp16 scales saturate at 65504)
        if not f.global_scale:  # (a two-level format's tensor scale follows the largest value)
            rest = ms.quantize(x[:, f.block_size:], name).dequantize()
            assert torch.equal(got[:, f.block_size:], rest)
            assert torch.equal(got[1], ms.quantize(x[1:], name).dequantize()[0])


def test_nvfp4_with_a_huge_float64_is_not_all_nan():
    x = _huge_row(registry["nvfp4"])
    for nonfinite in ("propagate", "zero"):
        d = ms.quantize(x, "nvfp4", nonfinite=nonfinite).dequantize()
        assert torch.isfinite(d).all()
        assert d[0, 3] == pytest.approx(6 * 448 * float(F32_MAX / 2688), rel=0.2)


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "int4_fp32", "int4_affine_g32", "fp8_e4m3_block128"])
def test_float64_beyond_float32_under_native_overflow_is_an_error(name):
    x = _huge_row(registry[name])
    with pytest.raises(ValueError, match=r"finite.*beyond float32's range.*1e\+39.*overflow='saturate'"):
        ms.quantize(x, name, overflow="native")


def test_nonfinite_error_message_is_true():
    """A huge finite value is not reported as NaN/Inf; a real NaN/Inf still is."""
    x = _huge_row(registry["mxfp4"])
    ms.quantize(x, "mxfp4", nonfinite="error")  # saturates: no error
    with pytest.raises(ValueError, match="beyond float32's range") as e:
        ms.quantize(x, "mxfp4", nonfinite="error", overflow="native")
    assert "NaN" not in str(e.value)
    x[1, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        ms.quantize(x, "mxfp4", nonfinite="error")


@pytest.mark.parametrize("element", ["e2m1", "e4m3", "e5m2", "int4", "mxint8"])
@pytest.mark.parametrize("overflow", ["saturate", "native"])
def test_encode_float64_beyond_float32(element, overflow):
    """Element encoding: a finite value beyond float32 is an overflow of the element (its
    max under saturate, its Inf/NaN under native), never a NaN/Inf input: not zeroed by
    nonfinite='zero', not refused by nonfinite='error'."""
    x = torch.tensor([1e39, -1e300, 1.0], dtype=torch.float64)
    big = torch.tensor([F32_MAX, -F32_MAX, 1.0], dtype=torch.float32)
    for nonfinite in ("propagate", "zero", "error"):
        got = ms.encode(x, element, overflow=overflow, nonfinite=nonfinite)
        assert torch.equal(got, ms.encode(big, element, overflow=overflow, nonfinite=nonfinite))
    assert ms.decode(ms.encode(x, element), element)[0] > 1.0  # saturated, not zeroed


# ---- affine formats: NaN and Inf stay in their own element -----------------------------
@pytest.mark.parametrize("name", [n for n, f in registry.items() if f.zero_point])
@pytest.mark.parametrize("bad", [float("nan"), -float("nan"), float("inf"), -float("inf")])
def test_affine_nonfinite_keeps_the_block(name, bad, gen):
    """A NaN or Inf does not set its block's range: the other elements decode exactly as
    when it is absent; NaN encodes as the block's zero point (decodes to 0: an unsigned code
    has no NaN), +-Inf saturates to the block's largest / smallest code."""
    f = registry[name]
    x = torch.randn(2, 2 * f.block_size, generator=gen)
    x[0, 5] = bad
    q = ms.quantize(x, name)
    d = q.dequantize()
    clean = x.clone()
    clean[0, 5] = 0.0  # inside every block's range [min(x, 0), max(x, 0)]: the same scale
    want = ms.quantize(clean, name).dequantize()
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[0, 5] = False
    assert torch.equal(d[keep], want[keep])
    assert torch.equal(q.scales, ms.quantize(clean, name).scales)
    s, zp = float(q.scales[0, 0]), float(q.zero_points[0, 0])
    if bad != bad:
        assert d[0, 5] == 0
    elif bad > 0:
        assert d[0, 5] == (f.element.max_code - zp) * s  # the block's largest value
    else:
        assert d[0, 5] == (0 - zp) * s  # its smallest
    assert torch.equal(ms.quantize(x, name, nonfinite="zero").dequantize()[keep], want[keep])
    with pytest.raises(ValueError, match="NaN or Inf"):
        ms.quantize(x, name, nonfinite="error")


def test_affine_all_nan_block_is_zero():
    x = torch.full((1, 32), float("nan"))
    d = ms.quantize(x, "int4_affine_g32").dequantize()
    assert torch.equal(d, torch.zeros(1, 32))
