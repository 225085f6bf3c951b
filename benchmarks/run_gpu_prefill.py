"""H200 check + benchmark of the prefill kernel on the canonical layout (``qlinear.prefill``).

One call: correctness against float64 ``x @ dequant(W)^T`` for several formats and ragged
shapes, then M=512/4096 timings of tile configs on 28672x8192 (and 8192x28672 for the
best) against cuBLAS bf16 ``F.linear`` and the split-K tensor-core kernel on a prepared
weight (CUDA events, median). Short table last; JSON to $OUT/prefill.json.

    PYTHONPATH=. python benchmarks/run_gpu_prefill.py
    WS=1 PYTHONPATH=. python benchmarks/run_gpu_prefill.py   (the warp-specialized Gluon kernel,
        ``qlinear.prefill_ws``: checks, then its tiles against ``ms.linear`` and cuBLAS)
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_gpu_gemv import fastest  # noqa: E402  (the summaries' best row per key)

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
# (block_m, block_n, block_k, warps, stages, swap, pair)
CONFIGS = [(256, 128, 64, 8, 3, 0, 0), (128, 128, 64, 8, 3, 0, 0), (256, 128, 64, 8, 3, 0, 1), (128, 128, 64, 8, 3, 0, 1),
           (256, 128, 64, 8, 4, 1, 0), (256, 128, 64, 8, 4, 1, 1), (128, 256, 64, 8, 3, 0, 1)]
QUICK = os.environ.get("QUICK") == "1"  # nvfp4 / mxfp4 at M=4096 only


#: WS_GRAPH=1: WS=1 timings by CUDA-graph replays (below ~0.3 ms per call the eager wrapper's host
#: time, not the GPU, sets the pace of back-to-back calls)
WS_GRAPH = os.environ.get("WS_GRAPH") == "1"


def t_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=3, rep=40, return_mode="median")


def t_ws(fn) -> float:
    """WS=1 timer: ``t_ms``, or CUDA-graph replays with ``WS_GRAPH=1``."""
    if WS_GRAPH:
        fn()  # compiled outside the capture
        return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median")
    return t_ms(fn)


def main() -> None:
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "checks": [], "timings": []}
    g = torch.Generator(device=dev).manual_seed(3)
    ok = True
    for name in ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128", "int8_fp16", "fp8_e4m3_block128"):
        for (m, n, k) in [(300, 1000, 2048)] if QUICK else [(300, 1000, 2048), (1024, 4096, 4096)]:
            q = ms.quantize(torch.randn(n, k, device=dev, generator=g), name)
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            bias = torch.randn(n, device=dev, generator=g)
            ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
            for cfg in (L.PrefillConfig(), L.PrefillConfig(128, 256, 64, swap=True), L.PrefillConfig(pair=True)):
                out = L.prefill(x, q, bias, cfg)
                e = ((out.double() - ref).norm() / ref.norm()).item()
                good = bool(torch.isfinite(out).all()) and e < 1e-2
                ok &= good
                res["checks"].append(dict(fmt=name, m=m, n=n, k=k, rel_err=e, ok=good))
        print(f"check {name:17s} last err={e:.2e} {'ok' if good else 'FAIL'}", flush=True)
    print(f"checks {'all ok' if ok else 'FAILED'}", flush=True)
    rows = []
    for (n, k) in [(28672, 8192)]:
        w = torch.randn(n, k, device=dev, generator=g)
        wb = w.to(torch.bfloat16)
        for m in (4096,) if QUICK else (512, 4096):
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            t_cub = t_ms(lambda: F.linear(x, wb))
            for name in ("nvfp4", "mxfp4") if QUICK else ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128"):
                q = ms.quantize(w, name)
                pw = L.prepare(q)
                t_tc = t_ms(lambda: L.linear(x, pw))
                for bm, bn, bk, nw, st, sw, pr in CONFIGS if name == "nvfp4" or m == 4096 else CONFIGS[:4]:
                    cfg = L.PrefillConfig(bm, bn, bk, 8, nw, st, bool(sw), bool(pr))
                    try:
                        t = t_ms(lambda: L.prefill(x, q, None, cfg))
                    except Exception as exc:  # a config that does not compile is reported, not fatal
                        print(f"{name} {cfg} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                        continue
                    tf = 2 * m * n * k / (t * 1e-3) / 1e12
                    r = dict(fmt=name, m=m, n=n, k=k, cfg=f"{bm}x{bn}x{bk}w{nw}s{st}{'T' if sw else ''}{'P' if pr else ''}", ms=t, cublas_ms=t_cub,
                             tc_ms=t_tc, vs_cublas=t_cub / t, tflops=tf)
                    rows.append(r)
                    res["timings"].append(r)
                    print(f"{name:17s} M={m:5d} {r['cfg']:>16s} {t:7.3f} ms  {tf:6.1f} TFLOP/s  {t_cub / t:5.2f}x cuBLAS"
                          f"  (tc kernel {t_tc:.3f} ms, cuBLAS {t_cub:.3f} ms)", flush=True)
                del q, pw
                torch.cuda.empty_cache()
    with open(os.path.join(OUT, "prefill.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nchecks {'all ok' if ok else 'FAILED'}")
    print(f"{'fmt':17s} {'M':>5s} {'best cfg':>16s} {'ms':>7s} {'x cuBLAS':>8s} {'tc kernel x':>11s}")
    for (fmt, m), r in fastest(rows, lambda r: (r["fmt"], r["m"])).items():
        print(f"{fmt:17s} {m:5d} {r['cfg']:>16s} {r['ms']:7.3f} {r['vs_cublas']:8.2f} {r['cublas_ms'] / r['tc_ms']:11.2f}")


#: WS=1 timings: token counts (WS_M="512,4096") and block_t x stages (WS_CFGS="256x4,128x4"; "auto": the
#: wrapper's choice)
WS_M = [int(v) for v in os.environ.get("WS_M", "512,4096").split(",")]
WS_CFGS = [(None, None) if v == "auto" else tuple(int(u) for u in v.split("x"))
           for v in os.environ.get("WS_CFGS", "256x4,256x3,128x4,128x8").split(",")]
#: WS=1 timings: persistent programs with the tail split in K (sk), without (1), one program per tile (0)
#: (WS_PERSIST="sk,1,0")
WS_PERSIST = os.environ.get("WS_PERSIST", "sk").split(",")
#: WS=1 timings: weight shapes N x K (WS_SHAPES="28672x8192,8192x28672,8192x8192")
WS_SHAPES = [tuple(int(u) for u in v.split("x"))
             for v in os.environ.get("WS_SHAPES", "28672x8192,8192x28672,8192x8192").split(",")]


def ws_main() -> None:
    """WS=1: ``prefill_ws`` (NVFP4, MXFP4) checked against float64 on ragged shapes (every
    element within bf16 rounding plus an fp32 accumulation bound), then timed at 512 / 4096
    tokens (``WS_M``) on the weight shapes ``WS_SHAPES`` for block_t x stages (``WS_CFGS``),
    next to the routed ``ms.linear`` and cuBLAS bf16 (median; ``t_ws``)."""
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "checks": [], "timings": []}
    g = torch.Generator(device=dev).manual_seed(8)
    ok = True
    for name in ("nvfp4", "mxfp4"):
        shapes = [(300, 1000, 2048, 256), (1024, 4096, 4096, 128), (77, 256, 512, 64), (100, 1001, 512, 128)]
        for (m, n, k, bt) in shapes:  # the last: N % 8 != 0 (direct stores)
            q = ms.quantize(torch.randn(n, k, device=dev, generator=g), name)
            x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
            bias = torch.randn(n, device=dev, generator=g)
            try:
                out = L.prefill_ws(x, q, bias, block_t=bt)
                wd = q.dequantize(torch.float64)
                ref = x.double() @ wd.T + bias.double()
                cond = x.double().abs() @ wd.abs().T + bias.double().abs()
                err = (out.double() - ref).abs()
                bound = 2.0 ** -8 * ref.abs() + 2.0 ** -16 * cond
                good = bool(torch.isfinite(out).all()) and bool((err <= bound).all())
                fro = ((out.double() - ref).norm() / ref.norm()).item()
            except Exception as exc:  # reported, counted as a failure
                good, fro = False, float("nan")
                print(f"check {name} {m}x{n}x{k} raised {type(exc).__name__}: {exc}"[:600], flush=True)
            ok &= good
            res["checks"].append(dict(fmt=name, m=m, n=n, k=k, block_t=bt, rel_err=fro, ok=good))
            print(f"check {name} {m}x{n}x{k} bt={bt}: rel {fro:.2e} {'ok' if good else 'FAIL'}", flush=True)
    print(f"checks {'all ok' if ok else 'FAILED'}", flush=True)
    rows = []
    for (n, k) in WS_SHAPES:
        w = torch.randn(n, k, device=dev, generator=g)
        wb = w.to(torch.bfloat16)
        for name in ("nvfp4", "mxfp4"):
            q = ms.quantize(w, name)
            for m in WS_M:
                x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
                cub = t_ws(lambda: F.linear(x, wb))
                lin = t_ws(lambda: ms.linear(x, q))
                for (bt, st), per in itertools.product(WS_CFGS, WS_PERSIST):
                    try:
                        t = t_ws(lambda: L.prefill_ws(x, q, block_t=bt, stages=st, persistent=per != "0",
                                                      split_tail=per == "sk"))
                    except Exception as exc:
                        print(f"ws bt={bt} st={st} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                        continue
                    r = dict(fmt=name, m=m, n=n, k=k, block_t=bt, stages=st, persistent=per, ms=t, linear_ms=lin,
                             cublas_ms=cub, tflops=2 * m * n * k / t / 1e9)
                    res["timings"].append(r)
                    rows.append(r)
                    print(f"{name:6s} {n}x{k} M={m:4d} ws bt={bt} st={st} p={per}: {t:.3f} ms ({r['tflops']:.0f} "
                          f"TFLOP/s) = {cub / t:.2f}x cuBLAS; ms.linear {lin:.3f} ms ({cub / lin:.2f}x)", flush=True)
    with open(os.path.join(OUT, "prefill_ws.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\nchecks {'all ok' if ok else 'FAILED'}")
    print(f"{'fmt':6s} {'shape':>11s} {'M':>4s} {'best ws':>15s} {'ms':>7s} {'x cuBLAS':>8s} {'ms.linear x':>11s}")
    for (fm, n, k, m), r in fastest(rows, lambda r: (r["fmt"], r["n"], r["k"], r["m"])).items():
        cfg = "bt%s st%s p%s" % (r["block_t"], r["stages"], r["persistent"])
        print(f"{fm:6s} {n:5d}x{k:5d} {m:4d} {cfg:>15s} {r['ms']:7.3f} {r['cublas_ms'] / r['ms']:8.2f} "
              f"{r['cublas_ms'] / r['linear_ms']:11.2f}")


if __name__ == "__main__":
    if os.environ.get("WS") == "1":
        ws_main()
        raise SystemExit(0)
    main()
