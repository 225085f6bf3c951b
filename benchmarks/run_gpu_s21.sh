#!/usr/bin/env bash
# Runs only on branch exp/ws-2cta (the "x2" variant, prefill_ws(per_sm=2), is not on main); kept
# here as the record of the twenty-first session's run (`h200_2026-12-03/s21/a/`, ~2 min): prefill_ws
# with 64-token tiles at two programs per SM (consumer registers 112 / 104, producer 24, launch
# maxnreg 80): GPU tests, then against the routed call (one program per SM) at 48-64 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu_prefill_ws"
cd benchmarks
M=48,64 FMTS=nvfp4 VARIANTS="linear;g4 s8 t64 x2;g4 s8 t64 x2 nosplit" step x2 200 python exp_ws_knobs.py \
  4096x4096 4096x14336 14336x4096 8192x8192 28672x8192
cd ..
tail -3 "$OUT/tests.log"; grep -A40 "^Median" "$OUT/x2.log" | grep -v "^$"
cat "$OUT/summary.txt"
