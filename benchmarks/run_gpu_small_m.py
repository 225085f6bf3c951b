"""H200: the canonical-layout prefill kernel at 16-64 tokens (tokens as the MMA's N side via
``swap``) against the split-K kernel and cuBLAS bf16; correctness first. Short table.

    PYTHONPATH=. python benchmarks/run_gpu_small_m.py
"""
import os
import sys

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_gpu_gemv import bench  # noqa: E402  (CUDA-graph replays of 20 calls)

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(5)
n, k = 28672, 8192
w = torch.randn(n, k, device=dev, generator=g)
wb = w.to(torch.bfloat16)
rows = []
for name in ("nvfp4", "mxfp4", "mxfp8_e4m3", "int4_affine_g128"):
    q = ms.quantize(w, name)
    pw = L.prepare(q)
    pair = name in ("nvfp4", "mxfp4")
    for m in (16, 64):
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        ref = x.double() @ q.dequantize(torch.float64).T
        t_cub = bench([lambda: F.linear(x, wb)])
        t_tc = bench([lambda: L.linear(x, pw)])
        for bm, bn, st in ((16, 64, 4), (16, 128, 4), (32, 64, 4), (64, 64, 4)):
            if bm > m:
                continue
            cfg = L.PrefillConfig(block_m=bm, block_n=bn, block_k=64, group_m=1, num_warps=4, num_stages=st,
                                  swap=True, pair=pair)
            try:
                out = L.prefill(x, q, None, cfg)
                e = ((out.double() - ref).norm() / ref.norm()).item()
                t = bench([lambda: L.prefill(x, q, None, cfg)])
            except Exception as exc:  # reported, not fatal
                print(f"{name} m={m} {cfg} failed: {type(exc).__name__}: {exc}"[:200], flush=True)
                continue
            rows.append((name, m, f"{bm}x{bn}s{st}", t, t_tc, t_cub, e))
            print(f"{name:17s} M={m:3d} {bm}x{bn}s{st}: {t * 1e3:7.1f} us  err {e:.1e}  ({t_cub / t:4.2f}x cuBLAS; "
                  f"split-K {t_tc * 1e3:.1f} us = {t_cub / t_tc:4.2f}x; cuBLAS {t_cub * 1e3:.1f} us)", flush=True)
    del q, pw
    torch.cuda.empty_cache()
