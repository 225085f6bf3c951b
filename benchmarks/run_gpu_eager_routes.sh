#!/usr/bin/env bash
# Eager routes at 2-8 tokens (benchmarks/exp_eager_routes.py, ~2 min), alternated and clock-aware,
# with decode_tma's plan launches bound (_launch.bind) and not; the plan and decode_tma GPU tests first.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q -x tests/kernels/test_plans.py tests/kernels/test_decode_tma.py
tail -3 "$OUT/tests.log"
step eager_routes 400 python benchmarks/exp_eager_routes.py
grep host "$OUT/eager_routes.log"
tail -28 "$OUT/eager_routes.log"
cat "$OUT/summary.txt"
