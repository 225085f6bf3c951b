#!/usr/bin/env bash
# Twenty-fifth session, third call (~5 min): the remaining GPU tests that run planned eager calls
# (GEMV, gemv_mma, launch, nn, demo), then the demo itself on the GPU.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q -k gpu tests/kernels/test_gemv.py tests/kernels/test_gemv_mma.py \
  tests/kernels/test_launch.py tests/nn tests/test_demo.py
tail -n 3 "$OUT/tests.log"
step demo 150 python -m microscale demo
tail -n 25 "$OUT/demo.log"
cat "$OUT/summary.txt"
