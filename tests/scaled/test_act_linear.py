"""The weight's operand kept per weight version, ``ms.linear(x, w, act_format=...)`` against the
oracle (CPU reference path, and the kernel under TRITON_INTERPRET=1), ``QuantLinear`` and
``quantize_model`` with activation formats."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import microscale as ms
from microscale.linear import scaled as sc
from microscale.nn import QuantLinear, quantize_model
from microscale.reference_scaled import scaled_mm_reference

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interp = pytest.mark.skipif(not INTERP, reason="kernels run on CPU only under TRITON_INTERPRET=1")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


@pytest.fixture
def count_prepares(monkeypatch):
    """Counts :func:`microscale.linear.scaled.prepare_operand` calls by operand (id)."""
    calls: dict[int, int] = {}
    real = sc.prepare_operand

    def counting(q):
        calls[id(q)] = calls.get(id(q), 0) + 1
        return real(q)

    monkeypatch.setattr(sc, "prepare_operand", counting)
    return calls


def _kernel_on_cpu(monkeypatch) -> None:
    """The custom op's CUDA branch (the kernel) for CPU operands: the interpreter runs it."""
    monkeypatch.setattr(sc, "_kernel_device", lambda t: True)


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_interp)], ids=["oracle", "kernel"])
def test_weight_prepared_once_per_version(monkeypatch, count_prepares, kernel):
    """Repeated ``scaled_mm(a, w)`` prepares w once (kept in its state) and reads its own tensors
    (no copy); an in-place change of w makes a fresh one. The activation is prepared every call."""
    if kernel:
        _kernel_on_cpu(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    w = ms.quantize(torch.randn(24, 64, generator=gen), "mxfp4")
    acts = [ms.quantize(torch.randn(m, 64, generator=gen), "mxfp8_e4m3") for m in (1, 3, 5)]
    for a in acts:
        out = ms.scaled_mm(a, w, out_dtype=torch.float32)
        assert _rel(out, scaled_mm_reference(a, w, None, torch.float32)) <= 1e-5
    assert count_prepares[id(w)] == 1
    assert all(count_prepares[id(a)] == 1 for a in acts)
    kept = sc.weight_operand(w)
    assert count_prepares[id(w)] == 1
    assert kept.codes.data_ptr() == w.data.data_ptr() and kept.scales.data_ptr() == w.scales.data_ptr()
    w.scales[0, 0] = w.scales[0, 0] + 1  # in place: a new version
    out = ms.scaled_mm(acts[0], w, out_dtype=torch.float32)
    assert count_prepares[id(w)] == 2
    assert _rel(out, scaled_mm_reference(acts[0], w, None, torch.float32)) <= 1e-5


# (activation format, weight format, K): FP8 x FP4, W4A4 NVFP4, fp8 block-128, ragged K (padded)
LINEAR_CASES = [("mxfp8_e4m3", "mxfp4", 64), ("nvfp4", "nvfp4", 64), ("fp8_e4m3_block128", "mxfp6_e2m3", 128),
                ("mxfp8_e4m3", "nvfp4", 40)]


def _weight(fw: str, n: int, k: int, gen: torch.Generator) -> ms.QTensor:
    return ms.quantize(torch.randn(n, k, generator=gen) * 0.1, fw, pad=True)


@pytest.mark.parametrize("fa,fw,k", LINEAR_CASES)
def test_linear_act_format_is_scaled_mm_of_quantized_x(fa, fw, k):
    """The CPU path: exactly the oracle of ``quantize(x)`` and w, leading dims kept, x's dtype out."""
    gen = torch.Generator().manual_seed(1)
    w = _weight(fw, 24, k, gen)
    x = torch.randn(2, 3, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(24, generator=gen)
    y = ms.linear(x, w, bias, act_format=fa)
    a = ms.quantize(x.reshape(6, k), fa, pad=True)
    assert y.shape == (2, 3, 24) and y.dtype == torch.bfloat16
    assert torch.equal(y, scaled_mm_reference(a, w, bias, torch.bfloat16).reshape(2, 3, 24))
    # and the quantized product is close to the float one
    assert _rel(y.float(), x.float() @ w.dequantize().T + bias) < 0.1


@needs_interp
@pytest.mark.parametrize("fa,fw,k", LINEAR_CASES[:2] + LINEAR_CASES[3:])
def test_linear_act_format_kernel_equals_oracle(monkeypatch, fa, fw, k):
    _kernel_on_cpu(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    w = _weight(fw, 24, k, gen)
    x = torch.randn(5, k, generator=gen)
    y = ms.linear(x, w, act_format=fa)  # float32 in, float32 out
    a = ms.quantize(x, fa, pad=True)
    assert _rel(y, scaled_mm_reference(a, w, None, torch.float32)) <= 1e-5


@pytest.mark.parametrize("key,stored,decode", [("input_scale", 0.25, 0.25), ("input_global_scale", 4.0, 0.25)])
def test_static_activation_scale(key, stored, decode):
    """NVFP4 activations take the weight's static per-tensor scale (ModelOpt ``input_scale`` is the
    decode multiplier; compressed-tensors ``input_global_scale`` its reciprocal); without one the
    scale comes from x (dynamic); block formats ignore it."""
    gen = torch.Generator().manual_seed(3)
    w = _weight("nvfp4", 16, 64, gen)
    x = torch.randn(4, 64, generator=gen) * 3
    dynamic = ms.linear(x, w, act_format="nvfp4")
    assert sc.activation_scale(w) is None
    assert torch.equal(dynamic, scaled_mm_reference(ms.quantize(x, "nvfp4"), w, None, torch.float32))
    w.meta[key] = {"shape": [1] if key == "input_global_scale" else [], "values": [stored]}
    s = sc.activation_scale(w)
    assert s.dtype == torch.float32 and float(s) == decode
    a = sc.quantize_activation(x, w, ms.get_format("nvfp4"))
    assert float(a.global_scale) == decode
    want = scaled_mm_reference(ms.quantize(x, "nvfp4", global_scale=torch.tensor(decode)), w, None, torch.float32)
    y = ms.linear(x, w, act_format="nvfp4")
    assert torch.equal(y, want) and not torch.equal(y, dynamic)
    assert torch.equal(ms.linear(x, w, act_format="mxfp8_e4m3"),
                       scaled_mm_reference(ms.quantize(x, "mxfp8_e4m3"), w, None, torch.float32))
    w.meta[key]["values"] = [stored, stored]
    with pytest.raises(ValueError, match="one"):
        sc.activation_scale(w)


def test_linear_act_format_errors():
    gen = torch.Generator().manual_seed(4)
    w = _weight("mxfp4", 16, 64, gen)
    with pytest.raises(TypeError, match="QTensor"):
        ms.linear(torch.randn(2, 64), ms.linear.prepare(w), act_format="mxfp8_e4m3")
    with pytest.raises(TypeError, match="float32"):
        ms.linear(torch.randn(2, 64, dtype=torch.float64), w, act_format="mxfp8_e4m3")
    with pytest.raises(ValueError, match="K"):
        ms.linear(torch.randn(2, 32), w, act_format="mxfp8_e4m3")
    with pytest.raises(KeyError):
        ms.linear(torch.randn(2, 64), w, act_format="no_such_format")


def _mlp(gen: torch.Generator) -> nn.Module:
    torch.manual_seed(int(torch.randint(0, 1 << 30, (1,), generator=gen)))
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16, bias=False))


def test_quantize_model_act_format():
    gen = torch.Generator().manual_seed(5)
    model = _mlp(gen)
    qm = quantize_model(model, "nvfp4", act_format="mxfp8_e4m3", inplace=False)
    l0, l2 = qm[0], qm[2]
    assert isinstance(l0, QuantLinear) and l0.act_format == ms.get_format("mxfp8_e4m3")
    assert "act_format=mxfp8_e4m3" in repr(l0)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    h = scaled_mm_reference(ms.quantize(x, "mxfp8_e4m3"), l0.qweight, l0.bias.detach(), torch.bfloat16)
    want = scaled_mm_reference(ms.quantize(torch.relu(h), "mxfp8_e4m3"), l2.qweight, None, torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(qm(x), want)
        # weight-only differs: the activations really are quantized
        assert not torch.equal(quantize_model(model, "nvfp4", inplace=False)(x), want)
    # the activation format travels in the extra state
    fresh = quantize_model(_mlp(gen), "nvfp4")
    assert fresh[0].act_format is None
    fresh.load_state_dict(qm.state_dict())
    assert fresh[0].act_format == ms.get_format("mxfp8_e4m3") and fresh[2].act_format == l2.act_format
    with torch.no_grad():
        assert torch.equal(fresh(x), want)
    ql = QuantLinear.from_linear(copy.deepcopy(model[0]), "mxfp4", act_format="nvfp4")
    assert ql.act_format.name == "nvfp4" and QuantLinear(64, 32).act_format is None
