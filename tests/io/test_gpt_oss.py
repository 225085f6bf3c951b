"""gpt-oss export: which tensors it quantizes, decided on the axis its blocks run along."""
import torch

import microscale as ms
from microscale import io as msio
from microscale.io.conventions import get_convention, quantizable_tensors


def test_gpt_oss_quantizability_follows_the_block_axis(tmp_path, make_checkpoint):
    """gpt-oss blocks run along ``in`` (dim -2 of HF's [E, in, out]): an expert whose ``out``
    is not a multiple of 32 is quantized, one whose ``in`` is not is left in float (never padded)."""
    g = torch.Generator().manual_seed(8)
    src = {"m.experts.up_proj": torch.randn(2, 64, 48, generator=g).bfloat16(),    # in=64: quantize
           "m.experts.gate_proj": torch.randn(2, 64, 16, generator=g).bfloat16(),  # in=64, out < one block
           "m.experts.down_proj": torch.randn(2, 48, 64, generator=g).bfloat16()}  # in=48: leave float
    sdir = make_checkpoint(tmp_path / "src", {"model.safetensors": src}, index=False)
    s = msio.convert(sdir, tmp_path / "q", fmt="mxfp4", convention="gpt-oss", progress=False)
    assert sorted(s["quantized"]) == ["m.experts.gate_proj", "m.experts.up_proj"]
    assert s["skipped"] == ["m.experts.down_proj"]
    ck = msio.open_checkpoint(tmp_path / "q")
    assert ck.info("m.experts.up_proj_blocks").shape == (2, 48, 2, 16)
    assert ck.info("m.experts.gate_proj_blocks").shape == (2, 16, 2, 16)
    assert torch.equal(ck.get("m.experts.down_proj"), src["m.experts.down_proj"])
    q = msio.load(tmp_path / "q")["m.experts.up_proj"]
    want = ms.quantize(src["m.experts.up_proj"].transpose(1, 2), "mxfp4")
    assert torch.equal(q.data, want.data) and torch.equal(q.scales, want.scales)


def test_quantizable_tensors_counts_what_a_convention_selects():
    """A dense model has nothing gpt-oss quantizes; the function says so before anything is written."""
    dense = {"model.layers.0.mlp.up_proj.weight": (128, 64), "model.layers.0.self_attn.q_proj.weight": (64, 64),
             "model.norm.weight": (64,)}
    assert quantizable_tensors("gpt-oss", dense, "mxfp4") == []
    assert "experts" in get_convention("gpt-oss").selects
    assert sorted(quantizable_tensors("native", dense, "mxfp4")) == sorted(list(dense)[:2])
    moe = {"m.experts.up_proj": (2, 64, 48), "m.experts.down_proj": (2, 48, 64), "m.router.weight": (4, 64)}
    assert quantizable_tensors("gpt-oss", moe, "mxfp4") == ["m.experts.up_proj"]
