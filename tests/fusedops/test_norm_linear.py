"""rmsnorm_linear and linear_batched vs their float64 reference compositions: every registry
format, the RMSNorm prologue of the split-K kernel under the interpreter, ragged N and M,
bias / no bias, gate / no gate; joined weights decode bit-identically."""
import os

import pytest
import torch

import microscale as ms
from microscale.linear.batched import join_weights
from microscale.linear.norm_linear import rmsnorm_linear_reference

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")
FORMATS = sorted(ms.registry.keys())


def _weights(name, ns, k, gen):
    fmt = ms.get_format(name)
    k = -(-k // fmt.block_size) * fmt.block_size
    ns = [max(fmt.block_rows, n // fmt.block_rows * fmt.block_rows) if fmt.block_rows > 1 else n for n in ns]
    return [ms.quantize(torch.randn(n, k, generator=gen) * 0.5, name) for n in ns], k


def _ref64(x, nw, q, bias, eps, gate):
    """float64: (x * rsqrt(mean(x^2) + eps) * nw [* silu(gate)]) @ dequant(q)^T + bias."""
    xd = x.double()
    h = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * nw.double()
    if gate is not None:
        h = h * gate.double() * torch.sigmoid(gate.double())
    y = h @ ms.dequantize(q, torch.float64).T
    return y if bias is None else y + bias.double()


def _rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


@needs_interp
@pytest.mark.parametrize("block_k", [64, 8192])
def test_norm_kernel_both_passes(block_k, monkeypatch):
    """The norm kernel alone vs float64: rows held in registers (one read) and rows longer than its
    block (two passes: sums of squares, then the output), gate and no gate, ragged K."""
    from microscale.linear import norm_linear

    monkeypatch.setattr(norm_linear, "NORM_BLOCK_K", block_k)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 200, generator=gen).to(torch.bfloat16)
    nw = torch.rand(200, generator=gen).to(torch.bfloat16)
    for gate in (None, torch.randn(3, 200, generator=gen).to(torch.bfloat16)):
        out = norm_linear._norm_rows(x, nw, gate, 1e-5)
        xd = x.double()
        ref = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-5) * nw.double()
        if gate is not None:
            ref = ref * gate.double() * torch.sigmoid(gate.double())
        assert out.dtype == torch.bfloat16 and _rel(out, ref) < 4e-3


@needs_interp
@pytest.mark.parametrize("name", FORMATS)
def test_rmsnorm_linear_kernel_every_format(name):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    (q,), k = _weights(name, [40], 96, gen)
    x = (torch.randn(3, k, generator=gen) * 2).to(torch.bfloat16)
    nw = torch.rand(k, generator=gen) + 0.5
    gate = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(q.shape[0], generator=gen)
    for b, g in ((None, None), (bias, gate)):
        out = ms.rmsnorm_linear(x, nw, q, b, eps=1e-5, gate=g, kernel=True)
        assert out.shape == (3, q.shape[0]) and out.dtype == x.dtype
        assert _rel(out, _ref64(x, nw, q, b, 1e-5, g)) < 1e-2, name


@pytest.mark.parametrize("name", FORMATS)
def test_rmsnorm_linear_cpu_composition(name):
    gen = torch.Generator().manual_seed(7)
    (q,), k = _weights(name, [24], 64, gen)
    x = torch.randn(2, 5, k, generator=gen).to(torch.bfloat16)
    nw = torch.rand(k, generator=gen)
    gate = torch.randn(2, 5, k, generator=gen).to(torch.bfloat16)
    out = ms.rmsnorm_linear(x, nw, q, None, eps=1e-6, gate=gate)
    assert out.shape == (2, 5, q.shape[0])
    assert _rel(out, _ref64(x, nw, q, None, 1e-6, gate)) < 1e-2


@needs_interp
@pytest.mark.parametrize("names", [("nvfp4", "nvfp4", "nvfp4"), ("mxfp4", "mxfp8_e4m3", "mxfp4"),
                                   ("int4_affine_g32", "int4_affine_g32", "int8_fp16")])
def test_rmsnorm_linear_kernel_many_weights(names):
    """Norm + q/k/v in one call (formats that cannot join run as separate groups), ragged N, bias on one."""
    gen = torch.Generator().manual_seed(3)
    k = 64
    ws = [_weights(nm, [n], k, gen)[0][0] for nm, n in zip(names, (24, 8, 40))]
    x = torch.randn(5, k, generator=gen).to(torch.float16)
    nw = torch.rand(k, generator=gen) + 0.5
    biases = [None, torch.randn(8, generator=gen), None]
    outs = ms.rmsnorm_linear(x, nw, ws, biases, eps=1e-6, kernel=True)
    assert [tuple(o.shape) for o in outs] == [(5, 24), (5, 8), (5, 40)]
    for o, q, b in zip(outs, ws, biases):
        assert _rel(o, _ref64(x, nw, q, b, 1e-6, None)) < 1e-2


@pytest.mark.parametrize("name", FORMATS)
def test_join_weights_decodes_bit_identically(name):
    gen = torch.Generator().manual_seed(11)
    ws, _ = _weights(name, [16, 8, 24], 64, gen)
    if ws[0].global_scale is not None:  # two-level formats join when they share the per-tensor scale
        ws = [ms.QTensor(w.data, w.scales, w.fmt, w.shape, w.dtype, ws[0].global_scale, w.zero_points, w.meta)
              for w in ws]
    j = join_weights(ws)
    assert torch.equal(ms.dequantize(j).view(torch.int32),
                       torch.cat([ms.dequantize(w) for w in ws]).view(torch.int32))


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "mxfp6_e3m2", "int4_affine_g64", "fp8_e4m3_block128x128"])
@pytest.mark.parametrize("concat", [False, True])
def test_linear_batched_vs_reference(name, concat):
    gen = torch.Generator().manual_seed(5)
    ws, k = _weights(name, [24, 8, 40], 64, gen)
    ws.append(_weights("mxfp8_e4m3", [16], k, gen)[0][0])  # another format: its own group
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    biases = [torch.randn(w.shape[0], generator=gen) if i % 2 else None for i, w in enumerate(ws)]
    outs = ms.linear_batched(x, ws, biases, concat=concat)
    for o, w, b in zip(outs, ws, biases):
        ref = x.double() @ ms.dequantize(w, torch.float64).T + (0 if b is None else b.double())
        assert o.shape == (3, w.shape[0]) and _rel(o, ref) < 1e-2
    if concat:
        base = outs[0].untyped_storage().data_ptr()
        assert all(o.untyped_storage().data_ptr() == base for o in outs)


