#!/usr/bin/env bash
# (The _DT_DRY switch lives on branch exp/dtma-dry; run this script there.)
# Thirty-sixth session (~3 min; branch exp/dtma-dry): decode_tma's TMA ring with consumers that only drain it
# (_DT_DRY: no decode, no MMA; the output is not checked) against the full kernel, 8 and 16 tokens, on the two
# large issue-4 shapes: what the current 256-row ring delivers with no work, against the 3.0x budget.
set -u
. "$(dirname "$0")/gpu_steps.sh"
M=8,16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma +_DT_DRY" step dry 240 python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672
grep -A20 "^Median" "$OUT/dry.log"
cat "$OUT/summary.txt"
