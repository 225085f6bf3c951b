"""error_report: per-tensor and model-total errors of each (format, method), against numbers
computed here from ms.quantize; ranking, the front, tensor selection."""
import math

import pytest
import torch
from torch import nn

import microscale as ms
from microscale.accuracy.report import error_report, format_report, parse_formats


def _tensors(gen):
    w = torch.randn(64, 256, generator=gen)
    w[0, :4] *= 30  # a few outliers
    return {"layers.0.q.weight": w, "layers.0.k.weight": torch.randn(32, 128, generator=gen).to(torch.bfloat16),
            "embed.weight": torch.randn(10, 128, generator=gen), "norm.weight": torch.ones(128),
            "small.weight": torch.randn(4, 64, generator=gen)}


def _direct(x, fmt, method):
    """(noise, signal, bytes) of quantizing x, computed here in float64."""
    q = ms.quantize(x, fmt, method=method, pad=True)
    d = x.double() - q.dequantize(torch.float64)
    return float((d * d).sum()), float((x.double() ** 2).sum()), q.nbytes


def test_numbers_match_direct_computation(gen):
    t = _tensors(gen)
    fmts, methods = ["nvfp4", "mxfp4", "mxfp8_e4m3"], ["rtn", "mse", "4over6"]
    r = error_report(t, fmts, methods)
    names = ["layers.0.q.weight", "layers.0.k.weight", "small.weight"]
    assert [d["name"] for d in r["tensors"]] == names
    assert {(d["format"], d["method"]) for d in r["not_applicable"]} == {("mxfp4", "4over6"),
                                                                         ("mxfp8_e4m3", "4over6")}
    assert len(r["results"]) == 7 and len(r["per_tensor"]) == 7 * 3
    for row in r["results"]:
        parts = [_direct(t[n], row["format"], row["method"]) for n in names]
        noise, signal, nbytes = (sum(p[i] for p in parts) for i in range(3))
        assert row["rel_fro"] == pytest.approx(math.sqrt(noise / signal), rel=1e-9)
        assert row["sqnr_db"] == pytest.approx(10 * math.log10(signal / noise), rel=1e-9)
        assert row["bytes"] == nbytes and row["elements"] == 64 * 256 + 32 * 128 + 4 * 64
        assert row["bits_per_element"] == pytest.approx(8 * nbytes / row["elements"], rel=1e-12)
    for row in r["per_tensor"]:
        noise, signal, nbytes = _direct(t[row["name"]], row["format"], row["method"])
        assert row["sqnr_db"] == pytest.approx(10 * math.log10(signal / noise), rel=1e-9)
    q_rows = {(d["format"], d["method"]): d for d in r["per_tensor"] if d["name"] == "layers.0.q.weight"}
    assert q_rows[("nvfp4", "rtn")]["bits_per_element"] == pytest.approx(4 + 8 / 16 + 32 / (64 * 256))
    assert q_rows[("mxfp4", "rtn")]["bits_per_element"] == 4.25


def test_ranking_and_front(gen):
    r = error_report(_tensors(gen), ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int8_fp16"], ["rtn", "mse"])
    rows = r["results"]
    assert [x["sqnr_db"] for x in rows] == sorted((x["sqnr_db"] for x in rows), reverse=True)
    for x in rows:  # the front, by its definition (bits to 0.001)
        bx = round(x["bits_per_element"], 3)
        beaten = any(round(o["bits_per_element"], 3) <= bx and o["sqnr_db"] >= x["sqnr_db"]
                     and (round(o["bits_per_element"], 3) < bx or o["sqnr_db"] > x["sqnr_db"]) for o in rows)
        assert x["pareto"] is (not beaten)
    by = {(x["format"], x["method"]): x for x in rows}
    assert by[("mxfp6_e2m3", "rtn")]["sqnr_db"] > by[("mxfp4", "rtn")]["sqnr_db"]
    assert not by[("mxfp8_e4m3", "rtn")]["pareto"]  # mxfp6 has fewer bits and a lower error here
    assert all(by[(f, "mse")]["sqnr_db"] >= by[(f, "rtn")]["sqnr_db"] for f in ("nvfp4", "mxfp4"))
    r2 = error_report({"w": _tensors(gen)["layers.0.q.weight"]}, ["nvfp4", "int4_fp16"], ["mse"])
    by2 = {x["format"]: x for x in r2["results"]}  # 4.502 vs 4.500 bits: the global scale counts here
    assert by2["nvfp4"]["bits_per_element"] > by2["int4_fp16"]["bits_per_element"]
    assert by2["int4_fp16"]["pareto"]
    assert by2["nvfp4"]["pareto"] is (by2["nvfp4"]["sqnr_db"] > by2["int4_fp16"]["sqnr_db"])
    text = format_report(r, per_tensor=True)
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["rank", "format", "method"]
    assert lines[2].split()[:3] == ["1", rows[0]["format"], rows[0]["method"]]
    assert "layers.0.k.weight" in text and "matched skip pattern '*embed*'" in text


def test_selection(gen):
    t = _tensors(gen)
    r = error_report(t, ["mxfp4"])
    assert [d["name"] for d in r["tensors"]] == ["layers.0.q.weight", "layers.0.k.weight", "small.weight"]
    r = error_report(t, ["mxfp4", "int4_affine_g128"])  # small.weight has one 64-element row: not for g128
    assert "small.weight" not in [d["name"] for d in r["tensors"]]
    assert {"name": "small.weight", "reason": "too small for int4_affine_g128 (every format ranks the same "
            "tensors)"} in r["skipped"]
    r = error_report(t, ["mxfp4"], skip=["*k*"], default_skip=False)
    assert [d["name"] for d in r["tensors"]] == ["layers.0.q.weight", "embed.weight", "small.weight"]


def test_a_module(gen):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    r = error_report(model, ["mxfp4"])
    assert [d["name"] for d in r["tensors"]] == ["0.weight", "2.weight"]
    assert r["results"][0]["elements"] == 64 * 32 + 32 * 16


def test_exact_reconstruction_is_inf(gen):
    w = torch.tensor([[0.5, -1.0, 2.0, 0.0] * 8] * 4)  # E2M1 values under scale 1: exact in mxfp4
    r = error_report({"w": w}, ["mxfp4"])
    assert r["results"][0]["sqnr_db"] == math.inf and r["results"][0]["rel_fro"] == 0.0
    assert " inf " in format_report(r)


def test_parse_formats():
    assert parse_formats(["NVFP4,mxfp4", "mxfp4"]) == ["nvfp4", "mxfp4"]
    assert len(parse_formats(["all"])) == len(ms.registry)
    with pytest.raises(ValueError, match="'nope' is not in the registry"):
        parse_formats(["nope"])


def test_errors(gen):
    t = _tensors(gen)
    with pytest.raises(ValueError, match="calibration"):
        error_report(t, ["nvfp4"], ["gptq"])
    with pytest.raises(ValueError, match="no method applies"):
        error_report(t, ["mxfp4"], ["4over6"])
    with pytest.raises(ValueError, match="no tensor"):
        error_report({"embed.weight": t["embed.weight"]}, ["mxfp4"])
    with pytest.raises(TypeError, match="not torch.Tensors"):
        error_report({"w": ms.quantize(t["embed.weight"], "mxfp4")}, ["mxfp4"])
    with pytest.raises(TypeError, match="checkpoint path"):
        error_report(3, ["mxfp4"])
