"""The scaled_mm Triton kernel vs the oracle (CPU, TRITON_INTERPRET=1), and the public op."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import microscale as ms
from microscale.linear.backends.scaled_exact import (ScaledConfig, bf16_exact, choose_scaled_config,
                                                     dequant_gemm_launch, exact_values, fp8_kind, global_product,
                                                     linear_choice, scaled_exact_run)
from microscale.linear.scaled import prepare_operand, scaled_mm
from microscale.reference_scaled import scaled_mm_reference

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")

PAIRS = [("fp8_e4m3_block128", "fp8_e4m3_block128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp4"),
         ("mxfp8_e5m2", "mxfp6_e2m3"), ("mxfp8_e4m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"),
         ("mxint8", "mxint8"), ("int8_fp32", "int4_fp16"), ("int8_affine_g32", "int4_affine_g64"),
         ("fp8_e4m3_block128", "mxfp4"), ("mxint5", "int3_fp16"), ("int2_fp32", "mxint6")]  # (codes across bytes)
SMALL = ScaledConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)


def _q(name: str, rows: int, k: int, gen: torch.Generator, scale: float = 1.0) -> ms.QTensor:
    return ms.quantize(torch.randn(rows, k, generator=gen) * scale, name, pad=True)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def _nonfinite_operands(seed: int) -> tuple[ms.QTensor, ms.QTensor]:
    """An MXFP8 E5M2 ``a`` with a NaN input and an -Inf code, an MXFP8 E4M3 ``b`` with an E8M0 NaN scale."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(18, 64, generator=gen)
    x[1, 3] = float("nan")
    a = ms.quantize(x, "mxfp8_e5m2")
    a.data[2, 40] = 0xFC  # an E5M2 -Inf code
    b = _q("mxfp8_e4m3", 17, 64, gen)
    b.scales[4, 1] = 255  # an E8M0 NaN scale
    return a, b


def _assert_nonfinite_placed(out: torch.Tensor, ref: torch.Tensor) -> None:
    """NaN / Inf where the oracle puts them (a NaN column from the NaN scale, some Inf), the rest within 1e-5."""
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and bool(torch.isnan(ref[:, 4]).all())
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and bool(torch.isinf(ref).any())
    fin = torch.isfinite(ref)
    assert _rel(out[fin], ref[fin]) <= 1e-5


@needs_interp
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_kernel_equals_oracle(fa: str, fb: str) -> None:
    """Ragged M and N (not multiples of the 16x16 tile), K not a multiple of the chunk."""
    gen = torch.Generator().manual_seed(0)
    m, k = 19, 200 if "128" not in fa + fb else 300
    n = 256 if "128x128" in fb else 21
    a, b = _q(fa, m, k, gen), _q(fb, n, k, gen, 0.25)
    bias = torch.randn(n, generator=gen)
    ref = scaled_mm_reference(a, b, bias, torch.float32)
    fp8 = fp8_kind(a.fmt, b.fmt)
    for cfg in {SMALL, dataclasses.replace(SMALL, fp8=fp8)}:  # bf16 operands, and fp8 ones where exact
        out = torch.full((m, n), float("nan"), dtype=torch.float32)  # poisoned: every element must be written
        scaled_exact_run(a, b, bias, torch.float32, cfg, out)
        assert _rel(out, ref) <= 1e-5, cfg


@needs_interp
@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("mxfp8_e4m3", "mxfp4"), ("mxfp4", "mxfp6_e2m3"),
                                   ("mxint8", "mxint8"), ("mxfp8_e5m2", "nvfp4")])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_dequant_gemm_route_equals_oracle(fa: str, fb: str, out_dtype: torch.dtype) -> None:
    """The many-token route (dequantize both to bf16, one GEMM): K not a multiple of either block,
    global scales of both operands, bias."""
    gen = torch.Generator().manual_seed(4)
    a, b = _q(fa, 37, 200, gen, 30.0), _q(fb, 45, 200, gen, 0.02)
    for bias in (None, torch.randn(45, generator=gen).to(out_dtype)):
        out = dequant_gemm_launch(prepare_operand(a), prepare_operand(b), bias, out_dtype)
        ref = scaled_mm_reference(a, b, bias, out_dtype)
        assert out.dtype == out_dtype and out.shape == (37, 45)
        assert _rel(out, ref) <= (1e-5 if out_dtype == torch.float32 else 4e-3)


@needs_interp
def test_dequant_gemm_route_nonfinite() -> None:
    """NaN / Inf codes and an E8M0 NaN scale come out where the oracle puts them."""
    a, b = _nonfinite_operands(5)
    _assert_nonfinite_placed(dequant_gemm_launch(prepare_operand(a), prepare_operand(b), None, torch.float32),
                             scaled_mm_reference(a, b, None, torch.float32))


@needs_interp
@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("mxfp8_e4m3", "mxfp4"), ("nvfp4", "mxfp8_e4m3"),
                                   ("mxfp4", "nvfp4"), ("mxfp8_e5m2", "mxfp8_e4m3")])
