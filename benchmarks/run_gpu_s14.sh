#!/usr/bin/env bash
# Device call of the fourteenth session: GPU tests of decode_tma (stream-K shares), the
# balance probe (old tile split against stream-K) and the variants at 9 / 16 tokens.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q -x tests/kernels/test_decode_tma.py tests/kernels/test_plans.py
step balance 120 python benchmarks/exp_balance.py
step variants 200 python benchmarks/exp_dtma_variants.py 28672x8192 8192x28672
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/tests.log | tail -3
cat "$OUT/balance.log"
grep -A20 "^shape" "$OUT/variants.log"
