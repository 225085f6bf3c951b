#!/usr/bin/env bash
# Twenty-fourth session, second call (~4 min): GPU tests of the new decode_tma token window
# (2-64 tokens on large weights, DECODE_TMA_SMALL_MIN_M-64 on smaller ones, 8 token columns),
# then gemv_mma against decode_tma at 3-8 tokens on smaller weights, graphs, to place
# DECODE_TMA_SMALL_MIN_M.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_decode_tma.py tests/kernels/test_gemv_mma.py \
    tests/kernels/test_plans.py tests/kernels/test_gemv.py -k "gpu" -p no:cacheprovider
M=3,4,5,6 FMTS=nvfp4 ROUNDS=2 VARIANTS="gemv_mma;dtma" step small8k 200 python benchmarks/exp_ws_knobs.py 8192x8192
M=4,8 FMTS=nvfp4 ROUNDS=2 VARIANTS="gemv_mma;dtma" step small4k 200 \
    python benchmarks/exp_ws_knobs.py 4096x4096 4096x14336 14336x4096
tail -3 "$OUT/tests.log"
grep -A20 "^Median" "$OUT/small8k.log"; grep -A30 "^Median" "$OUT/small4k.log"
cat "$OUT/summary.txt"
