"""The benchmark harness's logic, on the CPU: bytes/flops models, timing statistics,
suite selection, the runner's skip/fail handling, report generation and the CLI.

Speed is never asserted here; only what the harness computes from what it measured.
"""
from __future__ import annotations

import builtins
import dataclasses
import json
import os

import pytest
import torch

from microscale.bench import _clocks, _timing, cases, checks, models, report, runner, suites
from microscale.bench import main as bench_main
from microscale.bench.__main__ import build_parser
from microscale.bench.cases import Case, Context, Peer, Skip
from microscale.bench.checks import Check
from microscale.bench.runner import RunOptions
from microscale.bench.suites import CaseSpec

# ---- models ---------------------------------------------------------------------------


def test_bytes_models_count_each_input_once_and_each_output_once():
    numel, qn = 4096 * 4096, 4096 * 2048 + 4096 * 256 + 4
    assert models.quantize_bytes(numel, qn) == numel * 2 + qn
    assert models.dequantize_bytes(numel, qn) == qn + numel * 2
    assert models.quantize_bytes(numel, qn, in_elem_bytes=4) == numel * 4 + qn
    w = 28672 * 4096 + 28672 * 512 + 4
    assert models.linear_bytes(1, 28672, 8192, w) == w + 8192 * 2 + 28672 * 2
    assert models.linear_bytes(16, 64, 32, 100, bias_nbytes=128) == 100 + 16 * 32 * 2 + 16 * 64 * 2 + 128
    assert models.linear_flops(4096, 28672, 8192) == 2 * 4096 * 28672 * 8192
    assert models.copy_bytes(1 << 30) == 2 << 30


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_bytes_models_reject_bad_sizes_by_name(bad):
    with pytest.raises(ValueError, match="numel"):
        models.quantize_bytes(bad, 10)
    with pytest.raises(ValueError, match="M="):
        models.linear_flops(bad, 2, 3)


def test_throughput_percentages_and_bound():
    c = models.Ceilings(copy_gbps=4000.0, bf16_tflops=700.0, fp8_tflops=1300.0)
    # 4 GB in 1 ms is 4000 GB/s: the whole copy ceiling; no flops -> memory-bound
    t = models.throughput(4_000_000_000, 0, 1.0, c)
    assert t.gbps == pytest.approx(4000.0) and t.pct_copy == pytest.approx(100.0)
    assert t.bound == "memory" and t.pct_roofline == pytest.approx(100.0) and t.pct_compute is None
    # 0.7 PFLOP in 1 ms is 700 TFLOP/s; 1 GB at 4 TB/s is 0.25 ms -> compute-bound floor 1 ms
    t = models.throughput(1_000_000_000, 700_000_000_000, 2.0, c, "bf16_mm")
    assert t.tflops == pytest.approx(350.0) and t.pct_compute == pytest.approx(50.0)
    assert t.bound == "compute" and t.floor_ms == pytest.approx(1.0) and t.pct_roofline == pytest.approx(50.0)
    # the fp8 ceiling is chosen by kind
    assert models.throughput(1, 1_300_000_000_000, 1.0, c, "fp8_mm").pct_compute == pytest.approx(100.0)
    # unknown ceilings give None, not a division by zero
    t = models.throughput(10, 10, 1.0, models.Ceilings(), "bf16_mm")
    assert t.pct_copy is None and t.pct_compute is None and t.bound is None and t.pct_roofline is None
    with pytest.raises(ValueError, match="ceiling kind"):
        models.throughput(1, 1, 1.0, c, "tf32")
    with pytest.raises(ValueError, match="ms="):
        models.gbps(1, 0.0)


def test_ceilings_round_trip():
    c = models.Ceilings(1.0, 2.0, None)
    assert models.Ceilings.from_dict(json.loads(json.dumps(c.to_dict()))) == c


# ---- timing ---------------------------------------------------------------------------


def test_quantiles():
    assert _timing.quantiles([3.0]) == (3.0, 3.0, 3.0)
    med, p20, p80 = _timing.quantiles([5, 1, 4, 2, 3])
    assert (med, p20, p80) == (3.0, pytest.approx(1.8), pytest.approx(4.2))
    with pytest.raises(ValueError, match="empty"):
        _timing.quantiles([])


def test_rotation_count_exceeds_three_times_l2():
    l2 = 60 << 20
    n = _timing.rotation_count(1 << 20, l2)
    assert n * (1 << 20) > 3 * l2 and (n - 1) * (1 << 20) <= 3 * l2
    assert _timing.rotation_count(500 << 20, l2) == 1  # one set alone exceeds 3 x L2
    assert _timing.rotation_count(64 << 20, l2) == 3  # 192 MiB > 180 MiB
    assert _timing.rotation_count(60 << 20, l2) == 4  # 180 MiB is not > 180 MiB
    assert _timing.rotation_count(1024, l2) == 256  # capped by max_sets
    assert _timing.rotation_count(1 << 20, l2, max_total_bytes=10 << 20) == 10
    assert _timing.rotation_count(1 << 20, 0) == 1
    with pytest.raises(ValueError, match="set_bytes"):
        _timing.rotation_count(0, l2)


def test_time_cpu_statistics():
    calls = []
    t = _timing.time_cpu(lambda a: calls.append(a), [(1,), (2,)], target_s=0.001, min_reps=5)
    assert t.method == "perf_counter" and t.reps >= 5 and t.n_sets == 2
    assert 0 < t.p20_ms <= t.median_ms <= t.p80_ms
    assert set(calls) == {1, 2}  # rotated over both sets
    with pytest.raises(ValueError, match="sets"):
        _timing.time_cpu(lambda: None, [])


