"""Where the eager host time of one ``ms.linear`` call goes (GPU machine): the whole call
with its plan (``qlinear._Plan``) and without plans; without plans, the same call with
``qlinear.launch`` timed (launches through the cached launcher) and with launches stubbed
out (the wrappers' Python and torch calls); cuBLAS and a few single torch / Triton
operations for scale. Means over ``N_CALLS`` (environment, default 200) calls after
warm-up, µs.
Usage: ``PYTHONPATH=. python3 benchmarks/host_breakdown.py``."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from triton.runtime import driver

import microscale as ms
from microscale import qlinear as L
from profile_host import N_CALLS as N, host_us  # (this directory is on sys.path when the script runs)

DEV = "cuda"


def _tma(fn):
    """``fn()`` with ``linear`` routing 9-16 tokens to ``decode_tma`` in eager calls too."""
    L._DECODE_TMA = "1"
    try:
        return fn()
    finally:
        L._DECODE_TMA = "auto"


def main() -> None:
    torch.manual_seed(0)
    n, k = 28672, 8192
    qw = ms.quantize(torch.randn(n, k, device=DEV, dtype=torch.bfloat16), "nvfp4")
    xs = {m: torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for m in (1, 8, 16)}
    calls = {"ms.linear M=1": lambda: ms.linear(xs[1], qw), "ms.linear M=8": lambda: ms.linear(xs[8], qw),
             "ms.linear M=16": lambda: ms.linear(xs[16], qw),
             "ms.linear M=16, decode_tma route": lambda: _tma(lambda: ms.linear(xs[16], qw))}
    rows = []
    for name, fn in calls.items():
        planned = host_us(fn)
        L._PLANS = False
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
            L._PLANS = True
        rows.append((name, planned, whole, launches, per_launch, stub))
    drv = driver.active
    single = {
        "torch.empty((16, 8192), cuda)": lambda: torch.empty((16, 8192), device=DEV),
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "driver stream lookup": lambda: drv.get_current_stream(drv.get_current_device()),
        "x.reshape(-1, K)": lambda: xs[16].reshape(-1, k),
    }
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; means over {N} eager calls, µs")
    wb = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)
    print(f"cuBLAS F.linear bf16 M=1: {host_us(lambda: F.linear(xs[1], wb)):.1f} µs")
    print("| call | with plans | without | launches/call | µs per launch | launches stubbed |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.1f} | {r[5]:.1f} |")
    for name, fn in single.items():
        print(f"{name}: {host_us(fn, 2000):.2f} µs")


if __name__ == "__main__":
    main()
