"""H200 check + benchmark of the decode-path GEMV (``microscale.qlinear.gemv``).

One call: copy bandwidth; correctness of the PTX decode on real shapes for every element
kind (E2M1, E4M3, E5M2, int8, int4) and 1-4 tokens against float64 ``x @ dequant(W)^T``
(and the plain-Triton twin); then timings of tile variants per format and token count,
the activation-prep kernel alone, and cuBLAS bf16 ``F.linear`` on the same shapes,
weights rotated past the 60 MB L2, each timed as a CUDA-graph replay. Short table last;
JSON to $OUT/gemv.json.

    PYTHONPATH=. python benchmarks/run_gpu_gemv.py [--quick]
    GEMV_ONLY=nvfp4:2,nvfp4:4 PYTHONPATH=. python benchmarks/run_gpu_gemv.py   (those timing rows)
    GEMV_NOCHECK=1 ...   (no correctness checks: timings only)
"""
from __future__ import annotations

import json
from dataclasses import replace
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L
from microscale.kernels import _gemv_kernels as kern

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")


def bench(fns, reps: int = 60, min_calls: int = 20) -> float:
    """Median ms per call of a CUDA-graph replay of ``fns`` (over rotated weight buffers so
    L2 does not serve them), unrolled to at least ``min_calls`` calls per replay so the
    replay's own launch cost is amortised as in ``microscale.bench``."""
    fns = list(fns) * max(1, -(-min_calls // len(fns)))
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


def fastest(rows: list, key) -> dict:
    """``{key(row): the row of least "ms"}``, keys in first-seen order (the scripts' summaries)."""
    best: dict = {}
    for r in rows:
        kk = key(r)
        if kk not in best or r["ms"] < best[kk]["ms"]:
            best[kk] = r
    return best


CHECK_FORMATS = ("nvfp4", "mxfp4", "fp4_fp16", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp8", "mxint8", "int8_fp16",
                 "int4_fp32", "fp8_e4m3_block128", "int4_affine_g128", "int8_affine_g32")
# (format, tokens, [(block_n, block_kw, num_warps, num_stages, pdl, prefetch), ...]); block_kw in int32 words
_F4 = [(4, 256, 2, 4, 1, 1), (4, 512, 2, 4, 1, 1), (8, 256, 2, 4, 1, 1)]
_F8 = [(4, 256, 2, 4, 1, 0), (4, 512, 4, 3, 1, 1)]
GRID = [
    ("nvfp4", 1, _F4),
    ("mxfp4", 1, _F4),
    ("mxfp8_e4m3", 1, _F8),
    ("int8_fp16", 1, _F8),
    ("mxint8", 1, []),
    ("int4_affine_g128", 1, _F4),
    ("int8_affine_g128", 1, _F8),
    ("nvfp4", 2, []),
    ("nvfp4", 4, [(4, 128, 1, 4, 1, 0)]),
    ("mxfp4", 4, []),
    ("nvfp4", 8, []),
    ("mxfp8_e4m3", 4, []),
]


def start_run() -> tuple[dict, float]:
    """The run's header (device, versions, date) and the measured copy bandwidth (GB/s)."""
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checks": [], "timings": []}
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    cp = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    bw = 2 * a.numel() / (cp * 1e-3) / 1e9  # a, b are freed when this returns
    res["copy_GBps"] = bw
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    return res, bw


def main() -> None:
    quick = "--quick" in sys.argv
    res, bw = start_run()
    g = torch.Generator(device=dev).manual_seed(7)
    ok = True
    for name in () if os.environ.get("GEMV_NOCHECK") == "1" else CHECK_FORMATS:  # (timings only)
        for (m, n, k) in [(1, 4096, 4096), (3, 1000, 2048), (4, 8192, 8192), (2, 256, 28672)]:
            w = torch.randn(n, k, device=dev, generator=g)
            q = ms.quantize(w, name)
            x = (torch.randn(m, k, device=dev, generator=g) * 2).to(torch.bfloat16)
            x[0, :64] = 0.0
            x[-1, 5] = 300.0  # an outlier: the row's power of two follows it
            bias = torch.randn(n, device=dev, generator=g)
            ref = x.double() @ q.dequantize(torch.float64).T + bias.double()
            for asm, pdl, sel in ((True, False, False), (True, True, False), (False, False, False),
                                  (True, False, True), (True, False, "direct")):
                cfg = L.GemvConfig(block_n=4, block_kw=128, pdl=True, prefetch=True) if pdl else None
                if sel == "direct":  # scales by tl.load (the default loads them in PTX, scale_direct)
                    cfg = replace(L.choose_gemv_config(n, k, dev, m, q.fmt.element.bits), scale_direct=False)
                elif sel:  # the shift decode and byte-loaded scales (the defaults are f4_select / scale_pairs)
                    cfg = replace(L.choose_gemv_config(n, k, dev, m, q.fmt.element.bits), f4_select=False,
                                  scale_pairs=False)
                out = L.gemv(x, q, bias, cfg, use_asm=asm)
                e = ((out.double() - ref).norm() / ref.norm()).item()
                good = bool(torch.isfinite(out).all()) and e < 1e-2 and out.dtype == x.dtype
                ok &= good
                res["checks"].append(dict(fmt=name, m=m, n=n, k=k, asm=asm, pdl=pdl, select=sel, rel_err=e, ok=good))
                if not good or (asm and m == 4):
                    print(f"check {name:17s} m={m} n={n:5d} k={k:5d} asm={asm!s:5s} err={e:.2e} "
                          f"{'ok' if good else 'FAIL'}", flush=True)
    # linear() routes few tokens here: one end-to-end check through the public op
    q = ms.quantize(torch.randn(512, 1024, device=dev, generator=g), "nvfp4")
    x = torch.randn(2, 3, 1024, device=dev, generator=g).to(torch.bfloat16)
    e = ((ms.linear(x, q).double() - x.double() @ q.dequantize(torch.float64).T).norm()
         / (x.double() @ q.dequantize(torch.float64).T).norm()).item()
    ok &= e < 1e-2
    print(f"check ms.linear 2x3 tokens err={e:.2e}", flush=True)
    print(f"checks {'all ok' if ok else 'FAILED'} ({len(res['checks'])})", flush=True)
    rows = []
    n, k = 28672, 8192
    w = torch.randn(n, k, device=dev, generator=g)
    wb = [w.to(torch.bfloat16) for _ in range(2)]
    qcache: dict = {}
    cub: dict = {}
    only = os.environ.get("GEMV_ONLY")  # e.g. "nvfp4:2,mxfp4:4": those rows of GRID
    grid_rows = [r for r in GRID if f"{r[0]}:{r[1]}" in only.split(",")] if only else GRID[:2] if quick else GRID
    for fname, m, grid in grid_rows:
        if fname not in qcache:
            qcache[fname] = [ms.quantize(w, fname) for _ in range(2)]
        ql = qcache[fname]
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        if m not in cub:
            cub[m] = bench([lambda wt=wt: F.linear(x, wt) for wt in wb])
        qbytes = ql[0].nbytes
        d0 = L.choose_gemv_config(n, k, dev, m, ql[0].fmt.element.bits)
        # the default's select decode / paired scales turned off (label without x / y)
        sel = [replace(d0, f4_select=False, scale_pairs=False)] if fname in ("nvfp4", "mxfp4") else []
        sel += [replace(d0, scale_pairs=False), replace(d0, f4_select=False)] if fname == "nvfp4" else []
        sel += [replace(d0, scale_direct=False)]  # scales by tl.load (label without d; the default has d)
        for cfg in [None] + sel + [L.GemvConfig(bn, bkw, 1, nw, st, pdl=bool(p), prefetch=bool(pf))
                                   for bn, bkw, nw, st, p, pf in grid]:
            try:
                t = bench([lambda q=q: L.gemv(x, q, None, cfg) for q in ql])
            except Exception as exc:  # a variant that does not compile is reported, not fatal
                print(f"variant {cfg} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            r = dict(fmt=fname, m=m, n=n, k=k, variant="auto" if cfg is None else f"{cfg.block_n}x{cfg.block_kw}"
                     f"w{cfg.num_warps}s{cfg.num_stages}{'p' if cfg.pdl else ''}{'f' if cfg.prefetch else ''}"
                     f"{'x' if cfg.f4_select else ''}{'y' if cfg.scale_pairs else ''}"
                     f"{'d' if cfg.scale_direct else ''}", ms=t, cublas_ms=cub[m], speedup=cub[m] / t,
                     GBps=qbytes / (t * 1e-3) / 1e9, pct_copy=qbytes / (t * 1e-3) / 1e9 / bw)
            res["timings"].append(r)
            rows.append(r)
            print(f"{fname:11s} M={m:2d} {r['variant']:>12s} {t * 1e3:7.1f} us  {r['speedup']:5.2f}x cuBLAS  "
                  f"{100 * r['pct_copy']:5.1f}% copy", flush=True)
    # the activation prep alone (a single-program kernel per token)
    for m in (1, 4):
        x = torch.randn(m, k, device=dev).to(torch.bfloat16)
        xp = torch.empty((m, k), dtype=torch.float16, device=dev)
        xs = torch.empty((m, 2), dtype=torch.float32, device=dev)
        t = bench([lambda: kern._prep_x_kernel[(m, 2)](x, xp, xs, x.stride(0), K=k, XE=15, KIND=0, CW=512)])
        res[f"prep_us_m{m}"] = t * 1e3
        print(f"prep kernel alone M={m}: {t * 1e3:.1f} us", flush=True)
    with open(os.path.join(OUT, "gemv.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\ncopy {bw:.0f} GB/s; checks {'all ok' if ok else 'FAILED'}; prep {res['prep_us_m1']:.1f} us (M=1)")
    print(f"{'fmt':11s} {'M':>2s} {'best':>12s} {'us':>7s} {'auto us':>7s} {'cuBLAS':>7s} {'x cuBLAS':>8s} {'%copy':>6s}")
    auto = {(r["fmt"], r["m"]): r for r in rows if r["variant"] == "auto"}
    for key, r in fastest(rows, lambda r: (r["fmt"], r["m"])).items():
        print(f"{key[0]:11s} {key[1]:2d} {r['variant']:>12s} {r['ms'] * 1e3:7.1f} {auto[key]['ms'] * 1e3:7.1f} "
              f"{r['cublas_ms'] * 1e3:7.1f} {r['speedup']:8.2f} {100 * r['pct_copy']:5.1f}%")


if __name__ == "__main__":
    main()
