#!/usr/bin/env bash
# Thirty-first session, fifth call (~2 min): s31/d's one-program-per-SM variant (256-row tiles, two row slices per
# consumer warp, 160 registers) was 5% faster on 28672x8192 with only 112 programs (one 256-row tile each, 20 SMs
# idle); here with 132 equal stream-K shares (one per SM) and 128.
# (Ran as written; its _DT_SLICES / _DT_MAXNREG switches were folded into decode_tma(rows=256) afterwards:
# the variant is now `dtma r256`.)
set -u
. "$(dirname "$0")/gpu_steps.sh"
B="_DT_ROWS=256 _DT_SLICES=2 _DT_PER_SM=1 _DT_MAXNREG=160"
step slices_p 200 env M=16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma;dtma $B;dtma p132 $B;dtma p128 $B" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672 8192x8192
grep -E "rel err|Error" "$OUT/slices_p.log" | grep -v "e-03" | head -10
tail -n 20 "$OUT/slices_p.log"
cat "$OUT/summary.txt"
