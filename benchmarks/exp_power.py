"""GEMV configurations (one token, or TOKENS) under sustained load (H200). The fp4 GEMV reaches the board's
power cap within ~0.3 s of back-to-back calls (~700 W, SM clock down to 1.3-1.7 GHz; cuBLAS
bf16 stays at ~600 W and 1.98 GHz: ``benchmarks/exp_clocks.py``), so configurations are
compared on their steady time, not a burst. Per configuration: checked against float64, a
CUDA graph of 20 calls alternating over two weight copies, 1.5 s idle, then replays for
``SECONDS_WINDOW`` (1.2) s: the burst (first 5% of replays) and steady (last half) time
per call. Weight copies rotate past L2 (at least two, and at least 200 MB of them).
    [VARIANTS="default;stages 6"] [ROUNDS=1] [FMTS=nvfp4,mxfp4] [IDLE=1.5] [TOKENS=1] \
        python benchmarks/exp_power.py [NxK]   (default 28672x8192)"""
import dataclasses
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import microscale as ms
from microscale import qlinear as L
from exp_clocks import graph_of, replay_series  # a sibling script: benchmarks/ is on sys.path when run

dev = torch.device("cuda")
SECONDS = float(os.environ.get("SECONDS_WINDOW", "1.2"))
n, k = (tuple(map(int, sys.argv[1].split("x"))) if len(sys.argv) > 1 else (28672, 8192))
VARIANTS = {"default": {}, "rows 8": {"block_n": 8}, "rows 16": {"block_n": 16}, "rows 8, 4 warps":
            {"block_n": 8, "num_warps": 4}, "kw 128": {"block_kw": 128}, "no prefetch": {"prefetch": False},
            "stages 3": {"num_stages": 3}, "stages 6": {"num_stages": 6}, "prefetch": {"prefetch": True},
            "rows 2": {"block_n": 2}, "kw 512": {"block_kw": 512}, "split 2": {"split_k": 2},
            "warps 4": {"num_warps": 4}, "warps 1": {"num_warps": 1},
            "rows 8, prefetch": {"block_n": 8, "prefetch": True}, "rows 2, prefetch": {"block_n": 2, "prefetch": True},
            "kw 128, prefetch": {"block_kw": 128, "prefetch": True}}
if os.environ.get("VARIANTS"):  # e.g. VARIANTS="default;stages 6;block_n=2 prefetch=1" (named or GemvConfig fields)
    VARIANTS = {v: VARIANTS[v] if v in VARIANTS else {f: int(x) for f, x in (t.split("=") for t in v.split())}
                for v in os.environ["VARIANTS"].split(";")}
ROUNDS = int(os.environ.get("ROUNDS", "1"))
FMTS = os.environ.get("FMTS", "nvfp4,mxfp4").split(",")
IDLE = float(os.environ.get("IDLE", "1.5"))
TOKENS = int(os.environ.get("TOKENS", "1"))


def copies(q0, nbytes: int) -> list:
    """``q0`` and clones of it: at least two, and at least 200 MB (past the 60 MB L2)."""
    extra = max(1, -(-200_000_000 // nbytes) - 1)
    return [q0] + [dataclasses.replace(q0, data=q0.data.clone(), scales=q0.scales.clone()) for _ in range(extra)]


def sustained(fns: list) -> tuple[float, float]:
    """Burst (first 5% of replays) and steady (last half) µs per call of ``fns`` in rotation."""
    _, us = replay_series(*graph_of(fns), SECONDS, IDLE)
    return statistics.median(us[:max(1, len(us) // 20)]), statistics.median(us[len(us) // 2:])


w = torch.randn(n, k, device=dev)
x = torch.randn(TOKENS, k, device=dev).to(torch.bfloat16)
rows = []
for fmt in FMTS:
    q0 = ms.quantize(w, fmt)
    qs = copies(q0, q0.nbytes)
    ref = x.double() @ q0.dequantize().double().T
    base = L.choose_gemv_config(n, k, dev, TOKENS, q0.fmt.element.bits)
    for rnd, (name, over) in [(r, v) for r in range(ROUNDS) for v in VARIANTS.items()]:  # alternated
        try:
            cfg = dataclasses.replace(base, **over)
            out = L.gemv(x, qs[0], None, cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            burst, steady = sustained([lambda q=q: L.gemv(x, q, None, cfg) for q in qs]) if err < 1e-2 else (0, 0)
        except Exception as e:  # noqa: BLE001 - an experiment: report and go on
            print(f"{fmt} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        rows.append((fmt, name if ROUNDS == 1 else f"{name} #{rnd + 1}", err, burst, steady))
        print(*rows[-1], time.strftime("%H:%M:%S"), flush=True)
    qs = q0 = None
wb = [(w * (1 + i / 64)).to(torch.bfloat16) for i in range(max(2, -(-200_000_000 // (2 * n * k))))]
rows.append(("bf16", "cuBLAS", 0.0, *sustained([lambda v=v: F.linear(x, v) for v in wb])))
print(f"\n{n}x{k}, {TOKENS} token(s)\n{'fmt':11s} {'variant':20s} {'rel err':>9s} {'burst us':>8s} {'steady us':>9s}")
for f, v, e, b, s in rows:
    print(f"{f:11s} {v:20s} {e:9.2e} {b:8.1f} {s:9.1f}")