def test_time_cuda_rejects_bad_arguments_before_touching_a_device():
    with pytest.raises(ValueError, match="sets"):
        _timing.time_cuda(lambda: None, [])
    with pytest.raises(ValueError, match="graph="):
        _timing.time_cuda(lambda: None, [()], graph="sometimes")


# ---- selection ------------------------------------------------------------------------

UNIVERSE = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "int4_affine_g128", "int8_fp16")


def test_default_suite_covers_every_op_on_the_default_formats():
    specs = suites.select_cases("default", universe=UNIVERSE)
    assert {s.op for s in specs} == set(suites.OPS)
    assert {s.format for s in specs} == set(suites.DEFAULT_FORMATS)
    assert all(len(s.shape) == suites.SHAPE_RANK[s.op] for s in specs)
    assert len(specs) == len(set(specs))
    # the default suite stays small enough for its 8-minute budget
    assert len(specs) <= 36


def test_selection_by_op_format_and_shape():
    specs = suites.select_cases("default", ops="linear", formats=["mx*"], universe=UNIVERSE)
    assert {s.op for s in specs} == {"linear"}
    assert [s.format for s in specs][::3] == ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"]
    specs = suites.select_cases("default", ops=["quantize,linear"], formats="nvfp4",
                                shapes=["64x128", "2x64x128"], universe=UNIVERSE)
    assert [s.id for s in specs] == ["quantize/nvfp4/64x128", "linear/nvfp4/2x64x128"]
    # shapes of one rank leave the other ops' shapes alone
    specs = suites.select_cases("default", formats="nvfp4", shapes="64x128", universe=UNIVERSE)
    assert {s.shape for s in specs if s.op == "linear"} == set(suites.SUITES["default"].cuda["linear"].shapes)
    # a suite that names no formats takes every known one
    assert {s.format for s in suites.select_cases("quantize", universe=UNIVERSE)} == set(UNIVERSE)
    # the CPU table is its own
    cpu = suites.select_cases("default", cpu=True, universe=UNIVERSE)
    assert cpu and all(s.shape == (4096, 4096) for s in cpu)


def test_kv_shapes_take_a_zero_window_and_unfit_shapes_are_refused():
    specs = suites.select_cases("kv", formats="nvfp4", shapes="8x32768x64x8x128x0", universe=UNIVERSE)
    assert [s.id for s in specs] == ["kv_decode/nvfp4/8x32768x64x8x128x0"]
    with pytest.raises(ValueError, match="not a shape"):
        suites.parse_shape("8x0x64x8x128x0")  # only the window may be 0
    with pytest.raises(ValueError, match="not a shape"):
        suites.parse_shape("0x128")
    # a shape that fits no op of the suite is an error, not a filter that silently drops out
    with pytest.raises(ValueError, match=r"fit no op of suite 'kv'.*6 dims \(kv_decode\)"):
        suites.select_cases("kv", shapes="1x32768x64x8x128", universe=UNIVERSE)
    with pytest.raises(ValueError, match="fit no op"):
        suites.select_cases("default", ops="linear", shapes="64x128", universe=UNIVERSE)


def test_matrix_suite_shapes():
    specs = suites.select_cases("matrix", universe=UNIVERSE + ("mxint8",))
    nk = {(8192, 8192), (28672, 8192), (8192, 28672)}
    e2m1 = [s for s in specs if s.format in ("nvfp4", "mxfp4")]
    assert {(s.format, s.shape) for s in e2m1} == {
        (f, (m, n, k)) for f in ("nvfp4", "mxfp4") for n, k in nk
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 512, 4096)}
    eight = [s for s in specs if s.format not in ("nvfp4", "mxfp4")]
    assert {s.format for s in eight} == {"mxfp8_e4m3", "int8_fp16", "mxint8"}
    assert {s.shape for s in eight} == {(1, n, k) for n, k in nk}
    assert len(specs) == len(set(specs)) == 60 + 9
    # a format filter applies to every product of the plan; the overlap is listed once
    one = suites.select_cases("matrix", formats="nvfp4", shapes="1x64x64", universe=UNIVERSE)
    assert [s.id for s in one] == ["linear/nvfp4/1x64x64"]


@pytest.mark.parametrize("kwargs, match", [
    ({"suite": "nope"}, "suite='nope'"),
    ({"ops": "matmul"}, "ops=\\['matmul'\\]"),
    ({"formats": "fp3"}, "formats='fp3'"),
    ({"shapes": "8192"}, "shapes="),
    ({"shapes": "8x0"}, "shape='8x0'"),
    ({"shapes": "axb"}, "shape='axb'"),
])
def test_selection_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        suites.select_cases(universe=UNIVERSE, **kwargs)


def test_case_spec_id():
    assert CaseSpec("linear", "nvfp4", (1, 28672, 8192)).id == "linear/nvfp4/1x28672x8192"


# ---- runner (CPU, fake ops) -------------------------------------------------------------

def _ctx() -> Context:
    g = torch.Generator()
    g.manual_seed(0)
    return Context(torch.device("cpu"), g)


FAST = RunOptions(cpu_target_s=0.002)
CEIL = models.Ceilings(copy_gbps=10.0)


def _fake_case(spec: CaseSpec, ctx: Context, *, check_ok: bool = True, peers=()) -> Case:
    def make():
        return (cases.random_input(spec.shape, ctx, torch.float32),)

    def check(inputs, y):
        return Check(check_ok, "mismatches", 0.0 if check_ok else 3.0, "bit-exact" if check_ok else "3 differ")
    n = spec.shape[0] * spec.shape[1]
    return Case(spec, lambda x: x * 2, make, check, nbytes=8 * n, flops=0, compute_kind=None, set_bytes=8 * n,
                peers=list(peers))


