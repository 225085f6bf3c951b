"""conv2d on block-scaled weights: the canonical layout round trip, the Triton kernels under the
interpreter against the float64 reference (``F.conv2d`` on the dequantized weight), the CPU op,
the custom op's registration and the argument errors."""
import pytest
import torch
import torch.nn.functional as F

import microscale as ms
from microscale.conv import (as_conv_weight, conv2d_reference, conv2d_triton, conv_layout, dequantize_conv_weight,
                             quantize_conv_weight)
from microscale.quant import params
from microscale.reference import dequantize as ref_dequantize

#: (C_in, C_out, kernel (kh, kw), stride, padding, dilation, groups, order, H, W)
GENERAL = (6, 20, (3, 3), 1, 1, 1, 1, "hwc", 7, 9)  # K = 54: a ragged last block
PATCH = (3, 16, (4, 4), 4, 0, 1, 1, "chw", 8, 12)  # ViT patch embedding, kernel == stride
GROUPED = (8, 12, (3, 2), (2, 1), (2, 1), (2, 1), 2, "hwc", 9, 7)  # strides/padding/dilation differ per axis
DEPTHWISE = (8, 16, (3, 3), 2, 1, 2, 8, "hwc", 7, 6)  # groups == C_in, channel multiplier 2
CASES = {"general": GENERAL, "patch": PATCH, "grouped": GROUPED, "depthwise": DEPTHWISE}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _setup(case, name, gen, batch=2):
    ci, co, k, s, p, d, g, order, h, w = case
    wt = torch.randn(co, ci // g, *k, generator=gen)
    q = quantize_conv_weight(wt, name, order=order)
    x = torch.randn(batch, ci, h, w, generator=gen)
    return q, x, dict(stride=s, padding=p, dilation=d, groups=g)


@pytest.fixture
def poisoned(monkeypatch):
    """Kernel outputs start as NaN: an element the kernel fails to write shows."""
    monkeypatch.setattr(params, "_empty", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                                  device=device))


# ---- layout -------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["hwc", "chw"])
@pytest.mark.parametrize("name", ["nvfp4", "int4_affine_g32", "fp8_e4m3_block128x128"])
def test_layout_round_trip(name, order, gen):
    w = torch.randn(5, 3, 3, 2, generator=gen)
    q = quantize_conv_weight(w, name, order=order)
    lay = conv_layout(q)
    assert q.shape == (5, 18) and lay.shape == (5, 3, 3, 2) and lay.order == order
    flat = ref_dequantize(q, torch.float64)
    got = dequantize_conv_weight(q, torch.float64)
    # the documented index formulas, independently of ConvLayout.unflatten
    for o, c, r, s in [(0, 0, 0, 0), (4, 2, 2, 1), (1, 1, 0, 1), (3, 0, 2, 0)]:
        k = (r * 2 + s) * 3 + c if order == "hwc" else (c * 3 + r) * 2 + s
        assert got[o, c, r, s] == flat[o, k]
    assert torch.equal(lay.unflatten(lay.flatten(w)), w)
    # the layout survives a file round trip
    t, meta = q.state_dict()
    assert conv_layout(ms.QTensor.from_state_dict(t, meta)) == lay


def test_exactly_representable_weight_round_trips(gen):
    """A weight whose values a format holds exactly comes back bit for bit (E2M1 codes times
    power-of-two block scales in MXFP4; every block has an element of magnitude 6)."""
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = torch.randint(0, 8, (4, 32, 3, 3), generator=gen)
    sign = torch.where(torch.rand(codes.shape, generator=gen) < 0.5, -1.0, 1.0)
    w = vals[codes] * sign
    w[:, 0] = 6.0  # channel 0 of every tap: each hwc block (32 channels of one tap) has amax 6
    w = w * 2.0 ** torch.randint(-3, 4, (4, 1, 3, 3), generator=gen).float()
    q = quantize_conv_weight(w, "mxfp4")
    assert torch.equal(dequantize_conv_weight(q), w)


