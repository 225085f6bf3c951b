#!/usr/bin/env bash
# Thirtieth session, first call (~7 min): per-warp slot release in the Gluon kernels (the PTX rewrite of
# microscale/kernels/_ptx.py) against the default, decode_tma at 16 tokens and prefill_ws at 4096 tokens
# (timed like the matrix suite, each variant checked against float64 first), then the bit-identity check.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step t16 200 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="dtma;dtma +_DT_WARP_ARRIVE" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672 8192x8192
step t4096 220 env M=4096 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="ws;ws +_WS_WARP_ARRIVE" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672 28672x8192
step warp_check 150 env REPS=10 python benchmarks/exp_warp_arrive.py
tail -n 14 "$OUT/t16.log"
tail -n 14 "$OUT/t4096.log"
grep -c FAIL "$OUT/warp_check.log"; tail -n 2 "$OUT/warp_check.log"
cat "$OUT/summary.txt"
