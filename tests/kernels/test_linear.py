"""Fused weight-only linear: kernels vs float64 ``x @ dequant(W)^T`` (CPU, TRITON_INTERPRET=1).

    TRITON_INTERPRET=1 python -m pytest tests/kernels/test_linear.py -q

Small shapes only; the benchmark suite (``python -m microscale.bench``) checks real shapes on a GPU.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import microscale as ms
from microscale.linear import op
from microscale.linear import packed
from microscale.linear.backends import splitk as sk
from microscale.linear import weight_state as wst

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")

FORMATS = sorted(ms.formats.registry)


def _weight(name: str, n: int, k: int, gen: torch.Generator) -> ms.QTensor:
    fmt = ms.get_format(name)
    if fmt.block_rows > 1:
        n = max(fmt.block_rows, n // fmt.block_rows * fmt.block_rows)
    k = -(-k // fmt.block_size) * fmt.block_size
    return ms.quantize(torch.randn(n, k, generator=gen), name)


def _ref(x, q, bias):
    y = x.double() @ q.dequantize(torch.float64).T
    return y if bias is None else y + bias.double()


def _err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@needs_interp
@pytest.mark.parametrize("name", FORMATS)
def test_kernels_every_format(name):
    """Both kernels (split-K decode path and tiled prefill path), ragged M and N, poisoned output."""
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    q = _weight(name, 40, 128, gen)
    pw = packed.prepare(q)
    n, k = q.shape
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen)
    cfgs = [sk.LinearConfig(block_n=16, block_m=16, block_kw=8, split_k=2, pair=False),  # decode shape
            sk.LinearConfig(block_n=32, block_m=32, block_kw=16, split_k=1, pair=False)]  # prefill shape
    if pw.container_bits == 4:
        cfgs.append(sk.LinearConfig(block_n=16, block_m=16, block_kw=8, split_k=3, pair=True))
    ref = _ref(x, q, bias)
    for cfg in cfgs:
        out = torch.full((3, n), float("nan"), dtype=x.dtype)
        sk.splitk_run(x, pw, bias, cfg, out=out)
        assert not torch.isnan(out).any(), f"{name} {cfg}: output not fully written"
        assert _err(out, ref) < 1e-2, f"{name} {cfg}: rel err {_err(out, ref):.3e}"


@needs_interp
@pytest.mark.parametrize("name,m,dtype", [("nvfp4", 1, torch.bfloat16), ("mxfp4", 17, torch.float16),
                                           ("int4_affine_g64", 5, torch.bfloat16), ("mxfp8_e4m3", 33, torch.bfloat16),
                                           ("nvfp4", 70, torch.bfloat16)])
def test_public_op_heuristic(name, m, dtype):
    """The public op with its own config choice, leading batch dims, ragged K padding (K=48)."""
    gen = torch.Generator().manual_seed(m)
    fmt = ms.get_format(name)
    k = 48 if fmt.block_size == 16 else 2 * fmt.block_size
    q = ms.quantize(torch.randn(24, k, generator=gen), name)
    x = torch.randn(1, m, k, generator=gen).to(dtype)
    y = op.linear(x, q)
    assert y.shape == (1, m, 24) and y.dtype == dtype
    assert _err(y[0], _ref(x[0], q, None)) < 1e-2


def test_repack_round_trip():
    """prepare() is lossless: to_qtensor() gives back the canonical bytes."""
    gen = torch.Generator().manual_seed(0)
    for name in ["nvfp4", "mxfp6_e2m3", "int3_fp16", "mxfp8_e5m2", "int4_affine_g128"]:
        q = _weight(name, 8, 96 if name != "int4_affine_g128" else 256, gen)
        q2 = packed.prepare(q).to_qtensor()
        assert torch.equal(q2.data, q.data) and torch.equal(q2.scales.view(torch.uint8) if q2.scales.dtype != q.scales.dtype else q2.scales, q.scales)


def test_specials_detected_only_when_present():
    q = ms.quantize(torch.randn(4, 64), "mxfp8_e4m3")
    assert not packed.prepare(q).specials
    data = q.data.clone()
    data[0, 3] = 0x7F  # E4M3 NaN
    q2 = ms.QTensor(data, q.scales, q.fmt, q.shape, q.dtype)
    assert packed.prepare(q2).specials


def test_specials_assumed_while_capturing(monkeypatch):
    """Inside a CUDA graph capture (stood in for) the NaN/Inf scan, a host sync, is skipped:
    an unscanned fp8 weight is packed for the NaN/Inf-aware decode and the answer is not
    kept; a weight scanned by an earlier eager call keeps its scanned answer."""
    q = ms.quantize(torch.randn(4, 64), "mxfp8_e4m3")
    monkeypatch.setattr(wst, "capturing", lambda t: True)
    monkeypatch.setattr(wst, "codes_have_specials", lambda *a: pytest.fail("scanned while capturing"))
    assert packed.prepare(q).specials
    assert getattr(q.data, "_microscale_specials", None) is None
    monkeypatch.undo()
    assert not packed.prepare(q).specials  # scanned eagerly, answer kept
    monkeypatch.setattr(wst, "capturing", lambda t: True)
    monkeypatch.setattr(wst, "codes_have_specials", lambda *a: pytest.fail("scanned again"))
    assert not packed.prepare(q).specials


@needs_interp
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "fp8_e5m2_fp16", "fp8_e4m3_block128x128"])
def test_specials_decode_on_finite_codes(name):
    """The NaN/Inf-aware decode (taken for unscanned weights inside a capture) gives the
    same output as the plain one on finite codes."""
    gen = torch.Generator().manual_seed(5)
    q = _weight(name, 40, 256, gen)
    pw = packed.prepare(q)
    assert not pw.specials
    x = torch.randn(3, q.shape[1], generator=gen).to(torch.bfloat16)
    cfg = sk.LinearConfig(block_n=16, block_m=16, block_kw=8, split_k=2, pair=False)
    plain = sk.splitk_run(x, pw, None, cfg)
    aware = sk.splitk_run(x, dataclasses.replace(pw, specials=True), None, cfg)
    assert torch.equal(plain, aware)
    assert _err(aware, _ref(x, q, None)) < 1e-2


def test_cpu_reference_op_and_errors():
    """CPU tensors run the reference through the registered op; bad input raises clearly."""
    q = ms.quantize(torch.randn(16, 64), "mxfp4")
    x = torch.randn(2, 64).to(torch.bfloat16)
    y = torch.ops.microscale.linear(x, *_op_args(q))
    assert _err(y, _ref(x, q, None)) < 1e-2
    with pytest.raises(ValueError, match="K=64"):
        op.linear(torch.randn(2, 32).to(torch.bfloat16), q)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        op.linear(torch.randn(2, 64), q)
    with pytest.raises(ValueError, match="bias"):
        op.linear(x, q, torch.randn(3))


def _op_args(q):
    pw = packed.prepare(q)
    return (pw.codes, pw.scales, pw.zero_points, pw.global_scale, None, packed.fmt_json(pw.fmt), pw.n, pw.k,
            pw.specials)


def test_torch_compile_cpu():
    """torch.compile traces the custom op as one node (CPU: reference implementation)."""
    q = ms.quantize(torch.randn(16, 64), "nvfp4")
    pw = packed.prepare(q)
    bias = torch.randn(16)
    f = torch.compile(lambda a: op.linear(a, pw, bias), fullgraph=True, backend="eager")
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert _err(f(x), _ref(x, q, bias)) < 1e-2
    torch.library.opcheck(torch.ops.microscale.linear.default, (x, *_op_args(q)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fp8_e4m3_block128x128", "mxfp8_e5m2"])
def test_gpu_fp8_weight_first_used_in_a_graph(name):
    """An fp8 weight (formats with NaN/Inf codes) whose first use is inside a CUDA graph
    capture: no host sync is attempted, and the replayed graph is right (float64), also for a
    weight holding a NaN code (the NaN's row is NaN, the others finite)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    for m in (1, 24, 200):
        q = ms.quantize(torch.randn(256, 512, device=dev, generator=g), name)
        x = torch.randn(m, 512, device=dev, generator=g).to(torch.bfloat16)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = ms.linear(x, q)
        x.copy_(torch.randn(m, 512, device=dev, generator=g).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _err(y, _ref(x, q, None)) < 1e-2, (name, m)
        data = q.data.clone()
        data[5, 7] = 0x7F  # NaN in E4M3 and E5M2
        qn = ms.QTensor(data, q.scales, q.fmt, q.shape, q.dtype)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yn = ms.linear(x, qn)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isnan(yn[:, 5]).all() and not torch.isnan(yn[:, :5]).any() and not torch.isnan(yn[:, 6:]).any()
