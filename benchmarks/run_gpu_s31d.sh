#!/usr/bin/env bash
# Thirty-first session, fourth call (~4 min): decode_tma with two 16-row slices per consumer warp (each warp reads
# its activation fragments once for 32 rows: half the LDSM, 684 SASS per 32 code words against 371 per 16) on
# 256-row tiles: 2 ring chunks at 80 registers, two programs per SM; or 3 chunks at 160 registers, one per SM.
# Each variant checked against float64 before timing; clocks printed per timing.
# (Ran as written; its _DT_SLICES / _DT_MAXNREG switches were folded into decode_tma(rows=256) afterwards:
# the variant is now `dtma r256`.)
set -u
. "$(dirname "$0")/gpu_steps.sh"
B="_DT_ROWS=256 _DT_SLICES=2"
step slices 300 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma;dtma $B _DT_STAGES=2;dtma $B _DT_PER_SM=1 _DT_MAXNREG=160" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672 8192x8192
grep -E "rel err|Error" "$OUT/slices.log" | head -20
tail -n 14 "$OUT/slices.log"
cat "$OUT/summary.txt"