KDEV = "cuda" if torch.cuda.is_available() else "cpu"  # (kernels: the GPU, else the interpreter on CPU)


def _tri(x, q, bias=None, **kw):
    """``conv2d_triton`` on KDEV (the GPU where there is one), its output back on the CPU."""
    return conv2d_triton(x.to(KDEV), q.to(KDEV), None if bias is None else bias.to(KDEV), **kw).cpu()


# ---- kernels under the interpreter vs the float64 reference ---------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g32"])
def test_kernel_matches_float64_reference(name, case, gen, poisoned):
    q, x, kw = _setup(CASES[case], name, gen)
    want = conv2d_reference(x.double(), q, **kw)
    got = _tri(x, q, **kw)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert _rel(got, want) < 1e-5, (name, case)
    xb = x.bfloat16()
    got = _tri(xb, q, **kw)
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    assert _rel(got, conv2d_reference(xb.double(), q, **kw)) < 1e-2, (name, case)


@pytest.mark.parametrize("name", ["mxfp6_e3m2", "int3_fp16", "int5_fp32", "mxint2", "mxfp8_e5m2",
                                  "int8_affine_g64", "fp8_e4m3_block128x128", "nvfp8"])
def test_kernel_other_formats(name, gen, poisoned):
    """3/5/6-bit codes straddling bytes, 2-bit codes, fp16/fp32 scales, E5M2's Inf/NaN-capable
    decode, 2-D blocks: the general case and the depthwise one."""
    for case in (GENERAL, DEPTHWISE):
        q, x, kw = _setup(case, name, gen, batch=1)
        assert _rel(_tri(x, q, **kw), conv2d_reference(x.double(), q, **kw)) < 1e-5, (name, case)


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel lengths")
def test_kernel_bias_dtypes_layouts(gen, poisoned):
    """fp16 with bias, float32 with bias, a channels_last and an unbatched input, 'same' padding of
    an even kernel (asymmetric), and a 7x7 depthwise kernel (ConvNeXt) with bias."""
    q = quantize_conv_weight(torch.randn(12, 6, 3, 3, generator=gen), "nvfp4")
    b = torch.randn(12, generator=gen)
    x = torch.randn(2, 6, 6, 7, generator=gen)
    want = conv2d_reference(x.double(), q, b.double(), padding=1)
    assert _rel(_tri(x, q, b, padding=1), want) < 1e-5
    assert _rel(_tri(x.half(), q, b.half(), padding=1), conv2d_reference(x.half().double(), q, b.double(),
                                                                                 padding=1)) < 1e-2
    xcl = x.contiguous(memory_format=torch.channels_last)
    assert _rel(_tri(xcl, q, b, padding=1), want) < 1e-5
    y1 = _tri(x[1], q, b, padding=1)
    assert y1.shape == want.shape[1:] and _rel(y1, want[1]) < 1e-5
    qe = quantize_conv_weight(torch.randn(4, 6, 2, 4, generator=gen), "mxfp8_e4m3")
    want = F.conv2d(x.double(), dequantize_conv_weight(qe, torch.float64), None, 1, "same", (2, 1))
    assert _rel(conv2d_reference(x.double(), qe, padding="same", dilation=(2, 1)), want) == 0
    assert _rel(_tri(x, qe, padding="same", dilation=(2, 1)), want) < 1e-5
    qd = quantize_conv_weight(torch.randn(6, 1, 7, 7, generator=gen), "mxfp4")
    bd = torch.randn(6, generator=gen)
    assert _rel(_tri(x[:1], qd, bd, padding=3, groups=6),
                conv2d_reference(x[:1].double(), qd, bd.double(), padding=3, groups=6)) < 1e-5


