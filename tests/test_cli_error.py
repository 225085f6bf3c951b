"""`microscale error`: the table, --json / --plot written atomically under the output rules,
SRC only read, clear refusals."""
import hashlib
import json
import os

import pytest
import torch

from microscale.cli import main


def _save(path, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(path))


@pytest.fixture
def ckpt(tmp_path):
    """A float checkpoint folder of two shards with an index, a config and a README."""
    d = tmp_path / "src"
    d.mkdir()
    g = torch.Generator().manual_seed(0)
    _save(d / "a.safetensors", {"l0.weight": torch.randn(64, 128, generator=g), "embed.weight": torch.randn(8, 64)})
    _save(d / "b.safetensors", {"l1.weight": torch.randn(32, 64, generator=g).to(torch.bfloat16),
                                "norm.weight": torch.ones(64)})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "l0.weight": "a.safetensors", "embed.weight": "a.safetensors", "l1.weight": "b.safetensors",
        "norm.weight": "b.safetensors"}}))
    (d / "config.json").write_text("{}")
    return d


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _rows(out):
    """(format, method) -> cells of the ranking table."""
    rows = {}
    for line in out.splitlines():
        p = line.split()
        if p and p[0].isdigit() and len(p) >= 8:
            rows[(p[1], p[2])] = p
    return rows


def test_table_json_and_src_untouched(tmp_path, ckpt, capsys):
    before = _digest(ckpt)
    js = tmp_path / "out" / "err.json"
    assert main(["error", str(ckpt), "-q", "--formats", "nvfp4,mxfp4", "mxfp8_e4m3", "--method", "rtn", "4over6",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {("nvfp4", "rtn"), ("nvfp4", "4over6"), ("mxfp4", "rtn"), ("mxfp8_e4m3", "rtn")}
    assert "2 tensors" in out and "4over6 does not apply to mxfp4, mxfp8_e4m3" in out
    assert rows[("mxfp4", "rtn")][3] == "4.250" and rows[("mxfp8_e4m3", "rtn")][3] == "8.250"
    assert [r[0] for r in sorted(rows.values(), key=lambda r: -float(r[4]))] == ["1", "2", "3", "4"]
    doc = json.loads(js.read_text())
    assert [t["name"] for t in doc["tensors"]] == ["l0.weight", "l1.weight"]
    assert {(r["format"], r["method"]) for r in doc["results"]} == set(rows)
    for r in doc["results"]:
        assert f"{r['sqnr_db']:.2f}" == rows[(r["format"], r["method"])][4]
    assert len(doc["per_tensor"]) == 2 * 4
    assert _digest(ckpt) == before
    assert sorted(os.listdir(js.parent)) == ["err.json"]  # no temporaries left


def test_single_file_per_tensor_and_default_skip(tmp_path, capsys):
    f = tmp_path / "m.safetensors"
    _save(f, {"model.embed_tokens.weight": torch.randn(16, 64), "l.weight": torch.randn(16, 64)})
    assert main(["error", str(f), "-q", "-F", "mxfp4", "--per-tensor"]) == 0
    out = capsys.readouterr().out
    assert "1 tensors" in out and "matched skip pattern '*embed*'" in out
    assert any(line.startswith("l.weight") and "mxfp4" in line for line in out.splitlines())
    assert main(["error", str(f), "-q", "-F", "mxfp4", "--no-default-skip"]) == 0
    assert "2 tensors" in capsys.readouterr().out


def test_output_rules(tmp_path, ckpt, capsys):
    js = tmp_path / "err.json"
    js.write_text("keep")
    assert main(["error", str(ckpt), "-q", "-F", "mxfp4", "--json", str(js)]) == 2
    assert "exists" in capsys.readouterr().err and js.read_text() == "keep"
    assert main(["error", str(ckpt), "-q", "-F", "mxfp4", "--json", str(js), "--overwrite"]) == 0
    assert json.loads(js.read_text())["formats"] == ["mxfp4"]
    before = _digest(ckpt)
    for bad in (ckpt / "err.json", ckpt, ckpt / "a.safetensors"):  # inside or equal to SRC: never written
        assert main(["error", str(ckpt), "-q", "-F", "mxfp4", "--json", str(bad), "--overwrite"]) == 2
        assert "SRC" in capsys.readouterr().err
    assert _digest(ckpt) == before
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert main(["error", str(ckpt), "-q", "-F", "mxfp4", "--json", str(link), "--overwrite"]) == 2
    assert "symbolic link" in capsys.readouterr().err and not (tmp_path / "elsewhere.json").exists()
    assert main(["error", str(ckpt), "-q", "--json", str(js), "--plot", str(js), "--overwrite"]) == 2
    assert "same file" in capsys.readouterr().err


def test_plot(tmp_path, ckpt, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "err.png"
    assert main(["error", str(ckpt), "-q", "-F", "nvfp4", "mxfp4", "-m", "rtn,mse", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out


def test_progress_bar(ckpt, capsys, monkeypatch):
    from microscale.accuracy import report

    monkeypatch.setattr(report, "_BAR_DELAY", 0.0)  # as a long run shows it
    assert main(["error", str(ckpt), "-F", "mxfp4"]) == 0
    err = capsys.readouterr().err
    assert "error: 100%" in err and "elem" in err
    assert main(["error", str(ckpt), "-F", "mxfp4", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_refusals(tmp_path, ckpt, capsys):
    assert main(["error", str(ckpt), "-q", "-F", "nope"]) == 2
    assert "'nope' is not in the registry" in capsys.readouterr().err
    assert main(["error", str(ckpt), "-q", "-m", "gptq"]) == 2
    assert "calibration" in capsys.readouterr().err
    assert main(["error", str(tmp_path / "missing"), "-q"]) == 2
    assert "no such file" in capsys.readouterr().err
    q = tmp_path / "q"
    assert main(["quantize", str(ckpt), str(q), "-f", "nvfp4", "-q"]) == 0
    capsys.readouterr()
    assert main(["error", str(q), "-q"]) == 2
    assert "quantized checkpoint" in capsys.readouterr().err
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    assert main(["error", str(fifo), "-q"]) == 2  # refused without blocking
    assert "not a regular file" in capsys.readouterr().err
