"""Prefill kernel on the canonical layout (``linear.prefill``), against float64 math, in
the interpreter (small tiles) or, on a GPU machine, on CUDA tensors; the benchmark suite
(``python -m microscale.bench``) checks real shapes."""
import pytest
import torch

import microscale as ms
from microscale.formats import registry
from microscale.linear.backends.prefill import PrefillConfig
from microscale.linear.backends.prefill import choose_prefill_config
from microscale.linear.backends.prefill import prefill

FORMATS = [n for n, f in registry.items() if f.element.bits in (4, 8) and f.block_rows == 1]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    return float((a.double().cpu() - b).norm() / b.norm())


def _run(x, q, bias=None, config=None):
    """``prefill`` on DEV (inputs built on the CPU)."""
    return prefill(x.to(DEV), q.to(DEV), None if bias is None else bias.to(DEV), config).cpu()


@pytest.mark.parametrize("name", FORMATS)
def test_prefill_matches_float64(name, gen):
    m, n, k = 37, 40, 256  # ragged M and N
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen)
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
    bk = 64 if q.fmt.block_size <= 64 else 128
    out = _run(x, q, bias, PrefillConfig(block_m=16, block_n=16, block_k=bk, group_m=2, num_warps=4,
                                          swap=name.startswith("mx")))
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert torch.isfinite(out).all()
    # the interpreter's float32 -> bf16 cast truncates (the GPU rounds): ~2x the GPU's error
    assert rel(out, ref) < 1e-2


def test_prefill_fp16_and_block_larger_than_step(gen):
    q = ms.quantize(torch.randn(24, 256, generator=gen), "int4_affine_g128")
    x = torch.randn(20, 256, generator=gen).to(torch.float16)
    out = _run(x, q, None, PrefillConfig(block_m=16, block_n=16, block_k=64, group_m=1, num_warps=4))
    assert out.dtype == torch.float16
    assert rel(out, x.double() @ q.dequantize(torch.float64).T) < 1e-2


def test_prefill_config_and_errors(gen):
    assert choose_prefill_config(4096, registry["nvfp4"]).pair and choose_prefill_config(4096, registry["nvfp4"]).swap
    assert choose_prefill_config(4096, registry["mxfp8_e4m3"]).block_m == 256
    assert choose_prefill_config(4096, registry["int4_affine_g128"]).swap
    assert choose_prefill_config(512, registry["mxfp8_e4m3"]).pair
    assert choose_prefill_config(512, registry["int8_fp16"]).block_m == 128
    small = choose_prefill_config(12, registry["nvfp4"])
    assert (small.block_m, small.block_n, small.swap, small.pair) == (16, 64, True, True)
    assert choose_prefill_config(100, registry["int8_fp16"]).block_m == 64
    q = ms.quantize(torch.randn(16, 128, generator=gen), "mxfp6_e2m3")
    with pytest.raises(ValueError, match="4/8-bit"):
        _run(torch.randn(4, 128).to(torch.bfloat16), q)
    q = ms.quantize(torch.randn(16, 96, generator=gen), "mxfp4")
    with pytest.raises(ValueError, match="multiple of block_k"):
        _run(torch.randn(4, 96).to(torch.bfloat16), q)
    with pytest.raises(ValueError, match="K="):
        _run(torch.randn(4, 64).to(torch.bfloat16), q)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_prefill_pair_decode(name, gen):
    q = ms.quantize(torch.randn(40, 256, generator=gen), name)
    x = torch.randn(33, 256, generator=gen).to(torch.bfloat16)
    ref = x.double() @ q.dequantize(torch.float64).T
    for swap in (False, True):
        cfg = PrefillConfig(block_m=16, block_n=16, block_k=64, group_m=2, num_warps=4, pair=True, swap=swap)
        assert rel(_run(x, q, None, cfg), ref) < 1e-2


@pytest.mark.parametrize("name,block_k,split_k,pair", [
    ("nvfp4", 128, 2, True), ("nvfp4", 256, 2, False), ("mxfp4", 128, 4, True), ("mxfp8_e4m3", 256, 2, False),
    ("int4_affine_g128", 256, 2, False), ("int8_fp16", 128, 4, False), ("fp8_e4m3_block128", 128, 1, False)])
def test_prefill_split_k_and_wide_scales(name, block_k, split_k, pair, gen):
    """Split-K partials reduced by the last program of each tile (twice: the tile counters
    must come back to zero), with scales / zero points read as whole int32 words."""
    from microscale.linear.backends.prefill import word_rows as _word_rows
    m, n, k = 19, 40, 512
    q = ms.quantize(torch.randn(n, k, generator=gen), name)
    assert _word_rows(q.scales.contiguous())[1]
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
    cfg = PrefillConfig(block_m=16, block_n=16, block_k=block_k, group_m=1, num_warps=4, swap=True, pair=pair,
                        split_k=split_k)
    first = _run(x, q, bias, cfg)
    assert rel(first, ref) < 1e-2
    assert torch.equal(_run(x, q, bias, cfg), first)  # deterministic split order, counters reset
    unsplit = _run(x, q, bias, PrefillConfig(block_m=16, block_n=16, block_k=block_k, group_m=1, num_warps=4,
                                                swap=True, pair=pair))
    assert rel(first, unsplit.double()) < 1e-2


def test_prefill_split_k_errors(gen):
    q = ms.quantize(torch.randn(16, 256, generator=gen), "nvfp4")
    with pytest.raises(ValueError, match="split_k"):
        _run(torch.randn(16, 256).to(torch.bfloat16), q, None, PrefillConfig(block_k=128, split_k=3))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_prefill_pair_decode_8bit(name, gen):
    """8-bit minifloats decoded as bf16x2 pairs; a weight holding a NaN code falls back to
    the per-element decode, which honours it."""
    from microscale.linear.weight_state import has_specials as _weight_has_specials
    q = ms.quantize(torch.randn(40, 256, generator=gen) * 3, name)
    x = torch.randn(21, 256, generator=gen).to(torch.bfloat16)
    ref = x.double() @ q.dequantize(torch.float64).T
    cfg = PrefillConfig(block_m=16, block_n=16, block_k=64, group_m=1, num_warps=4, pair=True, swap=True)
    assert not _weight_has_specials(q)
    assert rel(_run(x, q, None, cfg), ref) < 1e-2
    nan_code = max(q.fmt.element.nan_codes)
    q.data[5, 7] = nan_code  # in place: the cached scan must notice the new version
    assert _weight_has_specials(q)
    out = _run(x, q, None, cfg)
    assert torch.isnan(out[:, 5]).all() and torch.isfinite(out[:, 6]).all()


def test_prefill_default_config_fits_k(gen):
    f = registry["nvfp4"]
    assert choose_prefill_config(16, f).split_k == 2 and choose_prefill_config(16, f).block_k == 128
    c = choose_prefill_config(16, f, 192)  # 192 = 3 x 64: no split, 64-element steps
    assert (c.split_k, c.block_k) == (1, 64)
    q = ms.quantize(torch.randn(24, 192, generator=gen), "nvfp4")
    x = torch.randn(12, 192, generator=gen).to(torch.bfloat16)
    assert rel(_run(x, q), x.double() @ q.dequantize(torch.float64).T) < 1e-2
