#!/usr/bin/env bash
# Device call of the fourteenth session (last): decode_tma's GPU tests with one TMA box of
# scales per ring chunk, and the variants at 16 tokens.   bash benchmarks/run_gpu_s14.sh
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 100 python -m pytest -q tests/kernels/test_decode_tma.py -k gpu
step variants 80 python benchmarks/exp_dtma_variants.py 28672x8192 8192x28672
cat "$OUT/summary.txt"
grep -h -E " passed| failed|Error" "$OUT"/tests.log | tail -3
grep -A20 "^shape" "$OUT/variants.log"