def test_linear_route_inputs_compose_to_oracle(fa: str, fb: str) -> None:
    """What the route through the linear kernels hands them (a's bf16 values without its global scale,
    b's likewise as those kernels decode them, fp32(g_a * g_b) for the sums), composed as they compute
    (exact products, float32 sums, then the scale, bias and one rounding), equals the oracle."""
    gen = torch.Generator().manual_seed(6)
    a, b = _q(fa, 3, 256, gen, 30.0), _q(fb, 40, 256, gen, 0.02)
    x, w = exact_values(a), exact_values(b)
    assert x.dtype == torch.bfloat16 and x.shape == (3, 256)
    g = global_product(a.global_scale, b.global_scale)
    assert (g is None) == (a.global_scale is None and b.global_scale is None)
    bias = torch.randn(40, generator=gen)
    acc = x.double() @ w.double().T  # (bf16 products are exact in float32; float64 sums stand in for its order)
    acc = acc.float() * (g if g is not None else 1.0) + bias
    for dt in (torch.float32, torch.bfloat16):
        assert _rel(acc.to(dt), scaled_mm_reference(a, b, bias, dt)) <= (1e-5 if dt == torch.float32 else 4e-3)


def test_linear_route_refusals() -> None:
    """The linear-kernel route says why it does not take a call (the tile kernel then runs)."""
    gen = torch.Generator().manual_seed(7)
    a, b = _q("nvfp4", 2, 64, gen), _q("nvfp4", 8, 64, gen)
    assert linear_choice(a, b, torch.float32)[1].startswith("writes bfloat16")
    assert "exact in bf16" in linear_choice(_q("int8_fp32", 2, 64, gen), _q("int4_fp16", 8, 64, gen), torch.bfloat16)[1]
    assert linear_choice(a, b, torch.bfloat16) == ("", "needs CUDA operands")


def test_bf16_exact_formats() -> None:
    f = ms.get_format
    assert all(bf16_exact(f(n)) for n in ("nvfp4", "mxfp4", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"))
    # float32 / float16 scales, zero points: element x scale needs more than bf16's 8 significant bits
    assert not any(bf16_exact(f(n)) for n in ("fp8_e4m3_block128", "int8_fp32", "int4_fp16", "int4_affine_g128"))


def test_decode_tiles_take_wide_chunks() -> None:
    f = ms.get_format
    assert choose_scaled_config(1, 4096, f("mxfp8_e4m3"), f("mxfp4")).block_m == 16
    assert choose_scaled_config(1, 4096, f("nvfp4"), f("nvfp4")).block_m == 64  # 16 x 16 chunks: wrong on sm_90


def test_fp8_operands_where_exact() -> None:
    f = ms.get_format
    assert fp8_kind(f("fp8_e4m3_block128"), f("fp8_e4m3_block128x128")) == 1
    assert fp8_kind(f("mxfp8_e4m3"), f("mxfp4")) == 1
    assert fp8_kind(f("mxfp8_e4m3"), f("mxfp6_e3m2")) == 1
    assert fp8_kind(f("mxfp8_e5m2"), f("mxfp8_e5m2")) == 2
    assert fp8_kind(f("nvfp4"), f("nvfp4")) == 0  # 16-element chunks
    assert fp8_kind(f("mxint8"), f("mxint8")) == 0  # 7-bit integers are not exact in E4M3
    assert fp8_kind(f("int8_affine_g32"), f("int4_affine_g64")) == 0


@needs_interp
def test_kernel_nonfinite_and_bf16_out() -> None:
    a, b = _nonfinite_operands(1)
    ref = scaled_mm_reference(a, b, None, torch.float32)
    _assert_nonfinite_placed(scaled_exact_run(a, b, None, torch.float32, SMALL), ref)
    fin = torch.isfinite(ref)
    o16 = scaled_exact_run(a, b, None, torch.bfloat16, SMALL)
    assert o16.dtype == torch.bfloat16
    r16 = scaled_mm_reference(a, b, None, torch.bfloat16)
    assert _rel(o16[fin], r16[fin]) <= 1e-2


@needs_interp
def test_kernel_default_config_global_scales() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = _q("nvfp4", 3, 64, gen, 100.0), _q("nvfp4", 70, 64, gen, 0.01)
    out = scaled_exact_run(a, b, None, torch.float32)
    ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    assert _rel(out, ref) <= 1e-5


def test_public_op_cpu_is_the_oracle() -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = _q("mxfp8_e4m3", 4, 64, gen), _q("mxfp4", 5, 64, gen)
    bias = torch.randn(5, generator=gen)
    assert torch.equal(scaled_mm(a, b, bias=bias), scaled_mm_reference(a, b, bias))
    assert ms.scaled_mm(a, b, out_dtype=torch.float16).dtype == torch.float16
    with pytest.raises(TypeError, match="out_dtype"):
        scaled_mm(a, b, out_dtype=torch.float64)
    with pytest.raises(ValueError, match="K=64"):
        scaled_mm(a, _q("mxfp4", 5, 96, gen))
