"""Host time per eager ``ms.linear`` call on a GPU: the CPU time a call takes to return, per route.

``tools/host_time.py`` measures the same on a machine without a GPU (launches stood in); this
script measures it where the kernels really launch. Each repeat issues ``calls`` calls back to back
without synchronizing (fewer than the launch queue holds, so the host never waits on the GPU),
times them with the host clock, then synchronizes; the GPU time per call is printed beside it
(events around the same loop), so a route whose kernel is longer than its host time is visible.

    PYTHONPATH=. python benchmarks/host_time_gpu.py [--calls 400] [--repeats 9] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import microscale as ms
from microscale.bench.report import write_text_atomic

# (format, tokens, N, K): the decode routes at 1, 8 and 16 tokens, a prefill at 256
CASES = [("nvfp4", 1, 4096, 4096), ("mxfp8_e4m3", 1, 4096, 4096), ("nvfp4", 8, 4096, 4096),
         ("nvfp4", 16, 4096, 4096), ("int4_affine_g128", 16, 4096, 4096), ("nvfp4", 256, 4096, 4096)]


def measure(fmt: str, m: int, n: int, k: int, calls: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    w = ms.quantize(torch.randn(n, k, generator=gen), fmt).to("cuda")
    x = torch.randn(m, k, generator=gen).bfloat16().cuda()
    want = x.double() @ w.dequantize(torch.float64).T
    got = ms.linear(x, w)
    err = float((got.double() - want).norm() / want.norm())
    for _ in range(20):  # warm: compile, route cache
        ms.linear(x, w)
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(repeats):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        s = time.perf_counter()
        for _ in range(calls):
            ms.linear(x, w)
        host.append((time.perf_counter() - s) / calls * 1e6)
        t1.record()
        torch.cuda.synchronize()
        dev.append(t0.elapsed_time(t1) / calls * 1e3)
    return {"format": fmt, "tokens": m, "shape": [n, k], "rel_err": err,
            "host_us": statistics.median(host), "gpu_us_per_call_in_loop": statistics.median(dev)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    rows = []
    for fmt, m, n, k in CASES:
        r = measure(fmt, m, n, k, a.calls, a.repeats)
        rows.append(r)
        print(f"{fmt:18s} {m:4d} tok {n}x{k}: host {r['host_us']:6.1f} µs/call, loop {r['gpu_us_per_call_in_loop']:6.1f}"
              f" µs/call on the GPU clock, rel err {r['rel_err']:.2e}", flush=True)
    if a.json:  # written whole or not at all
        write_text_atomic(a.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
