#!/usr/bin/env bash
# Twentieth session, fourth device call (~6 min; needs branch exp/ws-prefetch4): prefill_ws with code words 4 K steps ahead
# (`prefetch`): GPU tests, then against the routed call at 32-128 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu"
cd benchmarks
M=48,64 FMTS=nvfp4 VARIANTS="linear;g4 s8 t64 p4" step mid 150 python exp_ws_knobs.py 8192x8192 4096x4096 4096x14336 14336x4096
M=64 FMTS=nvfp4 VARIANTS="dtma;g4 s8 t64 p4" step big64 100 python exp_ws_knobs.py 28672x8192 8192x28672
M=128 FMTS=nvfp4 VARIANTS="linear;g4 s6 t128 p4;g4 s8 t64 p4" step m128 120 python exp_ws_knobs.py 8192x8192 28672x8192 8192x28672
M=32 FMTS=nvfp4 VARIANTS="linear;g4 s8 t64 p4" step m32 60 python exp_ws_knobs.py 8192x8192 4096x4096
cd ..
tail -3 "$OUT/tests.log"; for s in mid big64 m128 m32; do grep -A30 "^Median" "$OUT/$s.log" | grep -v "^$"; done
cat "$OUT/summary.txt"