def test_errors():
    gen = torch.Generator().manual_seed(1)
    (q,), k = _weights("nvfp4", [16], 32, gen)
    x = torch.randn(2, k).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"norm_weight has shape \(31,\); expected \(32,\)"):
        ms.rmsnorm_linear(x, torch.ones(31), q, eps=1e-6)
    with pytest.raises(ValueError, match="gate is"):
        ms.rmsnorm_linear(x, torch.ones(k), q, eps=1e-6, gate=torch.ones(2, k))
    with pytest.raises(ValueError, match="eps=-1"):
        ms.rmsnorm_linear(x, torch.ones(k), q, eps=-1)
    with pytest.raises(ValueError, match="K=32"):
        ms.linear_batched(x, [q, ms.quantize(torch.randn(16, 64), "nvfp4")])
    with pytest.raises(TypeError, match="non-empty list"):
        ms.linear_batched(x, [])
    with pytest.raises(ValueError, match=r"biases\[0\] has shape"):
        ms.linear_batched(x, [q], [torch.ones(3)])
    with pytest.raises(ValueError, match="global scales differ"):
        join_weights([q, ms.quantize(torch.randn(16, 32) * 5, "nvfp4")])
    assert torch.equal(rmsnorm_linear_reference(x, torch.ones(k), q, eps=1e-6),
                       ms.rmsnorm_linear(x, torch.ones(k), q, eps=1e-6))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gated", [False, True])
