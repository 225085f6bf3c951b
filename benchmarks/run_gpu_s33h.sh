#!/usr/bin/env bash
# Thirty-third session (~2 min): with cheap splits (first-program sums), does the 256-row tile gain from
# 132 equal shares with a deeper ring, or from 8-step ring chunks (256 contiguous bytes a row per box)?
# 28672x8192 NVFP4, 16 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step ring 200 env M=16 FMTS=nvfp4 ROUNDS=2 DATA=suite \
  VARIANTS="dtma r256;dtma r256 p132;dtma r256 p132 _DT_STAGES=4;dtma r256 _DT_CHUNK=8 _DT_STAGES=2;dtma r256 p132 _DT_CHUNK=8 _DT_STAGES=2" \
  python benchmarks/exp_ws_knobs.py 28672x8192
grep -v "^ *clocks" "$OUT/ring.log" | tail -n 8
cat "$OUT/summary.txt"
