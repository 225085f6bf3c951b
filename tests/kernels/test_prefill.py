"""Prefill kernel on the canonical layout (``qlinear.prefill``), against float64 math, in
the interpreter (small tiles); the H200 run (benchmarks/run_gpu_prefill.py) covers real
shapes."""
import pytest
import torch

import microscale as ms
from microscale.formats import registry
from microscale.qlinear import PrefillConfig, choose_prefill_config, prefill

FORMATS = [n for n, f in registry.items() if f.element.bits in (4, 8) and f.block_rows == 1]


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("name", FORMATS)
def test_prefill_matches_float64(name, gen):
    m, n, k = 37, 40, 256  # ragged M and N
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen)
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
    bk = 64 if q.fmt.block_size <= 64 else 128
    out = prefill(x, q, bias, PrefillConfig(block_m=16, block_n=16, block_k=bk, group_m=2, num_warps=4,
                                          swap=name.startswith("mx")))
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert torch.isfinite(out).all()
    # the interpreter's float32 -> bf16 cast truncates (the GPU rounds): ~2x the GPU's error
    assert rel(out, ref) < 1e-2


def test_prefill_fp16_and_block_larger_than_step(gen):
    q = ms.quantize(torch.randn(24, 256, generator=gen), "int4_affine_g128")
    x = torch.randn(20, 256, generator=gen).to(torch.float16)
    out = prefill(x, q, None, PrefillConfig(block_m=16, block_n=16, block_k=64, group_m=1, num_warps=4))
    assert out.dtype == torch.float16
    assert rel(out, x.double() @ q.dequantize(torch.float64).T) < 1e-2


def test_prefill_config_and_errors(gen):
    assert choose_prefill_config(4096, registry["nvfp4"]).pair and choose_prefill_config(4096, registry["nvfp4"]).swap
    assert choose_prefill_config(4096, registry["mxfp8_e4m3"]).block_m == 256
    assert choose_prefill_config(4096, registry["int4_affine_g128"]).swap
    assert choose_prefill_config(512, registry["mxfp8_e4m3"]).block_m == 128
    small = choose_prefill_config(12, registry["nvfp4"])
    assert (small.block_m, small.block_n, small.swap, small.pair) == (16, 64, True, True)
    assert choose_prefill_config(100, registry["int8_fp16"]).block_m == 64
    q = ms.quantize(torch.randn(16, 128, generator=gen), "mxfp6_e2m3")
    with pytest.raises(ValueError, match="4/8-bit"):
        prefill(torch.randn(4, 128).to(torch.bfloat16), q)
    q = ms.quantize(torch.randn(16, 96, generator=gen), "mxfp4")
    with pytest.raises(ValueError, match="multiple of block_k"):
        prefill(torch.randn(4, 96).to(torch.bfloat16), q)
    with pytest.raises(ValueError, match="K="):
        prefill(torch.randn(4, 64).to(torch.bfloat16), q)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_prefill_pair_decode(name, gen):
    q = ms.quantize(torch.randn(40, 256, generator=gen), name)
    x = torch.randn(33, 256, generator=gen).to(torch.bfloat16)
    ref = x.double() @ q.dequantize(torch.float64).T
    for swap in (False, True):
        cfg = PrefillConfig(block_m=16, block_n=16, block_k=64, group_m=2, num_warps=4, pair=True, swap=swap)
        assert rel(prefill(x, q, None, cfg), ref) < 1e-2
