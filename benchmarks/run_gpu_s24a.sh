#!/usr/bin/env bash
# Twenty-fourth session, first call (~5 min): GPU tests of the capture fix for fp8 weights and of
# decode_tma's 8 token columns; then 2-8 tokens in graphs: ms.linear as routed (gemv / gemv_mma)
# against decode_tma with 8 and 16 token columns, on the issue's shapes.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 300 python -m pytest -q tests/kernels/test_linear.py tests/kernels/test_decode_tma.py \
    tests/kernels/test_plans.py -k "gpu or plan" -p no:cacheprovider
M=2,4,8 FMTS=nvfp4,mxfp4 ROUNDS=2 VARIANTS="linear;dtma;dtma t16" step t8 400 \
    python benchmarks/exp_ws_knobs.py 28672x8192 8192x28672 8192x8192
tail -3 "$OUT/tests.log"
tail -40 "$OUT/t8.log"
cat "$OUT/summary.txt"
