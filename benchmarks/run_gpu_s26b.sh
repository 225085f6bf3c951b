#!/usr/bin/env bash
# Twenty-sixth session, second call (~7 min): decode_tma for int4_affine_g64 / _g128 weights;
# GPU tests of both Gluon kernels and the routing, then 1-32 tokens of int4_affine_g128 against
# cuBLAS bf16 and the previous routes (GEMV up to 4 tokens, the Triton prefill kernel from 5).
set -u
. "$(dirname "$0")/gpu_steps.sh"
step tests 360 python -m pytest -q tests/kernels/test_prefill_gluon.py tests/kernels/test_decode_tma.py \
  tests/kernels/test_linear.py tests/kernels/test_plans.py -k gpu
tail -n 5 "$OUT/tests.log"
M=1,2,4,8,16,32 ROUNDS=1 FMTS=int4_affine_g128 VARIANTS="linear;dtma;gemv;prefill" \
  step tdec 200 python benchmarks/exp_ws_knobs.py 28672x8192 8192x8192
tail -n 40 "$OUT/tdec.log"
cat "$OUT/summary.txt"