# ---- the op on the CPU and its registration -----------------------------------------------------
def test_cpu_op_is_float64_reference(gen):
    q, x, kw = _setup(GROUPED, "nvfp4", gen)
    b = torch.randn(12, generator=gen)
    want = F.conv2d(x.double(), dequantize_conv_weight(q, torch.float64), b.double(), **kw)
    assert torch.equal(ms.conv2d(x.double(), q, b.double(), **kw), want)
    xb, bb = x.bfloat16(), b.bfloat16()
    want = F.conv2d(xb.double(), dequantize_conv_weight(q, torch.float64), bb.double(), **kw)
    got = ms.conv2d(xb, q, bb, **kw)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert hasattr(torch.ops.microscale, "conv2d")


def test_custom_op_registration(gen):
    q, x, kw = _setup(PATCH, "mxfp4", gen, batch=1)
    from microscale.conv.op import _meta

    args = (x, q.data, q.scales, q.global_scale, q.zero_points, _meta(q), None, [4, 4], [0, 0, 0, 0], [1, 1], 1)
    torch.library.opcheck(torch.ops.microscale.conv2d.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_as_conv_weight_tags_a_flattened_weight(gen):
    w = torch.randn(8, 4, 3, 3, generator=gen)
    q2 = ms.quantize(w.reshape(8, -1), "mxfp8_e4m3", pad=True)  # PyTorch's flatten order
    q = as_conv_weight(q2, w.shape)
    x = torch.randn(1, 4, 5, 5, generator=gen)
    want = F.conv2d(x.double(), ref_dequantize(q2, torch.float64).reshape(8, 4, 3, 3))
    assert torch.equal(ms.conv2d(x.double(), q), want)


def test_argument_errors(gen):
    q = quantize_conv_weight(torch.randn(8, 4, 3, 3, generator=gen), "nvfp4")
    x = torch.randn(1, 4, 6, 6, generator=gen)
    with pytest.raises(TypeError, match="w must be a QTensor"):
        ms.conv2d(x, torch.randn(8, 4, 3, 3))
    with pytest.raises(ValueError, match="no conv2d layout"):
        ms.conv2d(x, ms.quantize(torch.randn(8, 36), "nvfp4", pad=True))
    with pytest.raises(ValueError, match="C_in=5 channels"):
        ms.conv2d(torch.randn(1, 5, 6, 6), q)
    with pytest.raises(ValueError, match=r"x must be \[N, C_in, H, W\]"):
        ms.conv2d(torch.randn(4, 6), q)
    with pytest.raises(ValueError, match="C_out=8 is not a multiple of groups=3"):
        ms.conv2d(torch.randn(1, 12, 6, 6), q, groups=3)
    with pytest.raises(ValueError, match="stride=0"):
        ms.conv2d(x, q, stride=0)
    with pytest.raises(ValueError, match=r"padding=\(1, -1\)"):
        ms.conv2d(x, q, padding=(1, -1))
    with pytest.raises(ValueError, match="dilation=1.5"):
        ms.conv2d(x, q, dilation=1.5)
    with pytest.raises(ValueError, match="groups=0"):
        ms.conv2d(x, q, groups=0)
    with pytest.raises(ValueError, match="padding='same' needs stride=1"):
        ms.conv2d(x, q, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding='full'"):
        ms.conv2d(x, q, padding="full")
    with pytest.raises(ValueError, match="no output"):
        ms.conv2d(torch.randn(1, 4, 2, 6), q)
    with pytest.raises(ValueError, match=r"bias has shape \(4,\); expected \(8,\)"):
        ms.conv2d(x, q, torch.randn(4))
    with pytest.raises(TypeError, match="x must be float32"):
        ms.conv2d(x.to(torch.int32), q)
    with pytest.raises(ValueError, match="w must be a 4-D tensor"):
        quantize_conv_weight(torch.randn(8, 36), "nvfp4")
    with pytest.raises(ValueError, match="order='whc'"):
        quantize_conv_weight(torch.randn(8, 4, 3, 3), "nvfp4", order="whc")
    with pytest.raises(ValueError, match=r"shape \(8, 36\) but its conv2d layout \[8, 4, 3, 2\] needs \[8, 24\]"):
        as_conv_weight(q, (8, 4, 3, 2))
