"""fp8 block-128 checkpoints as DeepSeek-V3 and transformers' FineGrainedFP8 ship them (``*.weight`` E4M3 beside
``*.weight_scale_inv`` per 128 x 128, ``quant_method: fp8``, dynamic activations), built here from the published
recipe rather than by microscale's quantizer: they load into QTensors without a float copy, run W8A8 equal to
the oracle, and write back byte for byte."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import microscale as ms
from microscale import io as msio
from microscale.nn import load_quantized_state
from microscale.reference_scaled import scaled_mm_reference

CONFIG = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}}


def _block_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's weight recipe: per 128 x 128 block s = amax / 448, codes = e4m3(w / s) (edges: partial blocks)."""
    n, k = w.shape
    bn, bk = -(-n // 128), -(-k // 128)
    pad = torch.nn.functional.pad(w, (0, bk * 128 - k, 0, bn * 128 - n))
    blocks = pad.reshape(bn, 128, bk, 128)
    s = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / 448.0
    codes = (blocks / s[:, None, :, None]).reshape(bn * 128, bk * 128)[:n, :k].to(torch.float8_e4m3fn)
    return codes, s.float()


class _Model(nn.Module):
    def __init__(self, n: int, k: int):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False)
        self.norm = nn.LayerNorm(k)


def _write(root, n: int, k: int, config: dict | None = CONFIG) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    w, s = _block_fp8(torch.randn(n, k, generator=g) * 0.05)
    t = {"proj.weight": w, "proj.weight_scale_inv": s, "norm.weight": torch.ones(k), "norm.bias": torch.zeros(k)}
    root.mkdir()
    save_file(t, str(root / "model.safetensors"))
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    return t


@pytest.mark.parametrize("n,k", [(256, 384), (200, 300)], ids=["whole_blocks", "partial_blocks"])
def test_loads_as_w8a8_and_runs_as_the_oracle(tmp_path, n, k):
    src = _write(tmp_path / "ds", n, k)
    ck = msio.open_checkpoint(tmp_path / "ds")
    assert ck.convention == "fp8-block"
    tensors = msio.load(tmp_path / "ds")
    q = tensors["proj.weight"]
    assert q.fmt.name == "fp8_e4m3_block128x128" and tuple(q.shape) == (n, k)
    assert q.meta["act_format"] == "fp8_e4m3_block128"
    # the codes and scales are the file's (no float copy; padded with zeros only at partial edges)
    assert torch.equal(q.data[:n, :k], src["proj.weight"].view(torch.uint8))
    assert torch.equal(q.scales, src["proj.weight_scale_inv"])
    scale = src["proj.weight_scale_inv"].double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    want = (src["proj.weight"].double() * scale).float()  # (code x scale, rounded once to float32)
    assert torch.equal(q.dequantize(torch.float32), want)
    model = load_quantized_state(_Model(n, k), tensors, fast_accum=True)
    assert model.proj.act_format == ms.get_format("fp8_e4m3_block128") and model.proj.fast_accum
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    a = ms.quantize(x, "fp8_e4m3_block128", pad=True)
    with torch.no_grad():
        assert torch.equal(model.proj(x), scaled_mm_reference(a, q, None, torch.float32))
    # written back in the same convention: the same bytes, the same config
    msio.save({"proj.weight": q}, tmp_path / "out", convention="fp8-block", config=CONFIG)
    back = msio.load(tmp_path / "out")
    assert torch.equal(back["proj.weight"].data, q.data) and torch.equal(back["proj.weight"].scales, q.scales)
    from safetensors.torch import load_file

    raw = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert raw["proj.weight"].dtype == torch.float8_e4m3fn and tuple(raw["proj.weight"].shape) == (n, k)
    assert torch.equal(raw["proj.weight"].view(torch.uint8), src["proj.weight"].view(torch.uint8))


def test_static_activations_stay_weight_only(tmp_path):
    cfg = {"quantization_config": dict(CONFIG["quantization_config"], activation_scheme="static")}
    _write(tmp_path / "ds", 128, 128, cfg)
    tensors = msio.load(tmp_path / "ds")
    assert "act_format" not in tensors["proj.weight"].meta


