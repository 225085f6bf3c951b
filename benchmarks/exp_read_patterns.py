"""How fast can a kernel read N bytes of weights once (H200)? Read-only streams of int32 words
(XOR-folded, one int32 stored per program) in several launch patterns, next to torch's own
reduction and cuBLAS bf16 at one token, so the one-token GEMV's remaining gap to its bytes can be
split into "the launch pattern" and "the decode". Graphs of 20 calls over copies past L2, burst
and steady µs per call as in ``exp_noprep.py``.

Patterns:
- ``rows R wW bB``: the GEMV's pattern: R rows per program, B-word steps, W warps, one program
  per R rows (``exp_noprep.py``'s read ceiling).
- ``flat P/SM wW uU``: persistent: P programs per SM, each reading one contiguous share in
  steps of W x 32 threads x U 16-byte loads (U loads in flight per thread).
- ``torch sum``: ``torch.sum`` of the int32 words (int64 result).

    [SECONDS_WINDOW=0.4] [IDLE=0.5] python benchmarks/exp_read_patterns.py [MB ...]"""
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

from exp_clocks import graph_of, replay_series  # a sibling script: benchmarks/ is on sys.path when run

dev = torch.device("cuda")
SECONDS = float(os.environ.get("SECONDS_WINDOW", "0.4"))
IDLE = float(os.environ.get("IDLE", "0.5"))
SMS = torch.cuda.get_device_properties(dev).multi_processor_count


def timed(fns: list) -> tuple[float, float]:
    """Burst (first 5%) and steady (second half) median µs per call."""
    fns[0]()
    _, us = replay_series(*graph_of(fns), SECONDS, IDLE)
    return statistics.median(us[:max(1, len(us) // 20)]), statistics.median(us[len(us) // 2:])


@triton.jit
def _rows_kernel(w_ptr, out_ptr, KW: tl.constexpr, R: tl.constexpr, BKW: tl.constexpr):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    acc = tl.zeros([R, BKW], dtype=tl.int32)
    for k in range(0, KW, BKW):
        acc ^= tl.load(w_ptr + rows[:, None] * KW + k + tl.arange(0, BKW)[None, :])
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(tl.xor_sum(acc, 1), 0))


@triton.jit
def _flat_kernel(w_ptr, out_ptr, NW, PER, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    """Program p reads words [p * PER, min((p + 1) * PER, NW)) in STEPS = ceil(PER / BLOCK)
    BLOCK-word steps, the next step's loads issued before the current step is folded."""
    start = tl.program_id(0).to(tl.int64) * PER
    end = tl.minimum(start + PER, NW)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    cur = tl.load(w_ptr + start + offs, mask=start + offs < end, other=0)
    for i in range(1, STEPS + 1):
        s = start + i * BLOCK
        nxt = tl.load(w_ptr + s + offs, mask=s + offs < end, other=0)
        acc ^= cur
        cur = nxt
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def main() -> None:
    sizes = [float(a) for a in sys.argv[1:]] or [67.1, 117.4, 234.9]
    out = torch.empty(1 << 20, dtype=torch.int32, device=dev)
    rows = []
    for mb in sizes:
        kw = 2048  # 8 KB rows, as an 8192-wide int8 weight (or a 16384-wide 4-bit one)
        n = int(mb * 1e6) // (4 * kw)
        n -= n % 64
        nbytes = n * kw * 4
        copies = max(2, -(-300_000_000 // nbytes))
        ws = [torch.randint(-2**31, 2**31 - 1, (n, kw), dtype=torch.int32, device=dev) for _ in range(copies)]
        nw = n * kw
        variants = []
        for r, warps, bkw in [(2, 1, 512), (2, 2, 256), (4, 2, 256), (8, 4, 256)]:
            variants.append((f"rows {r} w{warps} b{bkw}",
                             [lambda w=w, r=r, wp=warps, b=bkw: _rows_kernel[(n // r,)](
                                 w, out, KW=kw, R=r, BKW=b, num_warps=wp) for w in ws]))
        for per_sm, warps, u in [(1, 8, 8), (2, 8, 8), (4, 4, 8), (8, 4, 4), (16, 2, 4), (2, 16, 4)]:
            grid = per_sm * SMS
            per = -(-nw // grid)
            block = warps * 32 * 4 * u
            variants.append((f"flat {per_sm}/SM w{warps} u{u}",
                             [lambda w=w, g=grid, p=per, b=block, wp=warps: _flat_kernel[(g,)](
                                 w, out, nw, p, -(-p // b), BLOCK=b, num_warps=wp) for w in ws]))
        variants.append(("torch sum", [lambda w=w: torch.sum(w) for w in ws]))
        for name, fns in variants:
            b, s = timed(fns)
            rows.append((f"{nbytes / 1e6:.1f} MB", name, b, s, nbytes / s / 1e3))
            print(*rows[-1], flush=True)
        ws = None
        torch.cuda.empty_cache()
    # cuBLAS bf16 at one token on the shapes (bytes of the bf16 weight)
    for nn, kk in [(8192, 8192), (28672, 8192)]:
        wb = [torch.randn(nn, kk, device=dev, dtype=torch.bfloat16) for _ in range(3)]
        x = torch.randn(1, kk, device=dev, dtype=torch.bfloat16)
        b, s = timed([lambda w=w: torch.nn.functional.linear(x, w) for w in wb])
        rows.append((f"{nn * kk * 2 / 1e6:.1f} MB", f"cuBLAS 1x{nn}x{kk}", b, s, nn * kk * 2 / s / 1e3))
        print(*rows[-1], flush=True)
        wb = None
    print(f"\n{'bytes':10s} {'pattern':22s} {'burst us':>8s} {'steady us':>9s} {'GB/s':>6s}")
    for sz, name, b, s, gbs in rows:
        print(f"{sz:10s} {name:22s} {b:8.1f} {s:9.1f} {gbs:6.0f}")


if __name__ == "__main__":
    main()
