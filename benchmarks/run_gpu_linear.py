"""H200 check + benchmark of ``microscale.linear`` vs cuBLAS bf16 ``F.linear``.

One call does everything (device time is scarce): device facts and copy bandwidth,
correctness on real shapes for a representative set of formats (every element kind
and scale kind) against float64 ``x @ dequant(W)^T`` with poisoned outputs, CUDA-graph
capture and torch.compile of the op, then timings of every variant and cuBLAS bf16.
Weights are rotated so the 60 MB L2 does not serve them; small launches are timed
as CUDA-graph replays. Prints a short table last; writes JSON to $OUT/linear.json.

    PYTHONPATH=. python benchmarks/run_gpu_linear.py [--quick] [--variants]
"""
from __future__ import annotations

import argparse
import json
import math
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
RES: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "checks": [], "timings": []}


def log(*a):
    print(*a, flush=True)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # 1 GiB
    b = torch.empty_like(a)
    ms_ = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() / (ms_ * 1e-3) / 1e9


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


CHECK_FORMATS = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "mxint4",
                 "nvfp8", "fp4_fp16", "int4_fp16", "int8_fp32", "int3_fp16", "int4_affine_g128",
                 "int8_affine_g64", "fp8_e4m3_block128x128"]


def correctness(quick: bool) -> bool:
    ok = True
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    shapes = [(1, 384, 1024), (7, 200, 512), (16, 256, 2048), (45, 640, 1024), (300, 384, 512)]
    if quick:
        shapes = [(7, 200, 512), (300, 384, 512)]
    for name in (["nvfp4", "int4_affine_g128", "mxint8"] if quick else CHECK_FORMATS):
        fmt = ms.get_format(name)
        for (m, n, k) in shapes:
            if fmt.block_rows > 1:
                n = max(128, n // 128 * 128)
            w = torch.randn(n, k, device=dev, generator=g)
            q = ms.quantize(w, name)
            pw = L.prepare(q)
            for dt in (torch.bfloat16, torch.float16) if m in (7, 300) else (torch.bfloat16,):
                x = torch.randn(m, k, device=dev, generator=g).to(dt)
                bias = torch.randn(n, device=dev, generator=g) if m % 2 else None
                out = torch.full((m, n), float("nan"), dtype=dt, device=dev)
                L._launch(x, pw, bias, None, out=out)
                torch.cuda.synchronize()
                ref = x.double() @ q.dequantize(torch.float64).T + (0 if bias is None else bias.double())
                e = rel_err(out, ref)
                written = not bool(torch.isnan(out).any())
                good = e < 1e-2 and written
                ok &= good
                RES["checks"].append(dict(fmt=name, m=m, n=n, k=k, dtype=str(dt), err=e, ok=good))
                if not good:
                    log(f"FAIL {name} m={m} n={n} k={k} {dt} err={e:.3e} written={written}")
        log(f"check {name}: ok so far={ok}")
    # variants of the decode path on one format each
    for name in [] if quick else ["nvfp4", "int4_affine_g128", "mxfp8_e4m3"]:
        w = torch.randn(1024, 4096, device=dev, generator=g)
        q = ms.quantize(w, name)
        pw = L.prepare(q)
        for m in (1, 13):
            x = torch.randn(m, 4096, device=dev, generator=g).to(torch.bfloat16)
            ref = x.double() @ q.dequantize(torch.float64).T
            for cfg in variants(pw, m):
                out = torch.full((m, 1024), float("nan"), dtype=x.dtype, device=dev)
                try:
                    for _ in range(2):  # second call checks the workspace was left clean
                        L._launch(x, pw, None, cfg, out=out)
                except Exception as ex:
                    log(f"variant failed to run {name} m={m} {cfg}: {type(ex).__name__} {str(ex)[:150]}")
                    continue
                e = rel_err(out, ref)
                good = e < 1e-2 and not bool(torch.isnan(out).any())
                ok &= good
                if not good:
                    log(f"FAIL variant {name} m={m} {cfg} err={e:.3e}")
    # public op, leading dims, CUDA graph, torch.compile
    q = ms.quantize(torch.randn(512, 1024, device=dev), "nvfp4")
    x = torch.randn(2, 3, 1024, device=dev, dtype=torch.bfloat16)
    ref = (x.double() @ q.dequantize(torch.float64).T)
    y = L.linear(x, q)
    e1 = rel_err(y, ref)
    gr = torch.cuda.CUDAGraph()
    y2 = None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        L.linear(x, q)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(gr):
        y2 = L.linear(x, q)
    x.copy_(torch.randn_like(x))
    gr.replay()
    torch.cuda.synchronize()
    e2 = rel_err(y2, x.double() @ q.dequantize(torch.float64).T)
    pwc = L.prepare(q)  # under torch.compile pass the prepared weight
    fc = torch.compile(lambda a: L.linear(a, pwc), fullgraph=True)
    e3 = rel_err(fc(x), x.double() @ q.dequantize(torch.float64).T)
    log(f"public op err={e1:.2e} cuda-graph err={e2:.2e} compile err={e3:.2e}")
    ok &= max(e1, e2, e3) < 1e-2
    RES["op_checks"] = dict(public=e1, cuda_graph=e2, compile=e3)
    return ok


def variants(pw, m):
    base = L.choose_config(m, pw, torch.bfloat16, dev)
    out = [base]
    if isinstance(base, L.SplitKConfig):
        import dataclasses as dc
        if base.pair:
            out.append(dc.replace(base, pair=False))
        out.append(dc.replace(base, block_kw=base.block_kw * 2, split_k=max(1, base.split_k // 2)))
        out.append(dc.replace(base, block_n=64, split_k=max(1, base.split_k // 2)))
        out.append(dc.replace(base, num_warps=8))
    return out


def bench(fn, graph_calls: int) -> float:
    """Median ms per call; small calls are captured `graph_calls` times in a CUDA graph."""
    fn(0)
    torch.cuda.synchronize()
    if graph_calls > 1:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(graph_calls):
                fn(i)
        torch.cuda.current_stream().wait_stream(s)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            for i in range(graph_calls):
                fn(i)
        t = triton.testing.do_bench(gr.replay, warmup=20, rep=200, return_mode="median")
        return t / graph_calls
    return triton.testing.do_bench(lambda: fn(0), warmup=10, rep=100, return_mode="median")


def timing(shapes, ms_list, formats, with_variants: bool):
    rows = []
    for (n, k) in shapes:
        wf = torch.randn(n, k, device=dev)
        nrot_bf16 = max(2, math.ceil(3 * 60e6 / (n * k * 2)))
        wbs = [wf.to(torch.bfloat16) if i == 0 else torch.randn(n, k, device=dev, dtype=torch.bfloat16)
               for i in range(nrot_bf16)]
        qs = {}
        wdq = {}
        for name in formats:
            q = ms.quantize(wf, name)
            wdq[name] = q.dequantize(torch.float32)
            pw = L.prepare(q)
            nrot = max(2, math.ceil(3 * 60e6 / pw.nbytes))
            # rotated copies (same values; distinct buffers)
            copies = [pw] + [L.PackedLinearWeight(pw.fmt, pw.n, pw.k, pw.container_bits, pw.codes.clone(),
                                                  pw.scales.clone(), None if pw.zero_points is None else
                                                  pw.zero_points.clone(), pw.global_scale, pw.specials)
                             for _ in range(nrot - 1)]
            qs[name] = copies
        for m in ms_list:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            gc = 8 if m <= 128 else 1
            t_cub = bench(lambda i: F.linear(x, wbs[i % len(wbs)]), gc)
            flops = 2 * m * n * k
            for name, copies in qs.items():
                pw = copies[0]
                cfgs = variants(pw, m) if (with_variants and m <= 16 and n == 28672) else [None]
                for vi, cfg in enumerate(cfgs):
                    outb = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                    try:
                        yo = L._launch(x, copies[0], None, cfg)
                        ref = x.float() @ wdq[name].T
                        verr = ((yo.float() - ref).norm() / ref.norm()).item()
                        t = bench(lambda i: L._launch(x, copies[i % len(copies)], None, cfg, out=outb), gc)
                    except Exception as ex:  # a variant that does not compile is reported, not fatal
                        log(f"variant failed {name} m={m} {cfg}: {type(ex).__name__}: {str(ex)[:200]}")
                        continue
                    gbs = (pw.nbytes + 2 * m * k + 2 * m * n) / (t * 1e-3) / 1e9
                    r = dict(m=m, n=n, k=k, fmt=name, variant=vi, err=verr, cfg=repr(cfg if cfg else L.choose_config(
                        m, pw, torch.bfloat16, dev)), ms=t, cublas_ms=t_cub, ratio=t_cub / t, gbs=gbs,
                        tflops=flops / (t * 1e-3) / 1e12)
                    rows.append(r)
                    RES["timings"].append(r)
                    log(f"ROW {name:11s} {vi:1d} {m:5d} {n:6d} {k:6d} {t:9.4f} {t_cub:8.4f} {t_cub / t:6.2f} {gbs:6.0f} err={verr:.1e}")
            log(f"timed n={n} k={k} m={m} cublas={t_cub:.4f}ms")
        del qs, wbs, wf, wdq
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--formats", default="nvfp4,mxfp4,mxfp8_e4m3,int8_fp16")
    ap.add_argument("--ms", default="1,2,4,8,16,32,64,128,512,4096")
    ap.add_argument("--shapes", default="8192x8192,28672x8192,8192x28672")
    a = ap.parse_args()
    t0 = time.time()
    bw = copy_bandwidth()
    RES["copy_gbs"] = bw
    log(f"{RES['device']} torch {torch.__version__} triton {triton.__version__}; copy {bw:.0f} GB/s (r+w)")
    if not a.no_check:
        ok = correctness(a.quick)
        RES["correct"] = ok
        log(f"CORRECTNESS {'PASS' if ok else 'FAIL'} ({time.time() - t0:.0f}s)")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows = timing(shapes, [int(v) for v in a.ms.split(",")], a.formats.split(","), a.variants)
    with open(os.path.join(OUT, "linear.json"), "w") as f:
        json.dump(RES, f, indent=1)
    log(f"total {time.time() - t0:.0f}s")
    log(f"{'fmt':11s} {'v':>1s} {'M':>5s} {'N':>6s} {'K':>6s} {'ours ms':>9s} {'cuBLAS':>8s} {'ratio':>6s} {'GB/s':>6s}")
    for r in rows:
        log(f"{r['fmt']:11s} {r['variant']:1d} {r['m']:5d} {r['n']:6d} {r['k']:6d} {r['ms']:9.4f} {r['cublas_ms']:8.4f} "
            f"{r['ratio']:6.2f} {r['gbs']:6.0f}")


if __name__ == "__main__":
    sys.exit(main())
