#!/usr/bin/env bash
# (The _DT_NOFEED switch lives on branch exp/dtma-nofeed; run this script there.)
# Thirty-seventh session (~4 min; branch exp/dtma-nofeed): decode_tma's consumers with no HBM stream
# (_DT_NOFEED: the ring is loaded once, later slots are marked ready with no data, so every decode and MMA
# runs on stale data) against the full kernel and the ring with no work (_DT_DRY), 8 and 16 tokens, on the
# two large issue-4 shapes; "xperm" times the activation permutation launch alone.
set -u
. "$(dirname "$0")/gpu_steps.sh"
M=8,16 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="dtma;dtma +_DT_DRY;dtma +_DT_NOFEED;xperm" step nofeed 420 python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672
grep -A40 "^Median" "$OUT/nofeed.log"
cat "$OUT/summary.txt"
