"""QTensor: sizes, devices, safetensors round trip (no pickle), validation."""
import json
import os

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
    with pytest.raises(ValueError, match="unknown element"):  # a bad file is a ValueError, not a lookup miss
        ms.QTensor.load(tmp_path / "bad2.safetensors")
    (tmp_path / "trunc.safetensors").write_bytes(b"\x10\x00\x00")
    with pytest.raises(Exception):
        ms.QTensor.load(tmp_path / "trunc.safetensors")
    assert load_file(p)["data"].shape == (2, 16)


# ---- validation at construction ------------------------------------------------------
def _valid(name, gen, pad=True):
    """A QTensor of ``name`` whose shape needs padding along K (and rows for 2-D blocks)."""
    f = registry[name]
    shape = (f.block_rows + 3, 2 * f.block_size + 5) if f.block_rows > 1 else (2, 3, 2 * f.block_size + 5)
    return ms.quantize(torch.randn(shape, generator=gen), name, pad=pad)


def _fields(q):
    return dict(data=q.data, scales=q.scales, fmt=q.fmt, shape=q.shape, dtype=q.dtype,
                global_scale=q.global_scale, zero_points=q.zero_points, meta=q.meta)


def _grow(t, dim, n=1):
    """``t`` with ``n`` more entries along ``dim`` (n < 0: fewer)."""
    if n < 0:
        return t.narrow(dim, 0, t.shape[dim] + n)
    return torch.cat([t, t.narrow(dim, 0, 1).expand(*[n if d == dim % t.dim() else s for d, s in enumerate(t.shape)])],
                     dim)


