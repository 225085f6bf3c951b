"""Tile and kernel sweep of ``scaled_mm(..., fast_accum=True)`` on a Hopper: the Triton fp8 kernel's chosen
config against the warp-specialized Gluon kernel's (``Fp8Config(gluon=True)``) over tile widths, ring depths
and group sizes, for fp8 block-128 activations x 128x128-block (DeepSeek-V3) and 1x128-block weights, and
MXFP4 weights folded into 128x128 blocks (``ms.fold_fp8(w, block_rows=128)``).

    python benchmarks/sweep_scaled_fp8.py [--json OUT.json] [--tokens 128,512,4096] [--quick]

Every config is first checked on the GPU: against the float64 product of the dequantized operands on a slice
(relative error <= 5e-4, Hopper's fp8 accumulation allowance) and against the Triton kernel's output. Then it is
timed (``microscale.bench``'s CUDA-graph timing) beside cuBLAS bf16 on the same shape, and the TFLOP/s and the
ratio are printed, one JSON line per row. Used to set ``choose_fp8_config``
(docs/decisions/scaled-mm-operands.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import microscale as ms  # noqa: E402
from microscale.bench._timing import time_cuda  # noqa: E402
from microscale.bench.report import write_text_atomic  # noqa: E402
from microscale.linear.backends.scaled_fp8 import (Fp8Config, choose_fp8_config, scaled_fp8_launch,  # noqa: E402
                                                   scaled_fp8_ws_reason)
from microscale.linear.scaled import prepare_operand  # noqa: E402
from microscale.runtime import target  # noqa: E402

SHAPES = ((28672, 8192), (8192, 8192), (8192, 28672))
GLUON = [Fp8Config(128, bn, 4, st, group_m=g, gluon=True) for bn, st in ((128, 3), (128, 4), (128, 5), (64, 6))
         for g in (8, 16)]
#: ``--quick``: the best of an H100 run for 128x128-block weights (128 wide, group 16), the spill-free 64-wide
#: tile (1x128-block weights spilled at 128 on sm_90), and the deeper ring
QUICK = [Fp8Config(128, 128, 4, 3, group_m=16, gluon=True), Fp8Config(128, 64, 4, 6, group_m=8, gluon=True),
         Fp8Config(128, 128, 4, 4, group_m=8, gluon=True)]


def _check(oa, ob, a, b, cfg, want) -> float:
    """Relative error of ``cfg``'s output against float64 on the first 64 rows x 256 columns, and its
    distance from ``want`` (the Triton kernel's) on the whole output; raises past 5e-4."""
    out = scaled_fp8_launch(oa, ob, None, torch.float32, cfg)
    da, db = a.dequantize(torch.float32)[:64].double(), b.dequantize(torch.float32)[:256].double()
    ref = da @ db.T
    err = float((out[:64, :256].double() - ref).norm() / ref.norm())
    far = float((out - want).norm() / want.norm())
    if not err <= 5e-4 or not far <= 5e-4:
        raise AssertionError(f"{cfg}: {err:.2e} from float64, {far:.2e} from the Triton kernel")
    return err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows here (atomically)")
    ap.add_argument("--tokens", default="128,512,1024,4096")
    ap.add_argument("--quick", action="store_true", help="28672x8192 only, and three Gluon configs (QUICK)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or target.capability(torch.device("cuda")) != (9, 0):
        print("needs a Hopper GPU", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, bad = [], 0
    for n, k in SHAPES[:1] if args.quick else SHAPES:
        wf = torch.randn(n, k, device="cuda", generator=gen) * 0.02
        weights = {f: ms.quantize(wf, f) for f in ("fp8_e4m3_block128x128", "fp8_e4m3_block128")}
        # MXFP4 weights refolded losslessly (ms.fold_fp8) into 128 x 128 blocks: the W4A8 route on fp8 MMAs
        weights["mxfp4 fold_fp8 128x128"] = ms.fold_fp8(ms.quantize(wf, "mxfp4"), block_rows=128)
        wbf = wf.bfloat16()
        for m in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen)
            a = ms.quantize(x, "fp8_e4m3_block128")
            oa = prepare_operand(a)
            xbf = x.bfloat16()
            cublas = time_cuda(lambda: torch.mm(xbf, wbf.T), [()], graph="always").median_ms
            for wname, b in weights.items():
                ob = prepare_operand(b)
                base = choose_fp8_config(m, n, 128, target.num_sms(x.device))
                want = scaled_fp8_launch(oa, ob, None, torch.float32, base)
                for cfg in [base] + (QUICK if args.quick else GLUON):
                    if cfg.gluon and scaled_fp8_ws_reason(oa, ob, cfg) is not None:
                        continue
                    row = dict(n=n, k=k, m=m, weight=wname, config=repr(cfg))
                    try:
                        row["rel_err"] = _check(oa, ob, a, b, cfg, want)
                        t = time_cuda(lambda c=cfg: scaled_fp8_launch(oa, ob, None, torch.bfloat16, c), [()],
                                      graph="always").median_ms
                        row.update(ms=t, tflops=2 * m * n * k / t / 1e9, vs_cublas_bf16=cublas / t, cublas_ms=cublas)
                    except Exception as e:  # noqa: BLE001 - a failing config is a row, not the end of the sweep
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        bad += 1
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        write_text_atomic(args.json, json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
