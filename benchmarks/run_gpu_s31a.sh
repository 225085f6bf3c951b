#!/usr/bin/env bash
# Prepared in the thirtieth session, not run (no device time left; ~6 min): why the suites did not show the
# 16-token gain of per-warp slot release + multiply-add scales that the A/B script showed (48.5 against 51.7 µs,
# NVFP4 28672x8192). The same A/B with the suite's data (per-row 2^k), then after 90 s of sustained load.
set -u
. "$(dirname "$0")/gpu_steps.sh"
V="linear;dtma;dtma -_DT_WARP_ARRIVE -_SCALE_IMAD"
step ab_suite_data 90 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="$V" \
  python benchmarks/exp_ws_knobs.py 28672x8192
step ab_warm 200 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite WARM=90 VARIANTS="$V" \
  python benchmarks/exp_ws_knobs.py 28672x8192
# gemv_mma (2-8 tokens on small weights) with the UE4M3 multiply-add scales (_GEMV_MMA_SCALE_IMAD, off until timed;
# SASS 806 -> 774 per step at 8 tokens): each variant checked against float64 before timing
step ab_gemv_mma 90 env M=4,8 FMTS=nvfp4 ROUNDS=2 VARIANTS="gemv_mma;gemv_mma +_GEMV_MMA_SCALE_IMAD" \
  python benchmarks/exp_ws_knobs.py 8192x8192
tail -n 8 "$OUT/ab_suite_data.log" "$OUT/ab_warm.log" "$OUT/ab_gemv_mma.log"
cat "$OUT/summary.txt"
