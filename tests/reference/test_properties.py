"""Property tests (hypothesis): error bound, idempotence, zero blocks, NaN/Inf."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import microscale as ms
from microscale.formats import registry

NAMES = [n for n, f in registry.items() if f.block_rows == 1]
# within every scale codec's range (an FP16 scale saturates past 65504 * element max)
finite = st.floats(min_value=-3e4, max_value=3e4, allow_nan=False, width=32)


def blocks(fmt, n_blocks=2):
    return arrays(np.float32, (n_blocks * fmt.block_size,), elements=finite)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES))
def test_error_within_half_step(data, name):
    """|dequant(quant(x)) - x| <= half an element step at that magnitude times the block
    scale, unless the element saturated (then bounded by the clamp)."""
    f = registry[name]
    x = torch.from_numpy(data.draw(blocks(f)))
    q = ms.quantize(x, name)
    d = q.dequantize().double()
    xs = x.double()
    s = f.scale.decode(q.scales).double().repeat_interleave(f.block_size)
    if f.global_scale:
        s = s * float(q.global_scale)
    lut = f.element.lut().double()
    grid = torch.unique(lut[torch.isfinite(lut)])
    if f.zero_point:  # affine: uniform step s; the FP16 scale's rounding (relative 2^-11, or
        # half of the 2^-24 subnormal spacing: tiny blocks) can clip the ends
        rel = torch.clamp(2.0**-25 / s, min=2.0**-11)
        bound = (0.5 + f.element.max_code * rel) * s
        assert bool(((d - xs).abs() <= bound + 1e-30).all())
        return
    v = (xs / s).abs()
    # step at |v|: distance between the grid points around it
    idx = torch.searchsorted(grid, v.clamp(max=float(grid[-1])))
    hi = grid[idx.clamp(max=len(grid) - 1)]
    lo = grid[(idx - 1).clamp(min=0)]
    step = torch.where(v >= grid[-1], torch.zeros_like(v), hi - lo)
    sat = v > grid[-1]
    err = (d - xs).abs()
    ok = (err <= 0.5 * step * s * (1 + 1e-6) + 1e-37) | sat
    # scale rounding (fp16/e4m3 scales, global) can push |v| a hair past the grid max
    assert bool(ok.all()), (name, float(err.max()))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), name=st.sampled_from([n for n in NAMES if registry[n].scale_rule.value in ("floor", "amax")]))
def test_requantize_is_identity(data, name):
    """quantize(dequantize(q)) == q for FLOOR MX formats and amax-scaled formats with a
    given global scale (CEIL/EVEN/RCEIL can pick another but equal-valued encoding)."""
    f = registry[name]
    x = torch.from_numpy(data.draw(blocks(f)))
    kw = {"global_scale": 0.05} if f.global_scale else {}
    q = ms.quantize(x, name, **kw)
    q2 = ms.quantize(q.dequantize(), name, **kw)
    if f.scale.name in ("fp32", "fp16"):
        # the scale is recomputed from the dequantized amax: equal values, maybe another ulp
        assert torch.equal(q2.dequantize(), q.dequantize())
    else:
        raw, raw2 = q.scales.view(torch.uint8).flatten(), q2.scales.view(torch.uint8).flatten()
        # a block scale that underflows to 0 (NVFP4's ModelOpt cast has no lower clamp) leaves the
        # block all zeros with saturated codes; requantized, those zeros take the zero-block
        # encoding (scale 1.0, codes 0): the values are the same, the bits are not
        under = f.scale.decode(raw) == 0
        assert torch.equal(q2.dequantize(), q.dequantize())
        assert torch.equal(raw2[~under], raw[~under])
        per = q.data.numel() // raw.numel()  # code bytes per block
        keep = (~under).repeat_interleave(per)
        assert torch.equal(q2.data.flatten()[keep], q.data.flatten()[keep])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES), rule=st.sampled_from(["ceil", "even", "rceil"]))
def test_requantize_values_idempotent_other_rules(data, name, rule):
    f = registry[name]
    if f.scale.name != "e8m0":
        return
    x = torch.from_numpy(data.draw(blocks(f)))
    d = ms.quantize(x, name, scale_rule=rule).dequantize()
    assert torch.equal(ms.quantize(d, name, scale_rule=rule).dequantize(), d)


@pytest.mark.parametrize("name", NAMES)
def test_zero_and_nonfinite_blocks(name):
    f = registry[name]
    x = torch.zeros(3, f.block_size * 2)
    x[1, 0] = float("nan")
    x[2, f.block_size] = float("inf")
    x[0, f.block_size:] = 1.0
    d = ms.quantize(x, name).dequantize()
    assert torch.equal(d[0, : f.block_size], torch.zeros(f.block_size))  # zero block exact
    # a constant block lands on the element max: exact up to the scale codec's rounding
    # (an FP16 scale of 1/57344 is subnormal, hence the loose bound)
    assert torch.allclose(d[0, f.block_size:], torch.ones(f.block_size), rtol=1e-2, atol=0)
    dz = ms.quantize(x, name, nonfinite="zero").dequantize()
    assert torch.isfinite(dz).all() and dz[1, 0] == 0 and dz[2, f.block_size] == 0
    with pytest.raises(ValueError):
        ms.quantize(x, name, nonfinite="error")


def test_affine_nan_keeps_its_block():
    """A NaN in an affine block decodes to 0 and leaves the block's other values alone
    (tests/reference/test_nonfinite.py checks every affine format and Inf)."""
    x = torch.randn(2, 64)
    x[0, 5] = float("nan")
    d = ms.quantize(x, "int4_affine_g32").dequantize()
    y = x.clone()
    y[0, 5] = 0.0
    assert d[0, 5] == 0 and torch.equal(d, ms.quantize(y, "int4_affine_g32").dequantize())
