"""Eager ``ms.linear`` loops at 9 and 16 tokens (H200): µs per call over back-to-back calls
(weights rotated past L2, synchronized at the ends only, so each figure is whichever of
host and GPU time bounds the loop), with the tokens routed to ``gemv_mma`` / the GEMV
(``MICROSCALE_DECODE_TMA=graph``: eager calls take them) and to ``decode_tma`` (``1``), with
call plans on (``qlinear._Plan``) and off; cuBLAS bf16 ``F.linear`` the same way.
Usage: ``[MS=16,9] [SHAPES=28672x8192,8192x8192] PYTHONPATH=. python3 benchmarks/eager_decode.py``."""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L

DEV = "cuda"
CALLS = 400


def loop_us(fn, copies: int) -> float:
    for i in range(2 * copies + 3):  # warm-up: first uses, plan records
        fn(i % copies)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(CALLS):
        fn(i % copies)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / CALLS * 1e6


def main() -> None:
    g = torch.Generator(device=DEV).manual_seed(4)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; eager µs per call over {CALLS} calls")
    print("| N x K | M | cuBLAS | gemv_mma, plans | decode_tma, plans | gemv_mma, no plans | decode_tma, no plans |")
    print("|---|---|---|---|---|---|---|")
    shapes = os.environ.get("SHAPES", "28672x8192,8192x8192").split(",")
    for n, k in (tuple(map(int, s.split("x"))) for s in shapes):
        copies = 2 if n * k > 1 << 27 else 4
        ws = [torch.randn(n, k, device=DEV, generator=g) * 0.02 for _ in range(copies)]
        qs = [ms.quantize(w, "nvfp4") for w in ws]
        wb = [w.to(torch.bfloat16) for w in ws]
        ws = None
        for m in (int(v) for v in os.environ.get("MS", "16,9").split(",")):
            x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
            row = [loop_us(lambda i: F.linear(x, wb[i]), copies)]
            for plans in (True, False):
                L._PLANS = plans
                for route in ("graph", "1"):
                    L._DECODE_TMA = route
                    row.append(loop_us(lambda i: ms.linear(x, qs[i]), copies))
            L._PLANS, L._DECODE_TMA = True, "auto"
            print(f"| {n}x{k} | {m} | " + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)


if __name__ == "__main__":
    main()
