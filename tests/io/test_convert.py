"""Streaming conversion: shards, index, skips, side files, atomicity, memory."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import microscale as ms
from microscale import io as msio

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _digest(root):
    h = hashlib.sha256()
    for dp, _, fs in sorted(os.walk(root)):
        for f in sorted(fs):
            h.update(f.encode())
            h.update(open(os.path.join(dp, f), "rb").read())
    return h.hexdigest()


@pytest.mark.parametrize("conv,fmt", [("native", "nvfp4"), ("modelopt", "nvfp4"), ("compressed-tensors", "nvfp4"),
                                      ("compressed-tensors", "mxfp4"), ("native", "int4_affine_g32")])
def test_convert_sharded(tmp_path, toy_checkpoint, conv, fmt):
    before = _digest(toy_checkpoint)
    dst = str(tmp_path / "out")
    s = msio.convert(toy_checkpoint, dst, fmt=fmt, convention=conv, skip=["*q_proj*"], progress=False)
    assert _digest(toy_checkpoint) == before  # input untouched
    assert sorted(s["quantized"]) == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert "model.layers.0.self_attn.q_proj.weight" in s["skipped"]
    assert "lm_head.weight" in s["skipped"] and "model.embed_tokens.weight" in s["skipped"]
    files = sorted(os.listdir(dst))
    assert "model-00001-of-00002.safetensors" in files and "model-00002-of-00002.safetensors" in files
    assert "tokenizer.json" in files and not any(".partial" in f or f.endswith(".tmp") for f in files)
    idx = json.load(open(os.path.join(dst, "model.safetensors.index.json")))
    ck = msio.open_checkpoint(dst)  # the index is consistent with the shards
    assert set(idx["weight_map"]) == set(ck.names)
    assert ck.convention == conv
    out = msio.load(dst)
    src = msio.load(toy_checkpoint)
    f = msio.get_convention(conv).check_format(ms.get_format(fmt))
    for name in s["quantized"]:
        assert isinstance(out[name], ms.QTensor)
        ref = ms.quantize(src[name], f)
        assert torch.equal(out[name].data, ref.data)
        assert torch.equal(out[name].dequantize(), ref.dequantize())
    for name in s["skipped"] + s["copied"]:
        assert torch.equal(out[name], src[name]) and out[name].dtype == src[name].dtype
    cfg = json.load(open(os.path.join(dst, "config.json")))
    assert cfg["model_type"] == "toy"
    if conv == "modelopt":
        hq = json.load(open(os.path.join(dst, "hf_quant_config.json")))
        assert hq["quantization"]["quant_algo"] == "NVFP4"
        assert "model.layers.0.self_attn.q_proj" in hq["quantization"]["exclude_modules"]


def test_gpt_oss_experts(tmp_path, make_checkpoint):
    """gpt-oss quantizes only MoE experts, HF [E, in, out] -> blocks [E, out, in/32, 16]."""
    g = torch.Generator().manual_seed(7)
    src = {"model.layers.0.mlp.experts.gate_up_proj": torch.randn(2, 64, 128, generator=g).bfloat16(),
           "model.layers.0.mlp.experts.gate_up_proj_bias": torch.randn(2, 128, generator=g).bfloat16(),
           "model.layers.0.mlp.experts.down_proj": torch.randn(2, 64, 64, generator=g).bfloat16(),
           "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g).bfloat16()}
    sdir = make_checkpoint(tmp_path / "src", {"model.safetensors": src}, index=False)
    dst, back = str(tmp_path / "q"), str(tmp_path / "f")
    s = msio.convert(sdir, dst, fmt="mxfp4", convention="gpt-oss", progress=False)
    assert sorted(s["quantized"]) == ["model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.experts.gate_up_proj"]
    ck = msio.open_checkpoint(dst)
    assert ck.convention == "gpt-oss"
    assert ck.info("model.layers.0.mlp.experts.gate_up_proj_blocks").shape == (2, 128, 2, 16)
    assert ck.info("model.layers.0.mlp.experts.gate_up_proj_scales").shape == (2, 128, 2)
    assert json.load(open(os.path.join(dst, "config.json")))["quantization_config"]["quant_method"] == "mxfp4"
    msio.convert(dst, back, dequantize=True, progress=False)
    f = msio.open_checkpoint(back)
    w = src["model.layers.0.mlp.experts.gate_up_proj"]
    want = ms.quantize(w.transpose(1, 2), "mxfp4").dequantize(torch.bfloat16).transpose(1, 2)
    assert torch.equal(f.get("model.layers.0.mlp.experts.gate_up_proj"), want)
    assert torch.equal(f.get("model.layers.0.self_attn.q_proj.weight"), src["model.layers.0.self_attn.q_proj.weight"])


def test_dequantize_and_respell(tmp_path, toy_checkpoint):
    q_dir, ct_dir, f_dir = str(tmp_path / "q"), str(tmp_path / "ct"), str(tmp_path / "f")
    msio.convert(toy_checkpoint, q_dir, fmt="nvfp4", convention="modelopt", progress=False)
    msio.convert(q_dir, ct_dir, convention="compressed-tensors", progress=False)  # exact re-spelling
    a, b = msio.load(q_dir), msio.load(ct_dir)
    for k, v in a.items():
        if isinstance(v, ms.QTensor):
            assert torch.equal(v.data, b[k].data) and torch.equal(v.dequantize(), b[k].dequantize())
    s = msio.convert(ct_dir, f_dir, dequantize=True, dtype=torch.float32, progress=False)
    assert len(s["dequantized"]) == 3
    ck = msio.open_checkpoint(f_dir)
    assert ck.convention == "float"
    assert "quantization_config" not in json.load(open(os.path.join(f_dir, "config.json")))
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(ck.get(name), a[name].dequantize(torch.float32))


def test_convert_errors(tmp_path, toy_checkpoint):
    with pytest.raises(ValueError, match="NVFP4 only"):
        msio.convert(toy_checkpoint, tmp_path / "x", fmt="mxfp4", convention="modelopt", progress=False)
    with pytest.raises(ValueError, match="must differ"):
        msio.convert(toy_checkpoint, toy_checkpoint, fmt="mxfp4", progress=False)
    with pytest.raises(FileNotFoundError):
        msio.convert(tmp_path / "nope", tmp_path / "y", fmt="mxfp4", progress=False)
    assert not os.path.exists(tmp_path / "x")


def test_convert_to_gguf(tmp_path, toy_checkpoint):
    pytest.importorskip("gguf")
    dst = str(tmp_path / "m.gguf")
    s = msio.convert(toy_checkpoint, dst, fmt="mxfp4", convention="gguf", progress=False)
    back = msio.load(dst)
    src = msio.load(toy_checkpoint)
    for name in s["quantized"]:
        assert torch.equal(back[name].dequantize(), ms.quantize(src[name], "mxfp4").dequantize())
    assert torch.equal(back["lm_head.weight"], src["lm_head.weight"])  # bf16 kept as BF16
    assert msio.inspect(dst)[0] == "gguf"


_KILL_CHILD = textwrap.dedent("""
    import sys, time, signal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a parent started in the background may ignore it)
    sys.path.insert(0, {root!r})
    from microscale import io as msio
    def tick(name):
        print("done", name, flush=True)
        time.sleep(0.3)
    msio.convert({src!r}, {dst!r}, fmt="mxfp4", progress=False, on_tensor=tick)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_killed_conversion_leaves_no_output(tmp_path, toy_checkpoint, sig):
    dst = str(tmp_path / "out")
    before = _digest(toy_checkpoint)
    code = _KILL_CHILD.format(root=ROOT, src=toy_checkpoint, dst=dst)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("done")  # killed after the first tensor was written
    p.send_signal(sig)
    p.wait(timeout=60)
    assert p.returncode != 0
    assert not os.path.exists(dst)
    leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".out.partial-")]
    if sig == signal.SIGKILL:  # no chance to clean up: the next run removes the stale directory (its lock is free)
        assert len(leftovers) == 2 and sum(f.endswith(".lock") for f in leftovers) == 1
        msio.convert(toy_checkpoint, dst, fmt="mxfp4", progress=False)
        assert os.path.isdir(dst)
        leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".out.partial-")]
    assert leftovers == []
    assert _digest(toy_checkpoint) == before