@pytest.mark.parametrize("name", list(registry))
def test_every_format_passes_the_validator(name, gen, tmp_path):
    """What quantize builds (padded), its copy and its file are valid, with exact expected shapes."""
    q = _valid(name, gen)
    f = q.fmt
    shape = tuple(q.shape)
    kp = -(-shape[-1] // f.block_size) * f.block_size
    lead = list(shape[:-1])
    if f.block_rows > 1:
        lead[-1] = -(-lead[-1] // f.block_rows) * f.block_rows
    assert tuple(q.data.shape) == (*lead, kp * f.element.bits // 8)
    slead = lead[:-1] + [lead[-1] // f.block_rows] if f.block_rows > 1 else lead
    assert tuple(q.scales.shape) == (*slead, kp // f.block_size)
    assert q.scales.dtype == f.scale.storage
    ms.QTensor(**_fields(q)).validate(values=True)
    q.save(tmp_path / "q.safetensors")
    r = ms.QTensor.load(tmp_path / "q.safetensors")
    assert torch.equal(r.dequantize(), q.dequantize()) and r.dequantize().shape == q.shape


@pytest.mark.parametrize("name", list(registry))
def test_every_format_rejects_wrong_shapes(name, gen):
    """One entry too many or too few in any dim of data, scales or zero points is refused
    (it would broadcast, truncate or read outside the tensor)."""
    q = _valid(name, gen)
    kw = _fields(q)
    for field in ("data", "scales", "zero_points"):
        t = kw[field]
        if t is None:
            continue
        for dim in range(t.dim()):
            for n in (1, -1):
                with pytest.raises(ValueError, match=rf"{field} shape"):
                    ms.QTensor(**{**kw, field: _grow(t, dim, n)})
        with pytest.raises(ValueError, match=rf"{field} shape"):
            ms.QTensor(**{**kw, field: t.unsqueeze(0)})
    for bad in ([*q.shape[:-1], q.shape[-1] + q.fmt.block_size], [*q.shape[:-1], q.shape[-1] - q.fmt.block_size],
                [q.shape[0] + q.fmt.block_rows, *q.shape[1:]], list(q.shape[1:])):
        with pytest.raises(ValueError, match="shape"):
            ms.QTensor(**{**kw, "shape": bad})


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "int4_affine_g32", "fp8_e4m3_block128x128", "mxfp6_e3m2"])
def test_rejects_wrong_dtypes_and_parts(name, gen):
    q = _valid(name, gen)
    kw = _fields(q)
    f = q.fmt
    with pytest.raises(ValueError, match=r"data .*uint8"):
        ms.QTensor(**{**kw, "data": q.data.to(torch.int8)})
    wrong = torch.float16 if f.scale.storage != torch.float16 else torch.float32
    with pytest.raises(ValueError, match=rf"scales .*{str(f.scale.storage).removeprefix('torch.')}"):
        ms.QTensor(**{**kw, "scales": torch.zeros(q.scales.shape, dtype=wrong)})
    with pytest.raises(ValueError, match="zero_points"):
        ms.QTensor(**{**kw, "zero_points": None if f.zero_point else torch.zeros(q.scales.shape, dtype=torch.uint8)})
    if f.zero_point:
        with pytest.raises(ValueError, match="zero_points .*uint8"):
            ms.QTensor(**{**kw, "zero_points": q.zero_points.to(torch.int16)})
    with pytest.raises(ValueError, match="global_scale"):
        ms.QTensor(**{**kw, "global_scale": None if f.global_scale else torch.tensor(1.0)})
    if f.global_scale:
        for g, what in [(torch.tensor(1.0, dtype=torch.float64), "float32"), (torch.ones(2), "one value"),
                        (torch.ones(1, 1), "one value")]:
            with pytest.raises(ValueError, match=f"global_scale .*{what}"):
                ms.QTensor(**{**kw, "global_scale": g})
        assert ms.QTensor(**{**kw, "global_scale": torch.ones(1)}).global_scale.shape == ()  # [1] as stored in files
    with pytest.raises(TypeError, match="fmt"):
        ms.QTensor(**{**kw, "fmt": f.name})
    with pytest.raises(TypeError, match="data"):
        ms.QTensor(**{**kw, "data": q.data.numpy()})
    with pytest.raises(TypeError, match="dtype"):
        ms.QTensor(**{**kw, "dtype": "float32"})
    with pytest.raises(ValueError, match="dtype"):
        ms.QTensor(**{**kw, "dtype": torch.int32})
    with pytest.raises(TypeError, match="meta"):
        ms.QTensor(**{**kw, "meta": [1]})


@pytest.mark.parametrize("shape,err", [([4, -1], ValueError), ([4, 63.5], TypeError), ([4, True], TypeError),
                                       ([4, "64"], TypeError), ([], ValueError), (64, TypeError)])
def test_rejects_bad_original_shapes(shape, err):
    q = ms.quantize(torch.randn(4, 64), "mxfp4")
    with pytest.raises(err, match="shape"):
        ms.QTensor(q.data, q.scales, q.fmt, shape, q.dtype)


def test_shape_is_normalized_to_a_size():
    q = ms.quantize(torch.randn(4, 64), "mxfp4")
    r = ms.QTensor(q.data, q.scales, q.fmt, [4, 64], q.dtype)
    assert isinstance(r.shape, torch.Size) and r.shape == (4, 64)
    assert torch.equal(r.dequantize(), q.dequantize())


def test_2d_blocks_need_two_dims():
    f = registry["fp8_e4m3_block128x128"]
    with pytest.raises(ValueError, match="2 dims"):
        ms.QTensor(torch.zeros(128, dtype=torch.uint8), torch.zeros(1, dtype=torch.float32), f, (128,), torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices")
def test_rejects_mixed_devices():
    q = ms.quantize(torch.randn(4, 64), "nvfp4")
    with pytest.raises(ValueError, match="device"):
        ms.QTensor(q.data.cuda(), q.scales, q.fmt, q.shape, q.dtype, q.global_scale.cuda(), None, q.meta)
    with pytest.raises(ValueError, match="device"):
        ms.QTensor(q.data.cuda(), q.scales.cuda(), q.fmt, q.shape, q.dtype, q.global_scale, None, q.meta)


def test_dequantize_revalidates_fields_set_after_construction():
    """The fields stay assignable; dequantize checks them again (no broadcast of stale scales)."""
    q = ms.quantize(torch.randn(4, 64), "mxfp4")
    q.scales = q.scales[:, :1]
    with pytest.raises(ValueError, match="scales shape"):
        q.dequantize()
    with pytest.raises(ValueError, match="scales shape"):
        ms.dequantize(q)


def test_kernel_dequantize_refuses_an_invalid_qtensor():
    """The dequantize kernel addresses scales by the data's shape: a QTensor whose scales
    were replaced by a smaller tensor would be read past its end."""
    from microscale import quant as kq

    q = ms.quantize(torch.randn(4, 64), "mxfp4")
    q.scales = q.scales[:1].contiguous()
    with pytest.raises(ValueError, match="scales shape"):
        kq.dequantize(q)


# ---- validation at load --------------------------------------------------------------
def _saved(tmp_path, name="nvfp4", shape=(4, 64)):
    q = ms.quantize(torch.randn(shape), name)
    tensors, meta = q.state_dict()
    return q, tensors, json.loads(meta["microscale"])


def _write(tmp_path, tensors, m, fname="bad.safetensors"):
    p = tmp_path / fname
    save_file(tensors, p, metadata={"microscale": m if isinstance(m, str) else json.dumps(m)})
    return p


@pytest.mark.parametrize("g,what", [(float("nan"), "finite"), (float("inf"), "finite"), (0.0, "> 0"), (-2.0, "> 0")])
def test_load_rejects_bad_global_scale_values(tmp_path, g, what):
    q, tensors, m = _saved(tmp_path)
    tensors["global_scale"] = torch.tensor([g])
    p = _write(tmp_path, tensors, m)
    with pytest.raises(ValueError, match=rf"bad\.safetensors.*global_scale.*{what}"):
        ms.QTensor.load(p)


def test_load_rejects_bad_tensors_naming_file_and_tensor(tmp_path):
    q, tensors, m = _saved(tmp_path)
    cases = {
        "global_scale": (torch.tensor([1.0], dtype=torch.float64), "global_scale .*float32"),
        "scales": (tensors["scales"][:, :2].contiguous(), "scales shape"),
        "data": (tensors["data"][:, :-1].contiguous(), "data shape"),
    }
    for key, (t, msg) in cases.items():
        p = _write(tmp_path, {**tensors, key: t}, m)
        with pytest.raises(ValueError, match=rf"bad\.safetensors.*{msg}"):
            ms.QTensor.load(p)
    for key in ("data", "scales", "global_scale"):
        p = _write(tmp_path, {k: v for k, v in tensors.items() if k != key}, m)
        with pytest.raises(ValueError, match=rf"bad\.safetensors.*{key}"):
            ms.QTensor.load(p)
    p = _write(tmp_path, {**tensors, "extra": torch.zeros(1)}, m)
    with pytest.raises(ValueError, match="unexpected tensor 'extra'"):
        ms.QTensor.load(p)


def test_load_rejects_out_of_range_zero_points(tmp_path):
    q, tensors, m = _saved(tmp_path, "int4_affine_g32")
    tensors["zero_points"] = tensors["zero_points"].clone()
    tensors["zero_points"][0, 0] = 16
    with pytest.raises(ValueError, match=r"zero_points .*16.*15"):
        ms.QTensor.load(_write(tmp_path, tensors, m))


@pytest.mark.parametrize("path,value,err", [
    (("shape",), [4, -64], "shape"), (("shape",), [4, 64.0], "shape"), (("shape",), [4, True], "shape"),
    (("shape",), [4, 32], "shape"), (("shape",), "4x64", "shape"), (("dtype",), "int8", "dtype"),
    (("dtype",), 5, "dtype"), (("meta",), [1], "meta"), (("format",), "nvfp4", "format"),
    (("format", "block_size"), 16.5, "block_size"), (("format", "block_size"), True, "block_size"),
    (("format", "block_size"), "16", "block_size"), (("format", "block_size"), 0, "block_size"),
    (("format", "block_rows"), -1, "block_rows"), (("format", "global_scale"), "false", "global_scale"),
    (("format", "global_scale"), False, "global_scale"), (("format", "zero_point"), 1, "zero_point"),
    (("format", "element"), "e9m9", "element"), (("format", "element"), 4, "element"),
    (("format", "scale"), "fp64", "scale"), (("format", "scale_rule"), "round", "scale_rule"),
    (("format", "two_level"), None, "two_level"), (("format", "name"), 7, "name"),
])
def test_load_rejects_bad_metadata(tmp_path, path, value, err):
    """Each metadata field of the wrong type or value is refused with a ValueError naming
    the file and the field (nothing is coerced: 16.5 does not become 16, "false" not True)."""
    q, tensors, m = _saved(tmp_path)
    d = m
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises((ValueError, TypeError), match=rf"bad\.safetensors.*{err}"):
        ms.QTensor.load(_write(tmp_path, tensors, m))


@pytest.mark.parametrize("text", ["{", "[]", "null", json.dumps({"format": {}, "shape": [4, 64], "dtype": "float32"}),
                                  json.dumps({"shape": [4, 64], "dtype": "float32"})])
def test_load_rejects_malformed_metadata(tmp_path, text):
    q, tensors, m = _saved(tmp_path)
    with pytest.raises(ValueError, match=r"bad\.safetensors"):
        ms.QTensor.load(_write(tmp_path, tensors, text))


@pytest.mark.parametrize("change,msg", [({"two_level": "torchao"}, "two_level"),
                                        ({"global_scale_inv": "2.0"}, "global_scale_inv"),
                                        ({"global_scale_inv": -1.0}, "global_scale_inv"),
                                        ({"global_scale_inv": 1234.5}, "not the reciprocal")])
def test_load_rejects_inconsistent_two_level_meta(tmp_path, change, msg):
    """The stored compressed-tensors scale is written back to checkpoints: it must be the
    global scale's reciprocal, and the convention must be the format's."""
    q = ms.quantize(torch.randn(4, 64), "nvfp4", convention="compressed-tensors")
    tensors, meta = q.state_dict()
    q.save(tmp_path / "good.safetensors")
    assert ms.QTensor.load(tmp_path / "good.safetensors").meta == q.meta
    m = json.loads(meta["microscale"])
    m["meta"].update(change)
    with pytest.raises(ValueError, match=rf"bad\.safetensors.*{msg}"):
        ms.QTensor.load(_write(tmp_path, tensors, m))


def test_save_refuses_an_existing_file_unless_overwrite(tmp_path):
    """QTensor.save never replaces a file it was not told to; the new file follows the umask."""
    p = tmp_path / "w.safetensors"
    p.write_bytes(b"precious")
    q = ms.quantize(torch.randn(4, 32), "mxfp4")
    with pytest.raises(FileExistsError, match="overwrite"):
        q.save(p)
    assert p.read_bytes() == b"precious"
    old = os.umask(0o022)
    try:
        q.save(p, overwrite=True)
    finally:
        os.umask(old)
    assert (os.stat(p).st_mode & 0o777) == 0o644
    assert torch.equal(ms.QTensor.load(p).dequantize(torch.float32), q.dequantize(torch.float32))
    assert [f for f in os.listdir(tmp_path) if f != "w.safetensors"] == []  # no temporaries left


def test_load_refuses_a_fifo(tmp_path):
    """A FIFO named like a QTensor file is refused at once instead of blocking the reader."""
    p = tmp_path / "w.safetensors"
    os.mkfifo(p)
    with pytest.raises(ValueError, match="not a regular file"):
        ms.QTensor.load(p)
