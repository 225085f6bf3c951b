#!/usr/bin/env bash
# Device call of the fourteenth session: GPU tests of the call plans and the decode_tma
# routing (last session's final commits), then the tile-balance probe.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q -x tests/kernels/test_plans.py tests/kernels/test_decode_tma.py tests/kernels/test_launch.py
step balance 120 python benchmarks/exp_balance.py
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/tests.log | tail -3
cat "$OUT/balance.log"
