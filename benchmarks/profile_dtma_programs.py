"""Thirty-third session: why do equal stream-K shares cost ~6-8 us? ``qlinear.decode_tma`` on
28672x8192 NVFP4 at 16 tokens (256-row tiles, 112 of them) with ``PROGRAMS`` programs (default
112,113,132). ``time``: CUDA-graph medians of each; else (an ncu target, ``--profile-from-start off``)
each launched twice to warm up and then once inside ``cudaProfilerStart/Stop``."""
import os
import sys

import torch
import triton

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(3)
q = ms.quantize(torch.randn(28672, 8192, device=dev, generator=g), "nvfp4")
x = torch.randn(16, 8192, device=dev, generator=g).to(torch.bfloat16)
progs = [int(p) for p in os.environ.get("PROGRAMS", "112,113,132").split(",")]
for p in progs:
    def fn(p=p):
        return L.decode_tma(x, q, programs=p)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    if sys.argv[1:] == ["time"]:
        t = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
        print(f"programs {p}: {t:.1f} us")
    else:
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
