"""benchmarks/run_tp.py, the tensor-parallel check-and-time script, on 2 gloo ranks (spawned) at tiny
shapes: every check passes, every timing is filled in, the ranks agree, the outputs are written; a
wrong reference fails the layer check; the command line refuses to run outside torchrun."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORLD = 2


def _script():
    """benchmarks/run_tp.py as a module (registered first: its dataclasses look their module up)."""
    if "run_tp" not in sys.modules:
        spec = importlib.util.spec_from_file_location("run_tp", ROOT / "benchmarks" / "run_tp.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["run_tp"] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules["run_tp"]
            raise
    return sys.modules["run_tp"]


def _config(tp, tmp: str):
    return tp.quick_config(formats=("nvfp4", "fp8_e4m3_block128x128"), model_formats=("nvfp4",),
                           shapes=(("column", 256, 256), ("row", 256, 256)), tokens=(1, 5),
                           model_dims=(128, 256, 8, 4), warmup_ms=0.5, target_ms=0.5, sample_ms=0.1,
                           min_reps=2, max_reps=3, tmp=tmp)


def _checks(tp, rank: int, out: str) -> None:
    import microscale as ms

    cfg = _config(tp, out)
    doc = tp.run(cfg)
    bad = [(r.get("format"), r.get("parallel"), r.get("tokens"), c) for r in doc["results"]
           for c in r.get("checks", []) if not c["ok"]]
    assert doc["ok"] and not bad, bad
    layers = [r for r in doc["results"] if r["section"] == "layers"]
    assert {(r["format"], r["parallel"], r["tokens"]) for r in layers} == {
        (f, p, t) for f in cfg.formats for p in ("column", "row") for t in cfg.tokens}
    for r in layers:
        assert "error" not in r, r
        names = [c["name"] for c in r["checks"]]
        if r["parallel"] == "column":
            assert names == ["column bf16: gathered == single-device ms.linear (bitwise)"]
        else:
            assert len(names) == 2 and r["checks"][0]["err"] <= 1e-5
        tm = r["timing"]
        assert set(tm) == {"single", "local", "comm", "layer"}
        assert all(t["median_ms"] > 0 and t["reps"] >= cfg.min_reps for t in tm.values())
        assert r["speedup"] == pytest.approx(tm["single"]["median_ms"] / tm["layer"]["median_ms"])
        assert r["efficiency"] == pytest.approx(r["speedup"] / WORLD)
        assert r["comm_share"] == pytest.approx(tm["comm"]["median_ms"] / tm["layer"]["median_ms"])
    (model,) = [r for r in doc["results"] if r["section"] == "model"]
    assert model["checks"][0]["err"] <= 1e-5 and "ColumnParallelQuantLinear" in model["info"]["parallel_modules"]
    loads = [r for r in doc["results"] if r["section"] == "loading"]
    assert [r["format"] for r in loads] == list(cfg.formats)
    for r in loads:
        assert [p["rank"] for p in r["per_rank"]] == [0, 1]
        assert all(p["shard_bytes"] <= p["bytes_read"] <= p["shard_bytes"] + 128 for p in r["per_rank"])
        assert 2 * sum(r["local_bytes"].values()) == sum(r["full_bytes"].values())
    # every rank holds the same document: timings are agreed (slowest rank per sample), checks combined
    mine = [(r.get("speedup"), [c["ok"] for c in r.get("checks", [])]) for r in doc["results"]]
    box = [None] * WORLD
    dist.all_gather_object(box, mine)
    assert box[0] == box[1]
    # the layer check fails against another weight
    ls = tp.Lockstep(torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    q, other = (ms.quantize(torch.randn(256, 256, generator=g), "nvfp4") for _ in range(2))
    x = torch.randn(3, 256, generator=g).bfloat16()
    col = tp.ColumnParallelQuantLinear.from_qtensor(q, None, None, gather_output=True)
    assert tp._layer_checks(ls, "column", q, col, x)[0]["ok"]
    assert not tp._layer_checks(ls, "column", other, col, x)[0]["ok"]
    row = tp.RowParallelQuantLinear.from_qtensor(q, None, None, input_is_parallel=True)
    assert [c["ok"] for c in tp._layer_checks(ls, "row", other, row, x)] == [False, False]
    if rank == 0:
        js, md = tp.write_outputs(doc, out)
        assert json.loads(js.read_text())["env"]["world_size"] == WORLD
        text = md.read_text()
        assert "checks: all passed" in text and text.count("| nvfp4 | column 256x256 |") == len(cfg.tokens)


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        _checks(_script(), rank, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_run_tp_two_ranks(tmp_path):
    init = "file://" + os.path.join(str(tmp_path), "rendezvous")
    mp.spawn(_worker, args=(init, str(tmp_path)), nprocs=WORLD, join=True)
    assert sorted(p.name for p in tmp_path.glob("tp_cpu_w2.*")) == ["tp_cpu_w2.json", "tp_cpu_w2.md"]
    assert not list(tmp_path.glob("ms_tp_*"))  # the loading section's checkpoints are removed


def test_command_line(monkeypatch):
    tp = _script()
    for k in tp.MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert tp.main(["--device", "cpu", "--quick"]) == 2  # not under torchrun: refused, nothing started
    assert {k: os.environ.get(k) for k in tp.MULTICAST_OFF} == tp.MULTICAST_OFF  # set before any process group
    cfg = tp.config_from_args(tp.build_parser().parse_args(["--device", "cpu", "--quick", "--tokens", "1,7",
                                                            "--only", "layers"]))
    assert cfg.quick and cfg.tokens == (1, 7) and cfg.sections == ("layers",) and cfg.shapes == tp.QUICK_SHAPES
    full = tp.config_from_args(tp.build_parser().parse_args(["--device", "cpu"]))
    assert full.tokens == (1, 16, 4096) and full.shapes == (("column", 28672, 8192), ("row", 8192, 28672))
    with pytest.raises(Exception, match="nvfp5"):
        tp.config_from_args(tp.build_parser().parse_args(["--formats", "nvfp5"]))
