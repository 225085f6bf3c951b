"""Each convention round-trips bit-identically; peer-written files load exactly."""
import hashlib
import json
import os

import pytest
import torch

import microscale as ms
from microscale import io as msio
from microscale.io.conventions import CONVENTIONS

CASES = [("native", f) for f in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4_affine_g32", "int8_fp16",
                                 "fp8_e4m3_block128x128")]
CASES += [("modelopt", "nvfp4"), ("compressed-tensors", "nvfp4"), ("compressed-tensors", "mxfp4"),
          ("gpt-oss", "mxfp4"), ("gguf", "nvfp4"), ("gguf", "mxfp4")]


def _bits(t):
    return None if t is None else t.reshape(-1).view(torch.uint8) if t.element_size() == 1 else t.reshape(-1)


def _same(a: ms.QTensor, b: ms.QTensor) -> bool:
    return (a.shape == b.shape and torch.equal(a.data, b.data) and torch.equal(_bits(a.scales), _bits(b.scales))
            and (a.global_scale is None) == (b.global_scale is None)
            and (a.global_scale is None or torch.equal(a.global_scale.reshape(()), b.global_scale.reshape(())))
            and (a.zero_points is None or torch.equal(a.zero_points, b.zero_points)))


def _digest(path):
    h = hashlib.sha256()
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path))
    for f in files:
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


@pytest.mark.parametrize("conv,fmt", CASES, ids=[f"{c}-{f}" for c, f in CASES])
def test_roundtrip_bit_identical(tmp_path, conv, fmt):
    g = torch.Generator().manual_seed(1)
    shape = (2, 128, 256) if conv == "gpt-oss" else (128, 256)
    w = torch.randn(*shape, generator=g) * 0.02
    w[0, :16] = 0.0  # a zero block
    f = msio.get_convention(conv).check_format(ms.get_format(fmt))
    q = ms.quantize(w, f)
    ext = ".gguf" if conv == "gguf" else ""
    p1, p2 = str(tmp_path / ("a" + ext)), str(tmp_path / ("b" + ext))
    tensors = {"layer.weight": q, "layer.bias": torch.randn(shape[-2], generator=g)}
    msio.save(tensors, p1, convention=conv)
    back = msio.load(p1)
    assert set(back) == set(tensors)
    assert _same(q, back["layer.weight"])
    assert torch.equal(back["layer.bias"], tensors["layer.bias"])
    assert torch.equal(back["layer.weight"].dequantize(), q.dequantize())
    if conv != "gguf":
        assert msio.open_checkpoint(p1).convention == conv
    msio.save(back, p2, convention=conv)  # export of the import: the same bytes
    assert _digest(p1) == _digest(p2)


def test_registry_lists_conventions():
    assert {"native", "modelopt", "compressed-tensors", "gpt-oss", "gguf"} <= set(CONVENTIONS)
    with pytest.raises(ValueError, match="NVFP4 only"):
        msio.get_convention("modelopt").check_format(ms.get_format("mxfp4"))