def test_runner_times_checked_ops_and_their_peers():
    def ok_peer():
        return Peer("double-add", lambda x: x + x, lambda i, y: Check(True, "mismatches", 0.0))

    def skip_peer():
        raise Skip("no such library here")

    def broken_peer():
        raise RuntimeError("boom")

    def bad_peer():
        return Peer("wrong", lambda x: x * 3, lambda i, y: Check(bool(torch.equal(y, i[0] * 2)), "mismatches", 1.0,
                                                                 "differs"))
    peers = [("double-add", ok_peer), ("absent", skip_peer), ("broken", broken_peer), ("wrong", bad_peer)]
    builders = {"quantize": lambda s, c: _fake_case(s, c, peers=peers)}
    [r] = runner.run_cases([CaseSpec("quantize", "fake", (64, 64))], _ctx(), CEIL, FAST, builders, log=None)
    assert r.status == "ok" and r.check["ok"] and r.timing["method"] == "perf_counter"
    assert r.nbytes == 8 * 64 * 64
    assert r.throughput["gbps"] == pytest.approx(models.gbps(r.nbytes, r.timing["median_ms"]))
    assert r.throughput["pct_copy"] == pytest.approx(r.throughput["gbps"] * 10)
    st = {p.name: p for p in r.peers}
    assert st["double-add"].status == "ok"
    assert st["double-add"].ratio == pytest.approx(st["double-add"].timing["median_ms"] / r.timing["median_ms"])
    assert (st["absent"].status, st["absent"].reason) == ("skipped", "no such library here")
    assert st["broken"].status == "skipped" and "RuntimeError: boom" in st["broken"].reason
    assert st["wrong"].status == "failed" and "differs" in st["wrong"].reason and st["wrong"].timing is None


def test_runner_reports_skips_failures_and_errors_without_raising():
    def skip(spec, ctx):
        raise Skip("microscale.linear not available")

    def error(spec, ctx):
        raise KeyError("oops")

    def unimplemented(spec, ctx):
        case = _fake_case(spec, ctx)
        case.fn = lambda x: (_ for _ in ()).throw(NotImplementedError("no CPU kernel for mxfp6"))
        return case
    builders = {"quantize": lambda s, c: _fake_case(s, c, check_ok=False), "linear": skip, "dequantize": error,
                "moe": unimplemented}
    specs = [CaseSpec("quantize", "f", (8, 8)), CaseSpec("linear", "f", (1, 8, 8)),
             CaseSpec("dequantize", "f", (8, 8)), CaseSpec("moe", "f", (8, 8)), CaseSpec("attn", "f", (8, 8))]
    r = runner.run_cases(specs, _ctx(), CEIL, FAST, builders, log=None)
    assert [x.status for x in r] == ["failed", "skipped", "error", "skipped", "skipped"]
    assert "check failed: 3 differ" in r[0].reason and r[0].timing is None  # never timed when wrong
    assert r[1].reason == "microscale.linear not available"
    assert "KeyError" in r[2].reason
    assert r[3].reason == "not implemented: NotImplementedError: no CPU kernel for mxfp6"
    assert "no builder" in r[4].reason


def test_time_budget_skips_the_rest():
    builders = {"quantize": _fake_case}
    specs = [CaseSpec("quantize", "f", (8, 8))] * 3
    r = runner.run_cases(specs, _ctx(), CEIL, RunOptions(cpu_target_s=0.001, time_budget_s=0.0), builders,
                         log=None)
    assert r[0].status == "ok" and all(x.status == "skipped" and "time budget" in x.reason for x in r[1:])


def test_missing_op_in_microscale_is_a_skip(monkeypatch):
    def lookup(what):
        raise Skip(f"microscale.{what} not available")
    monkeypatch.setattr(cases, "_lookup", lookup)
    [r] = runner.run_cases([CaseSpec("linear", "nvfp4", (1, 64, 64))], _ctx(), CEIL, FAST, log=None)
    assert (r.status, r.reason) == ("skipped", "microscale.linear not available")


def test_ceilings_on_the_cpu_and_their_failures(monkeypatch):
    c, d = runner.measure_ceilings(_ctx(), RunOptions(cpu_target_s=0.01), log=None)
    assert c.copy_gbps > 0 and d["copy"]["status"] == "ok" and d["copy"]["check"]["ok"]
    assert c.bf16_tflops is None and d["bf16_mm"] == {"status": "skipped", "reason": "not measured on the CPU"}

    def broken(ctx, opts):
        raise RuntimeError("copy engine on fire")
    monkeypatch.setattr(runner, "_copy_ceiling", broken)
    c, d = runner.measure_ceilings(_ctx(), log=None)
    assert c.copy_gbps is None and d["copy"] == {"status": "error", "reason": "RuntimeError: copy engine on fire"}


@pytest.mark.parametrize("mode,want", [("always", "auto"), ("auto", "auto"), ("never", "never")])
def test_ceilings_are_not_timed_as_graphs(mode, want, monkeypatch):
    """A ceiling under ``graph='always'`` is timed as under 'auto' (a captured copy is a
    memcpy node the copy engines may serve, far below an SM copy); other modes pass through."""
    seen = []
    monkeypatch.setattr(runner, "_time", lambda fn, sets, ctx, opts, monitor=None: seen.append(opts.graph) or
                        _timing.Timing(1.0, 1.0, 1.0, 1, "events", 1, 1, "", 0.0))
    runner.measure_ceilings(_ctx(), RunOptions(graph=mode, cpu_target_s=0.01), log=None)
    assert seen and set(seen) == {want}


