"""Does one-token linear time depend on where the weight lies in device memory? (H200)
Copies of one quantized weight, each a fresh allocation, timed one call at a time after an
L2 flush (events around the call alone; the flush's dirty lines slow it), side by side with
cuBLAS bf16 on copies of the dense weight; then the suite's way (CUDA graph, calls
alternating over two copies); for normal weights and for the bench suite's (a power of
two per row).
    COPIES=8 python benchmarks/exp_placement.py [NxK ...]   (default 28672x8192)"""
import dataclasses
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import microscale as ms
from exp_clocks import graph_of  # a sibling script: benchmarks/ is on sys.path when run

dev = torch.device("cuda")
COPIES = int(os.environ.get("COPIES", "8"))
REPS = 40
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)


def clone(q):
    c = lambda t: None if t is None else t.clone()  # noqa: E731
    return dataclasses.replace(q, data=c(q.data), scales=c(q.scales), global_scale=c(q.global_scale),
                               zero_points=c(q.zero_points))


def cold(fn) -> float:
    """Median µs of fn() alone, each call after writing 256 MiB (L2 flushed)."""
    ts = []
    for _ in range(REPS):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ts) * 1e3


def graph(fns, calls: int = 20, reps: int = 10) -> float:
    """µs per call: a CUDA graph of ``calls`` calls rotating over ``fns``, replayed ``reps`` times."""
    g, calls = graph_of(fns, calls)
    g.replay()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        ts.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ts) * 1e3 / calls


shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(28672, 8192)]
rows = []
for (n, k), data in [(s, d) for s in shapes for d in ("randn", "per-row 2^k")]:
    w = torch.randn(n, k, device=dev)
    if data != "randn":  # as the bench suite makes weights: a power of two per row, 2^-4 .. 2^4, in bf16
        w = (w * torch.exp2(torch.randint(-4, 5, (n, 1), device=dev).float())).to(torch.bfloat16)
    x = torch.randn(1, k, device=dev).to(torch.bfloat16)
    wb = [w.to(torch.bfloat16) for _ in range(3)]
    for fmt in ("nvfp4", "mxfp4"):
        q0 = ms.quantize(w, fmt)
        qs = [clone(q0) for _ in range(COPIES)]
        ref = (x.double() @ q0.dequantize().double().T)
        for q in qs:
            out = ms.linear(x, q)
            assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
        t = [cold(lambda q=q: ms.linear(x, q)) for q in qs[:2]]
        tg = [graph([lambda q=q: ms.linear(x, q), lambda q=r: ms.linear(x, q)]) for q, r in zip(qs[0::2], qs[1::2])]
        rows.append((f"{n}x{k}", fmt, f"{data}: cold, per copy", t))
        rows.append((f"{n}x{k}", fmt, f"{data}: graph, pairs", tg))
        print(*rows[-2], flush=True)
        print(*rows[-1], flush=True)
        qs = q0 = None
    tb = [cold(lambda v=v: F.linear(x, v)) for v in wb]
    rows.append((f"{n}x{k}", "bf16", f"{data}: cuBLAS cold", tb))
    w = wb = None
print(f"\n{'shape':12s} {'fmt':6s} {'method':30s} {'min':>6s} {'median':>7s} {'max':>6s}  all (µs)")
for s, f, how, t in rows:
    print(f"{s:12s} {f:6s} {how:30s} {min(t):6.1f} {statistics.median(t):7.1f} {max(t):6.1f}  "
          + " ".join(f"{v:.1f}" for v in t))