def test_gpu_eager_replays_equal_unplanned_calls(gated):
    """From the third call with the same shapes the norm launch is a replayed plan: each call's x (and gate)
    reaches it, and the outputs equal those of the same calls with plans off, bit for bit."""
    from microscale.linear import tuning

    gen = torch.Generator().manual_seed(11)
    ws = [ms.quantize(torch.randn(n, 512, generator=gen), "mxfp4").to("cuda") for n in (256, 128, 128)]
    nw = torch.randn(512, generator=gen).cuda().bfloat16()
    calls = []
    for _ in range(5):  # (plans key on the tuning record: the unplanned calls come after)
        x = torch.randn(2, 512, generator=gen).cuda().bfloat16()
        gate = torch.randn(2, 512, generator=gen).cuda().bfloat16() if gated else None
        calls.append((x, gate, ms.rmsnorm_linear(x, nw, ws, eps=1e-6, gate=gate)))
    with tuning.override(plans=False):
        for x, gate, got in calls:
            want = ms.rmsnorm_linear(x, nw, ws, eps=1e-6, gate=gate)
            assert all(torch.equal(g, w) for g, w in zip(got, want))
    # the whole call (norm + joined GEMV) was served by one plan kept with the joined weight
    from microscale.linear.batched import _plan
    from microscale.linear.norm_linear import OP
    from microscale.linear.plans import Plan
    from microscale.linear.weight_state import state
    assert any(type(v) is Plan and k[0] == OP for k, v in state(_plan(ws)[1][0]).plans.items())


# ---- act_format: norm + activation quantize + both-quantized GEMM -----------------------------------------
def _act_oracle(x, nw, q, bias, eps, gate, act, gs=None):
    """float64 norm, its float32 rows quantized to ``act`` by the reference (per-tensor scale ``gs``), then the
    float64 product of both operands' decoded values."""
    xd = x.double()
    h = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps) * nw.double()
    if gate is not None:
        h = h * gate.double() * torch.sigmoid(gate.double())
    a = ms.quantize(h.float(), act, pad=True, global_scale=gs)
    y = ms.dequantize(a, torch.float64) @ ms.dequantize(q, torch.float64).T
    return y if bias is None else y + bias.double()


KERNEL_ARGS = [False] + ([True] if INTERP or torch.cuda.is_available() else [])


@pytest.mark.parametrize("kernel", KERNEL_ARGS)
@pytest.mark.parametrize("wf,act", [("nvfp4", "nvfp4"), ("mxfp4", "mxfp8_e4m3"), ("mxfp8_e4m3", "mxfp8_e4m3"),
                                    ("fp8_e4m3_block128x128", "fp8_e4m3_block128")])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_act_format_is_norm_quantize_scaled_mm(wf, act, gated, eps, kernel, gen):
    """With ``act_format`` the normalized activations are quantized (the fused rmsnorm-quantize pass on the kernel
    path where it serves, float32 rows + quantize otherwise) and multiplied by ``scaled_mm``: equal to that
    composition in float64 within bf16 rounding (and the two paths to each other), for one weight and a list
    (an eps of 0.5 moves the norm by ~20%: a dropped or misplaced eps shows)."""
    dev = "cuda" if torch.cuda.is_available() and kernel else "cpu"
    ws, k = _weights(wf, [128, 256], 256, gen)
    ws = [q.to(dev) for q in ws]
    x = torch.randn(3, k, generator=gen).bfloat16().to(dev)
    nw = (torch.rand(k, generator=gen) + 0.5).to(dev)
    gate = torch.randn(3, k, generator=gen).bfloat16().to(dev) if gated else None
    b = torch.randn(128, generator=gen).to(dev)
    y = ms.rmsnorm_linear(x, nw, ws[0], b, eps=eps, gate=gate, act_format=act, kernel=kernel)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 128)
    want = _act_oracle(x.cpu(), nw.cpu(), ws[0].to("cpu"), b.cpu(), eps, None if gate is None else gate.cpu(), act)
    assert _rel(y.cpu(), want) < 4e-3  # (bf16 outputs: ~2e-3)
    if kernel:
        other = ms.rmsnorm_linear(x, nw, ws[0], b, eps=eps, gate=gate, act_format=act, kernel=False)
        assert _rel(y.cpu(), other.cpu().double()) < 4e-3
    ys = ms.rmsnorm_linear(x, nw, ws, [b, None], eps=eps, gate=gate, act_format=act, kernel=kernel)
    assert torch.equal(ys[0], y)
    want1 = _act_oracle(x.cpu(), nw.cpu(), ws[1].to("cpu"), None, eps, None if gate is None else gate.cpu(), act)
    assert _rel(ys[1].cpu(), want1) < 4e-3


