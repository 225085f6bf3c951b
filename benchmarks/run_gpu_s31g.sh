#!/usr/bin/env bash
# Thirty-first session, seventh call (~3 min): the routed ms.linear with the 256-row tile at 8 and 64 token columns on
# 28672x8192 against the 128-row kernel, and the 256-row tile on 8192x28672 at 4 / 64 tokens (not routed there).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step routed 150 env M=4,64 FMTS=nvfp4 ROUNDS=1 DATA=suite VARIANTS="dtma r128;dtma r256;linear" \
  python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672
tail -n 16 "$OUT/routed.log"
cat "$OUT/summary.txt"
