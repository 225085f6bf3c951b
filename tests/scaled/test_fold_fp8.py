"""``fold_fp8``: block-scaled weights refolded into E4M3 codes with float32 scales per 128 elements, certified
bit for bit against the original's values, and the fp8 kernel of ``scaled_mm(..., fast_accum=True)`` on them."""
from __future__ import annotations

import os

import pytest
import torch

import microscale as ms
from microscale.formats import get_format
from microscale.linear.backends.scaled_fp8 import fast_accum_takes, scaled_fp8_launch
from microscale.linear.scaled import prepare_operand
from microscale.reference_scaled import scaled_mm_reference

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().contiguous().view(torch.int32)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3"])
def test_fold_is_lossless(fmt: str) -> None:
    """Experts axis kept, K not a multiple of 128 (nor of the block), a zero row, scales of very different sizes
    across rows: the folded tensor decodes to the original's float32 values bit for bit."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 300, generator=gen) * torch.logspace(-6, 6, 40)[None, :, None]
    x[1, 5] = 0
    w = ms.quantize(x, fmt, pad=True)
    f = ms.fold_fp8(w)
    assert f.fmt.name == "fp8_e4m3_block128" and f.shape == w.shape and f.dtype == w.dtype
    assert f.meta["folded_from"] == fmt and f.meta["inexact_chunks"] == 0
    assert torch.equal(_bits(f.dequantize()), _bits(w.dequantize()))
    assert f.scales.dtype == torch.float32 and f.scales.shape == (3, 40, 3)
    # power-of-two scales (no global scale here), the zero row's chunks scale 1 with zero codes
    m, e = torch.frexp(f.scales)
    assert bool((m == 0.5).all())
    assert bool((f.scales[1, 5] == 1).all()) and not bool(f.data[1, 5].any())


def test_fold_into_128_row_blocks_is_lossless() -> None:
    """``block_rows=128``: DeepSeek-V3's weight layout (one scale per 128 x 128 block), experts axis kept, N and K
    not multiples of 128 (rows past N stored as zero padding), a zero row: bit for bit the original's values."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 200, 300, generator=gen) * torch.logspace(-1, 1, 200)[None, :, None]
    x[1, 5] = 0
    w = ms.quantize(x, "mxfp4", pad=True)
    f = ms.fold_fp8(w, block_rows=128, rows_per_pass=130)  # (a pass covers whole row blocks: 128 rows)
    assert f.fmt.name == "fp8_e4m3_block128x128" and f.shape == w.shape and f.meta["inexact_chunks"] == 0
    assert f.data.shape == (2, 256, 384) and f.scales.shape == (2, 2, 3) and not f.data[:, 200:].any()
    assert torch.equal(_bits(f.dequantize()), _bits(w.dequantize()))
    m, _ = torch.frexp(f.scales)
    assert bool((m == 0.5).all())
    g = ms.fold_fp8(w, block_rows=128)
    assert torch.equal(g.data, f.data) and torch.equal(g.scales, f.scales)


def test_fold_into_128_row_blocks_refuses_rows_that_span_too_much() -> None:
    gen = torch.Generator().manual_seed(8)
    w = ms.quantize(torch.randn(256, 128, generator=gen) * torch.logspace(-6, 6, 256)[:, None], "mxfp4")
    with pytest.raises(ValueError, match=r"of 2 blocks \(128 x 128 elements\).*rows 0:128, columns 0:128.*"
                                         r"block_rows=1"):
        ms.fold_fp8(w, block_rows=128)
    assert ms.fold_fp8(w, block_rows=128, allow_lossy=True).meta["inexact_chunks"] >= 1
    assert ms.fold_fp8(w).meta["inexact_chunks"] == 0  # each row's chunk alone fits
    for bad in (0, 64, True):
        with pytest.raises(ValueError, match="block_rows"):
            ms.fold_fp8(w, block_rows=bad)


def test_global_scale_folds_into_the_chunk_scales() -> None:
    """A two-level weight whose block scales are equal in each chunk (here all 1) folds exactly with a global scale
    that is not a power of two: the chunk scales carry it."""
    gen = torch.Generator().manual_seed(1)
    w = ms.quantize(torch.randn(8, 256, generator=gen), "nvfp4")
    w.scales.fill_(1.0)
    w.global_scale = torch.tensor(0.37, dtype=torch.float32)
    f = ms.fold_fp8(w)
    assert f.global_scale is None
    assert torch.equal(_bits(f.dequantize()), _bits(w.dequantize()))
    assert bool((torch.frexp(f.scales / torch.tensor(0.37)).mantissa == 0.5).all())  # 2^b * 0.37, exactly


