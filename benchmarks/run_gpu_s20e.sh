#!/usr/bin/env bash
# Twentieth session, last device call (~3 min): where a small-weight prefill_ws call at 64 tokens
# spends its time: the routed call, its K-permutation kernel alone, whole tiles (no split), over K.
set -u
. "$(dirname "$0")/gpu_steps.sh"
cd benchmarks
M=64 FMTS=nvfp4 VARIANTS="linear;xperm;g4 s8 t64 nosplit" step parts 200 python exp_ws_knobs.py 4096x2048 4096x4096 4096x8192 4096x16384
cd ..
grep -A30 "^Median" "$OUT/parts.log" | grep -v "^$"
cat "$OUT/summary.txt"