def test_bad_scale_shape_names_the_tensor(tmp_path):
    from safetensors.torch import save_file

    root = tmp_path / "bad"
    root.mkdir()
    save_file({"proj.weight": torch.zeros(256, 256).to(torch.float8_e4m3fn), "proj.weight_scale_inv": torch.ones(2, 3)},
              str(root / "model.safetensors"))
    with pytest.raises(ValueError, match=r"proj\.weight_scale_inv.*expected \[2, 2\]"):
        msio.load(root)


def test_refuses_other_formats():
    with pytest.raises(ValueError, match="stores fp8_e4m3_block128x128 only"):
        msio.get_convention("fp8-block").check_format(ms.get_format("mxfp8_e4m3"))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_half_precision_scales_load_exactly_and_write_back(tmp_path, dt):
    """Qwen3 FP8 exports carry bf16 weight_scale_inv: widened exactly on load, written back in their dtype."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(3)
    w, s = _block_fp8(torch.randn(256, 384, generator=g) * 0.05)
    s = s.to(dt)
    (tmp_path / "q").mkdir()
    save_file({"proj.weight": w, "proj.weight_scale_inv": s}, str(tmp_path / "q" / "model.safetensors"))
    (tmp_path / "q" / "config.json").write_text(json.dumps(CONFIG))
    q = msio.load(tmp_path / "q")["proj.weight"]
    assert q.scales.dtype == torch.float32 and torch.equal(q.scales, s.float())
    msio.save({"proj.weight": q}, tmp_path / "out", convention="fp8-block", config=CONFIG)
    raw = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert raw["proj.weight_scale_inv"].dtype == dt and torch.equal(raw["proj.weight_scale_inv"], s)


def test_other_block_sizes_are_refused_by_name(tmp_path):
    cfg = {"quantization_config": dict(CONFIG["quantization_config"], weight_block_size=[64, 64])}
    _write(tmp_path / "ds", 128, 128, cfg)  # (scales of 128 x 128 blocks: decoding succeeds, the config is refused)
    with pytest.raises(ValueError, match=r"weight_block_size=\[64, 64\]"):
        msio.load(tmp_path / "ds")


def test_inspect_reads_headers_only(tmp_path):
    """``inspect`` decodes lazily (the weight a meta tensor, the small scale tensor read): format and shape."""
    g = torch.Generator().manual_seed(4)
    w, s = _block_fp8(torch.randn(200, 300, generator=g))
    (tmp_path / "i").mkdir()
    from safetensors.torch import save_file

    save_file({"proj.weight": w, "proj.weight_scale_inv": s}, str(tmp_path / "i" / "model.safetensors"))
    conv, rows = msio.inspect(tmp_path / "i")
    assert conv == "fp8-block" and [r[:3] for r in rows] == [("proj.weight", "fp8_e4m3_block128x128", (200, 300))]


def test_quantizers_match_deepseek_recipe():
    """microscale's quantizers give DeepSeek's bytes: weights per 128 x 128 block and activations per token and
    128 K (``act_quant``: s = amax / 448, codes = e4m3(x / s)), on data whose rows span several binades."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(256, 384, generator=g) * torch.rand(256, 1, generator=g) * 4
    codes, s = _block_fp8(w)
    q = ms.quantize(w, "fp8_e4m3_block128x128")
    assert torch.equal(q.scales, s) and torch.equal(q.data, codes.view(torch.uint8))
    x = torch.randn(64, 512, generator=g) * torch.rand(64, 1, generator=g) * 10
    xb = x.reshape(64, 4, 128)
    sx = xb.abs().amax(-1, keepdim=True) / 448.0
    a = ms.quantize(x, "fp8_e4m3_block128")
    assert torch.equal(a.scales, sx.squeeze(-1))
    assert torch.equal(a.data, (xb / sx).to(torch.float8_e4m3fn).view(torch.uint8).reshape(64, 512))
