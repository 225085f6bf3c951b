"""Host time per eager ``ms.linear`` call on a GPU: the CPU time a call takes to return, per route;
and the same for the other ops' eager calls (``ms.moe_experts`` at one token, ``ms.embedding`` of one id),
with call plans on and off.

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


def _time(call, calls: int, repeats: int) -> tuple[float, float]:
    """Median host µs per call and GPU µs per call over the same loop (see the module docstring)."""
    for _ in range(20):  # warm: compile, route cache, call plans
        call()
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(repeats):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        s = time.perf_counter()
        for _ in range(calls):
            call()
        host.append((time.perf_counter() - s) / calls * 1e6)
        t1.record()
        torch.cuda.synchronize()
        dev.append(t0.elapsed_time(t1) / calls * 1e3)
    return statistics.median(host), statistics.median(dev)


def measure(fmt: str, m: int, n: int, k: int, calls: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    w = ms.quantize(torch.randn(n, k, generator=gen), fmt).to("cuda")
    x = torch.randn(m, k, generator=gen).bfloat16().cuda()
    want = x.double() @ w.dequantize(torch.float64).T
    got = ms.linear(x, w)
    err = float((got.double() - want).norm() / want.norm())
    host, dev = _time(lambda: ms.linear(x, w), calls, repeats)
    return {"op": "linear", "format": fmt, "tokens": m, "shape": [n, k], "rel_err": err, "host_us": host,
            "gpu_us_per_call_in_loop": dev}


def measure_ops(calls: int, repeats: int) -> list[dict]:
    """``ms.moe_experts`` (MXFP4, gpt-oss-20b's experts: 32 x [5760, 2880] and [2880, 2880], top-4, one token)
    and ``ms.embedding`` (NVFP4 [32000, 4096], one id), each with call plans on and off."""
    from microscale.linear import tuning
    from microscale.moe import moe_experts_reference

    gen = torch.Generator().manual_seed(0)
    e, h, i = 32, 2880, 2880
    gu = ms.quantize(torch.randn(e, 2 * i, h, generator=gen), "mxfp4").to("cuda")
    dn = ms.quantize(torch.randn(e, h, i, generator=gen), "mxfp4").to("cuda")
    x = torch.randn(1, h, generator=gen).bfloat16().cuda()
    idx = torch.randperm(e, generator=gen)[:4].view(1, 4).cuda()
    tw = torch.softmax(torch.randn(1, 4, generator=gen), -1).cuda()
    moe = lambda: ms.moe_experts(x, gu, dn, idx, tw, activation="swiglu_clamped", layout="interleaved")  # noqa: E731
    ref = moe_experts_reference(x.double().cpu(), gu.dequantize(torch.float64).cpu(),
                                dn.dequantize(torch.float64).cpu(), idx.cpu(), tw.double().cpu(),
                                activation="swiglu_clamped", layout="interleaved")
    table = ms.quantize(torch.randn(32000, 4096, generator=gen), "nvfp4").to("cuda")
    ids = torch.tensor([17], device="cuda")
    emb = lambda: ms.embedding(ids, table, dtype=torch.bfloat16)  # noqa: E731
    want = table.dequantize(torch.float32)[ids]
    rows = []
    for name, call, check in (("moe_experts", moe, lambda y: float((y.double().cpu() - ref).norm() / ref.norm())),
                              ("embedding", emb, lambda y: float((y.float() - want).abs().max()))):
        for plans in (True, False):
            with tuning.override(plans=plans):
                err = check(call())
                host, dev = _time(call, calls, repeats)
            rows.append({"op": name, "plans": plans, "err": err, "host_us": host, "gpu_us_per_call_in_loop": dev})
    return rows


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
    for r in measure_ops(a.calls, a.repeats):
        rows.append(r)
        print(f"{r['op']:18s} plans {'on ' if r['plans'] else 'off'}: host {r['host_us']:6.1f} µs/call, loop "
              f"{r['gpu_us_per_call_in_loop']:6.1f} µs/call on the GPU clock, err {r['err']:.2e}", flush=True)
    if a.json:  # written whole or not at all
        write_text_atomic(a.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
