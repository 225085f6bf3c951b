#!/usr/bin/env bash
# Twenty-seventh session, second call (~6 min): GPU tests of the routing and plans (4-bit integers
# at 2 tokens now on the GEMV), then 48-96 tokens, where NVFP4 above 64 tokens and MXFP8 / int4
# above 32 take the Triton prefill kernel: routed, the Triton prefill kernel, prefill_ws, decode_tma.
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 200 python -m pytest -q tests/kernels/test_linear.py tests/kernels/test_plans.py tests/kernels/test_decode_tma.py -k gpu
tail -n 3 "$OUT/tests.log"
M=48,64,96 ROUNDS=1 FMTS=nvfp4,mxfp8_e4m3,int4_affine_g128 VARIANTS="linear;prefill;ws;dtma" \
  step mid 330 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192 8192x28672
sed -n '/^Median/,$p' "$OUT/mid.log"
cat "$OUT/summary.txt"
