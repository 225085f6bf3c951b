"""H200: the canonical-layout prefill kernel over K step, split-K, tile, swap and pair-decode
variants at 4-64 tokens (tokens on the MMA's N side via ``swap``) and at 4096, against the
default ``ms.linear`` route (GEMV up to 8 tokens) and cuBLAS bf16; every variant checked
against float64 first (rows 0-63 at 4096 tokens). Short table last; rows in
$OUT/small_m.json.

    PYTHONPATH=. python benchmarks/run_gpu_small_m.py         (QUICK=1: fewer variants)
"""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_gpu_gemv import bench  # noqa: E402  (CUDA-graph replays of 20 calls)

QUICK = os.environ.get("QUICK") == "1"
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(5)
n, k = 28672, 8192
w = torch.randn(n, k, device=dev, generator=g)
wb = w.to(torch.bfloat16)
# (block_m, block_n, block_k, num_warps, num_stages, split_k[, swap, pair]); pair defaults to the format's
V16 = [(16, 64, 128, 4, 4, 2), (16, 64, 128, 4, 4, 4), (16, 64, 128, 4, 3, 2), (16, 64, 256, 4, 4, 2),
       (16, 64, 64, 4, 4, 4), (16, 64, 64, 4, 6, 2)]
V32 = [(32, 64, 128, 4, 4, 2), (32, 64, 64, 4, 4, 2), (32, 64, 128, 4, 3, 1), (16, 64, 128, 4, 4, 2)]
V64 = [(64, 64, 64, 4, 4, 1), (64, 64, 128, 4, 3, 1), (64, 64, 64, 4, 4, 2)]
V4K = [(256, 128, 64, 8, 4, 1, True, True), (256, 128, 64, 8, 3, 1, True, True), (256, 128, 64, 8, 3, 1, False, True),
       (256, 128, 64, 8, 3, 1, False, False), (128, 128, 64, 8, 4, 1, True, True)]
PLAN = [("nvfp4", 16, V16), ("nvfp4", 32, V32), ("mxfp8_e4m3", 16, V16[:4]), ("mxfp8_e4m3", 64, V64),
        ("mxfp8_e4m3", 4096, V4K), ("int4_affine_g128", 16, [(16, 64, 128, 4, 4, 4), (16, 64, 256, 4, 4, 4)]),
        ("mxfp4", 16, V16[:2]), ("nvfp4", 64, V64[1:]), ("nvfp4", 4096, []), ("int4_affine_g128", 4096, []),
        ("nvfp4", 6, V16[:1]), ("nvfp4", 8, V16[:1]), ("mxfp8_e4m3", 8, V16[:1]), ("mxfp8_e4m3", 4, V16[:1])]
if QUICK:
    PLAN = [(f, m, v[:1]) for f, m, v in PLAN]
rows = []
t_start = time.time()
cache = {}
for name, m, variants in PLAN:
    if name not in cache:
        cache.clear()
        torch.cuda.empty_cache()
        cache[name] = ms.quantize(w, name)
    q = cache[name]
    pair_default = name in ("nvfp4", "mxfp4", "mxfp8_e4m3")
    x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    ref = (x.double() @ q.dequantize(torch.float64).T) if m <= 64 else None
    def err(out):
        if ref is None:  # big M: float64 on a slice of rows
            r = x[:64].double() @ q.dequantize(torch.float64).T
            return ((out[:64].double() - r).norm() / r.norm()).item()
        return ((out.double() - ref).norm() / ref.norm()).item()
    t_cub = bench([lambda: F.linear(x, wb)], min_calls=20 if m <= 64 else 3)
    out = ms.linear(x, q)
    e_def = err(out)
    t_def = bench([lambda: ms.linear(x, q)], min_calls=20 if m <= 64 else 3)
    rows.append(dict(fmt=name, m=m, cfg="default", us=t_def * 1e3, err=e_def, cublas_us=t_cub * 1e3, ok=e_def < 1e-2))
    print(f"{name:17s} M={m:4d} default ms.linear: {t_def * 1e3:8.1f} us  err {e_def:.1e}  "
          f"({t_cub / t_def:4.2f}x cuBLAS {t_cub * 1e3:.1f} us)", flush=True)
    for v in variants:
        bm, bn, bk, nw, st, sk = v[:6]
        swap, pair = (v[6], v[7]) if len(v) > 6 else (True, pair_default)
        cfg = L.PrefillConfig(block_m=bm, block_n=bn, block_k=bk, group_m=1 if m <= 64 else 8, num_warps=nw,
                              num_stages=st, swap=swap, pair=pair, split_k=sk)
        tag = f"{bm}x{bn}x{bk} w{nw} s{st} k{sk}{' sw' if swap else ''}{' pr' if pair else ''}"
        try:
            out = L.prefill(x, q, None, cfg)
            e = err(out)
            same = bool(torch.equal(out, L.prefill(x, q, None, cfg)))
            t = bench([lambda: L.prefill(x, q, None, cfg)], min_calls=20 if m <= 64 else 3)
        except Exception as exc:  # reported, not fatal
            print(f"{name} m={m} {tag} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        ok = e < 1e-2 and same
        rows.append(dict(fmt=name, m=m, cfg=tag, us=t * 1e3, err=e, cublas_us=t_cub * 1e3, ok=ok))
        print(f"{name:17s} M={m:4d} {tag:28s}: {t * 1e3:8.1f} us  err {e:.1e} {'ok' if ok else 'BAD'}  "
              f"({t_cub / t:4.2f}x cuBLAS)", flush=True)
with open(os.path.join(OUT, "small_m.json"), "w") as f:
    json.dump(rows, f, indent=1)
print(f"\n--- best per (format, M)   [{time.time() - t_start:.0f} s]")
for key in sorted({(r["fmt"], r["m"]) for r in rows}):
    rs = [r for r in rows if (r["fmt"], r["m"]) == key and r["ok"]]
    if not rs:
        continue
    b = min(rs, key=lambda r: r["us"])
    d = [r for r in rs if r["cfg"] == "default"]
    print(f"{key[0]:17s} M={key[1]:4d} best {b['cfg']:28s} {b['us']:7.1f} us = {b['cublas_us'] / b['us']:4.2f}x cuBLAS"
          + (f"   default {d[0]['us']:7.1f} us" if d else ""))
bad = [r for r in rows if not r["ok"]]
print("checks all ok" if not bad else f"checks FAILED: {len(bad)}")
