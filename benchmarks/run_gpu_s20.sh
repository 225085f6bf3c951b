#!/usr/bin/env bash
# Twentieth session, one device call (~6 min): the back-to-back GEMV test on main's prep, the
# nineteenth session's prepared x_direct A/B (carry "trees": trees/xd from
# `git archive exp/gemv-x-direct microscale | tar -x -C trees/xd`), and prefill_ws knobs at 4096
# tokens on the 8192-row shapes and at 32-128 tokens on 8192x8192 against the routed call.
set -u
. "$(dirname "$0")/gpu_steps.sh"
ROOT=$PWD
step b2b 150 python -m pytest -q -x tests/kernels/test_gemv.py -k "back_to_back or chained"
(cd benchmarks && M=4096 FMTS=nvfp4 ROUNDS=2 step ws4096 300 python exp_ws_knobs.py 8192x8192 8192x28672)
(cd benchmarks && M=32,64,128 FMTS=nvfp4 ROUNDS=2 VARIANTS="linear;g4 s8 t64;g1 s8 t64;g4 s6 t128" \
  step wsmid 200 python exp_ws_knobs.py 8192x8192)
(cd benchmarks && PYTHONPATH="$ROOT/trees/xd" VARIANTS="num_warps=1;x_direct=1 num_warps=1" FMTS=int8_fp16 ROUNDS=3 \
  IDLE=0.8 SECONDS_WINDOW=0.6 step xd 120 python exp_power.py 8192x8192)
for s in ws4096 wsmid xd; do echo "== $s"; tail -24 "$OUT/$s.log"; done
cat "$OUT/summary.txt"
