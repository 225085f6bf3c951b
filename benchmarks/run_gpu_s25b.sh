#!/usr/bin/env bash
# Twenty-fifth session, second call (~7 min): the GPU tests of the plans, decode_tma and linear
# (eager 2-8 tokens on large weights on decode_tma; bound plan launches), the bound launches'
# host time (exp_plan_host.py), then the default suite.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 330 python -m pytest -q -x -k gpu tests/kernels/test_plans.py tests/kernels/test_decode_tma.py \
  tests/kernels/test_linear.py
tail -n 3 "$OUT/tests.log"
step host 120 python benchmarks/exp_plan_host.py
tail -n 9 "$OUT/host.log"
step bench 200 python -m microscale.bench --out "$OUT/bench"
cat "$OUT/summary.txt"
