#!/usr/bin/env bash
# (The nat switch lives on branch exp/ws-nat; run this script there.)
# Thirty-sixth session (~7 min): prefill_ws reading the activations in natural K order (nat: no permutation
# pass; E2M1 weights): GPU tests of both orders, then an A/B of nat against the permuted activations at 128 to
# 4096 tokens on issue 4's shapes, NVFP4 and MXFP4, with cuBLAS bf16 in the same rounds.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_prefill_gluon.py -k "gpu and (natural or nvfp4 or mxfp4)" -p no:cacheprovider
tail -3 "$OUT/tests.log"
M=128,512,2048,4096 FMTS=nvfp4,mxfp4 ROUNDS=2 DATA=suite VARIANTS="ws;ws -_WS_NAT" step ab 300 python benchmarks/exp_ws_knobs.py 8192x8192 28672x8192 8192x28672
grep -A40 "^Median" "$OUT/ab.log"
cat "$OUT/summary.txt"
