"""Why ``ms.linear`` at 16 tokens took ~3 µs more than ``decode_tma`` called directly, both in CUDA
graphs (thirty-first session, ``h200_2026-12-04/s31/a/ab_suite_data.log``: NVFP4 28672x8192 52.0 against
48.8 µs, MXFP4 51.7 against 49.1; the old-path kernel 52.1 / 51.1). For each format: a fresh copy of the
weight (as the timing scripts rotate), the eager calls the timer makes first, then one graph capture of
each op with the launches recorded (kernel, grid, scalar arguments), then both graphs replayed and timed.
    python benchmarks/exp_route_gap.py"""
import dataclasses

import torch

import microscale as ms
from microscale import qlinear as L
from microscale.kernels import _launch as kl

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def captured(fn) -> tuple[torch.cuda.CUDAGraph, list]:
    """A graph of 20 calls of ``fn`` and the launches of its first call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    rec: list = []
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(gr, stream=s):
            kl.record(rec)
            fn()
            kl.record(None)
            for _ in range(19):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    return gr, rec


def show(rec: list) -> None:
    for r in rec:
        if r is None:
            print("    (a launch on Triton's own path)")
            continue
        compiled, grid, vals = r
        scal = [v for v in vals if isinstance(v, (bool, int, float, str)) or v is None]
        print(f"    {compiled.name} grid={tuple(grid)} scalars={scal}")


def us_per_call(gr: torch.cuda.CUDAGraph) -> float:
    gr.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(15):
        a.record()
        gr.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / 20)
    return sorted(ts)[len(ts) // 2]


for fmt in ("nvfp4", "mxfp4"):
    w = torch.randn(28672, 8192, device=dev, generator=g)
    x = torch.randn(16, 8192, device=dev, generator=g).to(torch.bfloat16)
    q0 = ms.quantize(w, fmt)
    q = dataclasses.replace(q0, data=q0.data.clone(), scales=q0.scales.clone())
    for _ in range(3):  # the timer's first calls, eager
        ms.linear(x, q)
    torch.cuda.synchronize()
    print(f"{fmt}: scale args {L._gluon_scale_args(q)}; scans on q.scales: "
          f"{[a for a in vars(q.scales) if a.startswith('_microscale')] if hasattr(q.scales, '__dict__') else '?'}")
    for name, fn in (("linear", lambda: ms.linear(x, q)), ("decode_tma", lambda: L.decode_tma(x, q))):
        gr, rec = captured(fn)
        print(f"  {name}: {us_per_call(gr):.1f} us per call")
        show(rec)
