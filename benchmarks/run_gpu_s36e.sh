#!/usr/bin/env bash
# (The _WS_TAIL_SK switch lives on branch exp/ws-tail-sk; run this script there.)
# Thirty-sixth session (~5 min; branch exp/ws-tail-sk): prefill_ws with a tail of more than half a wave cut into
# equal K-step ranges over all programs (_WS_TAIL_SK; today such a tail runs as whole tiles on R of the 132 SMs):
# GPU tests, then an A/B at 1024 / 2048 / 4096 tokens on the 8192-row shapes (tails of 124 / 116 / 100 tiles).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu and (stream_k or (prefill_ws and (nvfp4 or mxfp4)))" -p no:cacheprovider
tail -3 "$OUT/tests.log"
M=1024,2048,4096 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="ws;ws +_WS_TAIL_SK" step ab 300 python benchmarks/exp_ws_knobs.py 8192x8192 8192x28672
grep -A30 "^Median" "$OUT/ab.log"
cat "$OUT/summary.txt"
