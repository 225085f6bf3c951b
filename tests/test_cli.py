import json
import os

import pytest
import torch

from microscale.cli import main


@pytest.fixture
def ckpt(tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "src"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"l.weight": torch.randn(64, 128, generator=g), "l.bias": torch.randn(64, generator=g),
               "norm.weight": torch.ones(128)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "toy"}))
    return str(d)


def test_formats(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "nvfp4" in out and "mxfp4" in out


@pytest.mark.parametrize("conv", ["native", "modelopt", "compressed-tensors"])
def test_quantize_inspect_dequantize(tmp_path, ckpt, capsys, conv):
    dst, deq = str(tmp_path / "q"), str(tmp_path / "deq")
    assert main(["quantize", ckpt, dst, "--format", "nvfp4", "--convention", conv, "-q"]) == 0
    assert "1 tensors quantized" in capsys.readouterr().out
    assert main(["inspect", dst]) == 0
    out = capsys.readouterr().out
    assert f"convention {conv}" in out
    line = next(l for l in out.splitlines() if l.startswith("l.weight"))
    assert "nvfp4" in line and "64x128" in line and line.split()[-1] == str(64 * 64 + 64 * 8 + 4)
    assert main(["dequantize", dst, deq, "--dtype", "fp32", "-q"]) == 0
    assert main(["inspect", deq]) == 0
    assert "convention float" in capsys.readouterr().out


def test_quantize_gguf_and_convert(tmp_path, ckpt, capsys):
    pytest.importorskip("gguf")
    assert main(["quantize", ckpt, str(tmp_path / "m.gguf"), "-f", "mxfp4", "-c", "gguf", "-q"]) == 0
    assert main(["inspect", str(tmp_path / "m.gguf")]) == 0
    assert "convention gguf" in capsys.readouterr().out
    assert main(["quantize", ckpt, str(tmp_path / "a"), "-f", "mxfp4", "-c", "compressed-tensors", "-q"]) == 0
    assert main(["convert", str(tmp_path / "a"), str(tmp_path / "b"), "-c", "gpt-oss", "-q"]) == 0
    assert main(["inspect", str(tmp_path / "b")]) == 0
    assert "convention gpt-oss" in capsys.readouterr().out


def test_errors(tmp_path, ckpt, capsys):
    assert main(["quantize", ckpt, str(tmp_path / "x"), "-f", "mxfp4", "-c", "modelopt", "-q"]) == 2
    assert "NVFP4 only" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    assert main(["inspect", str(tmp_path / "bad.safetensors")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["quantize", ckpt, str(tmp_path / "y"), "-f", "nope"])


def test_bench_subcommand_delegates_to_the_harness(capsys):
    assert main(["bench", "--list", "--ops", "quantize", "--formats", "mxfp4"]) == 0
    out = capsys.readouterr().out
    assert "quantize/mxfp4/" in out and "linear/" not in out


def test_docs_format_table_is_current(capsys):
    from pathlib import Path

    assert main(["formats", "--markdown"]) == 0
    table = capsys.readouterr().out
    doc = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text()
    assert table in doc, "docs/formats.md is stale: regenerate it with `microscale formats --markdown`"
    assert "| `nvfp4` | e2m1 | 16 | ue4m3+fp32 tensor | amax | 4.500 |" in table
