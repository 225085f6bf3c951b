"""Why do eager loops of ``decode_tma`` at 4-8 tokens take ~58 µs per call on 28672x8192 when
the kernel takes ~45 in graphs (twenty-fourth session, ``s24/c/eager.log``)? Per token count,
``MICROSCALE_DECODE_TMA``-style route ``1`` with plans: the plans kept on the weight (types), the
host time per call (calls queued behind a long ``torch.cuda._sleep`` so the GPU never waits on
the host), the loop time, and the kernel alone in a graph."""
import time

import torch

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(4)
qs = [ms.quantize(torch.randn(28672, 8192, device=dev, generator=g), "nvfp4") for _ in range(2)]
L._DECODE_TMA = "1"
for m in (2, 4, 8, 16):
    x = torch.randn(m, 8192, device=dev, generator=g).to(torch.bfloat16)
    for i in range(7):
        ms.linear(x, qs[i % 2])
    torch.cuda.synchronize()
    kinds = sorted({"seen" if p is L._SEEN else "refused" if p is L._REFUSED else type(p).__name__
                    for p in qs[0].__dict__["_ms_plans"].values()})
    torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time ahead of the calls
    t0 = time.perf_counter()
    for i in range(200):
        ms.linear(x, qs[i % 2])
    host = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(400):
        ms.linear(x, qs[i % 2])
    torch.cuda.synchronize()
    loop = (time.perf_counter() - t0) / 400 * 1e6
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(20):
            L.decode_tma(x, qs[i % 2])
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    gr = (time.perf_counter() - t0) / 400 * 1e6
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for i in range(50):
        L.decode_tma(x, qs[i % 2])
    ev[1].record()
    torch.cuda.synchronize()
    print(f"M={m}: plans {kinds}; host {host:.1f} us/call; eager loop {loop:.1f}; graph {gr:.1f}; "
          f"unplanned direct loop {ev[0].elapsed_time(ev[1]) / 50 * 1e3:.1f} us", flush=True)
