#!/usr/bin/env bash
# Thirty-third session (~1.5 min): with cheap splits for 256-row tiles (first-program sums), do 256-row tiles
# now beat 128-row ones on 8192-row E2M1 weights at 8-64 tokens? (If so: one tile height and one scale
# table for every E2M1 bf16 weight.)
set -u
. "$(dirname "$0")/gpu_steps.sh"
step rows 150 env M=8,16,32,64 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma r128;dtma r256" \
  python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672
grep -v "^ *clocks" "$OUT/rows.log" | tail -n 19
cat "$OUT/summary.txt"
