"""Decode-path GEMV on the canonical 4-bit minifloat layout, against float64 math.

Under TRITON_INTERPRET=1 the plain-Triton twin of the PTX decode runs; the PTX itself
runs on the GPU (benchmarks/run_gpu_gemv.py checks it there).
"""
import pytest
import torch

import microscale as ms
from microscale.formats import registry
from microscale.kernels._gemv_kernels import word_asm
from microscale.qlinear import GemvConfig, gemv

FP4 = [n for n, f in registry.items() if f.element.bits == 4 and f.element.kind == "float" and not f.zero_point]


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("m,split", [(1, 1), (2, 2)])
def test_gemv_matches_float64(name, m, split, gen):
    n, k = 40, 256
    w = torch.randn(n, k, generator=gen)
    q = ms.quantize(w, name)
    x = (torch.randn(m, k, generator=gen) * 3).to(torch.bfloat16)
    x[0, :8] = 0.0  # a zero run, and a tiny value far below the row max
    x[0, 9] = 1e-6
    bias = torch.randn(n, generator=gen)
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
    out = gemv(x, q, bias, GemvConfig(block_n=16, block_kw=16, split_k=split), use_asm=False)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert not torch.isnan(out).any()
    assert rel(out, ref) < 1e-2


def test_gemv_large_activations_do_not_overflow(gen):
    q = ms.quantize(torch.randn(16, 128, generator=gen), "nvfp4")
    x = (torch.randn(1, 128, generator=gen) * 3e4).to(torch.bfloat16)  # f16 would overflow unscaled
    ref = x.double() @ q.dequantize(torch.float64).T
    out = gemv(x, q, None, GemvConfig(block_n=16, block_kw=16), use_asm=False)
    assert torch.isfinite(out).all() and rel(out, ref) < 1e-2


def test_word_asm_shifts():
    a = word_asm(1)
    assert "shl.b32 m, $1, 9;" in a and "shl.b32 m, $1, 5;" in a and "shl.b32 m, $1, 1;" in a
    assert "shr.u32 m, $1, 3;" in a and hex((7 << 9) | (7 << 25)) in a


def test_gemv_rejects_bad_config(gen):
    q = ms.quantize(torch.randn(16, 128, generator=gen), "mxfp4")
    x = torch.randn(1, 128, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="block_kw"):
        gemv(x, q, None, GemvConfig(block_kw=2), use_asm=False)
    with pytest.raises(ValueError, match="K="):
        gemv(torch.randn(1, 64).to(torch.bfloat16), q, None, use_asm=False)
