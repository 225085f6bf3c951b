"""The scaled_mm oracle vs float64 ``dequant(a) @ dequant(b)^T`` and its stated numerics."""
from __future__ import annotations

import pytest
import torch

import microscale as ms
from microscale.reference_scaled import scaled_mm_reference

# (activation format, weight format): every family of element and scale in the registry
PAIRS = [("fp8_e4m3_block128", "fp8_e4m3_block128x128"), ("mxfp8_e4m3", "mxfp8_e4m3"),
         ("mxfp8_e4m3", "mxfp4"), ("mxfp8_e5m2", "mxfp6_e2m3"), ("mxfp8_e4m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"),
         ("nvfp4", "nvfp4"), ("mxint8", "mxint8"), ("int8_fp32", "int4_fp16"), ("int8_affine_g32", "int4_affine_g64"),
         ("nvfp8", "nvfp4"), ("fp8_e4m3_block128", "mxfp4")]


def _q(name: str, rows: int, k: int, gen: torch.Generator, scale: float = 1.0) -> ms.QTensor:
    x = torch.randn(rows, k, generator=gen) * scale
    return ms.quantize(x, name, pad=True)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_oracle_equals_float64_dequant(fa: str, fb: str) -> None:
    gen = torch.Generator().manual_seed(0)
    m, n, k = 5, 131 if "128x128" not in fb else 256, 384
    a, b = _q(fa, m, k, gen), _q(fb, n, k, gen, 0.25)
    bias = torch.randn(n, generator=gen)
    ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T + bias.double()
    out = scaled_mm_reference(a, b, bias, torch.float32)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert _rel(out, ref) < 1e-6
    assert _rel(scaled_mm_reference(a, b, bias), ref) < 1e-2  # bf16 output


def test_ragged_k_ignores_padding() -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = _q("mxfp8_e4m3", 3, 100, gen), _q("nvfp4", 7, 100, gen)
    ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    assert _rel(scaled_mm_reference(a, b, out_dtype=torch.float32), ref) < 1e-6


def test_order_is_per_chunk_fp32_promotion() -> None:
    """Chunk results 2^25, 1, 1, 1 (exact E8M0 scales): added in float32 in K order they give
    2^25 (the ulp there is 4, so each +1 rounds away); one exact sum would give 2^25 + 4."""
    w = torch.zeros(1, 128)
    w[0, 0] = 2.0 ** 25
    for c in (1, 2, 3):
        w[0, 32 * c] = 1.0
    a = ms.quantize(torch.ones(1, 128), "mxfp8_e4m3")
    b = ms.quantize(w, "mxfp8_e4m3")
    assert torch.equal(b.dequantize(), w)
    out = scaled_mm_reference(a, b, out_dtype=torch.float32)
    assert float(out[0, 0]) == 2.0 ** 25
    assert float(torch.tensor(2.0 ** 25 + 3, dtype=torch.float32)) == 2.0 ** 25 + 4


def test_nonfinite_propagates() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 64, generator=gen)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    a = ms.quantize(x, "mxfp8_e5m2")
    b = _q("mxfp8_e4m3", 3, 64, gen)
    out = scaled_mm_reference(a, b, out_dtype=torch.float32)
    ref = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(out[fin].double(), ref[fin], rtol=1e-6, atol=0)


def test_errors_name_the_argument() -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = _q("mxfp4", 2, 64, gen), _q("mxfp4", 3, 32, gen)
    with pytest.raises(ValueError, match="K=64"):
        scaled_mm_reference(a, b)
    with pytest.raises(TypeError, match="b must be a QTensor"):
        scaled_mm_reference(a, torch.zeros(3, 64))
    with pytest.raises(TypeError, match="out_dtype"):
        scaled_mm_reference(a, a, out_dtype=torch.int8)
    with pytest.raises(ValueError, match="bias has shape"):
        scaled_mm_reference(a, a, torch.zeros(3))
