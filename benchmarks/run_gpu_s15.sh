#!/usr/bin/env bash
# Fifteenth session: decode_tma with 32 / 64 token columns, routed for 9-64 tokens. GPU tests
# of decode_tma and the eager plans, then issue 4's benchmark (the `matrix` suite).
#     bash benchmarks/run_gpu_s15.sh   (~6 min)     TOKENS=1: also exp_dtma_tokens.py
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_plans.py
tail -3 "$OUT/tests.log"
if [ "${TOKENS:-0}" = 1 ]; then step tokens 300 python benchmarks/exp_dtma_tokens.py; fi
step matrix 420 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 380
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
