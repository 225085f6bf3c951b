"""QTensor: sizes, devices, safetensors round trip (no pickle), validation."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import microscale as ms
from microscale.formats import registry


@pytest.mark.parametrize("name", list(registry))
def test_save_load_roundtrip(name, tmp_path, gen):
    f = registry[name]
    x = torch.randn((256, 256) if f.block_rows > 1 else (2, 3, 128), generator=gen, dtype=torch.bfloat16)
    q = ms.quantize(x, name, convention="compressed-tensors") if f.global_scale else ms.quantize(x, name)
    p = tmp_path / "q.safetensors"
    q.save(p)
    r = ms.QTensor.load(p)
    assert r.fmt == q.fmt and r.shape == q.shape and r.dtype == q.dtype and r.meta == q.meta
    for a, b in [(r.data, q.data), (r.scales, q.scales), (r.global_scale, q.global_scale),
                 (r.zero_points, q.zero_points)]:
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a, b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b))
    assert torch.equal(r.dequantize(), q.dequantize())
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves nothing behind


def test_nbytes_and_bits(gen):
    q = ms.quantize(torch.randn(64, 128, generator=gen), "nvfp4")
    assert q.nbytes == 64 * 64 + 64 * 8 + 4
    assert abs(q.bits_per_element - 4.5) < 0.01
    assert "nvfp4" in repr(q)
    assert q.to("cpu").device.type == "cpu"


def test_load_rejects_bad_files(tmp_path):
    p = tmp_path / "plain.safetensors"
    save_file({"data": torch.zeros(2, 16, dtype=torch.uint8)}, p)
    with pytest.raises(ValueError, match="no microscale metadata"):
        ms.QTensor.load(p)
    q = ms.quantize(torch.randn(2, 32), "mxfp4")
    tensors, meta = q.state_dict()
    tensors["scales"] = tensors["scales"][:, :0]
    save_file(tensors, tmp_path / "bad.safetensors", metadata=meta)
    with pytest.raises(ValueError, match="scales shape"):
        ms.QTensor.load(tmp_path / "bad.safetensors")
    m = json.loads(meta["microscale"])
    m["format"]["element"] = "e9m9"
    save_file(q.state_dict()[0], tmp_path / "bad2.safetensors", metadata={"microscale": json.dumps(m)})
    with pytest.raises(KeyError, match="unknown element"):
        ms.QTensor.load(tmp_path / "bad2.safetensors")
    (tmp_path / "trunc.safetensors").write_bytes(b"\x10\x00\x00")
    with pytest.raises(Exception):
        ms.QTensor.load(tmp_path / "trunc.safetensors")
    assert load_file(p)["data"].shape == (2, 16)