# ---- ModelOpt: tensors built from the FORMATS.md formulas -------------------------------
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def test_modelopt_formula_tensors_load(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(2)
    n, k = 32, 64
    w = torch.randn(n, k, generator=g)
    s2 = w.abs().amax() / 2688.0  # weight_scale_2 = amax/2688
    amax_b = w.reshape(n, k // 16, 16).abs().amax(-1)
    sb = (amax_b / (6 * s2)).to(torch.float8_e4m3fn)  # RNE cast, no clamp
    x = w.reshape(n, k // 16, 16) / (sb.float() * s2).unsqueeze(-1)
    codes = (x.unsqueeze(-1) - E2M1[:8]).abs().argmin(-1).to(torch.uint8)  # nearest magnitude
    codes = codes | ((x < 0).to(torch.uint8) << 3)
    codes = codes.reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    save_file({"m.weight": packed, "m.weight_scale": sb, "m.weight_scale_2": s2.reshape(()),
               "m.input_scale": torch.tensor(0.25)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                             "exclude_modules": []}}))
    ck = msio.open_checkpoint(tmp_path)
    assert ck.convention == "modelopt"
    q = msio.load(tmp_path)["m.weight"]
    want = E2M1[codes.long()] * sb.float().repeat_interleave(16, 1) * s2
    assert torch.equal(q.dequantize(torch.float32), want)
    assert q.meta["input_scale"]["values"] == [0.25]


def test_gpt_oss_formula(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (2, 8, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(118, 136, (2, 8, 4), generator=g, dtype=torch.uint8)
    save_file({"experts.down_proj_blocks": blocks, "experts.down_proj_scales": scales},
              str(tmp_path / "model.safetensors"))
    q = msio.load(tmp_path)["experts.down_proj"]
    lo, hi = (blocks & 0xF).long(), (blocks >> 4).long()
    vals = torch.stack([E2M1[lo], E2M1[hi]], -1).reshape(2, 8, 4, 32)
    want = torch.ldexp(vals, (scales.int() - 127).unsqueeze(-1)).reshape(2, 8, 128)
    assert torch.equal(q.dequantize(torch.float32), want)


# ---- GGUF: llama.cpp's layout, checked against the gguf package's own dequantizer ----------
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_gguf_layout_matches_gguf_package(tmp_path, fmt):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    g = torch.Generator().manual_seed(4)
    q = ms.quantize(torch.randn(16, 256, generator=g), fmt)
    from microscale.io.gguf_io import gguf_type, qtensor_to_gguf_bytes

    raw = qtensor_to_gguf_bytes(q).numpy()
    theirs = torch.from_numpy(dequantize(raw, gguf_type(q.fmt)).copy())
    if q.global_scale is not None:
        theirs = theirs * q.global_scale
    assert torch.equal(theirs.float(), q.dequantize(torch.float32))
    assert gguf.GGMLQuantizationType.MXFP4 == 39 and gguf.GGMLQuantizationType.NVFP4 == 40


# ---- compressed-tensors: files written by the library's own packers -----------------------
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compressed_tensors_library_files_load(tmp_path, fmt):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.mxfp4 import MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16, NVFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import save_file

    preset, comp, gsz = (NVFP4, NVFP4PackedCompressor, 16) if fmt == "nvfp4" else (MXFP4A16, MXFP4PackedCompressor, 32)
    g = torch.Generator().manual_seed(5)
    n, k = 64, 256
    w = torch.randn(n, k, generator=g) * 0.05
    args = preset["weights"]
    b = w.reshape(n, k // gsz, gsz)
    gs = generate_gparam(w.min(), w.max()) if fmt == "nvfp4" else None
    scale, zp = calculate_qparams(b.amin(-1), b.amax(-1), args, global_scale=gs)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    sd = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    if gs is not None:
        sd["weight_global_scale"] = gs
    out = comp.compress(sd, scheme)
    ref = comp.decompress(dict(out), scheme)["weight"]
    save_file({f"layer.{k_}": v.contiguous() for k_, v in out.items()}, str(tmp_path / "model.safetensors"))
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=f"{fmt}-pack-quantized",
                            quantization_status="compressed").model_dump(mode="json")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))

    ck = msio.open_checkpoint(tmp_path)
    assert ck.convention == "compressed-tensors"
    q = msio.load(tmp_path)["layer.weight"]
    assert torch.equal(q.data, out["weight_packed"])
    assert torch.equal(q.scales.view(torch.uint8), out["weight_scale"].view(torch.uint8))
    if gs is not None:
        assert q.meta["global_scale_inv"] == float(gs)
    # our export writes the library's bytes back
    msio.save({"layer.weight": q}, tmp_path / "re", convention="compressed-tensors")
    re = msio.open_checkpoint(tmp_path / "re")
    for k_, v in out.items():
        assert torch.equal(re.get("layer." + k_).reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k_
    # our config.json parses with the library's schema
    QuantizationConfig.model_validate(json.loads((tmp_path / "re" / "config.json").read_text())["quantization_config"])
    # our quantizer (compressed-tensors convention) makes the same codes and scales
    q2 = ms.quantize(w, msio.get_convention("compressed-tensors").check_format(ms.get_format(fmt)))
    assert torch.equal(q2.data, out["weight_packed"])
    assert torch.equal(q2.scales.view(torch.uint8), out["weight_scale"].view(torch.uint8))
    # dequantized values: identical for mxfp4; nvfp4 differs only by op order (x*(s/gs) vs x*s*(1/gs))
    ours = q.dequantize(torch.float32).to(ref.dtype)
    if fmt == "mxfp4":
        assert torch.equal(ours, ref)
    else:
        torch.testing.assert_close(ours.float(), ref.float(), rtol=2 ** -7, atol=0)


# ---- corrupt files ---------------------------------------------------------------------
def _good(tmp_path):
    from safetensors.torch import save_file

    p = str(tmp_path / "model.safetensors")
    save_file({"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(8, 8)}, p)
    return p


def test_truncated_file(tmp_path):
    p = _good(tmp_path)
    data = open(p, "rb").read()
    open(p, "wb").write(data[:-10])
    with pytest.raises(msio.SafetensorsError, match="truncated"):
        msio.open_checkpoint(p)
    open(p, "wb").write(data[:5])
    with pytest.raises(msio.SafetensorsError, match="truncated"):
        msio.open_checkpoint(p)


def test_corrupt_header(tmp_path):
    p = _good(tmp_path)
    data = bytearray(open(p, "rb").read())
    data[8] = ord("#")  # the opening brace
    open(p, "wb").write(bytes(data))
    with pytest.raises(msio.SafetensorsError, match="not valid JSON"):
        msio.open_checkpoint(p)
    open(p, "wb").write(b"\xff" * 64)
    with pytest.raises(msio.SafetensorsError, match="header length"):
        msio.open_checkpoint(p)


def _rewrite_header(p, fn):
    import struct

    data = open(p, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8:8 + n])
    fn(h)
    raw = json.dumps(h).encode()
    raw += b" " * (-len(raw) % 8)
    open(p, "wb").write(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


@pytest.mark.parametrize("lie,match", [
    (lambda h: h["a"].update(shape=[65]), "lying header"),
    (lambda h: h["a"].update(dtype="F64"), "lying header"),
    (lambda h: h["b"].update(data_offsets=[0, 256]), "overlaps"),
    (lambda h: h["a"].update(dtype="Q4"), "unsupported dtype"),
    (lambda h: h["b"].update(data_offsets=[256, 10**9]), "truncated|lying"),
])
def test_lying_header(tmp_path, lie, match):
    p = _good(tmp_path)
    _rewrite_header(p, lie)
    with pytest.raises(msio.SafetensorsError, match=match):
        msio.open_checkpoint(p)


def test_index_mismatch(tmp_path, toy_checkpoint):
    idx = os.path.join(toy_checkpoint, "model.safetensors.index.json")
    j = json.load(open(idx))
    j["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    json.dump(j, open(idx, "w"))
    with pytest.raises(ValueError, match="lm_head.weight"):
        msio.open_checkpoint(toy_checkpoint)


def test_activation_scale_carried_across_conventions(tmp_path):
    q = ms.quantize(torch.randn(32, 64), "nvfp4")
    q.meta["input_scale"] = {"shape": [], "values": [0.5]}
    msio.save({"m.weight": q}, tmp_path / "mo", convention="modelopt")
    msio.convert(tmp_path / "mo", tmp_path / "ct", convention="compressed-tensors", progress=False)
    ck = msio.open_checkpoint(tmp_path / "ct")
    assert float(ck.get("m.input_global_scale")) == 2.0  # compressed-tensors stores the reciprocal
    msio.convert(tmp_path / "ct", tmp_path / "mo2", convention="modelopt", progress=False)
    assert float(msio.open_checkpoint(tmp_path / "mo2").get("m.input_scale")) == 0.5


def test_gguf_package_quantizer_output_loads(tmp_path):
    """Blocks made by gguf's own MXFP4 quantizer (llama.cpp's reference in Python) decode to
    the values of our OCP FLOOR quantization; the bytes differ only in the sign of zero
    (ggml writes +0 where we keep -0)."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    from microscale.io.gguf_io import gguf_bytes_to_qtensor

    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(9))
    raw = torch.from_numpy(quantize(x.numpy(), T.MXFP4))
    theirs = gguf_bytes_to_qtensor(raw, "MXFP4", (64, 512))
    ours = ms.quantize(x, "mxfp4")
    assert torch.equal(theirs.scales, ours.scales)
    assert torch.equal(theirs.dequantize(), ours.dequantize())


@pytest.mark.parametrize("conv", ["modelopt", "compressed-tensors", "gguf"])
def test_padded_tensor_rejected_outside_native(tmp_path, conv):
    q = ms.quantize(torch.randn(8, 100), "nvfp4", pad=True)
    with pytest.raises(ValueError, match="padded"):
        msio.save({"w.weight": q}, tmp_path / ("x.gguf" if conv == "gguf" else "x"), convention=conv)
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "x.gguf")


# ---- compressed-tensors: config.json agrees with the tensors -------------------------------
@pytest.mark.parametrize("with_inputs", [True, False], ids=["input_global_scale", "weight_only"])
def test_compressed_tensors_config_declares_input_activations(tmp_path, with_inputs):
    """A checkpoint with ``input_global_scale`` tensors declares compressed-tensors' own NVFP4
    input_activations; applied to a model by compressed-tensors, the config registers exactly
    the scale tensors the file holds (a strict load finds nothing missing or unexpected)."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.quant_scheme import NVFP4, NVFP4A16
    from torch import nn

    q = ms.quantize(torch.randn(32, 64, generator=torch.Generator().manual_seed(11)),
                    msio.get_convention("compressed-tensors").check_format(ms.get_format("nvfp4")))
    if with_inputs:
        q.meta["input_scale"] = {"shape": [], "values": [0.5]}  # e.g. from ModelOpt
    msio.save({"lin.weight": q}, tmp_path / "mo", convention="modelopt")
    msio.convert(tmp_path / "mo", tmp_path / "ct", convention="compressed-tensors", progress=False)
    msio.save({"lin.weight": q}, tmp_path / "ct2", convention="compressed-tensors")
    for out in ("ct", "ct2"):
        qc = json.loads((tmp_path / out / "config.json").read_text())["quantization_config"]
        cfg = QuantizationConfig.model_validate(qc)
        group = cfg.config_groups["group_0"]
        preset = NVFP4 if with_inputs else NVFP4A16
        assert group.weights == QuantizationArgs.model_validate(preset["weights"].model_dump())
        if with_inputs:
            assert group.input_activations == preset["input_activations"]
        else:
            assert group.input_activations is None
        model = nn.Module()
        model.lin = nn.Linear(64, 32, bias=False)
        apply_quantization_config(model, cfg)
        expected = {k for k in model.state_dict() if k != "lin.weight"}
        ck = msio.open_checkpoint(tmp_path / out)
        held = {k for k in ck.names if k != "lin.weight_packed"}
        assert held == expected, out
        sd = {k: ck.get(k).float() for k in held}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert unexpected == [] and set(missing) == {"lin.weight"}


def test_modelopt_compressed_tensors_reciprocal_rounding_measured(tmp_path):
    """ModelOpt -> compressed-tensors -> ModelOpt keeps codes and block scales bit for bit, but
    compressed-tensors stores 1/weight_scale_2 in float32 and, for some tensors, no float32
    reciprocal inverts back: weight_scale_2 comes back one ulp off. The conversion warns and
    keeps the exact source value in the safetensors metadata of those tensors."""
    from microscale.io.conventions import RECIPROCAL_SUFFIX, ReciprocalRoundingWarning

    g = torch.Generator().manual_seed(12)
    n = 200
    tensors = {}
    for i in range(n):
        amp = float(torch.exp(torch.empty(()).uniform_(-7, 2, generator=g)))
        tensors[f"l{i}.weight"] = ms.quantize(torch.randn(16, 64, generator=g) * amp, "nvfp4")
    msio.save(tensors, tmp_path / "mo", convention="modelopt")
    with pytest.warns(ReciprocalRoundingWarning, match="reciprocal"):
        msio.convert(tmp_path / "mo", tmp_path / "ct", convention="compressed-tensors", progress=False)
    msio.convert(tmp_path / "ct", tmp_path / "mo2", convention="modelopt", progress=False)
    a, ct, b = (msio.open_checkpoint(tmp_path / d) for d in ("mo", "ct", "mo2"))
    inexact = []
    for i in range(n):
        m = f"l{i}"
        assert torch.equal(a.get(m + ".weight"), b.get(m + ".weight"))
        assert torch.equal(a.get(m + ".weight_scale").view(torch.uint8), b.get(m + ".weight_scale").view(torch.uint8))
        s, s_back = a.get(m + ".weight_scale_2"), b.get(m + ".weight_scale_2")
        ulps = abs(int(s.view(torch.int32)) - int(s_back.view(torch.int32)))
        assert ulps <= 1, m
        key = m + ".weight_global_scale" + RECIPROCAL_SUFFIX
        if ulps:
            inexact.append(m)
            assert json.loads(ct.metadata[key]) == [float(s)]  # the exact source value is kept
        else:
            assert key not in ct.metadata
    # measured: about 15% of float32 values (14-17% over realistic scale ranges) lose one ulp
    assert 0.05 < len(inexact) / n < 0.30, len(inexact)
    # decoded values: the scale's 2^-23 plus two roundings, at most 2^-22 relative (2 float32 ulps)
    da, db = msio.load(tmp_path / "mo"), msio.load(tmp_path / "mo2")
    worst = 0
    for m in inexact:
        x, y = da[m + ".weight"].dequantize(torch.float32), db[m + ".weight"].dequantize(torch.float32)
        assert bool(((x - y).abs() <= 2 ** -22 * x.abs()).all()), m
        worst = max(worst, int((x.view(torch.int32) - y.view(torch.int32)).abs().max()))
    assert 1 <= worst <= 2
