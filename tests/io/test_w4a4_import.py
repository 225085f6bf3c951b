"""W4A4 checkpoints: a ModelOpt NVFP4 export with ``input_scale`` (tensors built from the
ModelOpt formulas, not by microscale's quantizer) loads as W4A4 and runs both operands quantized,
equal to the oracle; the activation format survives native and ModelOpt re-export; a
compressed-tensors NVFP4 checkpoint with input activations likewise."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import microscale as ms
from microscale import io as msio
from microscale.nn import load_quantized_state, quantized_state
from microscale.reference_scaled import scaled_mm_reference

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6])


def _modelopt_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """``weight`` (packed E2M1), ``weight_scale`` (E4M3) and ``weight_scale_2`` as ModelOpt computes them."""
    n, k = w.shape
    s2 = w.abs().amax() / 2688.0
    sb = (w.reshape(n, k // 16, 16).abs().amax(-1) / (6 * s2)).to(torch.float8_e4m3fn)
    x = w.reshape(n, k // 16, 16) / (sb.float() * s2).unsqueeze(-1)
    codes = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1).to(torch.uint8) | ((x < 0).to(torch.uint8) << 3)
    codes = codes.reshape(n, k)
    return {"weight": codes[:, 0::2] | (codes[:, 1::2] << 4), "weight_scale": sb, "weight_scale_2": s2.reshape(())}


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 32, bias=False)
        self.head = nn.Linear(32, 8, bias=False)  # excluded from quantization: stays float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x).float())


def _model() -> nn.Module:
    return _Model()


def _write_modelopt(root, quant_algo: str, input_scale: float | None) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    t = {f"proj.{k}": v for k, v in _modelopt_nvfp4(torch.randn(32, 64, generator=g) * 0.05).items()}
    if input_scale is not None:
        t["proj.input_scale"] = torch.tensor(input_scale)
    t["head.weight"] = torch.randn(8, 32, generator=g).to(torch.bfloat16)
    root.mkdir()
    save_file(t, str(root / "model.safetensors"))
    (root / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt", "version": "0.29"},
         "quantization": {"quant_algo": quant_algo, "group_size": 16, "exclude_modules": ["head"]}}))


def test_modelopt_w4a4_loads_and_runs_as_w4a4(tmp_path):
    src = tmp_path / "modelopt"
    _write_modelopt(src, "NVFP4", 0.015625)
    tensors = msio.load(src)
    q = tensors["proj.weight"]
    assert q.meta["act_format"] == "nvfp4" and q.meta["input_scale"]["values"] == [0.015625]
    model = load_quantized_state(_model(), tensors)
    assert model.proj.act_format == ms.get_format("nvfp4")
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    a = ms.quantize(x.reshape(6, 64), "nvfp4", global_scale=torch.tensor(0.015625))
    assert float(a.global_scale) == 0.015625  # the static input scale, not x's amax
    want = scaled_mm_reference(a, q, None, torch.bfloat16).reshape(2, 3, 32)
    with torch.no_grad():
        y = model.proj(x)
        assert torch.equal(y, want)
        ref64 = a.dequantize(torch.float64) @ q.dequantize(torch.float64).T  # the oracle vs float64 math
        assert float((y.double().reshape(6, 32) - ref64).norm() / ref64.norm()) < 1e-2
        out = model(x)
    # re-exported natively: still W4A4, same output
    msio.save(quantized_state(model), tmp_path / "native")
    back = msio.load(tmp_path / "native")
    assert back["proj.weight"].meta["act_format"] == "nvfp4"
    model2 = load_quantized_state(_model(), back)
    assert model2.proj.act_format == ms.get_format("nvfp4")
    with torch.no_grad():
        assert torch.equal(model2(x), out)
    # and as ModelOpt: input_scale and quant_algo NVFP4 written, read back as W4A4
    msio.save({"proj.weight": back["proj.weight"]}, tmp_path / "modelopt2", convention="modelopt")
    assert msio.load(tmp_path / "modelopt2")["proj.weight"].meta["act_format"] == "nvfp4"


@pytest.mark.parametrize("quant_algo,input_scale", [("NVFP4", None), ("W4A8_NVFP4_FP8", 0.5)],
                         ids=["no_input_scale", "other_algo"])
def test_modelopt_weight_only_stays_weight_only(tmp_path, quant_algo, input_scale):
    _write_modelopt(tmp_path / "m", quant_algo, input_scale)
    tensors = msio.load(tmp_path / "m")
    assert "act_format" not in tensors["proj.weight"].meta
    assert load_quantized_state(_model(), tensors).proj.act_format is None


def test_compressed_tensors_w4a4_uses_input_global_scale(tmp_path):
    g = torch.Generator().manual_seed(2)
    f = msio.get_convention("compressed-tensors").check_format(ms.get_format("nvfp4"))
    q = ms.quantize(torch.randn(32, 64, generator=g) * 0.05, f)
    q.meta["input_scale"] = {"shape": [], "values": [0.25]}  # written as input_global_scale = 4
    msio.save({"proj.weight": q, "head.weight": torch.randn(8, 32, generator=g)}, tmp_path / "ct",
              convention="compressed-tensors")
    tensors = msio.load(tmp_path / "ct")
    w = tensors["proj.weight"]
    assert w.meta["act_format"] == "nvfp4" and w.meta["input_global_scale"]["values"] == [4.0]
    model = load_quantized_state(_model(), tensors)
    x = torch.randn(5, 64, generator=g)
    want = scaled_mm_reference(ms.quantize(x, "nvfp4", global_scale=torch.tensor(0.25)), w, None, torch.float32)
    with torch.no_grad():
        assert torch.equal(model.proj(x), want)
