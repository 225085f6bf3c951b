"""``decode_tma`` variants at 16 tokens or ``TOKENS`` (H200, CUDA graphs): the default, code words or scales
by one TMA box per K step instead of per ring chunk, two programs per SM with equal stream-K shares
instead of :func:`choose_decode_tma_programs`; each checked against float64 (relative
Frobenius error) before it is timed, next to cuBLAS bf16 ``F.linear`` and a device copy.
(The fourteenth session's wgmma, step-major-code and drain-only variants: branch
``exp/dtma-s14``.)
    [VARIANTS="default,2 per SM"] [TOKENS=16,32] python benchmarks/exp_dtma_variants.py [shape ...]
    (shape NxK, default the issue's three)"""
import os
import sys

import torch
import torch.nn.functional as F
import triton

import microscale as ms
from microscale import qlinear as L

VARIANTS = {  # qlinear switches, and "programs" for decode_tma (an int, or "2/SM": equal stream-K shares)
    "default": {}, "code box 1 step": {"_DT_WIDE": 1}, "scale box 1 step": {"_DT_SBOX": 1},
    "2 per SM": {"programs": "2/SM"}}
if os.environ.get("VARIANTS"):  # e.g. VARIANTS="default,2 per SM"
    VARIANTS = {v: VARIANTS[v] for v in os.environ["VARIANTS"].split(",")}
TOKENS = [int(t) for t in os.environ.get("TOKENS", "16").split(",")]
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(7)
shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(28672, 8192), (8192, 28672), (8192, 8192)]
rows = []
big = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
copy = triton.testing.do_bench_cudagraph(lambda: big.clone(), rep=30, return_mode="median") * 1e3
print(f"device copy of 256 MiB: {2 * big.numel() / copy / 1e3:.0f} GB/s (read + write)")
big = None
for n, k in shapes:
    w = torch.randn(n, k, device=dev, generator=g)
    wb = w.to(torch.bfloat16)
    for fmt in ("nvfp4", "mxfp4"):
        q = ms.quantize(w, fmt)
        wd = q.dequantize().double()
        for m in TOKENS:
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            ref = x.double() @ wd.T
            cub = triton.testing.do_bench_cudagraph(lambda: F.linear(x, wb), rep=30, return_mode="median") * 1e3
            for name, sw in VARIANTS.items():
                sw = dict(sw)
                prog = sw.pop("programs", None)
                prog = 2 * L._num_sms(dev) if prog == "2/SM" else prog
                saved = {a: getattr(L, a) for a in sw}
                for a, v in sw.items():
                    setattr(L, a, v)
                try:
                    out = L.decode_tma(x, q, programs=prog, rows=128)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    t = triton.testing.do_bench_cudagraph(lambda: L.decode_tma(x, q, programs=prog, rows=128), rep=30,
                                                          return_mode="median") * 1e3 if err < 1e-2 else float("nan")
                except Exception as e:  # noqa: BLE001 - an experiment: report and go on
                    err, t = float("nan"), float("nan")
                    print(f"{name} {fmt} {n}x{k} m{m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                finally:
                    for a, v in saved.items():
                        setattr(L, a, v)
                rows.append((f"{n}x{k}", fmt, m, name, err, t, cub / t, (n * k // 2 + n * k // 16) / t / 1e3))
                print(*rows[-1], flush=True)
        wd = None
print(f"\n{'shape':12s} {'fmt':6s} {'M':>3s} {'variant':12s} {'rel err':>9s} {'us':>7s} {'x cuBLAS':>8s} {'GB/s':>6s}")
for r in rows:
    print(f"{r[0]:12s} {r[1]:6s} {r[2]:3d} {r[3]:12s} {r[4]:9.2e} {r[5]:7.1f} {r[6]:8.2f} {r[7]:6.0f}")
