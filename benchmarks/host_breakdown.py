"""Where the eager host time of one ``ms.linear`` call goes (GPU machine): the whole call,
then the same call with ``qlinear.launch`` timed (kernel launches through the cached
launcher), then with launches stubbed out (the wrappers' Python and torch calls), plus a
few single torch / Triton operations for scale. Means over ``N`` calls after warm-up, µs.
Usage: ``PYTHONPATH=. python3 benchmarks/host_breakdown.py``."""
from __future__ import annotations

import time

import torch
from triton.runtime import driver

import microscale as ms
from microscale import qlinear as L
from microscale.kernels import _launch

N = 300
DEV = "cuda"


def host_us(fn, n: int = N) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main() -> None:
    torch.manual_seed(0)
    n, k = 28672, 8192
    qw = ms.quantize(torch.randn(n, k, device=DEV, dtype=torch.bfloat16), "nvfp4")
    xs = {m: torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for m in (1, 8, 16)}
    calls = {"ms.linear M=1": lambda: ms.linear(xs[1], qw), "ms.linear M=8": lambda: ms.linear(xs[8], qw),
             "ms.linear M=16": lambda: ms.linear(xs[16], qw),
             "decode_tma M=16": lambda: L.decode_tma(xs[16], qw)}
    rows = []
    for name, fn in calls.items():
        whole = host_us(fn)
        spent = [0.0, 0]
        orig = L.launch

        def timed(*a, **kw):
            t = time.perf_counter()
            orig(*a, **kw)
            spent[0] += time.perf_counter() - t
            spent[1] += 1
        L.launch = timed
        try:
            host_us(fn)
        finally:
            L.launch = orig
        per_launch = spent[0] / spent[1] * 1e6
        launches = spent[1] / (N + 5)
        L.launch = lambda *a, **kw: None
        try:
            stub = host_us(fn)
        finally:
            L.launch = orig
        rows.append((name, whole, launches, per_launch, stub))
    drv = driver.active
    single = {
        "torch.empty((16, 8192), cuda)": lambda: torch.empty((16, 8192), device=DEV),
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "driver stream lookup": lambda: drv.get_current_stream(drv.get_current_device()),
        "x.reshape(-1, K)": lambda: xs[16].reshape(-1, k),
    }
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; means over {N} eager calls, µs")
    print("| call | whole | launches/call | µs per launch | launches stubbed |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.0f} | {r[3]:.1f} | {r[4]:.1f} |")
    for name, fn in single.items():
        print(f"{name}: {host_us(fn, 2000):.2f} µs")


if __name__ == "__main__":
    main()
