"""One-token linear over a sustained window (H200): is the suite's spread (NVFP4 1x28672x8192
p20 33.7 / p80 37.2 µs within one run) the GPU's clock state? CUDA graphs of 20 calls
alternating over two weight copies (as the suite rotates), replayed back to back for
``SECONDS`` (default 1.5) after 2 s idle; the time per call in ten consecutive windows, for
NVFP4, MXFP4 and cuBLAS bf16, twice each (``ROUNDS``), at 1 token or each of ``TOKENS``.
Run ``nvidia-smi`` sampling beside it (read only) to see the clocks and power:
benchmarks/run_gpu_power.sh does.
    [TOKENS=1,16,4096] [ROUNDS=2] python benchmarks/exp_clocks.py"""
import os
import statistics
import time

import torch
import torch.nn.functional as F

import microscale as ms

dev = torch.device("cuda")
SECONDS = float(os.environ.get("SECONDS_WINDOW", "1.5"))
n, k = 28672, 8192


def graph_of(fns, calls=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    torch.cuda.synchronize()
    return g, calls


def sustained(name, fns):
    g, calls = graph_of(fns, 20 if m < 1024 else 4)
    g.replay()
    torch.cuda.synchronize()
    time.sleep(2.0)
    t0 = time.time()
    ev = []
    while time.time() - t0 < SECONDS:
        batch = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            batch.append((a, b))
        ev += batch
        batch[-1][1].synchronize()
    us = [a.elapsed_time(b) * 1e3 / calls for a, b in ev]
    bins = [us[i * len(us) // 10:(i + 1) * len(us) // 10] for i in range(10)]
    print(f"{name:12s} start {time.strftime('%H:%M:%S', time.localtime(t0))}.{int(t0 % 1 * 1000):03d} "
          f"{len(us)} replays, median {statistics.median(us):.1f} µs/call; per tenth: "
          + " ".join(f"{statistics.median(b):.1f}" for b in bins), flush=True)


w = torch.randn(n, k, device=dev)
qs = {f: [ms.quantize(w, f), ms.quantize(w * 1.01, f)] for f in ("nvfp4", "mxfp4")}
wb = [w.to(torch.bfloat16), (w * 1.01).to(torch.bfloat16)]
w = None
for m in [int(t) for t in os.environ.get("TOKENS", "1").split(",")]:
    x = torch.randn(m, k, device=dev).to(torch.bfloat16)
    for rnd in range(int(os.environ.get("ROUNDS", "2"))):
        for f in ("nvfp4", "mxfp4"):
            sustained(f"{f} m{m}", [lambda q=q: ms.linear(x, q) for q in qs[f]])
        sustained(f"cuBLAS m{m}", [lambda v=v: F.linear(x, v) for v in wb])
