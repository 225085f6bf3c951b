"""GGUF files as llama.cpp and ggml write them: NVFP4 without a per-tensor scale, llama.cpp's
``<stem>.scale`` / ``<stem>.input_scale`` names, and headers that lie about shapes."""
import struct

import numpy as np
import pytest
import torch

import microscale as ms
from microscale import io as msio

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def _ggml_nvfp4_bytes(rows: int, k: int, seed: int) -> np.ndarray:
    """Random NVFP4 super-blocks as ggml stores them: four UE4M3 bytes (0..0x7E) + 32 code bytes."""
    g = np.random.default_rng(seed)
    nb = k // 64
    d = g.integers(0, 0x7F, size=(rows, nb, 4), dtype=np.uint8)
    d[0, 0, :] = [0x00, 0x01, 0x7E, 0x38]  # zero, smallest subnormal, largest, 1.0
    qs = g.integers(0, 256, size=(rows, nb, 32), dtype=np.uint8)
    return np.concatenate([d, qs], axis=-1).reshape(rows, nb * 36)


def _write(path, tensors: dict):
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (arr, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_ggml_nvfp4_without_scale_loads_bit_exact(tmp_path):
    """ggml's own NVFP4 (x = e2m1 * ue4m3, no per-tensor scale) loads with a global scale of 1."""
    raw = _ggml_nvfp4_bytes(8, 256, 0)
    p = _write(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": (raw, T.NVFP4)})
    q = msio.load(p)["blk.0.ffn_up.weight"]
    assert tuple(q.shape) == (8, 256) and float(q.global_scale) == 1.0
    theirs = torch.from_numpy(dequantize(raw, T.NVFP4).copy())
    assert torch.equal(q.dequantize(torch.float32), theirs)
    # written back: the same blocks and, like ggml, no per-tensor scale tensor
    msio.save({"blk.0.ffn_up.weight": q}, tmp_path / "re.gguf", convention="gguf")
    (t,) = gguf.GGUFReader(str(tmp_path / "re.gguf")).tensors
    assert t.name == "blk.0.ffn_up.weight" and np.array_equal(np.array(t.data), raw)


def test_llama_cpp_scale_names_read(tmp_path):
    """llama.cpp's converter writes ModelOpt's weight_scale_2 as ``<stem>.scale`` and the
    activation scale as ``<stem>.input_scale``; both fold into the weight's QTensor."""
    raw = _ggml_nvfp4_bytes(4, 128, 1)
    s2, inp = np.array([0.0123], dtype=np.float32), np.array([0.75], dtype=np.float32)
    p = _write(tmp_path / "m.gguf", {"blk.0.attn_q.weight": (raw, T.NVFP4), "blk.0.attn_q.scale": (s2, None),
                                     "blk.0.attn_q.input_scale": (inp, None),
                                     "blk.0.attn_norm.weight": (np.ones(128, np.float32), None)})
    back = msio.load(p)
    assert set(back) == {"blk.0.attn_q.weight", "blk.0.attn_norm.weight"}
    q = back["blk.0.attn_q.weight"]
    assert float(q.global_scale) == float(s2[0]) and q.meta["input_scale"]["values"] == [0.75]
    theirs = torch.from_numpy(dequantize(raw, T.NVFP4).copy()) * torch.from_numpy(s2)
    assert torch.equal(q.dequantize(torch.float32), theirs)


def test_nvfp4_written_with_llama_cpp_names(tmp_path):
    """Our NVFP4 GGUF carries ``<stem>.scale`` (what llama.cpp multiplies by), so a reader that
    knows only llama.cpp's convention decodes the right values."""
    q = ms.quantize(torch.randn(16, 128, generator=torch.Generator().manual_seed(2)), "nvfp4")
    q.meta["input_scale"] = {"shape": [], "values": [0.5]}
    p = tmp_path / "m.gguf"
    msio.save({"blk.0.ffn_down.weight": q}, p, convention="gguf")
    r = gguf.GGUFReader(str(p))
    names = {t.name: t for t in r.tensors}
    assert set(names) == {"blk.0.ffn_down.weight", "blk.0.ffn_down.scale", "blk.0.ffn_down.input_scale"}
    scale = torch.from_numpy(np.array(names["blk.0.ffn_down.scale"].data, dtype=np.float32))
    theirs = torch.from_numpy(dequantize(np.array(names["blk.0.ffn_down.weight"].data), T.NVFP4).copy()) * scale
    assert torch.equal(theirs, q.dequantize(torch.float32))
    assert float(names["blk.0.ffn_down.input_scale"].data[0]) == 0.5
    back = msio.load(p)["blk.0.ffn_down.weight"]
    assert torch.equal(back.global_scale.reshape(()), q.global_scale.reshape(()))
    assert back.meta["input_scale"]["values"] == [0.5]


def test_legacy_global_scale_name_still_read(tmp_path):
    raw = _ggml_nvfp4_bytes(2, 64, 3)
    p = _write(tmp_path / "m.gguf", {"w": (raw, T.NVFP4), "w.global_scale": (np.array([2.0], np.float32), None)})
    q = msio.load(p)["w"]
    assert float(q.global_scale) == 2.0
    assert torch.equal(q.dequantize(torch.float32), torch.from_numpy(dequantize(raw, T.NVFP4).copy()) * 2)


def test_nvfp4_scale_byte_outside_ue4m3_rejected(tmp_path):
    raw = _ggml_nvfp4_bytes(2, 64, 4)
    raw[1, 2] = 0x7F  # ggml decodes 0x7F as 0, E4M3 as NaN
    p = _write(tmp_path / "m.gguf", {"w.weight": (raw, T.NVFP4)})
    with pytest.raises(ValueError, match=r"'w.weight'.*0x7F"):
        msio.load(p)


def _patch_dim0(path, name: str, new_dim0: int) -> None:
    """Rewrite the first (fastest) dimension of ``name`` in a GGUF header."""
    data = bytearray(open(path, "rb").read())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (ndims,) = struct.unpack_from("<I", data, at)
    assert ndims >= 1
    struct.pack_into("<Q", data, at + 4, new_dim0)
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("dim0", [512, 64], ids=["larger", "smaller"])
def test_lying_gguf_shape_rejected(tmp_path, dim0):
    """A header that claims a shape whose bytes run into the next tensor (or leave bytes
    unread) fails naming the file and the tensor, instead of reading the neighbour's data."""
    a = np.arange(4 * 256, dtype=np.float32).reshape(4, 256)
    b = np.full((4, 256), 7.0, dtype=np.float32)
    p = _write(tmp_path / "m.gguf", {"first.weight": (a, None), "second.weight": (b, None)})
    _patch_dim0(p, "first.weight", dim0)
    with pytest.raises(ValueError, match=r"m\.gguf.*'first\.weight'"):
        msio.load(p)
    with pytest.raises(ValueError, match=r"'first\.weight'"):
        msio.inspect(p)


def test_lying_gguf_quantized_shape_rejected(tmp_path):
    raw = _ggml_nvfp4_bytes(4, 128, 5)
    p = _write(tmp_path / "m.gguf", {"a.weight": (raw, T.NVFP4), "b.weight": (raw, T.NVFP4)})
    _patch_dim0(p, "a.weight", 256)
    with pytest.raises(ValueError, match=r"'a\.weight'.*NVFP4"):
        msio.load(p)
