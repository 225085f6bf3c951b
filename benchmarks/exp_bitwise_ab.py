"""Gluon kernel changes that must not change a bit (H200): the outputs of ``decode_tma`` / ``prefill_ws`` with
the ``qlinear`` switches of ``OLD`` set (the previous code path) against the defaults, per format, dtype,
token count and shape. Every one of ``REPS`` repeated default calls must equal the old path's output bit
for bit (a race in the ring would show as a differing repeat) and stay within 1e-2 of float64.

    [OLD="_DT_WARP_ARRIVE=0,_SCALE_IMAD=0"] [REPS=10] [FMTS=nvfp4,mxfp4,...] python benchmarks/exp_bitwise_ab.py
"""
from __future__ import annotations

import os

import torch

import microscale as ms
from microscale import qlinear as L

dev = torch.device("cuda")
REPS = int(os.environ.get("REPS", "10"))
OLD = {kv.split("=")[0]: bool(int(kv.split("=")[1]))
       for kv in os.environ.get("OLD", "_DT_WARP_ARRIVE=0,_SCALE_IMAD=0").split(",")}
FMTS = os.environ.get("FMTS", "nvfp4,mxfp4,mxfp8_e4m3,mxfp8_e5m2,mxint8,mxint4").split(",")
g = torch.Generator(device=dev).manual_seed(11)
CASES = [  # (op, N, K, tokens, programs, dtypes)
    ("decode_tma", 4104, 2048, 13, 37, (torch.bfloat16, torch.float16)),  # ragged N, tiles shared by programs
    ("prefill_ws", 4104, 2048, 777, None, (torch.bfloat16,)),
]
bad = runs = 0
for op, n, k, m, prog, dts in CASES:
    w = torch.randn(n, k, device=dev, generator=g)
    for fmt in FMTS:
        q = ms.quantize(w, fmt)
        wd = q.dequantize().double()
        for dt in dts:
            x = torch.randn(m, k, device=dev, generator=g).to(dt)
            ref = x.double() @ wd.T

            def call():
                return L.decode_tma(x, q, programs=prog) if op == "decode_tma" else L.prefill_ws(x, q)
            saved = {a: getattr(L, a) for a in OLD}
            for a, v in OLD.items():
                setattr(L, a, v)
            try:
                base = call()
            except ValueError as e:  # not a weight / dtype the kernel takes
                print(f"{op} {fmt} {str(dt)[6:]} {n}x{k} m{m}: skipped ({str(e)[:100]})", flush=True)
                continue
            finally:
                for a, v in saved.items():
                    setattr(L, a, v)
            outs = [call() for _ in range(REPS)]
            torch.cuda.synchronize()
            same = sum(bool(torch.equal(o, base)) for o in outs)
            err = ((outs[0].double() - ref).norm() / ref.norm()).item()
            ok = same == REPS and err < 1e-2
            bad += not ok
            runs += 1
            print(f"{op} {fmt} {str(dt)[6:]} {n}x{k} m{m} programs={prog}: bit-identical {same}/{REPS}, "
                  f"rel err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
print(f"\n{runs - bad}/{runs} cases bit-identical to the old path ({OLD}) in every repeat and within 1e-2")
