#!/usr/bin/env bash
# Twenty-seventh session, third call (~7 min): GPU tests of the new routes (prefill_ws from 65
# tokens, MXFP8 from 33; 4-bit integers at 2 tokens on the GEMV and 33-64 small-weight tokens on
# decode_tma), then the default suite (the generated part of benchmarks/RESULTS.md).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 240 python -m pytest -q tests/kernels/test_prefill_gluon.py tests/kernels/test_linear.py \
  tests/kernels/test_plans.py -k "gpu"
tail -n 3 "$OUT/tests.log"
step bench 330 python -m microscale.bench --out "$OUT/bench"
tail -n 30 "$OUT/bench.log"
cat "$OUT/summary.txt"