def test_bit_checks():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert checks.check_bits(a, a.clone()).ok
    b = a.clone()
    b[2] = 4.0
    c = checks.check_bits(b, a)
    assert not c.ok and c.value == 1
    assert not checks.check_bits(a.half(), a).ok
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    assert checks.check_matmul(x, w, (x @ w.T).bfloat16()).ok
    assert not checks.check_matmul(x, w, (x @ w.T) * 1.1).ok
    assert checks.rel_fro(torch.full((2,), float("nan")), torch.ones(2)) == float("inf")


def _no_peers(op):
    return lambda s, c: dataclasses.replace(cases.BUILDERS[op](s, c), peers=[])


@pytest.mark.parametrize("op", ["quantize", "dequantize"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "int4_affine_g128"])
def test_real_ops_on_cpu_are_checked_bit_exact(op, fmt):
    ms = pytest.importorskip("microscale")
    if not hasattr(ms, "quantize"):
        pytest.skip("microscale.quantize not written yet")
    [r] = runner.run_cases([CaseSpec(op, fmt, (8, 256))], _ctx(), CEIL, FAST, {op: _no_peers(op)}, log=None)
    assert r.status == "ok", r.reason
    assert r.check == {"ok": True, "metric": "mismatches", "value": 0.0, "detail": "bit-exact"}
    q = ms.quantize(torch.randn(8, 256), fmt)
    assert r.nbytes == 8 * 256 * 2 + q.nbytes


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "int4_affine_g128"])
def test_real_linear_on_cpu_is_checked_against_float64(fmt):
    try:
        cases._lookup("linear")
    except Skip as s:
        pytest.skip(str(s))
    [r] = runner.run_cases([CaseSpec("linear", fmt, (3, 128, 256))], _ctx(), CEIL, FAST,
                           {"linear": _no_peers("linear")}, log=None)
    assert r.status == "ok", r.reason
    assert r.check["metric"] == "rel_fro" and r.check["value"] < checks.LINEAR_TOL
    assert r.flops == 2 * 3 * 128 * 256 and r.compute_kind == "bf16_mm"


def test_quantize_check_catches_a_wrong_bit():
    ms = pytest.importorskip("microscale")
    if not hasattr(ms, "quantize"):
        pytest.skip("microscale.quantize not written yet")
    x = torch.randn(4, 64)
    q = ms.quantize(x, "mxfp4")
    assert checks.check_qtensor(q, ms.quantize(x, "mxfp4")).ok
    q.data[0, 0] ^= 1
    c = checks.check_qtensor(q, ms.quantize(x, "mxfp4"))
    assert not c.ok and c.value == 1 and "data: 1 mismatches" in c.detail


def test_random_input_is_never_zeros_and_is_fresh():
    ctx = _ctx()
    a, b = cases.random_input((16, 64), ctx), cases.random_input((16, 64), ctx)
    assert a.dtype == torch.bfloat16 and bool((a != 0).any()) and not torch.equal(a, b)


# ---- report ---------------------------------------------------------------------------

def _doc() -> dict:
    timing = {"median_ms": 0.130, "p20_ms": 0.129, "p80_ms": 0.132, "reps": 500, "method": "events", "n_sets": 2,
              "calls_per_sample": 1, "note": ""}
    peer = {"name": "cuBLAS bf16", "status": "ok", "reason": "", "nbytes": 470_000_000,
            "timing": dict(timing, median_ms=0.160), "gbps": 2937.5, "tflops": 2.9, "ratio": 0.160 / 0.130,
            "check": {"ok": True, "metric": "rel_fro", "value": 0.003, "detail": ""}}
    lin = {"op": "linear", "format": "nvfp4", "shape": [1, 28672, 8192], "status": "ok", "reason": "",
           "nbytes": 125_000_000, "flops": 2 * 28672 * 8192, "compute_kind": "bf16_mm", "timing": timing,
           "throughput": {"gbps": 961.5, "tflops": 3.6, "pct_copy": 22.5, "pct_compute": 0.5, "floor_ms": 0.029,
                          "pct_roofline": 22.5, "bound": "memory"},
           "check": {"ok": True, "metric": "rel_fro", "value": 0.003, "detail": ""},
           "peers": [peer, {"name": "tl.dot_scaled", "status": "skipped", "reason": "not MXFP4",
                            "timing": None, "nbytes": None, "gbps": None, "tflops": None, "ratio": None,
                            "check": None}]}
    q = {"op": "quantize", "format": "mxfp4", "shape": [8192, 8192], "status": "ok", "reason": "",
         "nbytes": 134_217_728 + 35_651_584, "flops": 0, "compute_kind": None,
         "timing": dict(timing, median_ms=0.05, method="graph"),
         "throughput": {"gbps": 3397.4, "tflops": 0.0, "pct_copy": 79.5, "pct_compute": None, "floor_ms": 0.04,
                        "pct_roofline": 79.5, "bound": "memory"},
         "check": {"ok": True, "metric": "mismatches", "value": 0.0, "detail": "bit-exact"}, "peers": []}
    bad = {"op": "dequantize", "format": "nvfp4", "shape": [8192, 8192], "status": "failed",
           "reason": "check failed: 12 of 67108864 elements differ", "peers": []}
    skipped = {"op": "linear", "format": "mxfp4", "shape": [1, 28672, 8192], "status": "skipped",
               "reason": "microscale.linear not available", "peers": []}
    return {"schema": 1, "mode": "cuda", "suite": "default", "selection": {"ops": None, "formats": None,
                                                                         "shapes": None},
            "env": {"date": "2026-11-29T13:00:00+00:00", "device": "NVIDIA H200", "capability": "9.0",
                    "sm_count": 132, "memory_gib": 139.8, "l2_mib": 60.0, "driver": "580.159.04",
                    "cuda_runtime": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "python": "3.12.3",
                    "microscale": "0.1.0", "git": "abc1234", "cpu": "x", "cpu_threads": 16},
            "seed": 7, "wall_s": 300.0,
            "ceilings": {"copy_gbps": 4270.0, "bf16_tflops": 700.0, "fp8_tflops": None},
            "ceilings_detail": {"copy": {"status": "ok", "what": "copy of 1024 MiB"},
                                "bf16_mm": {"status": "ok", "what": "cuBLAS"},
                                "fp8_mm": {"status": "error", "reason": "RuntimeError: no fp8"}},
            "methodology": {"timer": "CUDA events, median per call"},
            "results": [q, lin, bad, skipped]}


