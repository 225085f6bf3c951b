"""Eager ``ms.linear`` loops at a few tokens, route against route, alternated and clock-aware
(H200): settles the eager rule ``DECODE_TMA_EAGER_MIN_M`` that the twenty-fourth session left
open (``eager_decode.py`` had planned ``decode_tma`` at 4-8 tokens 4-13 µs behind ``gemv_mma``,
``exp_eager_tok8.py`` had it 7-11 µs ahead; the first recorded no clocks).

Per shape, token count and round: cuBLAS ``F.linear``, then ``ms.linear`` with
``_DECODE_TMA = "graph"`` (eager calls take the GEMV / ``gemv_mma``) and ``"1"``
(``decode_tma``; with its plans' TMA descriptors encoded once, ``_launch.bind``, and, as
``decode_tma/nobind``, encoded at every launch as before the twenty-fifth session), in an order
rotating per round, each after the board has left any power cap
(``Monitor.settle``), as CALLS back-to-back eager calls over weight copies past L2 (plans on,
warmed up). Prints µs per call with the SM clock range and slowed share of each window, the
host time per planned call of each route (calls queued behind a ``torch.cuda._sleep``), and
a median table last.

    [MS=2,4,8] [SHAPES=28672x8192,8192x28672] [ROUNDS=3] [CALLS=2000] \\
        PYTHONPATH=. python benchmarks/exp_eager_routes.py
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L
from microscale.bench import _clocks
from microscale.kernels import _launch

dev = torch.device("cuda")
MS = [int(v) for v in os.environ.get("MS", "2,4,8").split(",")]
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("SHAPES", "28672x8192,8192x28672,8192x8192").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CALLS = int(os.environ.get("CALLS", "2000"))


def loop(fn, copies: int, mon: _clocks.Monitor) -> tuple[float, str]:
    """µs per call of ``CALLS`` back-to-back ``fn(i)`` (after warm-up and a settled clock),
    and the window's clock summary."""
    for i in range(2 * copies + 3):  # first uses and plan records
        fn(i % copies)
    torch.cuda.synchronize()
    mon.settle()
    t0w, t0 = time.time(), time.perf_counter()
    for i in range(CALLS):
        fn(i % copies)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / CALLS * 1e6
    state = mon.window(t0w, time.time())
    return us, state.summary() if state is not None else "no clocks"


ROUTES = (("GEMV/gemv_mma", "graph", True), ("decode_tma", "1", True), ("decode_tma/nobind", "1", False))


def use(route: str, bind: bool, qs: list) -> None:
    """Route the eager calls; plans are dropped (they keep the launch form they were made with)."""
    L._DECODE_TMA, _launch._BIND = route, bind
    for q in qs:
        q.__dict__.pop("_ms_plans", None)


def host_us(fn, copies: int) -> float:
    """Host µs per call of planned ``fn(i)``, queued behind ~100 ms of GPU sleep."""
    for i in range(2 * copies + 3):
        fn(i % copies)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for i in range(300):
        fn(i % copies)
    us = (time.perf_counter() - t0) / 300 * 1e6
    torch.cuda.synchronize()
    return us


def main() -> None:
    g = torch.Generator(device=dev).manual_seed(5)
    rows = []  # (shape, m, variant, round, us)
    with _clocks.Monitor(dev) as mon:
        for n, k in SHAPES:
            copies = max(2, -(-200_000_000 // (n * k // 2)))
            ws = [torch.randn(n, k, device=dev, generator=g) for _ in range(copies)]
            qs = [ms.quantize(w, "nvfp4") for w in ws]
            wb = [w.to(torch.bfloat16) for w in ws[:2]]
            ws = None
            for m in MS:
                x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
                for name, route, bind in ROUTES:
                    use(route, bind, qs)
                    print(f"{n}x{k} m={m} host {name} {host_us(lambda i: ms.linear(x, qs[i]), copies):.1f} us/call",
                          flush=True)
                for r in range(ROUNDS):
                    us, clk = loop(lambda i: F.linear(x, wb[i % 2]), copies, mon)
                    rows.append((f"{n}x{k}", m, "cuBLAS", r, us))
                    print(f"{n}x{k} m={m} round {r} cuBLAS {us:.1f} us ({clk})", flush=True)
                    for name, route, bind in ROUTES[r % 3:] + ROUTES[:r % 3]:
                        use(route, bind, qs)
                        us, clk = loop(lambda i: ms.linear(x, qs[i]), copies, mon)
                        rows.append((f"{n}x{k}", m, name, r, us))
                        print(f"{n}x{k} m={m} round {r} {name} {us:.1f} us ({clk})", flush=True)
                    use("auto", True, qs)
    print(f"\nMedian µs per eager call over {ROUNDS} rounds ({CALLS} calls each)")
    for key in dict.fromkeys((s, m, v) for s, m, v, _, _ in rows):
        print(f"{key[0]:12s} m={key[1]:<3d} {key[2]:14s} "
              f"{statistics.median(us for s, m, v, _, us in rows if (s, m, v) == key):8.1f}")


if __name__ == "__main__":
    main()
