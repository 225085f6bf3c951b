"""Host (CPU) time of eager calls on the GPU: where a launch's microseconds go.

For a few eager calls (one-token ``ms.linear``, ``dequantize``, ``quantize``, and cuBLAS
``F.linear`` as the reference), after warm-up: the mean host time per call with the GPU
kept ahead (each call's launch is what the caller waits for), then a cProfile of the same
loop, top entries by own time. Usage (GPU machine): ``PYTHONPATH=. python3
benchmarks/profile_host.py``; the report also goes to ``$OUT/profile_host_fast1.txt``
(``MICROSCALE_FAST_LAUNCH=0``: Triton's own launch path, ``..._fast0.txt``).
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale.kernels import quantize as kq

DEV = "cuda"
N_CALLS = int(os.environ.get("N_CALLS", "200"))


def host_us(fn, n: int = N_CALLS) -> float:
    """Mean host microseconds per call over ``n`` eager calls (synchronized before and after)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def profile(fn, n: int = N_CALLS, top: int = 18) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
    return s.getvalue()


def main() -> None:
    torch.manual_seed(0)
    n, k = 28672, 8192
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02
    x1 = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    qw = ms.quantize(w, "nvfp4")
    xq = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    q8 = kq.quantize(xq, "mxfp4")
    x8 = torch.randn(8, k, device=DEV, dtype=torch.bfloat16)
    x16 = torch.randn(16, k, device=DEV, dtype=torch.bfloat16)
    from microscale import qlinear as L
    cases = {
        "F.linear bf16 M=1 (cuBLAS)": lambda: F.linear(x1, w),
        "ms.linear nvfp4 M=1": lambda: ms.linear(x1, qw),
        "ms.linear nvfp4 M=8 (tensor-core decode)": lambda: ms.linear(x8, qw),
        "ms.linear nvfp4 M=16 (eager route)": lambda: ms.linear(x16, qw),
        "qlinear.decode_tma nvfp4 M=16": lambda: L.decode_tma(x16, qw),
        "qlinear.gemv_mma nvfp4 M=16": lambda: L.gemv_mma(x16, qw),
        "kq.dequantize mxfp4 8192^2": lambda: kq.dequantize(q8, torch.bfloat16),
        "kq.quantize mxfp4 8192^2": lambda: kq.quantize(xq, "mxfp4"),
        "empty + zero-arg torch op": lambda: torch.empty(16, device=DEV).zero_(),
    }
    fast = os.environ.get("MICROSCALE_FAST_LAUNCH", "1")
    out = [f"{torch.cuda.get_device_name()}  torch {torch.__version__}  MICROSCALE_FAST_LAUNCH={fast}"]
    for name, fn in cases.items():
        out.append(f"{name:42s} host {host_us(fn):8.1f} us/call")
    for name in ("ms.linear nvfp4 M=1", "qlinear.decode_tma nvfp4 M=16", "qlinear.gemv_mma nvfp4 M=16"):
        out.append(f"\n--- cProfile, {N_CALLS} calls: {name}\n" + profile(cases[name]))
    text = "\n".join(out)
    print(text)
    with open(os.path.join(os.environ.get("OUT", "."), f"profile_host_fast{fast}.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