@pytest.mark.parametrize("kernel", KERNEL_ARGS)
def test_act_format_takes_the_static_activation_scale(kernel, gen, monkeypatch):
    """NVFP4 activations take the weight's static activation scale (ModelOpt ``input_scale``), so the kernel path
    normalizes and quantizes in one pass (and only then); the two paths agree, and not with the dynamic scale."""
    from microscale.quant import fused

    fused_calls = []
    real = fused.rmsnorm_quantize
    monkeypatch.setattr(fused, "rmsnorm_quantize", lambda *a, **kw: fused_calls.append(1) or real(*a, **kw))
    dev = "cuda" if torch.cuda.is_available() and kernel else "cpu"
    (q,), k = _weights("nvfp4", [64], 128, gen)
    q = q.to(dev)
    x = (torch.randn(2, k, generator=gen) * 3).bfloat16().to(dev)
    nw = torch.ones(k, device=dev)
    dynamic = ms.rmsnorm_linear(x, nw, q, eps=1e-6, act_format="nvfp4", kernel=kernel)
    assert not fused_calls  # (a dynamic two-level scale needs the rows' amax first: no one-pass kernel)
    q.meta["input_scale"] = {"shape": [], "values": [0.02]}
    y = ms.rmsnorm_linear(x, nw, q, eps=1e-6, act_format="nvfp4", kernel=kernel)
    assert len(fused_calls) == int(kernel)
    want = _act_oracle(x.cpu(), nw.cpu(), q.to("cpu"), None, 1e-6, None, "nvfp4", gs=torch.tensor(0.02))
    assert _rel(y.cpu(), want) < 1e-2 and not torch.equal(y, dynamic)


def test_act_format_shares_a_quantization_only_between_equal_scales(gen):
    """A list of NVFP4 weights quantizes the activations once per distinct static scale: ModelOpt's
    ``input_scale`` s and compressed-tensors' ``input_global_scale`` s (decode scale 1/s) are different scales,
    equal numbers or not; each weight's output equals its own single-weight call."""
    qs, k = _weights("nvfp4", [64, 64, 64], 128, gen)
    qs[0].meta["input_scale"] = {"shape": [], "values": [0.05]}
    qs[1].meta["input_global_scale"] = {"shape": [1], "values": [0.05]}
    qs[2].meta["input_scale"] = {"shape": [], "values": [0.05]}
    x = (torch.randn(2, k, generator=gen) * 3).bfloat16()
    nw = torch.rand(k, generator=gen) + 0.5
    ys = ms.rmsnorm_linear(x, nw, qs, eps=1e-6, act_format="nvfp4")
    for q, y in zip(qs, ys):
        assert torch.equal(y, ms.rmsnorm_linear(x, nw, q, eps=1e-6, act_format="nvfp4"))
    assert not torch.equal(ys[0], ys[1])


def test_act_format_errors(gen):
    (q,), k = _weights("mxfp4", [32], 64, gen)
    x = torch.randn(2, k, generator=gen).bfloat16()
    with pytest.raises(ValueError, match="fast_accum=True needs act_format"):
        ms.rmsnorm_linear(x, torch.ones(k), q, eps=1e-6, fast_accum=True)
    with pytest.raises(KeyError):
        ms.rmsnorm_linear(x, torch.ones(k), q, eps=1e-6, act_format="no_such_format")


def test_act_format_takes_float32_x(gen):
    """As ``ms.linear(..., act_format=...)``, float32 x is accepted with ``act_format`` (and float32 comes out);
    weight-only calls still take bfloat16 / float16 only."""
    (q,), k = _weights("mxfp4", [32], 64, gen)
    x = torch.randn(2, k, generator=gen)
    nw = torch.rand(k, generator=gen) + 0.5
    y = ms.rmsnorm_linear(x, nw, q, eps=1e-6, act_format="mxfp8_e4m3")
    assert y.dtype == torch.float32 and _rel(y, _act_oracle(x, nw, q, None, 1e-6, None, "mxfp8_e4m3")) < 1e-5
    with pytest.raises(TypeError, match="expected bfloat16 or float16"):
        ms.rmsnorm_linear(x, nw, q, eps=1e-6)
