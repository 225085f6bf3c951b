#!/usr/bin/env bash
# Eighteenth session, last call: the GEMV tests on the GPU (the chosen configs, now one warp for
# 8-bit codes at one token on 8192-row weights, against float64), then issue 4's matrix.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 120 python -m pytest -q -x tests/kernels/test_gemv.py -k "default_config or matches_float64 or scale_direct"
step matrix 440 python -m microscale.bench --suite matrix --out "$OUT/matrix" --time-budget 400
tail -3 "$OUT/tests.log"
tail -3 "$OUT/matrix.log"
cat "$OUT/summary.txt"
