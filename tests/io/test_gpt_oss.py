"""gpt-oss export: which tensors it quantizes, decided on the axis its blocks run along."""
import pytest
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


def _blocks_and_scales(gen, e=3, n=32, groups=8):
    """Random gpt-oss blocks (every byte, so every nibble pair) and every finite E8M0 scale 0..254."""
    b = torch.randint(0, 256, (e, n, groups, 16), generator=gen, dtype=torch.uint8)
    s = torch.randint(0, 255, (e, n, groups), generator=gen, dtype=torch.uint8)
    s.view(-1)[:255] = torch.arange(255, dtype=torch.uint8)
    return b, s


def test_gpt_oss_decode_is_bit_exact_with_transformers(tmp_path, make_checkpoint):
    """Our QTensor of a gpt-oss *_blocks/*_scales pair decodes bit for bit (signed zeros, float32
    subnormals and infinities included) to what transformers' own MXFP4 dequantization
    (integrations/mxfp4.py, convert_moe_packed_tensors) gives, in float32 and bfloat16: nibble order
    (low nibble = even element) and block layout ([E, out, K/32, 16] -> QTensor [E, out, K])."""
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    b, s = _blocks_and_scales(torch.Generator().manual_seed(21))
    sdir = make_checkpoint(tmp_path / "ck", {"model.safetensors": {"m.experts.gate_up_proj_blocks": b,
                                                                  "m.experts.gate_up_proj_scales": s}},
                           config={"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}},
                           index=False)
    q = msio.load(sdir)["m.experts.gate_up_proj"]
    assert q.fmt.name == "mxfp4" and tuple(q.shape) == (3, 32, 256)
    assert torch.equal(q.data, b.reshape(3, 32, 128)) and torch.equal(q.scales, s)
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        hf = mx.convert_moe_packed_tensors(b, s, dtype=dtype)  # [E, in, out]
        ours = q.dequantize(dtype).transpose(1, 2).contiguous()
        assert hf.shape == ours.shape and torch.equal(ours.view(bits), hf.view(bits)), dtype
    assert torch.isinf(hf).any() and (hf.view(bits) == torch.tensor(-0.0, dtype=dtype).view(bits)).any()


def test_gpt_oss_nan_scale_names_file_and_tensor(tmp_path, make_checkpoint):
    """E8M0 0xFF (NaN in OCP; transformers reads it as 2^128): an error naming the file and the tensor."""
    b, s = _blocks_and_scales(torch.Generator().manual_seed(22))
    s[1, 2, 3] = 255
    sdir = make_checkpoint(tmp_path / "ck", {"model.safetensors": {"m.experts.down_proj_blocks": b,
                                                                  "m.experts.down_proj_scales": s}}, index=False)
    with pytest.raises(ValueError, match=r"ck/model\.safetensors: gpt-oss: 'm\.experts\.down_proj_scales' .*0xFF"
                                         r".*\(1, 2, 3\)"):
        msio.load(sdir)
    bad = make_checkpoint(tmp_path / "bad", {"model.safetensors": {"m.experts.down_proj_blocks": b[..., :8],
                                                                  "m.experts.down_proj_scales": s}}, index=False)
    with pytest.raises(ValueError, match=r"bad/model\.safetensors: gpt-oss: 'm\.experts\.down_proj_blocks'"):
        msio.load(bad)
