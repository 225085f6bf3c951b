"""Host-side time of the kernel wrappers, launches stubbed out (runs on any machine, CPU
included): what a call costs in Python and torch before the GPU sees it.

    python benchmarks/host_wrappers.py

Prints µs per call (best of 9 rounds: shared machines are noisy) for quantize MXFP4, quantize NVFP4 with a static
global scale, dequantize MXFP4 and the prefill linear wrapper, on 1024x1024 bf16.
"""
import os
import time

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

import microscale as ms  # noqa: E402
from microscale import qlinear as L  # noqa: E402
from microscale.kernels import quantize as kq  # noqa: E402


def per_call_us(fn, n: int = 1000, rounds: int = 9) -> float:
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    kq.launch = L.launch = lambda *a, **k: None  # the wrappers' own work only
    x = torch.randn(1024, 1024, dtype=torch.bfloat16)
    qm, qn = ms.quantize(x.float(), "mxfp4"), ms.quantize(x.float(), "nvfp4")
    xp = torch.randn(512, 1024, dtype=torch.bfloat16)
    rows = [("quantize mxfp4", lambda: kq.quantize(x, "mxfp4")),
            ("quantize nvfp4 (static scale)", lambda: kq.quantize(x, "nvfp4", global_scale=1.0)),
            ("dequantize mxfp4", lambda: kq.dequantize(qm, torch.bfloat16)),
            ("prefill nvfp4, 512 tokens", lambda: L.prefill(xp, qn))]
    for label, fn in rows:
        print(f"{label:32s} {per_call_us(fn):7.1f} us/call")


if __name__ == "__main__":
    main()
