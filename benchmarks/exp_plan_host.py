"""Host time of planned eager ``ms.linear`` calls with bound launches (``_launch.bind``:
descriptors encoded once, tensors passed as addresses) against the compiled kernels' own
launchers (``_launch._BIND = False``), H200, NVFP4, per route and token count: host µs per
call (300 calls queued behind ~100 ms of ``torch.cuda._sleep``, median of 5) and, where the
host bounds it, the eager loop (2000 back-to-back calls over weight copies past L2, after
``Monitor.settle``, median of 3 alternated rounds).

    [MS=1,2,4,8] [SHAPES=8192x8192] PYTHONPATH=. python benchmarks/exp_plan_host.py
"""
from __future__ import annotations

import os
import statistics
import time

import torch

import microscale as ms
from microscale.bench import _clocks
from exp_eager_routes import use  # (this directory is on sys.path when the script runs)

dev = torch.device("cuda")
MS = [int(v) for v in os.environ.get("MS", "1,2,4,8").split(",")]
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("SHAPES", "8192x8192").split(",")]


def warm(fn, copies: int) -> None:
    for i in range(2 * copies + 3):
        fn(i % copies)
    torch.cuda.synchronize()


def host_us(fn, copies: int) -> float:
    out = []
    for _ in range(5):
        torch.cuda._sleep(200_000_000)
        t0 = time.perf_counter()
        for i in range(300):
            fn(i % copies)
        out.append((time.perf_counter() - t0) / 300 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def loop_us(fn, copies: int, mon) -> tuple[float, str]:
    mon.settle()
    t0w, t0 = time.time(), time.perf_counter()
    for i in range(2000):
        fn(i % copies)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / 2000 * 1e6
    st = mon.window(t0w, time.time())
    return us, st.summary() if st is not None else "no clocks"


def main() -> None:
    g = torch.Generator(device=dev).manual_seed(6)
    table = []
    with _clocks.Monitor(dev) as mon:
        for n, k in SHAPES:
            copies = max(2, -(-200_000_000 // (n * k // 2)))
            qs = [ms.quantize(torch.randn(n, k, device=dev, generator=g), "nvfp4") for _ in range(copies)]
            for m in MS:
                x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
                routes = [("graph", "routed eager")] + ([("1", "decode_tma")] if m >= 2 else [])
                for route, rname in routes:
                    res = {}
                    for bind in (True, False):
                        use(route, bind, qs)
                        fn = (lambda i: ms.linear(x, qs[i]))
                        warm(fn, copies)
                        res[bind] = [host_us(fn, copies), []]
                    for r in range(3):
                        for bind in ((True, False) if r % 2 == 0 else (False, True)):
                            use(route, bind, qs)
                            fn = (lambda i: ms.linear(x, qs[i]))
                            warm(fn, copies)
                            us, clk = loop_us(fn, copies, mon)
                            res[bind][1].append(us)
                            print(f"{n}x{k} m={m} {rname} bind={bind} round {r}: {us:.1f} us ({clk})", flush=True)
                    row = (f"{n}x{k}", m, rname, res[True][0], res[False][0],
                           statistics.median(res[True][1]), statistics.median(res[False][1]))
                    table.append(row)
                    print("  host bound / unbound %.1f / %.1f us; loop %.1f / %.1f us" % row[3:], flush=True)
                use("auto", True, qs)
    print("\n| shape | M | route | host µs bound | unbound | eager loop µs bound | unbound |\n|---|---|---|---|---|---|---|")
    for s, m, r, hb, hu, lb, lu in table:
        print(f"| {s} | {m} | {r} | {hb:.1f} | {hu:.1f} | {lb:.1f} | {lu:.1f} |")


if __name__ == "__main__":
    main()
