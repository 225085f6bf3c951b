"""One-token linear over a sustained window (H200): is the suite's spread (NVFP4 1x28672x8192
p20 33.7 / p80 37.2 µs within one run) the GPU's clock state? CUDA graphs of 20 calls
alternating over two weight copies (as the suite rotates), replayed back to back for
``SECONDS`` (default 1.5) after 2 s idle; the time per call in ten consecutive windows, for
NVFP4, MXFP4 and cuBLAS bf16, twice each (``ROUNDS``), at 1 token or each of ``TOKENS``.
Run ``nvidia-smi`` sampling beside it (read only) to see the clocks and power:
benchmarks/run_gpu_power.sh does.
    [TOKENS=1,16,4096] [ROUNDS=2] python benchmarks/exp_clocks.py"""
import os
import statistics
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale.bench import _timing

SECONDS = float(os.environ.get("SECONDS_WINDOW", "1.5"))


def graph_of(fns: list, calls: int = 20) -> tuple:
    """A CUDA graph of ``calls`` calls rotating over ``fns`` (the bench's capture), and the
    calls it holds."""
    unroll = max(1, calls // len(fns))
    g = _timing._capture(lambda f: f(), [(f,) for f in fns], unroll)
    torch.cuda.synchronize()
    return g, unroll * len(fns)


def replay_series(g, calls: int, seconds: float, idle_s: float) -> tuple[float, list[float]]:
    """After ``idle_s`` s idle, replay ``g`` back to back for ``seconds``: the start time and
    the µs per call of every replay, in order."""
    g.replay()
    torch.cuda.synchronize()
    time.sleep(idle_s)
    t0, ev = time.time(), []
    while time.time() - t0 < seconds:
        batch = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            batch.append((a, b))
        ev += batch
        batch[-1][1].synchronize()
    return t0, [a.elapsed_time(b) * 1e3 / calls for a, b in ev]


def sustained(name: str, fns: list, calls: int) -> None:
    t0, us = replay_series(*graph_of(fns, calls), SECONDS, 2.0)
    bins = [us[i * len(us) // 10:(i + 1) * len(us) // 10] for i in range(10)]
    print(f"{name:12s} start {time.strftime('%H:%M:%S', time.localtime(t0))}.{int(t0 % 1 * 1000):03d} "
          f"{len(us)} replays, median {statistics.median(us):.1f} µs/call; per tenth: "
          + " ".join(f"{statistics.median(b):.1f}" for b in bins), flush=True)


def main() -> None:
    dev = torch.device("cuda")
    n, k = 28672, 8192
    w = torch.randn(n, k, device=dev)
    qs = {f: [ms.quantize(w, f), ms.quantize(w * 1.01, f)] for f in ("nvfp4", "mxfp4")}
    wb = [w.to(torch.bfloat16), (w * 1.01).to(torch.bfloat16)]
    w = None
    for m in [int(t) for t in os.environ.get("TOKENS", "1").split(",")]:
        x = torch.randn(m, k, device=dev).to(torch.bfloat16)
        calls = 20 if m < 1024 else 4
        for _ in range(int(os.environ.get("ROUNDS", "2"))):
            for f in ("nvfp4", "mxfp4"):
                sustained(f"{f} m{m}", [lambda q=q: ms.linear(x, q) for q in qs[f]], calls)
            sustained(f"cuBLAS m{m}", [lambda v=v: F.linear(x, v) for v in wb], calls)


if __name__ == "__main__":
    main()
