#!/usr/bin/env bash
# (The _DT_DRY switch lives on branch exp/dtma-dry; run this script there.)
# Thirty-sixth session (~2 min; branch exp/dtma-dry): the no-work ring (_DT_DRY) at 16 tokens with the routed
# programs against 132 equal shares (all SMs), and the full kernel with 132 shares: does the feed itself speed up
# on all SMs?
set -u
. "$(dirname "$0")/gpu_steps.sh"
M=16 FMTS=nvfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma +_DT_DRY;dtma p132;dtma p132 +_DT_DRY" step dry132 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672
grep -A20 "^Median" "$OUT/dry132.log"
cat "$OUT/summary.txt"
