#!/usr/bin/env bash
# (The _WS_ALIGN switch lives on branch exp/ws-align; run this script there.)
# Thirty-sixth session (~6 min): prefill_ws consumers taking the ring a round at a time on compile-time slots
# (_WS_ALIGN, MICROSCALE_WS_ALIGN=1: 103 SASS per step against 124): GPU tests with the switch on (E2M1, int4,
# routing, graphs), then an A/B against the default at 128 / 512 / 4096 tokens on issue 4's shapes.
set -u
. "$(dirname "$0")/gpu_steps.sh"
MICROSCALE_WS_ALIGN=1 step tests 300 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu and (nvfp4 or mxfp4 or int4_affine_g128 or routing or graph)" -p no:cacheprovider
tail -3 "$OUT/tests.log"
M=128,512,4096 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="ws;ws +_WS_ALIGN" step ab 300 python benchmarks/exp_ws_knobs.py 8192x8192 28672x8192 8192x28672
grep -A40 "^Median" "$OUT/ab.log"
cat "$OUT/summary.txt"