def test_markdown_states_environment_ceilings_ratios_and_skips():
    md = report.render_markdown(_doc())
    for s in ("NVIDIA H200", "580.159.04", "2.11.0+cu130", "3.6.0", "2026-11-29T13:00:00+00:00",
              "4270 GB/s", "700 TFLOP/s", "n/a (RuntimeError: no fp8)", "## quantize", "## linear",
              "vs cuBLAS bf16", "1.23×", "vs tl.dot_scaled", "tl.dot_scaled: not MXFP4",
              "`dequantize/nvfp4/8192x8192` — failed: check failed: 12 of 67108864 elements differ",
              "`linear/mxfp4/1x28672x8192` — skipped: microscale.linear not available", "130.0 µs", "3397"):
        assert s in md, s
    # every table row has as many cells as its header
    for block in md.split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if rows:
            assert len({ln.count(" | ") for ln in rows if not ln.startswith("|---")}) == 1, block


def test_markdown_flags_an_incomplete_run():
    d = _doc()
    assert "INCOMPLETE" not in report.render_markdown(d)
    d["complete"] = False
    assert "INCOMPLETE" in report.render_markdown(d)


def test_csv_has_a_row_per_case_and_columns_per_peer(tmp_path):
    path = report.write_csv(_doc(), tmp_path / "r.csv")
    import csv
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 4
    assert rows[1]["cuBLAS bf16 ratio"] == str(round(0.160 / 0.130, 4))
    assert rows[1]["median_us"] == "130.0" and rows[2]["status"] == "failed"