def _wide_spread() -> ms.QTensor:
    """MXFP4 [4, 256] whose row 2, columns 128..255, holds blocks 2^20 apart (not E4M3 under one scale)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 256, generator=gen)
    x[2, 128:160] *= 2.0 ** 20
    return ms.quantize(x, "mxfp4")


def test_refuses_chunks_that_are_not_exact() -> None:
    w = _wide_spread()
    with pytest.raises(ValueError, match=r"1 of 8 chunks .* of w\.proj \(mxfp4.*row 2, columns 128:256.*allow_lossy"):
        ms.fold_fp8(w, name="w.proj")


def test_lossy_rounds_and_counts() -> None:
    """With allow_lossy the one wide chunk is rounded to nearest E4M3 (its large block stays exact), the others
    stay bit-exact, and the count is kept."""
    w = _wide_spread()
    f = ms.fold_fp8(w, allow_lossy=True)
    assert f.meta["inexact_chunks"] == 1
    a, b = f.dequantize(), w.dequantize()
    keep = torch.ones_like(a, dtype=torch.bool)
    keep[2, 128:256] = False
    assert torch.equal(_bits(a[keep]), _bits(b[keep]))
    assert not torch.equal(a[2, 128:256], b[2, 128:256])
    assert torch.equal(a[2, 128:160], b[2, 128:160])


def test_rows_per_pass_does_not_change_the_result() -> None:
    gen = torch.Generator().manual_seed(3)
    w = ms.quantize(torch.randn(37, 384, generator=gen), "mxfp4")
    one, many = ms.fold_fp8(w), ms.fold_fp8(w, rows_per_pass=5)
    assert torch.equal(one.data, many.data) and torch.equal(one.scales, many.scales)


@pytest.mark.parametrize("fmt,why", [("int4_affine_g128", "zero points"), ("fp8_e4m3_block128x128", "2-D blocks")])
def test_refuses_formats_by_name(fmt: str, why: str) -> None:
    w = ms.quantize(torch.randn(128, 256), fmt)
    with pytest.raises(ValueError, match=f"experts.w1 cannot fold to fp8_e4m3_block128: {fmt} has {why}"):
        ms.fold_fp8(w, name="experts.w1")
    with pytest.raises(TypeError, match="must be a QTensor"):
        ms.fold_fp8(torch.randn(4, 4))


def test_refuses_nan() -> None:
    w = ms.quantize(torch.randn(4, 64), "mxfp4")
    w.scales[1, 1] = 0xFF  # E8M0 NaN
    with pytest.raises(ValueError, match="NaN or Inf values \\(rows 0..3\\)"):
        ms.fold_fp8(w)


@pytest.mark.parametrize("block_rows", [1, 128])
def test_folded_weight_saves_and_loads(tmp_path, block_rows: int) -> None:
    f = ms.fold_fp8(ms.quantize(torch.randn(16, 128), "mxfp4"), block_rows=block_rows)
    f.save(tmp_path / "w.safetensors")
    g = ms.QTensor.load(tmp_path / "w.safetensors")
    assert torch.equal(g.data, f.data) and torch.equal(g.scales, f.scales) and g.meta == f.meta
    assert g.fmt.name == f.fmt.name and g.shape == f.shape and torch.equal(g.dequantize(), f.dequantize())


def test_fast_accum_takes_the_folded_pair() -> None:
    """The folded weight with fp8 block-128 activations is a pair the fp8 kernel takes (the original is not);
    on CPU the oracle equals float64 of the original weight's values up to float32 summation."""
    act, fold = get_format("fp8_e4m3_block128"), get_format("fp8_e4m3_block128")
    assert fast_accum_takes(act, fold, 4096) and not fast_accum_takes(act, get_format("mxfp4"), 4096)
    gen = torch.Generator().manual_seed(4)
    w = ms.quantize(torch.randn(96, 320, generator=gen), "mxfp4")
    a = ms.quantize(torch.randn(7, 320, generator=gen), "fp8_e4m3_block128", pad=True)
    ref = a.dequantize().double() @ w.dequantize().double().T
    out = ms.scaled_mm(a, ms.fold_fp8(w), out_dtype=torch.float32, fast_accum=True)
    assert _rel(out, ref) <= 1e-6


