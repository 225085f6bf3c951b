"""H200 check + benchmark of the decode-path GEMV (``microscale.qlinear.gemv``).

One call: copy bandwidth; correctness of the PTX decode on real shapes for every
4-bit minifloat format against float64 ``x @ dequant(W)^T`` (and the plain-Triton twin);
then M=1/2/4 timings of config variants, the split-K tensor-core kernel
(``linear`` on a prepared weight) and cuBLAS bf16 ``F.linear``, weights rotated past the
60 MB L2, each timed as a CUDA-graph replay. Short table last; JSON to $OUT/gemv.json.

    PYTHONPATH=. python benchmarks/run_gpu_gemv.py [--sweep]

``--sweep`` skips the checks and times a wider set of tile configs on nvfp4 only.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")


def bench(fns, reps: int = 100) -> float:
    """Median ms per call of a CUDA-graph replay of ``fns`` (one call each, over
    rotated weight buffers so L2 does not serve them), divided by ``len(fns)``."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return triton.testing.do_bench(g.replay, warmup=10, rep=reps, return_mode="median") / len(fns)


def main() -> None:
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checks": [], "timings": []}
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    cp = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    bw = 2 * a.numel() / (cp * 1e-3) / 1e9
    del a, b
    res["copy_GBps"] = bw
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    g = torch.Generator(device=dev).manual_seed(7)
    ok = True
    sweep = "--sweep" in sys.argv
    for name in () if sweep else ("nvfp4", "mxfp4", "fp4_fp16"):
        for (m, n, k) in [(1, 4096, 4096), (2, 1000, 2048), (4, 8192, 8192)]:
            w = torch.randn(n, k, device=dev, generator=g)
            q = ms.quantize(w, name)
            x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
            bias = torch.randn(n, device=dev, generator=g)
            ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
            for asm in (True, False):
                out = L.gemv(x, q, bias, use_asm=asm)
                e = ((out.double() - ref).norm() / ref.norm()).item()
                good = bool(torch.isfinite(out).all()) and e < 1e-2
                ok &= good
                res["checks"].append(dict(fmt=name, m=m, n=n, k=k, asm=asm, rel_err=e, ok=good))
                print(f"check {name:9s} m={m} n={n:5d} k={k:5d} asm={asm!s:5s} err={e:.2e} {'ok' if good else 'FAIL'}",
                      flush=True)
    if not ok:
        print("GEMV CHECK FAILED", flush=True)
    rows = []
    for (n, k) in [(28672, 8192), (8192, 8192)] if sweep else [(28672, 8192), (8192, 8192), (8192, 28672)]:
        nrot = max(2, int(3 * 60e6 // (n * k // 2)) + 1)
        ws = [torch.randn(n, k, device=dev, generator=g) for _ in range(1)]
        qs = [ms.quantize(ws[0], "nvfp4") for _ in range(nrot)]
        qm = [] if sweep else [ms.quantize(ws[0], "mxfp4") for _ in range(nrot)]
        wb = [ws[0].to(torch.bfloat16) for _ in range(max(2, int(3 * 60e6 // (n * k * 2)) + 1))]
        del ws
        for m in (1, 2, 4):
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            t_cub = bench([lambda w=w: F.linear(x, w) for w in wb])
            for fname, ql in (("nvfp4", qs),) if sweep else (("nvfp4", qs), ("mxfp4", qm)):
                qbytes = ql[0].nbytes
                pws = [L.prepare(q) for q in ql]
                t_tc = float("nan") if sweep else bench([lambda p=p: L.linear(x, p) for p in pws])
                variants = {"auto": None}
                grid = [(64, 32, 4, 4), (32, 128, 3, 4)]
                if sweep:
                    grid = [(8, 512, 4, 2), (8, 512, 3, 4), (4, 256, 4, 1), (4, 512, 4, 2), (8, 256, 6, 2),
                            (16, 256, 4, 2), (8, 128, 4, 1), (16, 512, 3, 4)]
                for bn, bkw, st, nw in grid:
                    if (k // 8) % bkw == 0:
                        base = L.choose_gemv_config(n, k, dev)
                        variants[f"{bn}x{bkw}s{st}w{nw}"] = L.GemvConfig(bn, bkw, base.split_k, nw, st)
                for vname, cfg in variants.items():
                    try:
                        t = bench([lambda q=q: L.gemv(x, q, None, cfg) for q in ql])
                    except Exception as exc:  # a variant that does not compile is reported, not fatal
                        print(f"variant {vname} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                        continue
                    r = dict(fmt=fname, m=m, n=n, k=k, variant=vname, ms=t, cublas_ms=t_cub, tc_ms=t_tc,
                             speedup=t_cub / t, GBps=qbytes / (t * 1e-3) / 1e9, pct_copy=qbytes / (t * 1e-3) / 1e9 / bw,
                             cfg=str(cfg or L.choose_gemv_config(n, k, dev)))
                    res["timings"].append(r)
                    rows.append(r)
        del qs, qm, wb
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "gemv.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\ncopy {bw:.0f} GB/s; checks {'all ok' if ok else 'FAILED'}")
    print(f"{'fmt':6s} {'M':>2s} {'N':>6s} {'K':>6s} {'variant':>12s} {'ms':>8s} {'cuBLAS':>8s} {'tc-kern':>8s} "
          f"{'x cuBLAS':>8s} {'GB/s':>6s} {'%copy':>6s}")
    best = {}
    for r in rows:
        key = (r["fmt"], r["m"], r["n"], r["k"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    for r in rows:
        if sweep or r["variant"] == "auto" or best[(r["fmt"], r["m"], r["n"], r["k"])] is r:
            print(f"{r['fmt']:6s} {r['m']:2d} {r['n']:6d} {r['k']:6d} {r['variant']:>12s} {r['ms']:8.4f} "
                  f"{r['cublas_ms']:8.4f} {r['tc_ms']:8.4f} {r['speedup']:8.2f} {r['GBps']:6.0f} {100 * r['pct_copy']:5.1f}%")


if __name__ == "__main__":
    main()
