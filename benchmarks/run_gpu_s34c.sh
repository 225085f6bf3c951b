#!/usr/bin/env bash
# Thirty-fourth session (~5 min): 33-64 tokens on small E2M1 weights inside graphs. The routed call
# (`linear`: prefill_ws while capturing, `_prefill_ws_small_wanted`) against decode_tma as routed (the one-table
# 256-row tile at 64 columns since the thirty-third session: 37.2 µs on 64x8192x8192 against the matrix's 41.3).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step small 330 env M=48,64 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="linear;dtma" \
  python benchmarks/exp_ws_knobs.py 4096x4096 14336x4096 4096x14336 8192x8192
grep -v "^ *clocks" "$OUT/small.log" | tail -n 30
cat "$OUT/summary.txt"
