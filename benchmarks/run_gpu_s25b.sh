#!/usr/bin/env bash
# Twenty-fifth session, second call (~6 min): the GPU tests of the plans, decode_tma and linear
# with eager 2-8 tokens on large weights routed to decode_tma, then the default suite.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 330 python -m pytest -q -k gpu tests/kernels/test_decode_tma.py tests/kernels/test_plans.py \
  tests/kernels/test_linear.py
tail -n 3 "$OUT/tests.log"
step bench 200 python -m microscale.bench --out "$OUT/bench"
cat "$OUT/summary.txt"