@needs_interp
@pytest.mark.parametrize("fmt,block_rows", [("mxfp6_e2m3", 1), ("mxfp4", 128)])
def test_fp8_kernel_on_a_folded_weight_equals_the_oracle(fmt: str, block_rows: int) -> None:
    from dataclasses import replace

    from microscale.linear.backends.scaled_fp8 import Fp8Config

    gen = torch.Generator().manual_seed(5)
    w = ms.quantize(torch.randn(40, 304, generator=gen), fmt, pad=True)
    f = ms.fold_fp8(w, block_rows=block_rows)
    a = ms.quantize(torch.randn(19, 304, generator=gen), "fp8_e4m3_block128", pad=True)
    ref = scaled_mm_reference(a, f, None, torch.float32)
    cfg = replace(Fp8Config(16, 16, 1, 1, group_m=2), tma=False)
    out = scaled_fp8_launch(prepare_operand(a), prepare_operand(f), None, torch.float32, cfg)
    assert _rel(out, ref) <= 1e-5


@needs_gpu
@pytest.mark.parametrize("m", [1, 70, 512, 1100])
@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("block_rows", [1, 128])
def test_gpu_folded_mxfp4_within_allowance(m: int, gluon: bool, block_rows: int) -> None:
    """MXFP4 weights x fp8 block-128 activations on fp8 tensor cores: within Hopper's fast_accum allowance
    (5e-4 relative) of float64 on the original MXFP4 values; the fold runs on the GPU too (1100 rows: the
    routed Gluon kernel on 128-row blocks)."""
    from microscale.linear.backends.scaled_fp8 import Fp8Config, scaled_fp8_ws_reason

    gen = torch.Generator().manual_seed(6)
    w = ms.quantize(torch.randn(300, 1024, generator=gen).cuda(), "mxfp4")
    f = ms.fold_fp8(w, block_rows=block_rows)
    assert torch.equal(_bits(f.dequantize()), _bits(w.dequantize()))
    a = ms.quantize(torch.randn(m, 1024, generator=gen).cuda(), "fp8_e4m3_block128")
    ref = a.dequantize().double() @ w.dequantize().double().T
    if gluon:
        cfg = Fp8Config(128, 128, 4, 4, gluon=True)
        if scaled_fp8_ws_reason(prepare_operand(a), prepare_operand(f), cfg):
            pytest.skip(scaled_fp8_ws_reason(prepare_operand(a), prepare_operand(f), cfg))
        out = scaled_fp8_launch(prepare_operand(a), prepare_operand(f), None, torch.float32, cfg)
    else:
        out = ms.scaled_mm(a, f, out_dtype=torch.float32, fast_accum=True)
    assert _rel(out, ref) <= 5e-4


def test_fold_fp8_layers_keeps_outputs() -> None:
    """A model quantized to MXFP4: the layers that fold exactly become fp8 weights x fp8 block-128 activations
    (outputs equal the float64 product of the original weight and the quantized input, up to float32 sums);
    skipped and not-exact layers stay; the state dict round-trips into a model folded the same way."""
    from microscale.nn import QuantLinear, fold_fp8_layers, quantize_model

    gen = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False),
                                torch.nn.Linear(32, 16))
    with torch.no_grad():
        model[2].weight[3, :32] *= 2.0 ** 20  # one chunk 2^20 wide: not exact
    quantize_model(model, "mxfp4")
    w0 = model[0].qweight
    report = fold_fp8_layers(model, skip=["3"], progress=False)
    assert report["0"] == "folded" and report["3"] == "skipped" and report["2"].startswith("left: fold_fp8: 1 of")
    assert model[0].fmt.name == "fp8_e4m3_block128" and model[0].fast_accum and model[2].fmt.name == "mxfp4"
    x = torch.randn(5, 256, generator=gen)
    a = ms.quantize(x, "fp8_e4m3_block128")
    want = a.dequantize().double() @ w0.dequantize().double().T + model[0].bias.double()
    assert _rel(model[0](x), want) <= 1e-6
    sd = model.state_dict()
    fresh = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32, bias=False),
                                torch.nn.Linear(32, 16))
    fresh[0] = QuantLinear.from_qtensor(model[0].qweight, model[0].bias.detach(), "fp8_e4m3_block128", True)
    quantize_model(fresh, "mxfp4", skip=["0"])
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(x), model(x))
    assert fold_fp8_layers(model, progress=False)["0"].startswith("left: its input is quantized already")
    from microscale.nn import QuantExperts

    moe = torch.nn.ModuleDict({"experts": QuantExperts.from_qtensors(ms.quantize(torch.randn(2, 64, 32), "mxfp4"),
                                                                     ms.quantize(torch.randn(2, 32, 32), "mxfp4"))})
    assert fold_fp8_layers(moe, progress=False) == {"experts": "left: MoE experts (the MoE kernels take no fp8 "
                                                                "activations)"}


