"""``decode_tma`` at 17-64 tokens (16 -> 32 / 64 token columns) against what ``ms.linear``
routed those calls to before the fifteenth session (the prefill kernel: ``DECODE_TMA_MAX_M``
set to 16 for that variant) and cuBLAS bf16 ``F.linear`` (H200, CUDA graphs). Every variant is
checked against float64 (relative Frobenius error) before it is timed. Variants at 33-64
tokens: one launch with 64 token columns (``_DT_STAGES_64`` chunks), and two launches of 32.
    python benchmarks/exp_dtma_tokens.py [NxK ...]   (default: the issue's three shapes)"""
import sys

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(11)
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(28672, 8192), (8192, 28672), (8192, 8192)]


def halves(x, q):
    return torch.cat([L.decode_tma(x[:32], q), L.decode_tma(x[32:], q)])


def before(x, q):
    saved, L.DECODE_TMA_MAX_M = L.DECODE_TMA_MAX_M, 16
    try:
        return ms.linear(x, q)
    finally:
        L.DECODE_TMA_MAX_M = saved


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3


rows = []
for n, k in shapes:
    w = torch.randn(n, k, device=dev, generator=g)
    wb = w.to(torch.bfloat16)
    for fmt in ("nvfp4", "mxfp4"):
        q = ms.quantize(w, fmt)
        wd = q.dequantize(torch.float64)
        for m in (16, 24, 32, 48, 64):
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            ref = x.double() @ wd.T
            variants = {"route before": lambda: before(x, q), "decode_tma": lambda: L.decode_tma(x, q)}
            if m > 32:
                variants["decode_tma 2x32"] = lambda: halves(x, q)
            cub = bench(lambda: F.linear(x, wb))
            for name, fn in variants.items():
                try:
                    out = fn()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    t = bench(fn) if err < 1e-2 else float("nan")
                except Exception as e:  # noqa: BLE001 - an experiment: report and go on
                    err, t = float("nan"), float("nan")
                    print(f"{name} {fmt} {n}x{k} m{m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows.append((f"{n}x{k}", fmt, m, name, err, t, cub, cub / t))
                print(*rows[-1], flush=True)
        wd = q = None
print(f"\n{'shape':12s} {'fmt':6s} {'M':>3s} {'variant':18s} {'rel err':>9s} {'us':>7s} {'cuBLAS':>7s}",
      f"{'x cuBLAS':>8s}")
for r in rows:
    print(f"{r[0]:12s} {r[1]:6s} {r[2]:3d} {r[3]:18s} {r[4]:9.2e} {r[5]:7.1f} {r[6]:7.1f} {r[7]:8.2f}")