def test_peak_rss_small(tmp_path):
    """~100 MB checkpoint: peak RSS of the converting process <= 2 x largest tensor + 500 MB,
    and its growth over the post-import baseline <= 2 x largest + 64 MB."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "convert_rss.py"), "--size-mb", "100",
                        "--largest-mb", "32", "--dtype", "float32", "--format", "mxfp8_e4m3", "--json",
                        "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["within_bound"] and r["input_unchanged"]
    assert r["peak_minus_baseline"] <= 2 * r["largest_tensor"] + 64 * 2**20, r


def test_group_split_across_shards_and_unaligned_k(tmp_path, make_checkpoint):
    """A ModelOpt weight whose scales sit in another shard; a K that is not a whole block
    is padded in native (shape kept) and left unquantized in conventions that cannot
    record the original shape."""
    q = ms.quantize(torch.randn(32, 64, generator=torch.Generator().manual_seed(3)), "nvfp4")
    shards = {"model-00001-of-00002.safetensors": {"a.weight": q.data, "a.weight_scale_2": q.global_scale},
              "model-00002-of-00002.safetensors": {"a.weight_scale": q.scales, "b.weight": torch.randn(8, 100)}}
    src = make_checkpoint(tmp_path / "src", shards)
    assert msio.open_checkpoint(src).convention == "modelopt"
    t = msio.load(src)
    assert torch.equal(t["a.weight"].dequantize(), q.dequantize())
    s = msio.convert(src, tmp_path / "n", fmt="nvfp4", convention="native", progress=False)
    assert "b.weight" in s["quantized"]
    assert msio.load(tmp_path / "n")["b.weight"].shape == (8, 100)
    s = msio.convert(src, tmp_path / "m", fmt="nvfp4", convention="modelopt", progress=False)
    assert "b.weight" in s["skipped"] and "a.weight" in s["quantized"]
    assert torch.equal(msio.load(tmp_path / "m")["b.weight"], t["b.weight"])
