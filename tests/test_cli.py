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


# ---- a fresh machine: help, version, names, pipes, devices ----------------------------------
@pytest.mark.parametrize("cmd,wanted", [
    ("quantize", ["SRC", "DST", "never modified", "--convention", "modelopt", "--scale-rule", "rceil",
                  "--block-size", "positive", "--overwrite", "examples:"]),
    ("convert", ["SRC", "DST", "compressed-tensors", "--overwrite", "examples:"]),
    ("dequantize", ["SRC", "DST", "--dtype", "--overwrite", "examples:"]),
    ("inspect", ["PATH", ".gguf", "examples:"]),
    ("demo", ["--device", "examples:"]),
    ("formats", ["--markdown", "examples:"]),
])
def test_help_explains_every_argument(capsys, cmd, wanted):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for w in wanted:
        assert w in out, (cmd, w)
    for line in out.splitlines():  # every argument line carries a help text
        if line.strip() in ("SRC", "DST", "PATH"):
            raise AssertionError(f"{cmd}: {line.strip()} has no help")


def test_version(capsys):
    import microscale

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"microscale {microscale.__version__}"


def test_format_and_convention_names_are_case_insensitive(tmp_path, ckpt, capsys):
    assert main(["quantize", ckpt, str(tmp_path / "a"), "-f", "NVFP4", "-c", "Compressed_Tensors", "-q"]) == 0
    assert "quantized to nvfp4 (compressed-tensors)" in capsys.readouterr().out


def test_block_size_is_checked_and_named(tmp_path, ckpt, capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", ckpt, str(tmp_path / "z"), "-f", "nvfp4", "--block-size", "0"])
    assert e.value.code == 2 and "positive block size" in capsys.readouterr().err
    assert main(["quantize", ckpt, str(tmp_path / "b"), "-f", "nvfp4", "--block-size", "64", "-q"]) == 0
    assert "quantized to nvfp4_b64" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "b")]) == 0
    assert "nvfp4_b64" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith("l.weight"))


def test_quantize_into_the_current_folder_is_refused(tmp_path, ckpt, capsys, monkeypatch):
    """`microscale quantize mymodel .` once replaced the current folder, SRC included."""
    work = tmp_path
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for extra in ([], ["--overwrite"]):
        assert main(["quantize", "src", ".", "-f", "nvfp4", "-q", *extra]) == 2
        assert "must differ from SRC" in capsys.readouterr().err
    assert (work / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(work / "src")) == ["config.json", "model.safetensors"]


def test_existing_dst_needs_overwrite(tmp_path, ckpt, capsys):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    assert main(["quantize", ckpt, str(dst), "-f", "nvfp4", "-q"]) == 2
    assert "--overwrite" in capsys.readouterr().err and (dst / "keep.txt").exists()
    assert main(["quantize", ckpt, str(dst), "-f", "nvfp4", "-q", "--overwrite"]) == 0
    assert sorted(os.listdir(dst)) == ["config.json", "model.safetensors"]


def test_skipped_side_files_are_printed(tmp_path, ckpt, capsys):
    open(os.path.join(ckpt, "pytorch_model.bin"), "wb").write(b"weights")
    assert main(["quantize", ckpt, str(tmp_path / "q"), "-f", "nvfp4", "-q"]) == 0
    assert "not copied: pytorch_model.bin (not on the side-file allow-list)" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "q" / "pytorch_model.bin")


def test_silent_no_ops_are_errors(tmp_path, ckpt, capsys):
    assert main(["quantize", ckpt, str(tmp_path / "o"), "-f", "mxfp4", "-c", "gpt-oss", "-q"]) == 2
    assert "gpt-oss" in capsys.readouterr().err
    assert main(["dequantize", ckpt, str(tmp_path / "d"), "-q"]) == 2
    assert "no quantized tensors" in capsys.readouterr().err
    assert main(["convert", ckpt, str(tmp_path / "c"), "-c", "modelopt", "-q"]) == 2
    assert "no quantized tensors" in capsys.readouterr().err
    assert not any(os.path.exists(tmp_path / n) for n in "odc")


def test_json_given_as_safetensors(tmp_path, capsys):
    p = tmp_path / "x.safetensors"
    p.write_text(json.dumps({"weight_map": {"a": "model.safetensors"}}))
    assert main(["inspect", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"not a safetensors file: {p}" in err and len(err.splitlines()) == 1


def test_inspect_into_a_closed_pipe(tmp_path):
    """`microscale inspect X | head` ends without a traceback."""
    import subprocess
    import sys

    from microscale.io import SafetensorsWriter

    w = SafetensorsWriter(str(tmp_path / "m.safetensors"))
    for i in range(3000):
        w.add(f"model.layers.{i}.some.rather.long.tensor.name.weight", torch.zeros(1))
    w.close()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.Popen([sys.executable, "-m", "microscale", "inspect", str(tmp_path / "m.safetensors")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
                         env={**os.environ, "PYTHONPATH": root})
    p.stdout.readline()
    p.stdout.close()  # as head does after its lines
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode == 141


def test_demo_on_cuda_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no usable CUDA GPU" in err and "--device cpu" in err
    assert main(["demo", "--device", "nonsense"]) == 2


def test_install_hints_name_installable_packages(monkeypatch):
    import builtins

    from microscale.io import gguf_io

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError) as e:
        gguf_io._gguf()
    assert "pip install 'gguf>=0.19'" in str(e.value) and "pip install -e '.[gguf]'" in str(e.value)
    assert "microscale[" not in str(e.value)


def test_demo_run_on_cuda_without_a_gpu_from_python(monkeypatch):
    from microscale import demo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no usable CUDA GPU"):
        demo.run(device="cuda")
