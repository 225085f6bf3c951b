import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import microscale as ms
from microscale.formats import get_format, unpack_codes

_FORMATS = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mxint8", "int4_fp16", "fp4_fp32", "nvfp8"]


def _block_err(x, q):
    """Squared error per block, float64, from the ordinary dequantize."""
    b = q.fmt.block_size
    d = (x.double() - q.dequantize(torch.float64)).reshape(-1, b)
    return (d * d).sum(-1)


@settings(max_examples=25, deadline=None)
@given(fmt=st.sampled_from(_FORMATS), seed=st.integers(0, 2**31 - 1), spread=st.floats(-6, 6),
       heavy=st.booleans())
def test_mse_never_worse_than_rtn_per_block(fmt, seed, spread, heavy):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 64, generator=g) * 2.0 ** spread
    if heavy:  # outliers
        x = x * torch.exp(2 * torch.randn(x.shape, generator=g))
    q0 = ms.quantize(x, fmt)
    q1 = ms.quantize(x, fmt, method="mse")
    e0, e1 = _block_err(x, q0), _block_err(x, q1)
    assert bool((e1 <= e0).all()), (e0 - e1).min()
    assert q1.data.shape == q0.data.shape and q1.scales.dtype == q0.scales.dtype


@pytest.mark.parametrize("fmt", _FORMATS)
def test_mse_lowers_error_on_gaussian(fmt, gen):
    x = torch.randn(32, 256, generator=gen)
    e0 = _block_err(x, ms.quantize(x, fmt)).sum()
    e1 = _block_err(x, ms.quantize(x, fmt, method="mse")).sum()
    assert e1 < e0


def _brute_4over6(x, fmt):
    """Per block, by loop: the amax->6 (rtn) and amax->4 choices, the lower error (6 on ties)."""
    f = get_format(fmt)
    q = ms.quantize(x, f)
    s_dec = q.global_scale if q.global_scale is not None else torch.ones(())
    elem, codec, b = f.element, f.scale, f.block_size
    codes0 = unpack_codes(q.data, 4, x.shape[-1]).reshape(-1, b)
    raw0 = q.scales.reshape(-1)
    xb = x.reshape(-1, b)
    out_codes, out_raw = codes0.clone(), raw0.clone()
    for i in range(xb.shape[0]):
        blk = xb[i]
        e6 = ((blk.double() - elem.decode(codes0[i]).double() * codec.decode(raw0[i:i + 1]).double()
               * s_dec.double()) ** 2).sum()
        raw4 = codec.encode((blk.abs().max() / 4.0 / s_dec).reshape(1))
        m4 = codec.decode(raw4) * s_dec
        if float(m4) <= 0:
            continue
        c4 = elem.encode(blk / m4)
        e4 = ((blk.double() - elem.decode(c4).double() * m4.double()) ** 2).sum()
        if e4 < e6:
            out_codes[i], out_raw[i:i + 1] = c4, raw4
    return out_codes, out_raw


@pytest.mark.parametrize("fmt", ["nvfp4", "fp4_fp16", "fp4_fp32"])
def test_4over6_equals_brute_force(fmt, gen):
    x = torch.randn(6, 64, generator=gen) * torch.exp(torch.randn(6, 64, generator=gen))
    x[0, :16] = 0.0  # a zero block
    q = ms.quantize(x, fmt, method="4over6")
    codes, raw = _brute_4over6(x, fmt)
    b = q.fmt.block_size
    assert torch.equal(unpack_codes(q.data, 4, 64).reshape(-1, b), codes)
    assert torch.equal(q.scales.reshape(-1).view(torch.uint8) if q.scales.dtype == torch.float8_e4m3fn
                       else q.scales.reshape(-1), raw.view(torch.uint8) if raw.dtype == torch.float8_e4m3fn else raw)
    assert bool((_block_err(x, q) <= _block_err(x, ms.quantize(x, fmt))).all())
    assert float(_block_err(x, q).sum()) < float(_block_err(x, ms.quantize(x, fmt)).sum())


def test_ordinary_qtensor_and_padding(gen):
    x = torch.randn(5, 40, generator=gen)
    for m in ("mse", "4over6"):
        q = ms.quantize(x, "nvfp4", method=m, pad=True)
        q0 = ms.quantize(x, "nvfp4", pad=True)
        assert q.shape == q0.shape and q.data.shape == q0.data.shape and q.scales.shape == q0.scales.shape
        assert torch.equal(q.global_scale, q0.global_scale)
        q.validate()
        assert q.dequantize().shape == x.shape


def test_rtn_default_unchanged(gen):
    x = torch.randn(4, 64, generator=gen)
    a, b = ms.quantize(x, "mxfp4"), ms.quantize(x, "mxfp4", method="rtn")
    assert torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


def test_method_errors(gen):
    x = torch.randn(2, 64, generator=gen)
    with pytest.raises(ValueError, match="4over6"):
        ms.quantize(x, "mxfp4", method="4over6")
    with pytest.raises(ValueError, match="affine"):
        ms.quantize(x, "int4_affine_g32", method="mse")
    with pytest.raises(ValueError, match="not known"):
        ms.quantize(x, "mxfp4", method="gptq")
    with pytest.raises(ValueError, match="rounding"):
        ms.quantize(x, "mxfp4", method="mse", rounding="stochastic")