def test_regenerate_is_atomic_and_checks_the_schema(tmp_path):
    j = report.write_json(_doc(), tmp_path / "results.json")
    md = tmp_path / "bench" / "RESULTS.md"
    md.parent.mkdir()
    md.write_text("old")
    assert report.regenerate(j, md) == md
    assert md.read_text().startswith("# microscale benchmark results")
    assert sorted(os.listdir(md.parent)) == ["RESULTS.md"]  # no temporary file left behind
    (tmp_path / "bad.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="schema"):
        report.regenerate(tmp_path / "bad.json", md)
    assert bench_main(["report", str(j), "--md", str(md), "--csv", str(tmp_path / "x.csv")]) == 0
    assert (tmp_path / "x.csv").exists()


def test_regenerate_keeps_the_hand_summary_above_the_mark(tmp_path):
    j = report.write_json(_doc(), tmp_path / "results.json")
    md = tmp_path / "RESULTS.md"
    head = "# Results\n\nA summary written by hand.\n\n" + report.GENERATED_MARK
    md.write_text(head + "\n\n# microscale benchmark results\n\nstale generated text\n")
    report.regenerate(j, md)
    text = md.read_text()
    assert text.startswith(head + "\n\n# microscale benchmark results")
    assert "stale generated text" not in text and text.count(report.GENERATED_MARK) == 1
    report.regenerate(j, md)  # idempotent: the summary is kept once, not stacked
    assert md.read_text() == text
    md.write_text("A file without the mark is generated whole.\n")
    report.regenerate(j, md)
    assert md.read_text().startswith("# microscale benchmark results")


def test_json_replaces_non_finite_floats(tmp_path):
    d = _doc()
    d["results"][0]["check"]["value"] = float("inf")
    j = report.write_json(d, tmp_path / "r.json")
    assert report.load_json(j)["results"][0]["check"]["value"] == "inf"
    report.render_markdown(report.load_json(j))


@pytest.mark.parametrize("ops", [("quantize", "linear"), ("quantize",), ("linear",)])
def test_roofline_plot(tmp_path, ops):
    pytest.importorskip("matplotlib")
    d = _doc()
    d["results"] = [r for r in d["results"] if r["op"] in ops]
    d["ceilings"]["bf16_tflops"] = None if ops == ("linear",) else 700.0  # the CPU has no bf16 ceiling
    assert report.plot_roofline(d, tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    d["results"] = [r for r in d["results"] if r["status"] != "ok"]
    assert not report.plot_roofline(d, tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_roofline_plot_is_optional(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert report.plot_roofline(_doc(), tmp_path / "roofline.png") is False
    assert not (tmp_path / "roofline.png").exists()
    paths = report.write_outputs(_doc(), tmp_path)
    assert paths["png"] is None and paths["json"].exists() and paths["csv"].exists()


# ---- command line ---------------------------------------------------------------------

def test_cli_list(capsys):
    assert bench_main(["--list", "--ops", "linear", "--formats", "nvfp4"]) == 0
    out = capsys.readouterr().out.split()
    assert out and all(line.startswith("linear/nvfp4/") for line in out)
    with pytest.raises(SystemExit):
        bench_main(["--list", "--ops", "matmul"])


@pytest.mark.parametrize("argv,want", [(["--suite", "matrix"], "always"),
                                       (["--suite", "matrix", "--graph", "never"], "never"),
                                       (["--suite", "linear"], "auto"), (["--graph", "always"], "always")])
def test_cli_graph_mode_defaults_per_suite(argv, want, monkeypatch, tmp_path):
    """The matrix suite times every row (ours and the peers') as graph replays unless
    ``--graph`` says otherwise; the other suites default to 'auto'."""
    seen = {}

    def fake_run(suite, **kw):
        seen["graph"] = kw["opts"].graph
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner, "run_benchmark", fake_run)
    assert bench_main(argv + ["--out", str(tmp_path)]) == 2
    assert seen["graph"] == want


@pytest.mark.parametrize("suite,want", [("matrix", "always"), ("linear", "auto")])
def test_run_benchmark_takes_the_suites_graph_mode(suite, want, monkeypatch):
    """Called without options, :func:`runner.run_benchmark` uses the suite's graph mode."""
    seen = []
    monkeypatch.setattr(runner, "measure_ceilings", lambda ctx, opts, log: seen.append(opts.graph) or
                        (models.Ceilings(), {}))
    monkeypatch.setattr(runner, "run_cases", lambda *a, **k: [])
    runner.run_benchmark(suite, cpu=True, log=None)
    assert seen == [want]


def test_methodology_names_the_graph_mode():
    """The recorded method says what each graph mode does (the 'auto' rule's threshold read
    from ``_timing``), not the 'auto' rule for every mode."""
    auto = runner.methodology(RunOptions(graph="auto"), False)["graph"]
    always = runner.methodology(RunOptions(graph="always"), False)["graph"]
    assert auto.startswith("auto") and f"{_timing.EVENTS_SPREAD_MAX:.0%}" in auto
    assert always.startswith("always") and "< 10 us" not in always


def test_cli_cpu_end_to_end(tmp_path):
    ms = pytest.importorskip("microscale")
    rc = bench_main(["--cpu", "--ops", "quantize", "--formats", "mxfp4", "--shapes", "64x256",
                     "--target-ms", "20", "--out", str(tmp_path)])
    doc = report.load_json(tmp_path / "results.json")
    assert doc["mode"] == "cpu" and doc["complete"] and doc["ceilings"]["copy_gbps"] > 0
    [r] = doc["results"]
    assert (r["op"], r["format"], r["shape"]) == ("quantize", "mxfp4", [64, 256])
    if hasattr(ms, "quantize"):
        assert rc == 0 and r["status"] == "ok" and r["check"]["ok"] and r["timing"]["median_ms"] > 0
    else:
        assert r["status"] == "skipped"
    assert (tmp_path / "results.csv").exists()
    assert "## quantize" in report.render_markdown(doc)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_linear_dtype(dtype, monkeypatch):
    """``--dtype``: the linear case's activations are in that dtype (the op sees them; checked against
    float64), its cuBLAS peer is named for it, the method records it, and the CLI passes it through."""
    try:
        real = cases._lookup("linear")
    except Skip as s:
        pytest.skip(str(s))
    seen = []
    lookup = cases._lookup
    monkeypatch.setattr(cases, "_lookup", lambda what: (lambda x, q: seen.append(x.dtype) or real(x, q))
                        if what == "linear" else lookup(what))
    ctx = dataclasses.replace(_ctx(), act_dtype=suites.DTYPES[dtype])
    spec = CaseSpec("linear", "nvfp4", (3, 128, 256))
    [r] = runner.run_cases([spec], ctx, CEIL, FAST, {"linear": _no_peers("linear")}, log=None)
    assert r.status == "ok" and r.check["value"] < checks.LINEAR_TOL, r.reason
    assert seen and set(seen) == {suites.DTYPES[dtype]}
    case = cases.build_linear(spec, ctx)
    assert [name for name, _ in case.peers][0] == f"cuBLAS {dtype}"
    if dtype == "fp16":  # activations scaled down: x . w at the suite's K stays finite in fp16 (65504)
        x, q = cases.build_linear(CaseSpec("linear", "nvfp4", (16, 64, 8192)), ctx).make_inputs()
        assert x.dtype == torch.float16 and float(x.abs().max()) <= 8
        assert float((x.double() @ q.dequantize().double().T).abs().max()) < 65504 / 4
    got = {}
    monkeypatch.setattr(runner, "measure_ceilings", lambda ctx, opts, log: (models.Ceilings(), {}))
    monkeypatch.setattr(runner, "run_cases", lambda specs, ctx, *a, **k: got.update(dt=ctx.act_dtype) or [])
    doc = runner.run_benchmark("linear", cpu=True, log=None, dtype=dtype)
    assert got["dt"] == suites.DTYPES[dtype] and doc["methodology"]["activations"].startswith(dtype)
    assert doc["selection"]["dtype"] == dtype
    assert [p for p in doc["methodology"]["peers"] if p.startswith("cuBLAS")] == [f"cuBLAS {dtype}"]
    with pytest.raises(ValueError, match="dtype"):
        runner.run_benchmark("linear", cpu=True, log=None, dtype="fp8")
    assert build_parser().parse_args(["--dtype", dtype]).dtype == dtype


# ---- the CUDA control flow, on a fake device ----------------------------------------------

class _FakeEvent:
    """Stands in for torch.cuda.Event: records the host clock (the fake device is synchronous)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph; ``capturing`` is what a host sync would trip on."""

    capturing = False
    captured = 0
    ended_after_failure = False

    def capture_begin(self, *a, **k):
        _FakeGraph.capturing = True

    def capture_end(self):
        failed = _FakeGraph.capturing == "failed"
        _FakeGraph.capturing = False
        if failed:
            _FakeGraph.ended_after_failure = True
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        _FakeGraph.captured += 1

    def replay(self):
        pass


def _host_sync():
    """What a host sync does under capture."""
    if _FakeGraph.capturing:
        _FakeGraph.capturing = "failed"
        raise RuntimeError("operation not permitted when stream is capturing")


class _FakeStream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    import contextlib
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(_timing, "l2_cache_bytes", lambda device=None: 60 << 20)
    _FakeGraph.capturing, _FakeGraph.captured, _FakeGraph.ended_after_failure = False, 0, False
    return _FakeGraph


def _busy(us):
    import time
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def test_time_cuda_picks_graphs_for_short_calls_and_events_otherwise(fake_cuda):
    calls = []
    t = _timing.time_cuda(lambda i: calls.append(i), [(0,), (1,), (2,)], warmup_ms=0.1, target_ms=1.0)
    assert t.method == "graph" and fake_cuda.captured == 1
    assert t.calls_per_sample == 21 and t.n_sets == 3  # 7 unrolled copies of 3 sets >= 20 calls
    assert set(calls) == {0, 1, 2}
    t = _timing.time_cuda(lambda: _busy(200), [()], warmup_ms=1.0, target_ms=5.0, graph="never")
    assert t.method == "events" and t.reps >= 10 and t.median_ms >= 0.2


def test_time_cuda_retimes_scattered_event_samples_as_a_graph(fake_cuda, monkeypatch):
    """A call that is not host-bound by its batch estimate but whose per-call event samples
    scatter (the launch path showing through) is timed again as a graph replay; tight event
    samples stand."""
    monkeypatch.setattr(_timing, "_timed_batch", lambda fn, sets, idx, k: (0.2, 0.01))  # 200 us, host 10 us
    scattered = [0.2, 0.45, 0.6, 0.3, 0.7] * 4
    monkeypatch.setattr(_timing, "_time_events", lambda fn, sets, reps: scattered[:reps])
    monkeypatch.setattr(_timing, "_time_graph", lambda fn, sets, unroll, reps: [0.21] * reps)
    t = _timing.time_cuda(lambda: None, [()], warmup_ms=0.1, target_ms=4.0)
    assert t.method == "graph" and t.median_ms == 0.21 and "events spread" in t.note
    monkeypatch.setattr(_timing, "_time_events", lambda fn, sets, reps: [0.2, 0.201, 0.199] * 7)
    t = _timing.time_cuda(lambda: None, [()], warmup_ms=0.1, target_ms=4.0)
    assert t.method == "events" and t.median_ms == 0.2 and t.note == ""
    monkeypatch.setattr(_timing, "_time_events", lambda fn, sets, reps: scattered[:reps])
    t = _timing.time_cuda(lambda: None, [()], warmup_ms=0.1, target_ms=4.0, graph="never")
    assert t.method == "events" and t.median_ms == 0.45  # 'never' is never overruled


def test_time_cuda_falls_back_to_events_when_capture_fails(fake_cuda):
    t = _timing.time_cuda(_host_sync, [()], warmup_ms=0.1, target_ms=1.0, graph="always")
    assert t.method == "events" and "graph capture failed" in t.note
    assert "operation not permitted when stream is capturing" in t.note  # the call's error, not the end's
    assert fake_cuda.ended_after_failure and not fake_cuda.capturing  # the capture was ended


def test_run_case_rotates_inputs_past_l2_on_a_device(fake_cuda):
    made = []

    def build(spec, ctx):
        def make():
            made.append(1)
            return (torch.ones(4),)
        return Case(spec, lambda x: _busy(50), make, lambda i, y: Check(True, "mismatches", 0.0), nbytes=50 << 20,
                    flops=0, compute_kind=None, set_bytes=50 << 20,
                    peers=[("p", lambda: Peer("p", lambda x: _busy(100), lambda i, y: Check(True, "m", 0.0)))])
    ctx = Context(torch.device("cuda"), torch.Generator())
    r = runner.run_case(CaseSpec("quantize", "f", (8, 8)), ctx, models.Ceilings(copy_gbps=4000.0),
                        RunOptions(warmup_ms=0.5, target_ms=5.0, graph="never"), {"quantize": build})
    assert r.status == "ok", r.reason
    assert r.timing["n_sets"] == len(made) == 4  # 4 x 50 MiB > 3 x 60 MiB
    assert r.peers[0].status == "ok" and r.peers[0].timing["n_sets"] == 4 and r.peers[0].ratio > 1


class _FakeMonitor:
    """Stands in for microscale.bench._clocks.Monitor: every window was power-capped."""

    def __init__(self):
        self.windows, self.settled = [], 0

    def settle(self):
        self.settled += 1
        return 0.0

    def window(self, t0, t1):
        self.windows.append((t0, t1))
        return _clocks.summarize([(1455.0, 1980.0, 700.0, 700.0, 0x4), (1980.0, 1980.0, 650.0, 700.0, 0)])


def test_run_case_records_the_clocks_of_each_timing(fake_cuda):
    def build(spec, ctx):
        return Case(spec, lambda x: _busy(20), lambda: (torch.ones(4),), lambda i, y: Check(True, "mismatches", 0.0),
                    nbytes=1 << 20, flops=0, compute_kind=None, set_bytes=1 << 20,
                    peers=[("p", lambda: Peer("p", lambda x: _busy(40), lambda i, y: Check(True, "m", 0.0)))])
    ctx = Context(torch.device("cuda"), torch.Generator())
    mon = _FakeMonitor()
    r = runner.run_case(CaseSpec("quantize", "f", (8, 8)), ctx, models.Ceilings(copy_gbps=4000.0),
                        RunOptions(warmup_ms=0.2, target_ms=2.0, graph="never"), {"quantize": build}, mon)
    assert r.status == "ok", r.reason
    assert len(mon.windows) == 2 and all(t0 < t1 for t0, t1 in mon.windows)  # the op's timing, the peer's
    assert mon.settled == 2  # each started once the clock was free
    assert r.timing["clocks"]["slowed"] == 0.5 and r.peers[0].timing["clocks"]["reasons"] == ("power cap",)
    assert "power cap 50%, SM >= 1.46 GHz" in runner._describe(r)
    # no monitor: no clocks
    r = runner.run_case(CaseSpec("quantize", "f", (8, 8)), ctx, models.Ceilings(copy_gbps=4000.0),
                        RunOptions(warmup_ms=0.2, target_ms=2.0, graph="never"), {"quantize": build})
    assert r.timing["clocks"] is None


def test_markdown_and_csv_say_when_the_clocks_were_held_down(tmp_path):
    d = _doc()
    lin = d["results"][1]
    lin["timing"] = dict(lin["timing"], clocks={"samples": 6, "sm_mhz_min": 1455.0, "sm_mhz_median": 1500.0,
                                                  "sm_mhz_top": 1980.0, "power_w_max": 700.0, "power_limit_w": 700.0,
                                                  "slowed": 0.8, "reasons": ["power cap"]})
    md = report.render_markdown(report.load_json(report.write_json(d, tmp_path / "r.json")))
    row = next(ln for ln in md.splitlines() if "1×28672×8192" in ln and "nvfp4" in ln)
    assert row.rstrip().endswith("power cap 80%, SM >= 1.46 GHz |"), row
    q_row = next(ln for ln in md.splitlines() if "8192×8192" in ln and "mxfp4" in ln)
    assert "SM" not in q_row  # no clocks recorded there
    import csv
    rows = list(csv.DictReader(open(report.write_csv(d, tmp_path / "r.csv"))))
    assert rows[1]["slowed_pct"] == "80.0" and rows[1]["sm_mhz_min"] == "1455.0" and rows[0]["slowed_pct"] == ""


def test_moe_routing_decode_distinct_prefill_skewed() -> None:
    """The moe suite's routing: a decode step touches distinct experts; beyond, each token's experts are distinct
    and the load is skewed (the busiest expert well above the mean, every expert drawn)."""
    from microscale.bench.cases_moe import _routing

    ctx = Context(torch.device("cpu"), torch.Generator().manual_seed(0))
    dec = _routing(8, 32, 4, ctx)
    assert dec.shape == (8, 4) and torch.unique(dec).numel() == 32
    idx = _routing(4096, 128, 4, ctx)
    assert idx.shape == (4096, 4) and bool((idx.sort(1).values.diff(dim=1) > 0).all())
    load = torch.bincount(idx.flatten(), minlength=128).double()
    assert bool((load > 0).all()) and 2.0 < float(load.max() / load.mean()) < 6.0


def test_moe_check_rows_bounded_by_experts_decoded() -> None:
    """A moe check decodes at most _CHECK_EXPERTS experts in float64: a decode step of 8 tokens x top-4 is
    checked whole, a prefill case over its first rows only, and a token alone past the bound still is."""
    from microscale.bench import cases_moe as cm

    ctx = Context(torch.device("cpu"), torch.Generator().manual_seed(0))
    assert cm._check_row_count(cm._routing(8, 32, 4, ctx)) == 8
    idx = cm._routing(4096, 128, 4, ctx)
    r = cm._check_row_count(idx)
    assert 1 <= r < cm._CHECK_ROWS and torch.unique(idx[:r]).numel() <= cm._CHECK_EXPERTS
    assert torch.unique(idx[:r + 1]).numel() > cm._CHECK_EXPERTS
    wide = torch.arange(40).reshape(1, 40)
    assert cm._check_row_count(wide) == 1


def test_runner_records_where_a_case_spends_its_wall_time():
    """Each case and peer keeps the wall seconds of its phases; a slow check shows in the check phase, and a
    case over the slow threshold logs them."""
    import io
    import time as _t

    def slow_check_peer():
        def check(i, y):
            _t.sleep(0.05)
            return Check(True, "mismatches", 0.0)
        return Peer("slow-check", lambda x: x + x, check)

    builders = {"quantize": lambda s, c: _fake_case(s, c, peers=[("slow-check", slow_check_peer)])}
    log = io.StringIO()
    old, runner._SLOW_CASE_S = runner._SLOW_CASE_S, 0.0
    try:
        [r] = runner.run_cases([CaseSpec("quantize", "fake", (64, 64))], _ctx(), CEIL, FAST, builders, log=log)
    finally:
        runner._SLOW_CASE_S = old
    assert set(r.phases) == {"build", "inputs", "check", "time", "peers"}
    assert r.phases["peers"] >= 0.05 and r.phases["check"] < r.phases["peers"]
    [p] = r.peers
    assert set(p.phases) == {"build", "inputs", "check", "time"} and p.phases["check"] >= 0.05
    assert "wall: build" in log.getvalue()
    assert r.to_dict()["phases"] == r.phases
