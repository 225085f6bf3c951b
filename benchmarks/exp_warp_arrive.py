"""Per-warp slot release in the Gluon kernels (``qlinear._DT_WARP_ARRIVE`` / ``_WS_WARP_ARRIVE``, the PTX
rewrite of :mod:`microscale.kernels._ptx`) against the default (H200): for each format, dtype, token count
and shape, the rewritten kernel's output must equal the default's bit for bit in every one of ``REPS``
repeated calls (a race in the ring would show as a differing repeat), and stay within 1e-2 of float64.

    [REPS=20] [FMTS=nvfp4,mxfp4,int4_affine_g128,mxfp8_e4m3] python benchmarks/exp_warp_arrive.py
"""
from __future__ import annotations

import os

import torch

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
REPS = int(os.environ.get("REPS", "20"))
g = torch.Generator(device=dev).manual_seed(11)
CASES = [  # (op, switch, N, K, tokens, programs)
    ("decode_tma", "_DT_WARP_ARRIVE", 4104, 2048, 16, None),
    ("decode_tma", "_DT_WARP_ARRIVE", 4104, 2048, 5, 37),  # tiles shared by several programs
    ("prefill_ws", "_WS_WARP_ARRIVE", 4104, 2048, 777, None),
    ("prefill_ws", "_WS_WARP_ARRIVE", 1000, 1024, 300, None),
]
FMTS = os.environ.get("FMTS", "nvfp4,mxfp4,int4_affine_g128,mxfp8_e4m3").split(",")
bad = 0
runs = 0
for op, sw, n, k, m, prog in CASES:
    w = torch.randn(n, k, device=dev, generator=g)
    for fmt in FMTS:
        q = ms.quantize(w, fmt)
        wd = q.dequantize().double()
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, k, device=dev, generator=g).to(dt)
            ref = x.double() @ wd.T

            def call():
                if op == "decode_tma":
                    return L.decode_tma(x, q, programs=prog)
                return L.prefill_ws(x, q)
            try:
                base = call()
            except ValueError as e:  # not a weight / dtype the kernel takes
                print(f"{op} {fmt} {str(dt)[6:]} {n}x{k} m{m}: skipped ({str(e)[:100]})", flush=True)
                continue
            setattr(L, sw, True)
            try:
                outs = [call() for _ in range(REPS)]
            finally:
                setattr(L, sw, False)
            torch.cuda.synchronize()
            same = sum(bool(torch.equal(o, base)) for o in outs)
            err = ((outs[0].double() - ref).norm() / ref.norm()).item()
            ok = same == REPS and err < 1e-2
            bad += not ok
            runs += 1
            print(f"{op} {fmt} {str(dt)[6:]} {n}x{k} m{m} programs={prog}: bit-identical {same}/{REPS}, "
                  f"rel err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
print(f"\n{runs - bad}/{runs} cases bit-identical to the default in every repeat and within 1e-2")
