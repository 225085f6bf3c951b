#!/usr/bin/env bash
# Twentieth session, second device call (~6 min): prefill_ws ring depth at 4096 and 512 tokens on
# the three shapes, and prefill_ws 64-token tiles against the routed decode_tma at 48 and 64 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
(cd benchmarks && M=4096 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="linear;g4 s3;g4 s2" \
  step ws4096 240 python exp_ws_knobs.py 28672x8192 8192x28672 8192x8192)
(cd benchmarks && M=48,64 FMTS=nvfp4 ROUNDS=2 VARIANTS="linear;g4 s8 t64;g4 s4 t64" \
  step wsmid 150 python exp_ws_knobs.py 28672x8192 8192x28672 8192x8192)
(cd benchmarks && M=512 FMTS=nvfp4 ROUNDS=2 VARIANTS="linear;g4 s3 t256;g4 s4 t256;g4 s4 t128" \
  step ws512 120 python exp_ws_knobs.py 28672x8192 8192x28672 8192x8192)
for s in ws4096 wsmid ws512; do echo "== $s"; grep -A30 "^Median" "$OUT/$s.log"; done
cat "$OUT/summary.txt"