def test_fold_fp8_layers_prefers_128_row_blocks_where_exact() -> None:
    """``block_rows=128``: a layer whose blocks are all exact takes the 128 x 128 form, one that is not falls back
    to the per-row form (exact there), one exact in neither is left; outputs as the oracle's."""
    from microscale.nn import fold_fp8_layers, quantize_model

    gen = torch.Generator().manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(256, 200), torch.nn.Linear(200, 256), torch.nn.Linear(256, 64))
    with torch.no_grad():
        model[1].weight.mul_(torch.logspace(-6, 6, 256)[:, None])  # rows 2^40 apart: per-row chunks only
        model[2].weight[3, :32] *= 2.0 ** 20  # one chunk 2^20 wide: exact in neither form
    quantize_model(model, "mxfp4")
    w0 = model[0].qweight
    report = fold_fp8_layers(model, progress=False, block_rows=128)
    assert report["0"] == "folded (128 x 128 blocks)" and report["1"] == "folded"
    assert report["2"].startswith("left: fold_fp8: 1 of")
    assert model[0].fmt.name == "fp8_e4m3_block128x128" and model[1].fmt.name == "fp8_e4m3_block128"
    x = torch.randn(5, 256, generator=gen)
    want = ms.quantize(x, "fp8_e4m3_block128").dequantize().double() @ w0.dequantize().double().T
    assert _rel(model[0](x), want + model[0].bias.double()) <= 1e-6
    with pytest.raises(ValueError, match="block_rows=2"):
        fold_fp8_layers(model, block_rows=2)


@pytest.mark.parametrize("byte", [0, 1, 5, 127, 250])
def test_e8m0_extremes_fold_exactly(byte: int) -> None:
    """Every E8M0 scale from 2^-127 up: tiny chunks fold exactly with normal float32 chunk scales (never an
    overflowed 2^-b, never NaN codes), huge ones too while their values stay finite."""
    gen = torch.Generator().manual_seed(8)
    w = ms.quantize(torch.randn(2, 256, generator=gen), "mxfp4")
    w.scales.fill_(byte)
    f = ms.fold_fp8(w)
    assert torch.equal(_bits(f.dequantize()), _bits(w.dequantize()))
    assert bool((f.scales >= 2.0 ** -126).all())


def test_lossy_never_writes_nan() -> None:
    """A chunk with one block at 2^-127 and one at 2^100: not exact; rounded, its small values flush to zero
    (never NaN), its large ones stay exact."""
    gen = torch.Generator().manual_seed(9)
    w = ms.quantize(torch.randn(1, 128, generator=gen), "mxfp4")
    w.scales[0, 0], w.scales[0, 1] = 0, 227
    with pytest.raises(ValueError, match="1 of 1 chunks"):
        ms.fold_fp8(w)
    f = ms.fold_fp8(w, allow_lossy=True)
    v, want = f.dequantize(), w.dequantize()
    assert not bool(v.isnan().any()) and bool((v[0, :32] == 0).all())
    assert torch.equal(_bits(v[0, 32:64]), _bits(want[0, 32:64]))


def test_refuses_values_that_overflow_with_the_global_scale() -> None:
    w = ms.quantize(torch.randn(4, 256), "nvfp4")
    w.scales.fill_(1.0)
    w.global_scale = torch.tensor(3.3e38, dtype=torch.float32)
    with pytest.raises(ValueError, match="NaN or Inf"):
        ms.fold_fp8(w)
    w.global_scale = torch.tensor(0.37, dtype=torch.float32)
    assert "two_level" in w.meta and "two_level" not in ms.fold_fp8(w).meta
