"""H200: the canonical-layout prefill kernel at 16-64 tokens (tokens on the MMA's N side via
``swap``) over K step, split-K and tile variants, against cuBLAS bf16; every variant checked
against float64 first. Short table last; rows also in $OUT/small_m.json.

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
# (block_m, block_n, block_k, num_warps, num_stages, split_k)
V16 = [(16, 64, 64, 4, 4, 1), (16, 64, 128, 4, 4, 1), (16, 64, 256, 4, 4, 1), (16, 64, 256, 4, 3, 1),
       (16, 64, 128, 4, 4, 2), (16, 64, 256, 4, 4, 2), (16, 64, 256, 4, 3, 4), (16, 128, 256, 8, 3, 1),
       (16, 64, 512, 4, 2, 1)]
V64 = [(64, 64, 64, 4, 4, 1), (64, 64, 128, 4, 4, 1), (64, 64, 256, 4, 3, 1), (64, 64, 256, 4, 3, 2),
       (64, 128, 128, 8, 3, 1), (32, 64, 256, 4, 3, 1)]
SHORT = [(16, 64, 64, 4, 4, 1), (16, 64, 256, 4, 4, 1), (16, 64, 256, 4, 4, 2), (16, 64, 256, 4, 3, 4)]
PLAN = [("nvfp4", (16, 64)), ("mxfp8_e4m3", (16, 64)), ("int4_affine_g128", (16,)), ("mxfp4", (16,))]
if QUICK:
    V16, V64 = V16[:1] + V16[5:6], V64[:1]
rows = []
t_start = time.time()
for name, ms_ in PLAN:
    q = ms.quantize(w, name)
    pair = name in ("nvfp4", "mxfp4")
    for m in ms_:
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        ref = x.double() @ q.dequantize(torch.float64).T
        t_cub = bench([lambda: F.linear(x, wb)])
        out = ms.linear(x, q)
        e_def = ((out.double() - ref).norm() / ref.norm()).item()
        t_def = bench([lambda: ms.linear(x, q)])
        rows.append(dict(fmt=name, m=m, cfg="default", us=t_def * 1e3, err=e_def, cublas_us=t_cub * 1e3))
        print(f"{name:17s} M={m:3d} default ms.linear: {t_def * 1e3:7.1f} us  err {e_def:.1e}  "
              f"({t_cub / t_def:4.2f}x cuBLAS {t_cub * 1e3:.1f} us)", flush=True)
        variants = V16 if m <= 16 else V64
        if name in ("int4_affine_g128", "mxfp4"):
            variants = [v for v in variants if v in SHORT]
        for bm, bn, bk, nw, st, sk in variants:
            cfg = L.PrefillConfig(block_m=bm, block_n=bn, block_k=bk, group_m=1, num_warps=nw, num_stages=st,
                                  swap=True, pair=pair, split_k=sk)
            tag = f"{bm}x{bn}x{bk} w{nw} s{st} k{sk}"
            try:
                out = L.prefill(x, q, None, cfg)
                e = ((out.double() - ref).norm() / ref.norm()).item()
                out2 = L.prefill(x, q, None, cfg)
                same = bool(torch.equal(out, out2))
                t = bench([lambda: L.prefill(x, q, None, cfg)])
            except Exception as exc:  # reported, not fatal
                print(f"{name} m={m} {tag} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            ok = e < 1e-2 and same
            rows.append(dict(fmt=name, m=m, cfg=tag, us=t * 1e3, err=e, cublas_us=t_cub * 1e3, ok=ok))
            print(f"{name:17s} M={m:3d} {tag:22s}: {t * 1e3:7.1f} us  err {e:.1e} {'ok' if ok else 'BAD'}  "
                  f"({t_cub / t:4.2f}x cuBLAS)", flush=True)
    del q
    torch.cuda.empty_cache()
with open(os.path.join(OUT, "small_m.json"), "w") as f:
    json.dump(rows, f, indent=1)
print(f"\n--- best per (format, M)   [{time.time() - t_start:.0f} s]")
for key in sorted({(r["fmt"], r["m"]) for r in rows}):
    rs = [r for r in rows if (r["fmt"], r["m"]) == key and r.get("ok", True)]
    b = min(rs, key=lambda r: r["us"])
    d = [r for r in rs if r["cfg"] == "default"]
    print(f"{key[0]:17s} M={key[1]:3d} best {b['cfg']:22s} {b['us']:7.1f} us = {b['cublas_us'] / b['us']:4.2f}x cuBLAS"
          + (f"   default {d[0]['us']:7.1f} us" if d else ""))
bad = [r for r in rows if r.get("ok") is False]
print("checks all ok" if not bad else f"checks FAILED: {len(bad)}")
